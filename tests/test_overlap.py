"""Megatron-LM's communication overlaps as terms hiding under compute (planner.cost: dp_grads, dp_param_gather,
tp_comm, pp_p2p), the switch (`--overlap`) and the flags the emitted run sets (fast)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from planner import Candidate, TrainingSpec, estimate, load_model, make_cluster
from planner.cost import ddp_bucket_share
from planner.emit.megatron_lm import megatron_lm_args
from planner.emit.setup import RunSetup
from planner.errors import InputError

MODEL = load_model("llama3-70b")
CLUSTER = make_cluster(gpu="H100", gpus=64)
BASE = TrainingSpec(global_batch=128, seq_len=8192, precision="fp8", framework="megatron-lm",
                    fp8_recipe="tensorwise", grad_reduce_dtype="bf16")
# Megatron-Bridge 25.11 DGX-H100 Llama 3 70B FP8: TP4 PP8 VP5 DP2, MBS 1, GBS 128 (tests/bench/validate_moe_cp.py)
BRIDGE_70B = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, recompute="none", zero=1, sp=True, vpp=5)
BRIDGE_70B_TOKENS_PER_GPU = 1602   # NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11


def terms(training: TrainingSpec, cand: Candidate = BRIDGE_70B):
    e = estimate(MODEL, CLUSTER, training, cand)
    return e, {t.name: t for t in e.time.terms.terms}, e.time.terms.step_seconds_by_term(e.time.params)


def test_megatron_lm_overlaps_by_default_and_none_turns_them_off():
    on, on_terms, on_by = terms(BASE)
    off, off_terms, off_by = terms(replace(BASE, overlap=()))
    for name in ("dp_grads", "dp_param_gather", "pp_p2p"):
        assert on_terms[name].overlap is not None and off_terms[name].overlap is None
        assert on_terms[name].seconds == off_terms[name].seconds        # the traffic is the same, only hidden
        assert on_by[name][1] > 0 and off_by[name][1] == 0
    assert on_terms["tp_comm"].overlap is None                         # TP comm overlap is asked for (userbuffers)
    assert on.step_time_s < off.step_time_s


def test_the_dp_reduce_keeps_its_last_bucket_exposed():
    """--overlap-grad-reduce hides every bucket but the last under the last micro-batch's backward; buckets are
    max(40M, 1M x DP) parameters (Megatron-Core distributed_data_parallel.py)."""
    e, t, by = terms(BASE)
    raw = t["dp_grads"].seconds
    exposed, hidden = by["dp_grads"]
    assert exposed + hidden == pytest.approx(raw)
    assert exposed >= raw * t["dp_grads"].overlap.exposed_min * (1 - 1e-12)
    assert 0 < t["dp_grads"].overlap.exposed_min < 0.1                # 40M of a 70B/32 stage: a few per cent


def test_bucket_share_follows_megatrons_default_bucket_size():
    from planner.cost import step_context
    from planner.topology import Topology

    ctx = step_context(MODEL.with_overrides(seq_len=BASE.seq_len), BRIDGE_70B, CLUSTER, BASE, Topology(CLUSTER))
    assert ddp_bucket_share(ctx) == pytest.approx(40e6 / ctx.params_gpu)


def test_tp_comm_overlap_needs_sp_and_keeps_one_chunk_of_tp_exposed():
    tp_on = replace(BASE, overlap=("grad-reduce", "param-gather", "tp-comm", "p2p"))
    _, t, by = terms(tp_on)
    assert t["tp_comm"].overlap.exposed_min == pytest.approx(1 / BRIDGE_70B.tp)
    assert by["tp_comm"][0] == pytest.approx(BRIDGE_70B.gas * t["tp_comm"].seconds / BRIDGE_70B.tp)
    _, t_nosp, _ = terms(tp_on, replace(BRIDGE_70B, sp=False))
    assert t_nosp["tp_comm"].overlap is None


def test_p2p_hides_only_in_the_interleaved_schedule():
    _, t, _ = terms(BASE, replace(BRIDGE_70B, vpp=1))
    assert t["pp_p2p"].overlap is None


def test_the_bridge_70b_row_is_closer_with_the_overlaps_its_recipe_runs():
    """Published 1602 tokens/s per GPU: without overlap plan predicts 0.85 of it (0.81 in issue 19, before the
    attention core ran at cuDNN's published rate, planner.attention); with the DP and p2p overlaps (and TP comm
    overlap, which Bridge's H100 perf recipes run with userbuffers) closer to 1."""
    ratios = {}
    for name, overlap in (("none", ()), ("default", None), ("all", ("grad-reduce", "param-gather", "tp-comm", "p2p"))):
        e = estimate(MODEL, CLUSTER, replace(BASE, overlap=overlap), BRIDGE_70B)
        ratios[name] = e.throughput.tokens_per_s / CLUSTER.world_size / BRIDGE_70B_TOKENS_PER_GPU
    assert ratios["none"] < ratios["default"] < ratios["all"] <= 1.05
    assert ratios["none"] == pytest.approx(0.85, abs=0.02)
    assert ratios["default"] > 0.84


def test_the_emitted_run_sets_the_flags_the_time_assumed():
    def args(training, cand=BRIDGE_70B):
        setup = RunSetup(model=MODEL, cluster=CLUSTER, training=training, candidate=cand)
        return {a[0] for a in megatron_lm_args(setup)}

    default = args(BASE)
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= default
    assert "--tp-comm-overlap" not in default and "--no-overlap-p2p-communication" not in default
    off = args(replace(BASE, overlap=()))
    assert not off & {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"}
    assert "--no-overlap-p2p-communication" in off
    assert "--tp-comm-overlap" in args(replace(BASE, overlap=("grad-reduce", "tp-comm")))
    assert "--overlap-param-gather" not in args(BASE, replace(BRIDGE_70B, zero=0))   # needs the dist. optimizer


@pytest.mark.parametrize("overlap, framework, words", [
    (("sideways",), "megatron-lm", "unknown overlap"),
    (("grad-reduce",), "fsdp", "Megatron-LM's"),
    (("param-gather",), "megatron-lm", "needs grad-reduce"),
])
def test_bad_overlaps_are_refused(overlap, framework, words):
    with pytest.raises(InputError, match=words):
        TrainingSpec(global_batch=8, seq_len=8, framework=framework, overlap=overlap)


def test_cli_overlap_flag():
    base = [sys.executable, "-m", "planner.cli", "--model", "llama3-8b", "--gpus", "16", "--gpu", "H100",
            "--framework", "megatron-lm", "--top", "1"]
    bad = subprocess.run(base + ["--overlap", "grad-reduce,bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown overlap bogus" in bad.stderr and "Traceback" not in bad.stderr
    ok = subprocess.run(base + ["--overlap", "none"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
