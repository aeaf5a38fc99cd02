"""Memory model: seed 001's bytes per parameter, ZeRO sharding, Korthikanti et al. 2022 activations."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from planner.hardware import make_cluster
from planner.memory import (in_flight_microbatches, layer_activations, logits_bytes, memory_breakdown, param_bytes,
                            stored_layer_bytes, sharded_static_bytes, stage_memory, verdict)
from planner.model import ModelSpec, get_preset
from planner.recompute import recomputed
from planner.space import Candidate, TrainingSpec


@pytest.mark.parametrize("precision,optimizer,total", [
    ("bf16", "adamw", 18),        # seed 001: "18 bytes per parameter"
    ("fp32", "adamw", 16),        # 4 weights + 4 grads + 8 states
    ("bf16", "adamw-bf16", 8),    # seed 001: AnyPrecisionAdamW "only 8 bytes per parameter"
    ("bf16", "adamw-8bit", 12),   # 6 + 4 + 2 (bnb 8-bit states)
    ("bf16", "sgd", 14), ("bf16", "lion", 14), ("bf16", "adafactor", 14),  # 4-byte optimizers
])
def test_bytes_per_param_seed001(precision, optimizer, total):
    assert param_bytes(precision, optimizer).total == total


def test_zero_stages_shard_what_the_zero_paper_says():
    pb = param_bytes("bf16", "adamw")
    n, dp = 1_000_000, 8
    stages = {z: sum(sharded_static_bytes(n, pb, Candidate(tp=1, pp=1, dp=dp, mbs=1, gas=1, zero=z), dp))
              for z in range(4)}
    assert stages[0] == 18 * n
    assert stages[1] == pytest.approx((2 + 4 + 12 / dp) * n)
    assert stages[2] == pytest.approx((2 + 16 / dp) * n)
    assert stages[3] == pytest.approx(18 / dp * n)


GPT = ModelSpec(name="gpt", layers=24, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=50304,
                seq_len=2048)
NOFLASH = TrainingSpec(global_batch=512, seq_len=2048, flash_attention=False)


@pytest.mark.parametrize("tp,sp,recompute,per_sbh", [
    (1, False, "none", lambda a, s, h, t: 34 + 5 * a * s / h),          # Korthikanti Eq. 1
    (4, False, "none", lambda a, s, h, t: 10 + 24 / t + 5 * a * s / (h * t)),  # Eq. 2
    (4, True, "none", lambda a, s, h, t: 34 / t + 5 * a * s / (h * t)),  # Eq. 4
    (4, True, "selective", lambda a, s, h, t: 34 / t),                   # Table 2, selective + SP
    (4, False, "selective", lambda a, s, h, t: 10 + 24 / t),
    (4, False, "full", lambda a, s, h, t: 2),                            # Table 2, full recompute
])
def test_activations_per_layer_korthikanti_table2(tp, sp, recompute, per_sbh):
    c = Candidate(tp=tp, pp=1, dp=1, mbs=2, gas=1, recompute=recompute, sp=sp)
    s, b, h, a = GPT.seq_len, 2, GPT.hidden, GPT.heads
    assert layer_activations(GPT, c, NOFLASH).stored_bytes == pytest.approx(s * b * h * per_sbh(a, s, h, tp))


def test_flash_attention_drops_the_score_term():
    c = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=1)
    flash = TrainingSpec(global_batch=512, seq_len=2048, flash_attention=True)
    s, h = GPT.seq_len, GPT.hidden
    assert layer_activations(GPT, c, flash).stored_bytes == pytest.approx(34 * s * h)


def test_korthikanti_figure1_activation_memory(data_dir):
    """First-stage activations of the paper's configurations (Figure 1, GiB per GPU), incl. the
    interleaved-schedule factor 1 + (p-1)/(p·v) for the 175B and 530B runs."""
    rows = [r for r in yaml.safe_load((data_dir / "published_public.yaml").read_text())
            if "memory_breakdown_gib_per_gpu_fig1" in r["measured"]]
    assert len(rows) == 4
    for r in rows:
        md, p, fig = r["model"], r["parallel"], r["measured"]["memory_breakdown_gib_per_gpu_fig1"]
        m = ModelSpec(name=r["id"], layers=md["layers"], hidden=md["hidden"], heads=md["heads"], kv_heads=md["heads"],
                      ffn_hidden=md["ffn_hidden"], vocab=md["vocab"], seq_len=md["seq_len"])
        for recompute, sp, key in [("none", False, "activations_no_recompute_no_sp"),
                                   ("selective", True, "activations_selective_plus_sp")]:
            c = Candidate(tp=p["tp"], pp=p["pp"], dp=1, mbs=p["micro_batch"], gas=p["grad_accum"],
                          recompute=recompute, sp=sp, vpp=p["virtual_pipeline"])
            per_layer = layer_activations(m, c, NOFLASH).stored_bytes
            first_stage = per_layer * (m.layers // p["pp"]) * in_flight_microbatches(c)
            assert first_stage / 2**30 == pytest.approx(fig[key], rel=0.01), (r["id"], key)
        cluster = make_cluster(gpu="A100-80GB", gpus=r["hardware"]["total_gpus"])
        c = Candidate(tp=p["tp"], pp=p["pp"], dp=1, mbs=1, gas=p["grad_accum"])
        static = stage_memory(m, c, cluster, TrainingSpec(global_batch=p["global_batch"], seq_len=2048,
                                                         framework="megatron-lm"))[0]  # the paper's framework
        # "params_and_optimizer" (18 bytes/param of the first stage); within 10%
        assert static.static_bytes / 2**30 == pytest.approx(fig["params_and_optimizer"], rel=0.10), r["id"]


def test_first_stage_holds_pp_microbatches_and_last_the_logits():
    m = get_preset("1B3")
    cluster = make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4)
    t = TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", flash_attention=False)
    first, last = stage_memory(m, Candidate(tp=1, pp=4, dp=2, mbs=1, gas=256), cluster, t)
    assert (first.stage, last.stage) == ("first", "last")
    assert first.logits_bytes == 0 and last.logits_bytes > 0
    assert first.activations_bytes > 3 * last.activations_bytes  # 4 micro-batches in flight vs 1


@pytest.mark.parametrize("framework,precision,zero0,zero1_per_dp", [
    # Megatron-LM theoretical_memory_usage.py: 18 bytes/param, 6 + 12/d with the distributed optimizer
    ("megatron-lm", "bf16", 18, (6, 12)),
    # ZeRO paper Sec. 5.1: 2Ψ + 2Ψ + KΨ/Nd (K = 12) plus DeepSpeed's fp32 gradient partition 4Ψ/Nd
    ("megatron-deepspeed", "bf16", 20, (4, 16)),
    # FSDP mixed precision: sharded fp32 parameters, fp32 gradients and Adam states, 16Ψ/N under FULL_SHARD
    ("fsdp", "bf16", 16, None),
])
def test_bytes_per_param_where_each_framework_keeps_gradients(framework, precision, zero0, zero1_per_dp):
    pb = param_bytes(precision, "adamw", framework)
    assert pb.total == zero0
    n, dp = 1_000_000, 64
    if zero1_per_dp is not None:
        fixed, sharded = zero1_per_dp
        got = sum(sharded_static_bytes(n, pb, Candidate(tp=1, pp=1, dp=dp, mbs=1, gas=1, zero=1), dp))
        assert got == pytest.approx((fixed + sharded / dp) * n)
    else:
        got = sum(sharded_static_bytes(n, pb, Candidate(tp=1, pp=1, dp=dp, mbs=1, gas=1, zero=3), dp))
        assert got == pytest.approx(16 / dp * n)


def test_llama13b_tp1_fits_in_hagemann_headline_run():
    """Hagemann et al. 2023's headline: Llama 13B at TP1 PP1 MBS1 (seq 2048, FlashAttention-2 + RMS kernel) ran on
    64 A100-80GB at 70.6% MFU. Their framework keeps 16-bit gradients (Aleph-Alpha/scaling parameter_group.py: every
    worker holds "all original-precision weights as well as gradients"); with fp32 gradients it could not fit. The
    planner's stand-in for it is the microsoft Megatron-DeepSpeed flavour (search.published_runs); the bigscience fork
    under bf16 runs BF16_Optimizer, whose fp32 gradients (planner.pipeline_engine) would not fit either."""
    m = get_preset("llama2-13b").with_overrides(seq_len=2048)
    cluster = make_cluster(gpu="A100-80GB", gpus=64)
    c = Candidate(tp=1, pp=1, dp=64, mbs=1, gas=32, zero=1)
    deepspeed_style = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-deepspeed", flavor="microsoft")
    bigscience = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-deepspeed", flavor="bigscience")
    assert not verdict(memory_breakdown(m, c, cluster, bigscience), cluster, bigscience).fits
    megatron = TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-lm")
    assert verdict(memory_breakdown(m, c, cluster, deepspeed_style), cluster, deepspeed_style).fits
    assert not verdict(memory_breakdown(m, c, cluster, megatron), cluster, megatron).fits


def test_logits_megatron_theoretical_memory_usage_plus_the_16_bit_output_at_the_peak():
    """Megatron's theoretical_memory_usage.py, output layer and CE loss: 4·s·b·h·(1 + V/h)/t bytes in steady state;
    at the peak the 16-bit LM-head output (2 bytes per logit) is alive beside the fp32 copy."""
    m = get_preset("gpt3-175b")
    c = Candidate(tp=8, pp=1, dp=1, mbs=1, gas=1)
    s, b, h, v = m.seq_len, 1, m.hidden, m.vocab
    assert logits_bytes(m, c, "megatron-lm") == pytest.approx(4 * s * b * h * (1 + v / h) / 8 + 2 * s * b * v / 8)
    # PyTorch-eager cross-entropy on fp32 logits (torchtitan): bf16 logits + fp32 copy + fp32 log-softmax
    assert logits_bytes(m, c, "fsdp") == pytest.approx((10 * s * b * v + 4 * s * b * h) / 8)


LLAMA3_8B_TORCHTITAN = TrainingSpec(global_batch=16, seq_len=8192, framework="fsdp")


def _stored_per_layer(m, recompute, training=LLAMA3_8B_TORCHTITAN, **kw):
    """Activations a rank keeps per layer and micro-batch (checkpointed layers their input, the others all)."""
    c = Candidate(**{"tp": 1, "pp": 1, "dp": 8, "mbs": 2, "gas": 1, "zero": 3, **kw}, recompute=recompute)
    act = layer_activations(m, c, training)
    return stored_layer_bytes(m, c, "only", m.layers, act) / m.layers


@pytest.mark.parametrize("mode", ["selective-op", "selective-layer", "selective-layer-3"])
def test_torchtitan_recompute_modes_sit_between_none_and_full(mode):
    m = get_preset("llama3-8b")
    assert _stored_per_layer(m, "full") < _stored_per_layer(m, mode) < _stored_per_layer(m, "none")


def test_selective_layer_every_layer_is_full_recompute():
    m = get_preset("llama3-8b")
    assert _stored_per_layer(m, "selective-layer-1") == pytest.approx(_stored_per_layer(m, "full"))
    assert recomputed(m, "selective-layer-1", 32, 1) == recomputed(m, "full", 32, 1)


def test_torchtitan_llama3_8b_selective_op_published_peak():
    """torchtitan docs/performance.md Table 1: Llama 3.1 8B, FSDP on 8 H100, local batch 2, selective (op) AC:
    82.4 GiB peak. Predicted within 15% (plantune's 0.95.x: 115 GiB, 40% over)."""
    m = get_preset("llama3-8b")
    cluster = make_cluster(gpu="H100-SXM", gpus=8)
    c = Candidate(tp=1, pp=1, dp=8, mbs=2, gas=1, recompute="selective-op", zero=3)
    total = memory_breakdown(m, c, cluster, LLAMA3_8B_TORCHTITAN).total_bytes / 2**30
    assert total == pytest.approx(82.4, rel=0.15)


def test_megatron_core_without_dropout_keeps_the_probabilities_alone():
    """Without FlashAttention and without dropout, Megatron-Core's DotProductAttention keeps the softmax output alone
    (2 bytes a score, not Korthikanti's 5), and GQA's K and V as expanded to every head (repeat_interleave before the
    batched GEMMs); with its fusions off the unfused SwiGLU keeps silu(gate) too. Real Megatron-LM (core_v0.17.1,
    local transformer, unfused attention, fusions off) on one H200, llama-1.1b at MBS 1 / 2 / 4-full / 4 (tests/bench/
    gpu_runs/h200-2026-11-26-megatron: bench_megatron.log 24.6 / 32.8 / 25.4 GB, trial-0000-result.json 54.56 GB) is
    torch's max_memory_allocated of the first iteration (Megatron's one memory report, "after 1 iterations"): the
    plan's first-iteration peak (bench_megatron.first_report_bytes: forward and backward before AdamW's lazily created
    moments, or the step with foreach AdamW's temporary) within 10% of each (the 5-bytes count said 39.7 / 58.4 / 27.9
    GB of steady state, 1.2-1.8x)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
    from bench_megatron import MODEL, TRAINING, candidate, first_report_bytes

    from planner import estimate, make_cluster

    t = TRAINING
    h200 = make_cluster(gpu="H200", gpus=1)
    for layout, measured_gb in (("mbs=1", 24.6), ("mbs=2", 32.8), ("mbs=4,recompute=full", 25.4), ("mbs=4", 54.56)):
        mem = estimate(MODEL, h200, t, candidate(layout)).memory
        report = first_report_bytes(mem, candidate(layout), h200)
        assert report / 1e9 == pytest.approx(measured_gb, rel=0.10), layout
        # the steady state (AdamW's moments beside the activations from the second iteration on) is above the report
        assert mem.total_gb > report / 1e9 or "full" in layout, layout
    gpt = MODEL.with_overrides(norm="layernorm", bias=True, glu=False, ffn_hidden=4 * MODEL.hidden)
    assert gpt.dropout and not MODEL.dropout
    one = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=1)
    flash = replace(t, flash_attention=True)
    llama_scores = layer_activations(MODEL, one, t).stored_bytes - layer_activations(MODEL, one, flash).stored_bytes
    sbh = MODEL.seq_len * MODEL.hidden
    expanded_kv = 4 * (1 - MODEL.kv_heads / MODEL.heads) * sbh   # K and V at every head instead of kv_heads
    assert llama_scores == pytest.approx(2 * MODEL.heads * MODEL.seq_len ** 2 + expanded_kv)
    fused = replace(t, eager_ops=False)
    silu_out = 2 * MODEL.ffn_hidden * MODEL.seq_len
    assert layer_activations(MODEL, one, t).stored_bytes - layer_activations(MODEL, one, fused).stored_bytes == \
        pytest.approx(silu_out)


def test_deepspeed_fp16_optimizer_flattens_fp32_gradients_at_zero_0():
    """DeepSpeed's FP16_Optimizer (ZeRO 0, fp16, fused Adam) holds 16-bit gradients, then at the step their fp32
    copies and flat concatenation (planner.memory.FP16_STEP_GRAD_BYTES): 2 weights + 2 gradients + 8 at the
    step + 4 master weights + 8 Adam = 24 bytes a parameter where the 18 rule counts 18 (FP16_UnfusedOptimizer, any
    other optimizer: 4 at the step). Published nvidia-smi peaks of runs at DP 1 and ZeRO 0: seed 003's BigScience
    1B3 at PP 8 on V100-16GB (9 and 11 GB at MBS 1 and 4, the 18 rule said 7.6 and 10.2), 1.04 and 1.09 of them as
    nvidia-smi shows it (the step's flat tensors in segments of their own beside the cached activations)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from published import seed003_dev_cases

    from planner.memory import deepspeed_fp16_step_grad_bytes as step_grads
    from planner.memory import reported_bytes

    fp16 = TrainingSpec(global_batch=8, seq_len=2048, precision="fp16", framework="megatron-deepspeed")
    zero0, zero1 = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=8), Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, zero=1)
    assert step_grads(zero0, fp16) == 8 and step_grads(zero0, replace(fp16, optimizer="adamw-8bit")) == 4
    assert step_grads(zero1, fp16) == 0 == step_grads(zero0, replace(fp16, precision="bf16"))
    assert step_grads(zero0, replace(fp16, framework="megatron-lm")) == 0
    published = {"seed003_v100-16gb-recompute_tp1_pp8_mbs1": 9, "seed003_v100-16gb-recompute_tp1_pp8_mbs4": 11}
    cases = [c for c in seed003_dev_cases() if c.id in published]
    assert len(cases) == len(published)
    for c in cases:
        mem = stage_memory(c.model, c.cand, c.cluster, c.training)[0]   # the first stage: nvidia-smi's first node
        assert mem.step_bytes == 8 * mem.params_on_gpu
        shown = reported_bytes(mem, c.cand, c.cluster, "nvidia-smi")
        assert shown / 2**30 == pytest.approx(published[c.id], rel=0.1), c.id


