"""A probe builds only its shard and reports memory in the planner's terms.

    python -m pytest tests/test_probes_memory.py -q

Fast tests run one process in this interpreter: initial values do not depend on the layout,
the peak counter resets, and a rank's parameter / gradient / optimizer bytes equal
`planner.memory`'s for the same model and layout. Slow tests start torchrun: TP, ZeRO-3 and PP
ranks hold the planner's per-rank share, and a TP rank's resident memory during set-up never
holds the full model (meta-device build, each rank materialises its shard only).
"""

from __future__ import annotations

import time

import pytest

from conftest_probes import PROBE_TIMEOUT_S, tiny_model, tiny_spec
from planner.hardware import make_cluster
from planner.memory import stage_memory
from planner.space import Candidate, TrainingSpec
from probes.layout import model_run, resolve_layout

torch = pytest.importorskip("torch")
from probes.gpt import GPTStage, init_parameters  # noqa: E402
from probes.memstat import reset_peak_memory, vm_kib  # noqa: E402
from probes.train import run_probe  # noqa: E402


def _built(m, layers, seed=7):
    with torch.device("meta"):
        stage = GPTStage(m, layer_ids=layers, first=layers.start == 0, last=layers.stop == m.layers)
    stage.to_empty(device="cpu")
    init_parameters(stage, seed)
    return dict(stage.named_parameters())


def test_initial_values_do_not_depend_on_the_stage_a_layer_lands_in():
    m = tiny_model()
    whole = _built(m, range(0, 4))
    second = _built(m, range(2, 4))
    assert set(second) < set(whole)
    for name, p in second.items():
        assert torch.equal(p, whole[name]), name
    assert not torch.equal(whole["layers.0.attn.wq.weight"], whole["layers.1.attn.wq.weight"])
    assert torch.equal(whole["layers.0.norm1.weight"], torch.ones(m.hidden))
    assert whole["embed.tok.weight"].std().item() == pytest.approx(0.02, rel=0.1)


