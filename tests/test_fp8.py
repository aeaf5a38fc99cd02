"""FP8: which accelerators have it, memory as Transformer Engine keeps it, GEMMs at the FP8 peak, MFU against bf16."""

from __future__ import annotations

import pytest

from planner import fp8, load_model, make_cluster
from planner.constraints import Reason, structural_violations
from planner.errors import InputError
from planner.hardware import get_accelerator
from planner.memory import param_bytes
from planner.rank import estimate
from planner.space import Candidate, TrainingSpec


@pytest.mark.parametrize("gpu,tflops", [("H100-SXM", 1979), ("H200", 1979), ("H100-PCIe", 1513), ("B200", 4500),
                                        ("MI300X", 2614.9)])
def test_fp8_dense_peaks_are_the_datasheets(gpu, tflops):
    """Datasheets quote FP8 with 2:4 sparsity (H100 SXM 3,958 TFLOPS); the dense peak is half, 2x the bf16 one."""
    acc = get_accelerator(gpu)
    assert acc.peak_flops("fp8") == pytest.approx(tflops * 1e12)
    assert acc.peak_flops("fp8") == pytest.approx(2 * acc.peak_flops("bf16"), rel=0.01)


def test_no_fp8_on_a100_is_a_named_reason():
    with pytest.raises(InputError, match="no FP8"):
        get_accelerator("A100-80GB").peak_flops("fp8")
    cluster = make_cluster(gpu="A100-80GB", gpus=8)
    t = TrainingSpec(global_batch=64, seq_len=4096, precision="fp8", framework="megatron-lm")
    reasons = structural_violations(load_model("llama3-8b"), Candidate(tp=1, pp=1, dp=8, mbs=1, gas=8), cluster, t)
    assert Reason.FP8_HARDWARE in {v.reason for v in reasons}


def test_fp8_memory_as_transformer_engine_keeps_it():
    """Without --fp8-param-gather (no distributed optimizer): bf16 weights and fp32 master/grads/Adam stay (18 bytes),
    plus the cached FP8 weight and transpose (2)."""
    assert param_bytes("fp8", "adamw").total == param_bytes("bf16", "adamw").total + 2 == 20


def test_fp8_is_faster_but_mfu_stays_against_the_bf16_peak():
    m = load_model("llama3-70b")
    cluster = make_cluster(gpu="H100", gpus=64)
    c = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, recompute="none", zero=1, sp=True, vpp=5)
    bf16, f8 = (estimate(m, cluster, TrainingSpec(global_batch=128, seq_len=8192, precision=p,
                                                  framework="megatron-lm"), c) for p in ("bf16", "fp8"))
    speedup = bf16.time.step_time_s / f8.time.step_time_s
    # GEMMs at 2x peak, attention/element-wise/communication unchanged: NVIDIA reports 1.2-1.5x end to end
    # (docs.nvidia.com/nemo/megatron-bridge/latest/performance-guide.html, "Low Precision Training": 1.2-1.5X)
    assert 1.2 < speedup < 1.6
    assert f8.throughput.mfu == pytest.approx(f8.throughput.model_tflops_per_gpu * 1e12 / 989e12)
    assert f8.memory.activations_bytes < bf16.memory.activations_bytes   # FP8 GEMM inputs saved


def test_compute_precision_keeps_attention_in_bf16():
    assert fp8.compute_precision("fp8") == "bf16" and fp8.compute_precision("fp16") == "fp16"


# NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11 container, DGX-H100 pre-training, FP8-CS:
# (model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, EP, published tokens/s/GPU). Their perf scripts (Megatron-Bridge
# scripts/performance/configs/llama3{,1}/*_llm_pretrain.py at da980700a) run them with no recompute, bf16 main grads
# (grad_reduce_in_fp32 = False) and fp8_cs = per-tensor current scaling with fp8_param_gather.
MEGATRON_BRIDGE_H100 = [
    ("llama3-70b", 64, 128, 1, 8192, 4, 8, 1, 5, 1, 1602),
    ("llama3.1-405b", 1024, 512, 1, 8192, 8, 8, 2, 8, 1, 292),
]


def _bridge_estimate(row, **training):
    name, gpus, gbs, mbs, seq, tp, pp, cp, vp, ep, _ = row
    m, cluster = load_model(name), make_cluster(gpu="H100", gpus=gpus)
    t = TrainingSpec(global_batch=gbs, seq_len=seq, framework="megatron-lm",
                     **{**dict(precision="fp8", fp8_recipe="tensorwise", grad_reduce_dtype="bf16"), **training})
    dp = gpus // (tp * pp * cp)
    c = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, gas=gbs // (mbs * dp), recompute="none", zero=1,
                  sp=tp > 1, vpp=vp)
    return estimate(m, cluster, t, c), gpus