def test_deepspeed_fp16_zero_keeps_16bit_gradients_and_a_reserve_nvidia_smi_counts():
    """DeepSpeed's fp16 ZeRO optimizer (runtime/zero/stage_1_and_2.py) keeps 16-bit gradients: 2 + 2 + 12/N bytes a
    parameter live; its runs' nvidia-smi peaks follow 18 (6 + 12/N), 2 bytes of the allocator's reserve
    (DEEPSPEED_FP16_RESERVED_BYTES), of which what must fit counts the share the allocator cannot give back,
    DEEPSPEED_PINNED_PARTITION_BYTES / N. Published: BLOOM tr11 TP8 PP6 DP8 MBS8 (chronicles-prequel.md, 02-20 MBS
    sweep) ran at nvidia-smi 75 GB of 80; seed 003's 1B3 at TP1 PP2 DP4 MBS16 on V100-32GB and tr8-104B's TP1 PP64
    DP2 (bnb) ran out of memory."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from published import dev_cases, seed003_dev_cases

    from planner.constants import DEEPSPEED_FP16_RESERVED_BYTES, DEEPSPEED_PINNED_PARTITION_BYTES
    from planner.memory import reported_bytes

    pb = param_bytes("fp16", "adamw", "megatron-deepspeed")
    assert (pb.weights, pb.grads, pb.master + pb.optimizer, pb.reserved) == (2, 2, 12, 2)
    assert pb.total + pb.reserved == 18 == DEEPSPEED_FP16_RESERVED_BYTES + 16
    assert param_bytes("bf16", "adamw", "megatron-deepspeed").reserved == 0 == param_bytes("fp16", "adamw").reserved
    cases = {c.id: c for c in seed003_dev_cases() + dev_cases()}
    l511 = cases["bloom_prequel_L511_n48_tp8_pp6_dp8_mbs8_gbs2048"]
    first, last = stage_memory(l511.model, l511.cand, l511.cluster, l511.training)
    n = l511.cand.dp
    assert first.grads_bytes == 2 * first.params_on_gpu
    assert first.pinned_bytes == pytest.approx(DEEPSPEED_PINNED_PARTITION_BYTES / n * first.params_on_gpu)
    assert first.pinned_bytes + first.reserved_bytes == pytest.approx(2 * first.params_on_gpu)
    assert verdict(max((first, last), key=lambda m: m.total_bytes), l511.cluster, l511.training).fits
    shown = reported_bytes(first, l511.cand, l511.cluster, "nvidia-smi") / 2**30   # the 18 rule's view, 80 GiB
    assert shown == pytest.approx(75, rel=0.07)
    for oom in ("seed003_v100-32gb-recompute_tp1_pp2_mbs16", "bigsci_tr8_104b_v100_bnb_n32_tp1_pp64_dp2"):
        c = cases[oom]
        assert c.oom
        busiest = max(stage_memory(c.model.with_overrides(seq_len=c.training.seq_len), c.cand, c.cluster, c.training),
                      key=lambda m: m.total_bytes)
        assert not verdict(busiest, c.cluster, c.training).fits, oom


def test_deepspeed_zero1_over_one_rank_is_its_zero_optimizer():
    """ZeRO-1 over one DP rank runs DeepSpeed's ZeRO optimizer (runtime/zero/stage_1_and_2.py), not FP16_Optimizer:
    16-bit gradients, then at the step the rank's partition (every gradient) flattened to 16 bits and cast to fp32, 2
    + 4 bytes (FP16_STEP_GRAD_BYTES "zero1_one_rank"): 16 bytes a parameter through the backward, 22 at the step,
    where ZeRO 0's FP16_Optimizer needs 24. Published (nvidia-smi): BigScience tr8-104B at TP4 PP32 DP1 with apex
    FusedAdam, 30 GB; BLOOM tr11's 18B candidate on one node, TP8 DP1 (chronicles-prequel.md "Max possible TFLOPs
    check, 1 node"), 6 layers at MBS 2 54 GB and 10 layers at MBS 1 80 GB, all the device: it ran, so the plan must
    not rule it out, and the step (22 bytes x 3.5B parameters) fits only because it never meets the activations."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from published import dev_cases

    from planner.memory import deepspeed_fp16_step_grad_bytes as step_grads
    from planner.memory import reported_bytes, verdict
    from planner.rules import structural_violations

    fp16 = TrainingSpec(global_batch=8, seq_len=2048, precision="fp16", framework="megatron-deepspeed")
    one_rank = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=8, zero=1)
    assert step_grads(one_rank, fp16) == 6
    cluster = make_cluster(gpu="A100-80GB", gpus=1)
    assert not any("shards nothing" in v.detail for v in structural_violations(GPT, one_rank, cluster, fp16))
    bf16 = replace(fp16, precision="bf16")   # BF16_Optimizer (the bigscience fork) or ZeRO's bf16: same at DP 1
    assert any("shards nothing" in v.detail for v in structural_violations(GPT, one_rank, cluster, bf16))
    published = {"bigsci_tr8_104b_v100_baseline_main_n32_tp4_pp32_dp1": 30,
                 "bloom_prequel_L658_n1_tp8_pp1_dp1_mbs2_h64_gbs2048": 54,
                 "bloom_prequel_L660_n1_tp8_pp1_dp1_mbs1_h64_gbs2048": 80}
    cases = [c for c in dev_cases() if c.id in published]
    assert len(cases) == len(published)
    for c in cases:
        assert c.cand.zero == 1 and c.cand.dp == 1, c.id
        mem = stage_memory(c.model.with_overrides(seq_len=c.training.seq_len), c.cand, c.cluster, c.training)[0]
        assert mem.grads_bytes == 2 * mem.params_on_gpu and mem.step_bytes == 6 * mem.params_on_gpu
        shown = reported_bytes(mem, c.cand, c.cluster, "nvidia-smi")
        assert shown / 2**30 == pytest.approx(published[c.id], rel=0.06), c.id
        busiest = max(stage_memory(c.model.with_overrides(seq_len=c.training.seq_len), c.cand, c.cluster,
                                   c.training), key=lambda m: m.total_bytes)
        assert verdict(busiest, c.cluster, c.training).fits, c.id