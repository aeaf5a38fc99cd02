"""FP8 training (Transformer Engine / torchao float8): which accelerators run it, what it costs and saves.

``--precision fp8`` means what Megatron-LM's ``--fp8-format hybrid`` and torchtitan's float8 converter
do: the linear layers' GEMMs run on FP8 tensor cores (E4M3 forward, E5M2 gradients in the hybrid
recipe), with delayed or per-tensor scaling; everything else (attention core, norms, softmax,
LM head, communication, master weights and optimizer) stays bf16/fp32. Sources: NVIDIA
TransformerEngine docs "Using FP8 with Transformer Engine" (FP8 GEMM inputs, bf16 weights kept,
FP8 weight and transpose cached for the backward; amax history); Micikevicius et al. 2022 "FP8
Formats for Deep Learning" (arXiv 2209.05433) Sec. 3-4. MFU stays against the bf16 dense peak, as
Llama 3 (Dubey et al. 2024 Table 4 "BF16 MFU") and DeepSeek-V3 report it, so FP8 speedups show as
higher MFU, not as a different denominator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner import moe

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.model import ModelSpec
    from planner.space import Candidate, TrainingSpec

FRAMEWORKS_WITH_FP8 = {"megatron-lm": "--fp8-format hybrid", "fsdp": "torchtitan float8 (torchao)"}
# TransformerEngine caches the FP8 copy of each weight and its transpose (1 byte each) for the
# backward of every micro-batch (TE docs, "FP8 weight caching" with is_first_microbatch).
FP8_WEIGHT_CACHE_BYTES = 2.0
# Bytes moved per GEMM-input element to quantize it: TE fuses the cast into the producer (LayerNormLinear,
# LayerNormMLP and the fused activation emit FP8 directly; cast-transpose kernels elsewhere), so what is
# added is writing the FP8 copy and its FP8 transpose for the backward: 1 + 1 (TE docs, "FP8 cast-transpose").
CAST_BYTES_PER_ELEMENT = 2.0


def compute_precision(precision: str) -> str:
    """Precision of what does not run in FP8 (attention core, LM head) and of the MFU denominator."""
    return "bf16" if precision == "fp8" else precision


def violations(model: "ModelSpec", c: "Candidate", cluster: "ClusterSpec",
               training: "TrainingSpec", framework: str | None = None) -> list[tuple[str, str]]:
    if training.precision != "fp8":
        return []
    fw = framework or training.framework
    out = []
    if cluster.gpu.peak_fp8_flops is None:
        out.append(("fp8_needs_hardware", f"{cluster.gpu.id} has no FP8 tensor cores (H100, H200, B200 and MI300X "
                                          "do); use --precision bf16"))
    if fw not in FRAMEWORKS_WITH_FP8:
        out.append(("framework_limit", f"FP8 training is not in {fw}; use --framework megatron-lm "
                                       "(Transformer Engine) or fsdp (torchtitan float8)"))
    return out


def weight_bytes(base: float, precision: str) -> float:
    """Bytes per parameter of the forward's weights: bf16 kept as is (TE keeps bf16 weights and fp32
    master weights), plus the cached FP8 weight and transpose."""
    return base + FP8_WEIGHT_CACHE_BYTES if precision == "fp8" else base


def activation_saving_bytes(c: "Candidate", precision: str, sbh: float, f_ratio: float) -> float:
    """Bytes per layer and micro-batch that FP8 saves on stored activations: the inputs of the QKV,
    output-projection, FC1 and FC2 GEMMs are saved as FP8 (1 byte) instead of 16-bit (TE Linear keeps
    its quantized input for the weight gradient). In Korthikanti et al. 2022's units (bytes per
    s·b·h): QKV and FC1 inputs 2 each (split by TP only with SP), projection input 2 and FC2 input
    2·f/h (split by TP)."""
    if precision != "fp8":
        return 0.0
    t = c.tp
    return sbh * ((1 + 1) / (t if c.sp else 1) + (1 + f_ratio) / t)


def cast_traffic_bytes(model: "ModelSpec", c: "Candidate", precision: str, tokens: int) -> float:
    """HBM bytes of quantizing one layer's GEMM inputs in the forward (QKV, projection, FC1, FC2); MoE layers
    quantize each token's k permuted copies (`planner.moe.mlp_gemm_input_widths`)."""
    if precision != "fp8":
        return 0.0
    t, h = c.tp, model.hidden
    fc1, fc2 = moe.mlp_gemm_input_widths(model, c)
    elements = tokens * (h + model.q_dim / t + fc1 + fc2)
    return CAST_BYTES_PER_ELEMENT * elements


__all__ = ["FRAMEWORKS_WITH_FP8", "activation_saving_bytes", "cast_traffic_bytes", "compute_precision",
           "violations", "weight_bytes"]


def require_hardware(gpu: object, precision: str) -> None:
    """One line and exit 2 before planning when --precision fp8 names an accelerator without FP8."""
    from planner.errors import InputError

    if precision == "fp8" and getattr(gpu, "peak_fp8_flops", None) is None:
        raise InputError(f"--precision fp8: {getattr(gpu, 'id', gpu)} has no FP8 tensor cores (H100, H200, B200 and "
                         "MI300X do); use --precision bf16 or --gpu H100")