@pytest.mark.parametrize("row", MEGATRON_BRIDGE_H100, ids=[r[0] for r in MEGATRON_BRIDGE_H100])
def test_megatron_bridge_fp8_rows_fit_as_published_and_within_25_percent(row):
    """The published runs fit on 80 GB without recompute, so plan's FP8 memory must let them (FP8 weights under
    --fp8-param-gather, bf16 grads, Megatron's fused SwiGLU); throughput then comes out 0.81 and 0.91 of published."""
    e, gpus = _bridge_estimate(row)
    assert e.fits, e.memory.total_gb
    tokens = e.throughput.tokens_per_s / gpus
    assert tokens == pytest.approx(row[-1], rel=0.25), f"{row[0]}: predicted {tokens:.0f} tokens/s/GPU"


def test_fp8_param_gather_keeps_fp8_weights_and_its_transpose_only():
    """--fp8-param-gather (needs the distributed optimizer): the weight is FP8 plus its columnwise copy, 1 + 1 bytes,
    against bf16 + the cached FP8 weight and transpose, 2 + 2, without it; the flag is emitted with ZeRO-1."""
    from planner.emit.parallel_extras import megatron_lm_flags
    from planner.emit.setup import RunSetup

    row = MEGATRON_BRIDGE_H100[0]
    e1, _ = _bridge_estimate(row)
    assert e1.memory.weights_bytes == pytest.approx(e1.memory.params_on_gpu * fp8.FP8_PARAM_BYTES)
    assert fp8.FP8_PARAM_BYTES == 2 and fp8.weight_bytes(2, "fp8") == 4
    m, cluster = load_model("llama3-70b"), make_cluster(gpu="H100", gpus=64)
    t = TrainingSpec(global_batch=128, seq_len=8192, precision="fp8", framework="megatron-lm")
    for zero, flag in ((0, False), (1, True)):
        c = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, zero=zero, sp=True, vpp=5)
        assert fp8.fp8_param_gather(c, t) is flag
        setup = RunSetup(model=m, cluster=cluster, training=t, candidate=c)
        assert (["--fp8-param-gather"] in megatron_lm_flags(setup)) is flag


def test_bf16_main_grads_halve_the_grad_buffer_and_are_emitted():
    """Megatron-LM keeps fp32 main grads under --bf16 unless --grad-reduce-in-bf16 (arguments.py); Megatron-Bridge's
    perf recipes run with grad_reduce_in_fp32 = False."""
    from planner.emit.megatron_lm import megatron_lm_args
    from planner.emit.setup import RunSetup

    row = MEGATRON_BRIDGE_H100[0]
    (b16, _), (f32, _) = _bridge_estimate(row), _bridge_estimate(row, grad_reduce_dtype="fp32")
    assert f32.memory.grads_bytes == pytest.approx(2 * b16.memory.grads_bytes)
    assert b16.memory.grads_bytes == pytest.approx(2 * b16.memory.params_on_gpu)
    m, cluster = load_model("llama3-70b"), make_cluster(gpu="H100", gpus=64)
    c = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, zero=1, sp=True, vpp=5)
    for dtype in ("fp32", "bf16"):
        t = TrainingSpec(global_batch=128, seq_len=8192, precision="fp8", framework="megatron-lm",
                         grad_reduce_dtype=dtype)
        args = megatron_lm_args(RunSetup(model=m, cluster=cluster, training=t, candidate=c))
        assert (("--grad-reduce-in-bf16",) in args) is (dtype == "bf16")
    with pytest.raises(InputError, match="gradient reduce dtype"):
        TrainingSpec(global_batch=8, seq_len=8, grad_reduce_dtype="fp16")
    with pytest.raises(InputError, match="FP8 recipe"):
        TrainingSpec(global_batch=8, seq_len=8, fp8_recipe="mxfp4")


def test_fp8_activation_caches_as_te_keeps_them():
    """TE Linear saves its FP8 input (1 byte) instead of bf16 for QKV, FC1 (the norms' outputs) and FC2 (the SwiGLU
    output); FlashAttention keeps its bf16 output O for its backward, so the projection's FP8 copy adds 1 byte.
    Llama 3 70B at TP 4 with SP (h 8192, ffn 28672: Dubey et al. 2024 Table 3): (2/4 + (3.5 - 1)/4)·sbh."""
    c = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, sp=True)
    sbh = 8192 * 8192
    assert fp8.activation_saving_bytes(c, "fp8", sbh, 28672 / 8192) == pytest.approx(sbh * (0.5 + 2.5 / 4))
    assert fp8.activation_saving_bytes(c, "fp8", sbh, 3.5, flash_attention=False) == pytest.approx(sbh * (0.5 + 4.5 / 4))
    assert fp8.activation_saving_bytes(c, "bf16", sbh, 3.5) == 0


