"""The attention core by kernel: which kernel a run uses and how fast it runs on its GPU.

Kernels (`KERNELS`): FlashAttention 1 / 2 / 3 and cuDNN's fused attention keep no s x s matrix in memory and skip the
blocks a causal mask or a sliding window leaves out; "fused-softmax" (Megatron's unfused backend: QK^T and AV as
batched GEMMs around its fused scale-mask-softmax kernel) and "unfused" (the same GEMMs around PyTorch's softmax ops:
SDPA's math backend, Hugging Face's eager attention) compute the full square and move the scores through HBM
(planner.ops costs their element-wise traffic).

A fused kernel's time is its published forward + backward rate on the GPU (planner/accelerators.yaml
``attention_tflops``: the FlashAttention-2 and -3 papers' figures on A100 and H100, per head dim, mask and sequence
length), over the FLOPs it does: the op list's forward 4·s²·d per head x the share of the square it computes
(`work_fraction`) x (1 + 2.5) for the backward (the papers' count: the backward recomputes the scores, 2.5x the
forward's FLOPs). GPUs with no published rate (V100, Blackwell, AMD) keep the GEMM shape model (planner.ops.gemm_s).

Which kernel a run uses follows from the framework and the GPU (`default_kernel`); `plan --attention-kernel`
overrides it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from planner.errors import InputError
from planner.hardware import Accelerator, thaw
from planner.model import ModelSpec
from planner.space import TrainingSpec

KERNELS: dict[str, str] = {
    "fa1": "FlashAttention (v1)",
    "fa2": "FlashAttention-2",
    "fa3": "FlashAttention-3",
    "cudnn": "cuDNN fused attention",
    "fused-softmax": "batched GEMMs + fused scale-mask-softmax",
    "unfused": "batched GEMMs + PyTorch softmax ops",
}
"""`--attention-kernel` names -> what they are"""
FUSED = ("fa1", "fa2", "fa3", "cudnn")
"""the kernels that keep no s x s matrix (TrainingSpec.flash_attention True)"""
SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)
"""the sequence lengths of the papers' figures (batch x seq = 16k tokens, hidden 2048: Dao 2023 Sec. 4.1)"""
BACKWARD_FLOPS = 2.5
"""backward FLOPs / forward FLOPs of a flash kernel as the papers count them (the backward recomputes QK^T: Dao 2023
Sec. 4.1, "the backward pass FLOPs is 2.5 times the forward"; flash-attention benchmarks flops(mode="fwd_bwd"))"""


def kernel_names() -> str:
    return ", ".join(KERNELS)


def check_kernel(name: str, where: str = "--attention-kernel") -> str:
    if name not in KERNELS:
        raise InputError(f"{where} {name!r} is not a kernel plantune knows; use one of {kernel_names()}")
    return name


def default_kernel(training: TrainingSpec, gpu: Accelerator, eager: bool) -> tuple[str, str]:
    """(kernel, why) a run uses: --attention-kernel, else what its framework runs on this GPU."""
    if training.attention_kernel:
        return check_kernel(training.attention_kernel, "attention_kernel"), "--attention-kernel"
    if not training.flash_attention:
        return (("unfused", "no flash attention, eager PyTorch") if eager else
                ("fused-softmax", "no flash attention, Megatron's kernels"))
    hopper = "fa3" in published_kernels(gpu)
    fw = training.framework
    if fw == "megatron-lm":
        # Transformer Engine's DotProductAttention (transformer_engine/pytorch/attention.py get_attention_backend):
        # cuDNN's FusedAttention preferred on sm90, flash-attn 2 on sm80
        return ("cudnn", "Megatron-LM + Transformer Engine on Hopper") if hopper else \
            ("fa2", "Megatron-LM + Transformer Engine (flash-attn 2)")
    if fw == "megatron-deepspeed":
        if training.flavor == "microsoft":   # what plantune's emitter launches: --use-flash-attn-v2
            return "fa2", "Megatron-DeepSpeed (microsoft) --use-flash-attn-v2"
        return "fa1", "Megatron-DeepSpeed 2022 fork (flash-attn v1)"
    # torch.nn.functional.scaled_dot_product_attention's flash backend is FlashAttention-2 (PyTorch 2.2 release
    # notes): torchtitan, fms-fsdp, Hugging Face's sdpa attention
    return "fa2", "PyTorch SDPA flash backend (FlashAttention-2)"


