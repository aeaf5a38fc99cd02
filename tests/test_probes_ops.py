"""The probe model's hand-written ops: Megatron-LM's fused SwiGLU memory and rotary embeddings.

    python -m pytest tests/test_probes_ops.py -q

The SwiGLU function must give eager autograd's gradients while keeping only its two inputs for the backward
(the planner counts Megatron-LM's fused SwiGLU, `planner.memory.layer_activations`); RoPE must rotate each pair
by its position so that a query-key product depends on their distance only (Su et al. 2021, Eq. 16).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from probes.gpt import _rope, _rope_tables, _SwiGLU  # noqa: E402


def test_swiglu_gradients_equal_eager_autograd():
    g = torch.Generator().manual_seed(0)
    gate, up = (torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(_SwiGLU.apply, (gate, up))
    w = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    (F.silu(gate) * up * w).sum().backward()
    eager = gate.grad.clone(), up.grad.clone()
    gate.grad = up.grad = None
    (_SwiGLU.apply(gate, up) * w).sum().backward()
    assert torch.allclose(gate.grad, eager[0]) and torch.allclose(up.grad, eager[1])


def _saved_bytes(fn, *inputs) -> int:
    """Bytes autograd keeps for the backward of ``fn(*inputs)`` (distinct storages)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def test_swiglu_keeps_only_its_inputs():
    gate, up = (torch.randn(4, 16, 32, requires_grad=True) for _ in range(2))
    one = gate.numel() * gate.element_size()
    assert _saved_bytes(_SwiGLU.apply, gate, up) == 2 * one          # gate and up, as Megatron-LM's fused kernel
    assert _saved_bytes(lambda a, b: F.silu(a) * b, gate, up) == 3 * one   # eager also keeps silu(gate)


def test_rope_scores_depend_on_the_distance_only():
    d, s = 16, 12
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    tables = _rope_tables(s, d, None, torch.device("cpu"), torch.float64)
    rq = _rope(q.expand(1, s, 1, d), tables)[0, :, 0]     # the same query at every position
    rk = _rope(k.expand(1, s, 1, d), tables)[0, :, 0]
    scores = rq @ rk.T                                     # scores[m, n] = <q at m, k at n>
    for shift in (1, 3, 7):
        assert torch.allclose(scores.diagonal(shift), scores.diagonal(shift)[0].expand(s - shift))
    assert not torch.allclose(scores.diagonal(1)[0], scores.diagonal(3)[0])
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(s))           # a rotation: norms kept
    assert torch.allclose(rq[0], q)                                        # position 0: unrotated


def test_rope_positions_select_rows_of_the_table():
    d, s = 8, 10
    x = torch.randn(2, 4, 3, d)
    pos = torch.tensor([0, 1, 8, 9])     # a context-parallel rank's two chunks
    full = _rope(torch.randn(2, s, 3, d).index_copy(1, pos, x), _rope_tables(s, d, None, x.device, x.dtype))
    part = _rope(x, _rope_tables(4, d, pos, x.device, x.dtype))
    assert torch.allclose(part, full[:, pos], atol=1e-6)