def test_megatron_fused_swiglu_keeps_only_its_input():
    """megatron/core/fusions/fused_bias_swiglu.py saves only the FC1 output; torchtitan's F.silu(w1(x)) * w3(x) also
    keeps silu's output and the product: 2·ffn/t bytes per token more (Llama 3 70B: 2·28672/4)."""
    from planner.memory import layer_activations

    m = load_model("llama3-70b")
    c = Candidate(tp=4, pp=1, dp=1, mbs=1, gas=1, sp=True)
    mega, fsdp = (layer_activations(m, c, TrainingSpec(global_batch=8, seq_len=8192, framework=fw)).stored_bytes
                  for fw in ("megatron-lm", "fsdp"))
    assert fsdp - mega == pytest.approx(m.seq_len * 2 * m.ffn_hidden / 4)


def test_current_scaling_adds_the_amax_pass_as_hbm_traffic():
    """TE normalization.cpp: delayed scaling's Float8Quantizer takes the FULLY_FUSED norm (FP8 out), current scaling's
    FUSED_NORM_AMAX_FP8 writes bf16 and quantizes after (+2 write +2 read); other GEMM inputs get an amax read (+2).
    Llama 3 70B, TP 4, per token: 4·(h + h) + 2·(q/4 + ffn/4)."""
    m = load_model("llama3-70b")
    c = Candidate(tp=4, pp=8, dp=2, mbs=1, gas=64, sp=True, vpp=5)
    tokens = 8192
    extra = fp8.cast_traffic_bytes(m, c, "fp8", tokens, "tensorwise") - fp8.cast_traffic_bytes(m, c, "fp8", tokens)
    assert extra == pytest.approx(tokens * (4 * 2 * 8192 + 2 * (8192 / 4 + 28672 / 4)))
    row = MEGATRON_BRIDGE_H100[0]
    (cs, _), (ds, _) = _bridge_estimate(row), _bridge_estimate(row, fp8_recipe="delayed")
    assert 1.0 < cs.time.step_time_s / ds.time.step_time_s < 1.1   # memory-bound casts: a few percent of a step


def test_cli_refuses_fp8_on_a100_in_one_line(capsys):
    from planner.cli import main

    assert main(["--model", "mixtral-8x7b", "--gpus", "8", "--gpu", "A100", "--precision", "fp8",
                 "--framework", "megatron-lm"]) == 2
    err = capsys.readouterr().err
    assert "no FP8 tensor cores" in err and err.count("\n") == 1


def test_moe_fp8_casts_quantize_the_permuted_copies():
    """Transformer Engine's GroupedLinear quantizes its input, the k permuted copies of each token: Mixtral's FC1
    input is 2·h per token (top-2), its FC2 input 2·14336 (Jiang et al. 2024 Sec. 2), against h and ffn for a dense MLP."""
    from planner import fp8, moe
    from planner.model import get_preset
    from planner.space import Candidate

    m, c = get_preset("mixtral-8x7b"), Candidate(tp=1, pp=1, dp=8, ep=8, mbs=1, gas=1)
    assert moe.mlp_gemm_input_widths(m, c) == (2 * 4096, 2 * 14336)
    tokens = 4096
    assert fp8.cast_traffic_bytes(m, c, "fp8", tokens) == pytest.approx(
        fp8.CAST_BYTES_PER_ELEMENT * tokens * (4096 + 4096 + 2 * 4096 + 2 * 14336))


def test_fp8_param_gather_all_gathers_one_byte_weights():
    """The distributed optimizer's reduce-scatter (bf16 grads) + all-gather (FP8 weights under --fp8-param-gather):
    (2 + 1) / (2 + 2) of the 16-bit traffic; Llama 3.1 405B's Megatron-Bridge row (DP 8 x CP 2 over the network)."""
    row = MEGATRON_BRIDGE_H100[1]   # the traffic, not hidden (--overlap none)
    (f8, _), (b16, _) = _bridge_estimate(row, overlap=()), _bridge_estimate(row, precision="bf16", overlap=())
    assert b16.time.dp_comm_s > 0
    assert f8.time.dp_comm_s == pytest.approx(0.75 * b16.time.dp_comm_s)