@functools.lru_cache(maxsize=64)   # pure in a frozen Accelerator; asked once per op list
def published_kernels(gpu: Accelerator) -> dict:
    """kernel -> its published table on this GPU (accelerators.yaml ``attention_tflops``; {} when none)."""
    if not gpu.attention_tflops:
        return {}
    table = thaw(gpu.attention_tflops)
    return {k: v for k, v in table.items() if k in KERNELS}


def _fwd_bwd(entry: dict, mask: str, where: str) -> list[float]:
    """Forward + backward TFLOP/s at SEQ_POINTS: given, or combined from the forward and backward figures as the
    papers count them, 3.5 / (1/fwd + 2.5/bwd); a causal backward that is not published = the full one x the
    forward's causal / full ratio (checked on FA2's H100 bars, tests/test_attention.py)."""
    if "full" in entry or "causal" in entry:
        return [float(v) for v in entry[mask if mask in entry else "full"]]
    fwd, bwd = entry["forward"], entry["backward"]
    out = []
    for i in range(len(SEQ_POINTS)):
        f_full, b_full = float(fwd["full"][i]), float(bwd["full"][i])
        both = (1 + BACKWARD_FLOPS) / (1 / f_full + BACKWARD_FLOPS / b_full)
        if mask == "causal":
            if "causal" in bwd:
                f_c, b_c = float(fwd["causal"][i]), float(bwd["causal"][i])
                both = (1 + BACKWARD_FLOPS) / (1 / f_c + BACKWARD_FLOPS / b_c)
            else:
                both *= float(fwd["causal"][i]) / f_full
        out.append(both)
    if len(out) != len(SEQ_POINTS):
        raise InputError(f"{where}: {len(out)} figures; give one per sequence length {SEQ_POINTS}")
    return out


@dataclass(frozen=True, slots=True)
class AttentionRate:
    """A fused kernel's forward + backward rate on one GPU, as a fraction of that GPU's 16-bit peak, per head dim at
    SEQ_POINTS; and the share of the full square it computes for this model."""

    kernel: str
    work: float
    """the share of the op list's s x s FLOPs the kernel computes (`work_fraction`)"""
    curves: tuple[tuple[int, tuple[float, ...]], ...]
    """(head dim, fraction of peak at each of SEQ_POINTS), by head dim"""

    def fraction(self, head_dim: int, seq: int) -> float:
        """Fraction of peak at this head dim and sequence length: linear in log2(seq) between the published lengths
        and linear in the head dim between the published ones; clamped outside both (no extrapolation)."""
        dims = [d for d, _ in self.curves]
        at = [self._at_seq(c, seq) for _, c in self.curves]
        if head_dim <= dims[0]:
            return at[0]
        for (d0, f0), (d1, f1) in zip(zip(dims, at), zip(dims[1:], at[1:])):
            if head_dim <= d1:
                return f0 + (f1 - f0) * (head_dim - d0) / (d1 - d0)
        return at[-1]

    @staticmethod
    def _at_seq(curve: tuple[float, ...], seq: int) -> float:
        x = math.log2(min(max(seq, SEQ_POINTS[0]), SEQ_POINTS[-1]))
        xs = [math.log2(s) for s in SEQ_POINTS]
        for i in range(len(xs) - 1):
            if x <= xs[i + 1]:
                return curve[i] + (curve[i + 1] - curve[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])
        return curve[-1]

    def seconds_factor(self, head_dim: int, seq: int) -> float:
        """Seconds of the op list's forward per (FLOP / peak): forward + backward at the published rate, the op list
        running the backward at 2x its forward (planner.ops.LayerOps), so the forward carries (1 + 2.5) / 3."""
        return self.work * (1 + BACKWARD_FLOPS) / 3 / self.fraction(head_dim, seq)


