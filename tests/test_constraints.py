"""Every rule is a named check with a reason and a detail; `plan` counts them."""

from __future__ import annotations

import pytest

from planner.rules import Reason, structural_violations
from planner.hardware import make_cluster
from planner.model import Rampup, get_preset
from planner.rank import estimate, plan
from planner.rampup import largest_dp_for, rampup_problems
from planner.space import Candidate, TrainingSpec

BLOOM = get_preset("176B")
CLUSTER = make_cluster(gpu="A100-80GB", gpus=384)
BS = TrainingSpec(global_batch=2048, seq_len=2048, flash_attention=False, rampup=BLOOM.rampup)


def reasons(cand: Candidate, training: TrainingSpec = BS, model=BLOOM, cluster=CLUSTER) -> set[Reason]:
    return {v.reason for v in structural_violations(model, cand, cluster, training)}


def test_bloom_real_layout_passes_every_rule():
    est = estimate(BLOOM, CLUSTER, BS, Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128, recompute="full", zero=1))
    assert est.fits, est.reasons


@pytest.mark.parametrize("cand,reason", [
    (Candidate(tp=4, pp=12, dp=7, mbs=2, gas=128), Reason.WORLD_SIZE),
    (Candidate(tp=16, pp=12, dp=2, mbs=2, gas=512), Reason.TP_EXCEEDS_NODE),
    (Candidate(tp=3, pp=1, dp=128, mbs=1, gas=16), Reason.TP_HEADS),
    (Candidate(tp=4, pp=96, dp=1, mbs=1, gas=2048), Reason.PP_EXCEEDS_LAYERS),
    (Candidate(tp=4, pp=12, dp=8, mbs=2, gas=100), Reason.BATCH_DIVISIBILITY),
    (Candidate(tp=4, pp=12, dp=8, mbs=16, gas=16), Reason.RAMPUP),
    (Candidate(tp=1, pp=384, dp=1, mbs=1, gas=2048), Reason.PP_EXCEEDS_LAYERS),
    (Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128, zero=2), Reason.FRAMEWORK_LIMIT),
    (Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128, recompute="selective"), Reason.FRAMEWORK_LIMIT),
    (Candidate(tp=8, pp=48, dp=1, mbs=1, gas=2048, zero=1), Reason.REDUNDANT),
    (Candidate(tp=8, pp=48, dp=1, mbs=64, gas=32), Reason.RAMPUP),
])
def test_each_rule(cand, reason):
    assert reason in reasons(cand)


def test_microbatches_fewer_than_stages():
    t = TrainingSpec(global_batch=96, seq_len=2048)
    assert Reason.MICROBATCHES_LT_STAGES in reasons(Candidate(tp=8, pp=12, dp=4, mbs=8, gas=3), t)


def test_kv_heads_and_ffn_divisibility():
    llama70 = get_preset("llama2-70b")   # 8 KV heads
    c = make_cluster(gpu="H100-SXM", gpus=96, gpus_per_node=8)
    t = TrainingSpec(global_batch=1024, seq_len=4096, framework="megatron-lm")
    assert Reason.TP_KV_HEADS not in reasons(Candidate(tp=8, pp=4, dp=3, mbs=1, gas=341), t, llama70, c)
    assert Reason.TP_HEADS in reasons(Candidate(tp=6, pp=4, dp=4, mbs=1, gas=256), t, llama70, c)


def test_layers_vs_pp_per_framework():
    t_ds = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-deepspeed")
    t_lm = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-lm")
    uneven = Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128)   # 70 layers on 12 stages: BLOOM did it
    assert Reason.PP_LAYERS not in reasons(uneven, t_ds)
    assert Reason.PP_LAYERS not in reasons(uneven, t_lm)          # --decoder-first/last-pipeline-num-layers
    assert Reason.VIRTUAL_PIPELINE in reasons(Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128, vpp=2), t_lm)


def test_megatron_lm_interleaving_on_two_stages():
    """Megatron-LM's validate_args: interleaving needs PP > 1 with p2p overlap (its default; Megatron-Bridge runs
    Qwen3-30B-A3B on PP 2 x VP 24), PP > 2 only without it; PP 1 has nothing to interleave."""
    t_lm = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-lm")
    assert Reason.VIRTUAL_PIPELINE not in reasons(Candidate(tp=4, pp=2, dp=48, mbs=2, gas=16, vpp=2), t_lm)
    assert Reason.PP_LAYERS not in reasons(Candidate(tp=4, pp=2, dp=48, mbs=2, gas=16, vpp=2), t_lm)  # 70+2 = 2x2x18
    assert Reason.VIRTUAL_PIPELINE in reasons(Candidate(tp=4, pp=1, dp=96, mbs=2, gas=8, vpp=2), t_lm)


def test_fsdp_rules():
    t = TrainingSpec(global_batch=1024, seq_len=4096, framework="fsdp")
    m, c = get_preset("llama2-7b"), make_cluster(gpu="A100-80GB", gpus=16)
    assert Reason.FRAMEWORK_LIMIT in reasons(Candidate(tp=2, pp=1, dp=8, mbs=1, gas=128, zero=3), t, m, c)
    assert Reason.FRAMEWORK_LIMIT in reasons(Candidate(tp=1, pp=1, dp=16, mbs=1, gas=64, zero=1), t, m, c)
    assert not reasons(Candidate(tp=1, pp=1, dp=16, mbs=1, gas=64, zero=3, hybrid=True), t, m, c)


def test_rampup_rules_megatron_microbatches():
    r = Rampup(start=32, increment=32, samples=2_000_000)
    # seed 003: "starting from 32, that means that you can use max 32/1 = 32 gpus"
    assert largest_dp_for(32, 1, 64) == 32 and largest_dp_for(32, 4, 64) == 8
    assert rampup_problems(r, 512, mbs=1, dp=32) == []
    assert rampup_problems(r, 512, mbs=1, dp=64)
    assert "divisible by increment" in rampup_problems(Rampup(start=30, increment=32, samples=10), 512, 1, 2)[0]


def test_memory_rules_and_the_pruning_summary():
    p = plan(BLOOM, CLUSTER, BS)
    assert p.total == sum(p.pruned.values()) + len(p.candidates)
    assert Reason.MEMORY_STATIC not in p.pruned   # seed 004's 75% is a first guess, a mark, not a wall
    for reason in (Reason.MEMORY_TOTAL, Reason.RAMPUP, Reason.TP_HEADS):
        assert p.pruned[reason] > 0
        cand, violation = p.examples[reason]
        assert violation.reason is reason and violation.detail
    for e in p.candidates:
        assert e.memory.total_bytes <= 0.95 * CLUSTER.gpu.memory_bytes
        c = e.candidate
        assert c.tp * c.pp * c.dp == 384 and c.mbs * c.dp * c.gas == 2048 and c.tp <= 8
        assert all(b % (c.mbs * c.dp) == 0 for b in BLOOM.rampup.batch_sizes(2048))
    ranks = [e.rank for e in p.candidates]
    assert ranks == list(range(1, len(ranks) + 1))
    tflops = [e.model_tflops_per_gpu for e in p.candidates]
    assert all(a >= b * 0.998 for a, b in zip(tflops, tflops[1:]))  # ties: same 0.1% bucket
