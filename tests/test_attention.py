"""The attention core by kernel (planner.attention) against the FlashAttention-2 and -3 papers' figures, and the op
list's time for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import attention
from planner.cost import layer_op_list
from planner.errors import InputError
from planner.hardware import get_accelerator, make_cluster
from planner.model import load_model
from planner.ops import ATTENTION
from planner.space import Candidate, TrainingSpec

A100, H100 = get_accelerator("A100-80GB"), get_accelerator("H100-SXM")


def _tflops(gpu, kernel, head_dim, seq, causal=True, model=None):
    model = model or load_model("llama2-7b")
    rate = attention.attention_rate(gpu, kernel, model, causal=causal)
    return rate.fraction(head_dim, seq) * gpu.peak_bf16_flops / 1e12


def test_fa2_on_a100_is_the_papers_figure_4():
    """Dao 2023 (arXiv 2307.08691) Fig. 4: FlashAttention-2 forward + backward on A100 80GB, 187 TFLOP/s at head dim 128
    and 2k without a mask, 155 with the causal mask; 176 at head dim 64 and 16k; FlashAttention (v1) 69 causal at 2k."""
    assert _tflops(A100, "fa2", 128, 2048, causal=False) == pytest.approx(187)
    assert _tflops(A100, "fa2", 128, 2048) == pytest.approx(155)
    assert _tflops(A100, "fa2", 64, 16384, causal=False) == pytest.approx(176)
    assert _tflops(A100, "fa1", 128, 2048) == pytest.approx(69)
    # between the published lengths: linear in log2(seq); beyond them clamped
    assert _tflops(A100, "fa2", 128, 2896) == pytest.approx((155 + 173) / 2, rel=0.01)
    assert _tflops(A100, "fa2", 128, 65536) == pytest.approx(189)
    # between head dims 64 and 128, linear; head dim 96 at 4k causal: (156 + 173) / 2
    assert _tflops(A100, "fa2", 96, 4096) == pytest.approx((156 + 173) / 2)


def test_fa3_and_cudnn_on_h100_combine_the_papers_forward_and_backward():
    """Shah et al. 2024 (arXiv 2407.08608) Fig. 5-6, head dim 128 at 16k without a mask: FlashAttention-3 forward 648,
    backward 561 TFLOP/s -> 3.5 / (1/648 + 2.5/561) = 584 forward + backward; cuDNN 595 / 516 -> 536."""
    assert _tflops(H100, "fa3", 128, 16384, causal=False) == pytest.approx(3.5 / (1 / 648 + 2.5 / 561))
    assert _tflops(H100, "cudnn", 128, 16384, causal=False) == pytest.approx(3.5 / (1 / 595 + 2.5 / 516))
    # FA3's own claim: 1.5-2x FlashAttention-2 (Shah et al. abstract), forward + backward at head dim 128, 8k
    ratio = _tflops(H100, "fa3", 128, 8192, causal=False) / _tflops(H100, "fa2", 128, 8192, causal=False)
    assert 1.5 <= ratio <= 2.0


def test_the_causal_rule_holds_on_fa2s_h100_bars():
    """A causal backward that FA3's paper does not publish is taken as the full one x the forward's causal / full
    ratio; FA2's own H100 bars (forward + backward, FA2 paper's H100 figure; forward: FA3 paper Fig. 5) obey that rule
    within 8% from 2k on, the rule on the slow side (head dim 128: fwd+bwd causal/full 265/320, 294/326, 308/335, 328/338; forward 298/362,
    319/368, 333/370, 335/370)."""
    fwd_bwd = {2048: (265, 320), 4096: (294, 326), 8192: (308, 335), 16384: (328, 338)}
    forward = {2048: (298, 362), 4096: (319, 368), 8192: (333, 370), 16384: (335, 370)}
    for seq, (causal, full) in fwd_bwd.items():
        fc, ff = forward[seq]
        assert causal / full == pytest.approx(fc / ff, rel=0.08)
        assert fc / ff <= causal / full


def test_the_work_a_kernel_skips():
    model = load_model("llama2-7b")
    assert attention.work_fraction(model) == 0.5
    assert attention.work_fraction(model, causal=False) == 1.0
    # Mistral-7B-v0.1's 4096-token window at 16k: each query sees at most 4096 keys
    windowed = model.with_overrides(seq_len=16384, sliding_window=4096)
    assert attention.work_fraction(windowed) == pytest.approx((4096 * 16384 - 4096 ** 2 / 2) / 16384 ** 2)
    # Gemma-2's every other layer in full attention
    mixed = windowed.with_overrides(window_full_every=2)
    assert attention.work_fraction(mixed) == pytest.approx((0.5 + attention.work_fraction(windowed)) / 2)


def test_the_default_kernel_follows_framework_and_gpu():
    def kernel(gpu, **kw):
        return attention.default_kernel(TrainingSpec(global_batch=8, seq_len=2048, **kw), gpu, eager=False)[0]
    assert kernel(H100, framework="megatron-lm") == "cudnn"
    assert kernel(A100, framework="megatron-lm") == "fa2"
    assert kernel(H100, framework="fsdp") == "fa2"
    assert kernel(A100, framework="megatron-deepspeed", flavor="bigscience") == "fa1"
    assert kernel(A100, framework="megatron-deepspeed", flavor="microsoft") == "fa2"
    assert kernel(A100, framework="megatron-deepspeed", flash_attention=False) == "fused-softmax"
    assert attention.default_kernel(TrainingSpec(global_batch=8, seq_len=2048, framework="fsdp",
                                                 flash_attention=False), A100, eager=True)[0] == "unfused"
    assert kernel(A100, framework="megatron-lm", attention_kernel="fa1") == "fa1"
    with pytest.raises(InputError, match="fa3"):
        attention.require_published(A100, "fa3")


def test_the_op_list_times_the_core_at_the_kernels_rate():
    """Llama-2 7B at 4k on one A100: the core's forward + backward (3x the op list's forward) is 3.5 x half the full
    square's 4·s²·d FLOPs over FA2's causal rate at head dim 128, 4k (173 TFLOP/s); FA1 runs it at 76: 2.3x longer."""
    model = load_model("llama2-7b")
    cluster = make_cluster(gpu="A100-80GB", gpus=1, gpus_per_node=1)
    cand = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=1, recompute="none")

    def core_s(kernel):
        training = TrainingSpec(global_batch=1, seq_len=4096, framework="megatron-lm", attention_kernel=kernel)
        return layer_op_list(model, cand, cluster, training).seconds(ATTENTION)

    flops = 4 * 4096 ** 2 * 128 * 32   # forward, full square, 32 heads
    blocks = 32 * 4096 // 128           # 1024 thread blocks on 108 SMs: 10 waves, the last 52/108 full
    waves = blocks / (10 * 108)
    assert 3 * core_s("fa2") == pytest.approx(3.5 * flops / 2 / 173e12 / waves, rel=1e-6)
    assert core_s("fa1") / core_s("fa2") == pytest.approx(173 / 76, rel=1e-6)


def test_a_gpu_without_published_rates_keeps_the_gemm_model():
    model = load_model("llama2-7b")
    assert attention.attention_rate(get_accelerator("V100-32GB"), "fa2", model) is None
    assert attention.attention_rate(get_accelerator("B200"), "cudnn", model) is None
    assert attention.attention_rate(A100, "fused-softmax", model) is None


def test_unfused_softmax_as_pytorch_ops_moves_more_than_megatrons_fused_kernel():
    """Hagemann et al.'s "torch" attention (PyTorch's softmax ops) against their "fused" (Megatron's fused softmax):
    the scores' element-wise traffic is planner.ops.EAGER_SCORE_BYTES against 9 bytes a score."""
    model = load_model("llama2-13b").with_overrides(seq_len=8192)
    cluster = make_cluster(gpu="A100-80GB", gpus=8)
    cand = Candidate(tp=2, pp=1, dp=4, mbs=1, gas=1, recompute="none")
    base = TrainingSpec(global_batch=4, seq_len=8192, framework="megatron-deepspeed", flavor="microsoft",
                        flash_attention=False)
    fused = layer_op_list(model, cand, cluster, replace(base, attention_kernel="fused-softmax"))
    eager = layer_op_list(model, cand, cluster, replace(base, attention_kernel="unfused"))
    by = {lo: {op.name: op for op in lo.ops} for lo in (fused, eager)}
    assert by[eager]["softmax_dropout"].bytes / by[fused]["softmax_dropout"].bytes == pytest.approx(17 / 9)


def _plan(*args: str):
    import subprocess
    import sys
    from pathlib import Path

    from conftest import HANG_GUARD_S
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_plan_says_the_kernel_and_a_flag_overrides_it(tmp_path):
    """The header names the kernel and its rate; --attention-kernel picks another, the emitted run launches it
    (Megatron-LM --attention-backend fused for cuDNN) and plan.yaml keeps it; one clear line for a GPU without it."""
    base = ("--model", "llama2-7b", "--gpus", "16", "--gpu", "H100", "--framework", "megatron-lm")
    out = _plan(*base)
    assert out.returncode == 0, out.stderr
    assert "attention: cudnn (cuDNN fused attention; Megatron-LM + Transformer Engine on Hopper)" in out.stdout
    fa2 = _plan(*base, "--attention-kernel", "fa2", "--explain", "tp=1,pp=1,dp=16,mbs=1,recompute=none",
                "--format", "json")
    assert fa2.returncode == 0, fa2.stderr
    import json
    d = json.loads(fa2.stdout)
    assert d["attention"]["kernel"] == "fa2" and d["attention"]["why"] == "--attention-kernel"
    emitted = _plan(*base, "--attention-kernel", "cudnn", "--emit", "megatron-lm", "--out", str(tmp_path / "run"))
    assert emitted.returncode == 0, emitted.stderr
    args = (tmp_path / "run" / "args.txt").read_text()
    assert "--attention-backend\nfused" in args or "--attention-backend fused" in args
    import yaml
    plan_yaml = yaml.safe_load((tmp_path / "run" / "plan.yaml").read_text())
    assert plan_yaml["plantune"]["training"]["attention_kernel"] == "cudnn"
    again = _plan("--from", str(tmp_path / "run" / "plan.yaml"))
    assert again.returncode == 0 and "attention: cudnn" in again.stdout and "--attention-kernel" in again.stdout
    bad = _plan("--model", "llama2-7b", "--gpus", "16", "--gpu", "A100", "--attention-kernel", "fa3")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no FlashAttention-3 on A100-80GB" in bad.stderr


def test_a_megatron_style_trainer_with_pytorch_element_wise_ops():
    """TrainingSpec.eager_ops (Hagemann et al.'s trainer; Aleph Alpha's scaling runs SwiGLU as silu(x) * gate and
    RoPE as q·cos + rotate_half(q)·sin, src/scaling/core/nn/mlp.py and rotary.py): the element-wise ops counted one
    PyTorch op at a time, the norms as ``fused_norm`` says (one kernel: 4 bytes an element; PyTorch's RMSNorm: 36)."""
    from planner.ops import EAGER_ACTIVATION_BYTES, EAGER_BINARY_BYTES
    model = load_model("llama2-13b")
    cluster = make_cluster(gpu="A100-80GB", gpus=8)
    cand = Candidate(tp=2, pp=1, dp=4, mbs=1, gas=1, recompute="none")
    base = TrainingSpec(global_batch=4, seq_len=4096, framework="megatron-deepspeed", flavor="microsoft",
                        eager_ops=True)
    tokens, th = 4096, 4096 * model.hidden

    def ops(training):
        return {op.name: op for op in layer_op_list(model, cand, cluster, training).ops}

    eager, unfused_norm, fused = ops(base), ops(replace(base, fused_norm=False)), ops(replace(base, eager_ops=False))
    assert eager["mlp_act"].bytes == (EAGER_ACTIVATION_BYTES + EAGER_BINARY_BYTES) * tokens * model.ffn_hidden / 2
    assert eager["norms"].bytes == 2 * 4 * th
    assert unfused_norm["norms"].bytes == 2 * 36 * th
    assert eager["rope"].bytes > 0 and "rope" not in fused   # Megatron fuses RoPE into its layout copies
    assert sum(o.bytes for o in eager.values()) > sum(o.bytes for o in fused.values())


def test_hagemann_tables_tune_flags_plan_their_kernel_and_ops():
    """tune's flags for each of Hagemann's tables (search.published_tables) plan the kernel the sheet names and the
    trainer's PyTorch element-wise ops, as validate.py reads the rows."""
    from planner.cli import build_parser, setup_from_args
    from published import tables_of

    tables = tables_of("hagemann_13b_dev.yaml")
    kernels = set()
    for t in tables:
        args = build_parser().parse_args(t.tune_flags("llama2-13b"))
        _, _, training = setup_from_args(args)
        got = (training.attention_kernel, training.eager_ops, training.fused_norm, training.flash_attention)
        assert got == (t.training.attention_kernel, True, t.training.fused_norm, t.training.flash_attention), t.name
        kernels.add(training.attention_kernel)
    assert kernels == {"fa1", "fa2", "fused-softmax", "unfused"}
