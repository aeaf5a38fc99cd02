"""The probe's op-level SAC (recompute=selective-op, torchtitan's SelectiveAC "op"): same gradients as no recompute,
and the activations it keeps are what planner.memory counts for selective-op.

    python -m pytest tests/test_probes_op_sac.py -q

What a checkpointed block keeps cannot be read with saved_tensors_hooks: non-reentrant checkpoint installs its own
hooks inside the block (the innermost hooks win) and op-level SAC caches the saved ops' outputs in its own storage.
So the test records every tensor storage the forward creates (a TorchDispatchMode) and, once the forward returned,
sums those still alive besides the output: what the block holds for its backward, in every mode alike.
"""

from __future__ import annotations

import pytest

from conftest_probes import tiny_model
from planner.memory import layer_activations
from planner.space import Candidate, TrainingSpec

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from probes.gpt import GPTStage, init_parameters  # noqa: E402

LLAMA = tiny_model(kv_heads=2, glu=True, ffn_hidden=128, position="rope", norm="rmsnorm", bias=False)
MODELS = {"gpt": tiny_model(), "llama-gqa": LLAMA}
B = 2


class _Storages(TorchDispatchMode):
    """Weak references to the storage of every tensor an op returns, by address (a reused address: the newer)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.made[s.data_ptr()] = (StorageWeakRef(s), s.nbytes())
        return out


def _stage(model, recompute: str) -> GPTStage:
    with torch.device("meta"):
        stage = GPTStage(model, layer_ids=range(1), first=False, last=False, recompute=recompute)
    stage.to_empty(device="cpu")
    init_parameters(stage, seed=7)
    return stage


def _input(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(B, model.seq_len, model.hidden, generator=g, requires_grad=True)


def _kept_bytes(model, recompute: str) -> int:
    """Bytes the one-layer stage's forward keeps alive for its backward (its input, output and weights not counted:
    an op's view of a weight, as ``t()``, shares the weight's storage)."""
    stage, x = _stage(model, recompute), _input(model)
    before = {t.untyped_storage().data_ptr() for t in [x, *stage.parameters()]}
    with torch.no_grad():
        stage(x)                       # fills the RoPE table cache, which is no activation
    with _Storages() as seen:
        y = stage(x)
    before.add(y.untyped_storage().data_ptr())
    return sum(n for ptr, (ref, n) in seen.made.items() if ptr not in before and not ref.expired())


def _planner_kept_elements(model, recompute: str) -> float:
    """planner.memory's stored activations of one layer less its input, in elements (it counts 16-bit bytes)."""
    act = layer_activations(model, Candidate(tp=1, pp=1, dp=1, mbs=B, gas=1, recompute=recompute),
                            TrainingSpec(global_batch=B, seq_len=model.seq_len, framework="fsdp",
                                         flash_attention=True))
    return (act.stored_bytes - 2 * B * model.seq_len * model.hidden) / 2


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_gradients_equal_no_recompute(model):
    grads = {}
    for recompute in ("none", "selective-op"):
        stage, x = _stage(model, recompute), _input(model)
        w = torch.randn(B, model.seq_len, model.hidden, generator=torch.Generator().manual_seed(5))
        (stage(x) * w).sum().backward()
        grads[recompute] = [x.grad] + [p.grad for p in stage.parameters()]
    assert len(grads["none"]) == len(grads["selective-op"]) > 1
    for a, b in zip(grads["none"], grads["selective-op"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_kept_activations_match_planner(model):
    kept = {r: _kept_bytes(model, r) for r in ("none", "selective", "selective-op", "full")}
    assert kept["full"] == 0                                    # only the input, which is not counted here
    assert 0 < kept["selective-op"] < kept["selective"] <= kept["none"], kept
    # SDPA's log-sum-exp (b x heads x s, fp32) is kept with the attention output; the planner drops it (s/h smaller)
    lse = B * model.heads * model.seq_len
    assert kept["selective-op"] / 4 == _planner_kept_elements(model, "selective-op") + lse