def work_fraction(model: ModelSpec, causal: bool = True) -> float:
    """Share of the full s x s square a fused kernel computes: half with a causal mask (its blocks above the diagonal
    skipped; (s+1)/(2s) of the scores, 1/2 at training lengths); with a sliding window of w tokens each query sees
    min(i, w) keys: (w·s - w²/2) / s² of the square; layers in full attention every ``window_full_every``-th."""
    s = max(1, model.seq_len)
    if not causal:
        return 1.0
    full = 0.5
    w = model.sliding_window
    if not w or w >= s:
        return full
    windowed = (w * s - w * w / 2) / (s * s)
    every = model.window_full_every
    return full / every + windowed * (1 - 1 / every) if every else windowed


@functools.lru_cache(maxsize=256)   # pure in frozen specs; asked once per op list
def attention_rate(gpu: Accelerator, kernel: str, model: ModelSpec, causal: bool = True) -> AttentionRate | None:
    """The fused kernel's rate on ``gpu`` (None: an unfused core, or no published rate for this GPU: the GEMM shape
    model). Published TFLOP/s / the measuring GPU's peak x (this GPU's gemm_efficiency / the measuring GPU's: the
    clocks a power cap holds, e.g. H100-HBM2e-96GB at 500 W)."""
    if kernel not in FUSED:
        return None
    tables = published_kernels(gpu)
    if kernel not in tables:
        return None
    table = thaw(gpu.attention_tflops)
    where = f"{gpu.id} attention_tflops.{kernel}"
    scale = gpu.gemm_efficiency / float(table["gemm_efficiency"]) / float(table["peak_tflops"])
    curves = []
    for key, entry in sorted(tables[kernel].items(), key=lambda kv: int(kv[0].removeprefix("hd"))):
        figures = _fwd_bwd(entry, "causal" if causal else "full", f"{where}.{key}")
        curves.append((int(key.removeprefix("hd")), tuple(v * scale for v in figures)))
    return AttentionRate(kernel=kernel, work=work_fraction(model, causal), curves=tuple(curves))


def require_published(gpu: Accelerator, kernel: str) -> None:
    """An --attention-kernel this GPU cannot run: FlashAttention-3 on a GPU whose other kernels are published (it
    runs on Hopper only), one clear line."""
    tables = published_kernels(gpu)
    if kernel in FUSED and tables and kernel not in tables:
        raise InputError(f"--attention-kernel {kernel}: no {KERNELS[kernel]} on {gpu.id} (published here: "
                         f"{', '.join(tables)}); use one of those or --gpu H100")


def describe(kernel: str, why: str, rate: AttentionRate | None, model: ModelSpec, seq: int, gpu: Accelerator,
             peak: float) -> str:
    """One line for the plan's header: the kernel, why, and its rate at the model's head dim and this sequence."""
    name = f"attention: {kernel} ({KERNELS[kernel]}; {why})"
    if rate is None:
        if kernel in FUSED:
            return f"{name}, as batched GEMMs at the GEMM shape model's rate (no published rate on {gpu.id})"
        return f"{name}, full s x s square"
    f = rate.fraction(model.head_dim, seq)
    return (f"{name}, {f * peak / 1e12:.0f} TFLOP/s forward + backward at head dim {model.head_dim}, seq {seq} "
            f"({f:.0%} of peak), computing {rate.work:.2f} of the s x s square")


__all__ = ["AttentionRate", "BACKWARD_FLOPS", "FUSED", "KERNELS", "SEQ_POINTS", "attention_rate", "check_kernel",
           "default_kernel", "describe", "kernel_names", "published_kernels", "require_published", "work_fraction"]