def test_megatron_lm_reduces_fp32_main_grads_under_bf16():
    """Megatron-LM under --bf16 accumulates and reduces gradients in fp32 (arguments.py sets
    accumulate_allreduce_grads_in_fp32 -> DistributedDataParallelConfig.grad_reduce_in_fp32) unless
    --grad-reduce-in-bf16; the distributed optimizer then all-gathers 16-bit weights: ZeRO-1 traffic (4 + 2) / (2 + 2),
    ZeRO-0 4 / 2 of the bf16 reduce. fp16 keeps fp16 gradients (only args.bf16 turns fp32 reduce on). The Llama 3
    paper (Sec. 3.3.2) reduce-scatters in FP32 as well."""
    name, gpus, gbs, mbs, seq, tp, pp, cp, vp, ep, _ = row = MEGATRON_BRIDGE_H100[1]
    m, cluster, dp = load_model(name), make_cluster(gpu="H100", gpus=gpus), gpus // (tp * pp * cp)
    times = {}
    for precision in ("bf16", "fp16"):
        for dtype in ("fp32", "bf16"):
            t = TrainingSpec(global_batch=gbs, seq_len=seq, framework="megatron-lm", precision=precision,
                             grad_reduce_dtype=dtype, overlap=())   # the traffic, not hidden
            for zero in (0, 1):
                c = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, gas=gbs // (mbs * dp), zero=zero, sp=True, vpp=vp)
                times[precision, dtype, zero] = estimate(m, cluster, t, c).time.dp_comm_s
    assert times["bf16", "bf16", 1] > 0
    assert times["bf16", "fp32", 1] == pytest.approx(1.5 * times["bf16", "bf16", 1])
    assert times["bf16", "fp32", 0] == pytest.approx(2.0 * times["bf16", "bf16", 0])
    assert times["fp16", "fp32", 1] == pytest.approx(times["fp16", "bf16", 1]) == pytest.approx(times["bf16", "bf16", 1])
    # FP8 weights gathered, fp32 grads reduced: (4 + 1) / 4
    f8, _ = _bridge_estimate(row, grad_reduce_dtype="fp32", overlap=())
    assert f8.time.dp_comm_s == pytest.approx(1.25 * times["bf16", "bf16", 1])


def test_megatron_lm_main_grad_buffer_memory_follows_the_reduce_dtype():
    """The grad buffer memory and the DP traffic read one fact: Megatron-LM's main grads are fp32 only under --bf16
    (arguments.py accumulate_allreduce_grads_in_fp32; --grad-reduce-in-bf16 turns it off); --fp16 keeps them in
    the parameters' fp16 (param_and_grad_buffer grad_dtype): 18 bytes per parameter with bf16 (seed 001, Megatron's
    theoretical_memory_usage.py), 16 with fp16 or a bf16 reduce, the ZeRO paper's 2 + 2 + 12."""
    from planner.memory import training_param_bytes

    def per_param(precision, dtype="fp32"):
        pb = training_param_bytes(TrainingSpec(global_batch=8, seq_len=128, framework="megatron-lm",
                                               precision=precision, grad_reduce_dtype=dtype))
        return pb.weights + pb.master + pb.grads + pb.optimizer, pb.grads

    assert per_param("bf16") == (18, 4)
    assert per_param("bf16", "bf16") == (16, 2)
    assert per_param("fp16") == (16, 2)
    assert per_param("fp32") == (16, 4)    # no master copy: the fp32 weights are the gradients' dtype


def test_moe_fp8_keeps_the_permuted_copies_in_fp8_and_qwen3_fits_as_published():
    """A MoE layer's expert FC1 input is the k permuted copies (Qwen3-30B-A3B: top-8 of 128 experts, HF config
    num_experts_per_tok), kept by TE GroupedLinear in FP8; Megatron-Bridge ran it on 16 H100 at PP 2 x VP 24, EP 8,
    MBS 2, seq 4096, without recompute (set_qwen3_common_configs: recompute_granularity None), so it must fit."""
    from planner.model import get_preset

    m = get_preset("qwen3-30b-a3b")
    t = TrainingSpec(global_batch=512, seq_len=4096, precision="fp8", framework="megatron-lm",
                     fp8_recipe="tensorwise", grad_reduce_dtype="bf16")
    assert fp8.fc1_input_copies(m, t) == 8 and fp8.fc1_input_copies(load_model("llama3-70b"), t) == 1
    c = Candidate(tp=1, pp=2, dp=8, ep=8, mbs=2, gas=32, recompute="none", zero=1, vpp=24)
    assert estimate(m, make_cluster(gpu="H100", gpus=16), t, c).fits