def test_cpu_peak_counter_resets():
    if vm_kib("VmHWM") is None:
        pytest.skip("no /proc/self/status VmHWM")
    big = torch.ones(64 * 2**20 // 4)            # 64 MiB touched
    del big
    high = vm_kib("VmHWM")
    if not reset_peak_memory(torch.device("cpu")):
        pytest.skip("/proc/self/clear_refs is not writable here")
    assert vm_kib("VmHWM") < high - 32 * 1024   # KiB: the 64 MiB peak is forgotten


def _run(spec):
    """run_probe in this process (one rank, CPU)."""
    return run_probe(spec, resolve_layout(spec, world=1), 0, 1, torch.device("cpu"), time.time())


def _predicted(spec, nproc, precision="fp32"):
    """planner.memory.stage_memory for the model and layout the probe runs, by stage name."""
    layout = resolve_layout(spec, world=nproc)
    m = model_run(spec, layout)
    cand = Candidate(**spec.candidate)
    cluster = make_cluster(gpu="A100-80GB", gpus_per_node=8, nodes=1)
    # the probe's DDP/autocast recipe keeps fp32 master weights and fp32 gradients: Megatron-LM's accounting
    framework = "fsdp" if cand.zero == 3 else "megatron-lm"
    training = TrainingSpec(global_batch=cand.global_batch, seq_len=m.seq_len, precision=precision,
                            framework=framework)
    return {b.stage: b for b in stage_memory(m, cand, cluster, training)}


def test_one_process_holds_the_planners_fp32_model_states():
    """fp32 AdamW: 4 + 4 + 8 bytes per parameter, the planner's ParamBytes for fp32, field by field."""
    spec = tiny_spec(mbs=2, gas=2)
    r = _run(spec)
    rec = r.memory_per_rank[0]
    plan = _predicted(spec, 1)["only"]
    assert rec["stage"] == "only"
    assert rec["params_on_gpu"] == plan.params_on_gpu
    assert rec["weights_bytes"] == rec["param_bytes"] == plan.weights_bytes
    assert rec["grads_bytes"] == plan.grads_bytes
    assert rec["optimizer_bytes"] == plan.optimizer_bytes
    assert rec["peak_allocated_bytes"] is None and rec["context_bytes"] is None      # CPU: not measurable
    # in this interpreter freed memory of earlier tests may be reused: growth can be 0 (torchrun tests check it)
    assert rec["rss_peak_bytes"] > 0 and rec["rss_after_setup_bytes"] > 0 and rec["rss_start_bytes"] > 0
    if rec["peak_reset"]:
        assert 0 <= rec["materialise_peak_growth_bytes"] < 2 * rec["param_bytes"] + 4 * 2**20
    assert r.precision_recipe["bytes_per_param"] == 16 and r.precision_recipe["master_weights"] is False


def test_bf16_reports_master_weights_and_what_differs_from_the_planner():
    spec = tiny_spec(precision="bf16")
    r = _run(spec)
    rec = r.memory_per_rank[0]
    plan = _predicted(spec, 1, "bf16")["only"]
    assert r.precision_recipe["master_weights"] is True and r.precision_recipe["bytes_per_param"] == 18
    assert "autocast" in r.precision_recipe["differs_from_planner"]
    assert rec["weights_bytes"] is None                   # the bf16 copy is autocast's cache, not a held tensor
    assert rec["optimizer_bytes"] == plan.optimizer_bytes   # fp32 master 4 + Adam 8
    assert rec["grads_bytes"] == plan.grads_bytes           # fp32 grads 4


# --- torchrun: each rank holds its share ---------------------------------------------------------

BIG = dict(layers=16, hidden=256, heads=4, kv_heads=4, ffn_hidden=1024, vocab=1024, seq_len=32)
"""~13M parameters (52 MB fp32): large next to a rank's shard plus one full parameter"""


@pytest.mark.slow
@pytest.mark.parametrize("kw, nproc", [
    (dict(tp=2, gas=2), 2),
    (dict(dp=2, zero=3, gas=2), 2),
    (dict(pp=2, gas=2), 2),
    (dict(tp=2, dp=2, zero=3, gas=2), 4),
], ids=["tp2", "dp2-zero3", "pp2", "tp2-dp2-zero3"])
def test_each_rank_holds_the_planners_share(kw, nproc, tmp_path, warm_run):
    """Counted from the rank's tensors (not its resident memory): warm workers, as tune runs them."""
    spec = tiny_spec(**kw)
    r = warm_run(spec, nproc, tmp_path, PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    plan = _predicted(spec, nproc)
    for rec in r.memory_per_rank:
        want = plan[rec["stage"]]
        # TP replicates the norms (and row-parallel biases) the planner divides by TP: within 3%
        assert rec["param_bytes"] == pytest.approx(want.weights_bytes, rel=0.03), rec
        assert rec["grads_bytes"] == pytest.approx(want.grads_bytes, rel=0.03), rec
        assert rec["optimizer_bytes"] == pytest.approx(want.optimizer_bytes, rel=0.03), rec
    assert sorted({rec["stage"] for rec in r.memory_per_rank}) == sorted(plan)


@pytest.mark.slow
def test_a_tp_rank_never_holds_the_full_model_while_building(tmp_path):
    """Meta-device build: resident memory grows by this rank's shard and one full parameter at most."""
    from probes.launch import run_local

    spec = tiny_spec(model=tiny_model(**BIG), tp=2, mbs=1, gas=1, steps=1)
    r = run_local(spec, nproc=2, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    full_bytes = 4 * model_run(spec, resolve_layout(spec, world=2)).params
    for rec in r.memory_per_rank:
        growth = rec["materialise_peak_growth_bytes"]
        bound = rec["param_bytes"] + rec["largest_param_full_bytes"] + 4 * 2**20
        assert bound < 0.8 * full_bytes          # the check can tell a shard from the full model
        assert rec["param_bytes"] == pytest.approx(full_bytes / 2, rel=0.03)
        assert growth < bound, (growth, rec)


@pytest.mark.slow
def test_tied_embeddings_stay_one_table_when_sharded(tmp_path, warm_run):
    """The meta-device build keeps the tied table one parameter: ZeRO-3 over 2 gives the one-process
    losses and holds half the planner's (tied) parameter count (warm workers, as tune runs them)."""
    m = tiny_model(tied_embeddings=True)
    one = warm_run(tiny_spec(model=m, gas=4), 1, tmp_path / "one", PROBE_TIMEOUT_S)
    two = warm_run(tiny_spec(model=m, dp=2, zero=3, gas=2), 2, tmp_path / "two", PROBE_TIMEOUT_S)
    assert one.status == "ok" and two.status == "ok", (one.reason, two.reason)
    assert one.memory_per_rank[0]["params_on_gpu"] == m.params
    assert two.memory_per_rank[0]["params_on_gpu"] == pytest.approx(m.params / 2, abs=2)
    assert two.losses[:4] == pytest.approx(one.losses[:4], rel=1e-5)
