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

from dataclasses import replace
from typing import TYPE_CHECKING

from planner import moe, offload
from planner.constants import BLOCK_SCALED_GEMM_EFFICIENCY, ROWWISE_GEMM_EFFICIENCY
from planner.ops import bytes_op

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.model import ModelSpec
    from planner.ops import LayerOps
    from planner.space import Candidate, TrainingSpec

FRAMEWORKS_WITH_FP8 = {"megatron-lm": "--fp8-format hybrid", "fsdp": "torchtitan float8 (torchao)"}
# TransformerEngine caches the FP8 copy of each weight and its transpose (1 byte each) for the
# backward of every micro-batch (TE docs, "FP8 weight caching" with is_first_microbatch).
FP8_WEIGHT_CACHE_BYTES = 2.0
# Bytes moved per GEMM-input element to quantize it: TE fuses the cast into the producer (LayerNormLinear,
# LayerNormMLP and the fused activation emit FP8 directly; cast-transpose kernels elsewhere), so what is
# added is writing the FP8 copy and its FP8 transpose for the backward: 1 + 1 (TE docs, "FP8 cast-transpose").
CAST_BYTES_PER_ELEMENT = 2.0
# Megatron-LM --fp8-param-gather ("Keep the compute param in fp8 (do not use any other intermediate dtype) and perform
# the param all-gather in fp8", megatron/training/arguments.py; needs --use-distributed-optimizer, which keeps the fp32
# main params): the weight is the FP8 tensor, 1 byte, plus the columnwise (transposed) copy Hopper's dgrad GEMM reads,
# 1 byte (megatron/core/fp8_utils.py keeps the columnwise data after the all-gather); no bf16 copy. Megatron-Bridge's
# FP8 recipes set it (bf16_with_fp8_current_scaling_mixed: fp8_param_gather=True).
FP8_PARAM_BYTES = 1.0 + 1.0
# Transformer Engine scaling recipes plan models (Megatron-LM --fp8-recipe): delayed scaling takes the scale from the
# amax history, so the norm writes FP8 directly and a cast computes amax in the same pass; per-tensor current scaling
# ("tensorwise", Megatron-Bridge's H100 FP8-CS runs: fp8_recipe="tensorwise") needs the tensor's amax first.
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "mxfp8", "blockwise")
# Block-scaled FP8: a scale per block of consecutive elements along the GEMM's reduction axis, so the forward and the
# backward need two quantized copies of each input (one per axis, each from the 16-bit tensor: an FP8 transpose of the
# first would carry the wrong blocks). mxfp8: OCP Microscaling (MX spec v1.0), 32 elements per E8M0 scale (1 byte),
# applied by Blackwell's tensor cores (Megatron-LM --fp8-recipe mxfp8 -> TE MXFP8BlockScaling; torchao MXLinear
# recipe mxfp8_cublas); blockwise: DeepSeek-V3's (arXiv 2412.19437 Sec. 3.3.1) 1x128 tiles for activations and
# gradients, 128x128 blocks for weights, fp32 scales (4 bytes; --fp8-recipe blockwise -> TE Float8BlockScaling).
# recipe -> (elements per scale along the reduction axis, bytes per scale)
BLOCK_SCALING = {"mxfp8": (32, 1.0), "blockwise": (128, 4.0)}
# torchao's MXLinear casts each input twice, once per axis (the dim0 cast in torch.compile's fused kernels, the dim1
# cast in its own kernel, mxfp8_dim1_cast_kernel_choice): the second reads the 16-bit input again. TE's MXFP8
# quantizer writes both copies from one read (cast_mxfp8_2D with rowwise and columnwise scaling).
BLOCK_SECOND_AXIS_READ_BYTES = 2.0
# torchao's rowwise float8 (torchtitan quantize.linear.float8 recipe_name "rowwise"): a scale per row of each GEMM
# operand, so GEMMs with row-scaled epilogues (torch._scaled_mm rowwise) and, for the weight-gradient GEMM, each input
# quantized a second time along its other axis (torchao float8 CastConfig AXISWISE per operand).
# Their rate relative to tensorwise: ROWWISE_GEMM_EFFICIENCY (planner.constants, measured on an H200).
# Bytes per GEMM-input element of rowwise's second, other-axis quantization: read the bf16 input and its amax pass
# (2 + 2), write the FP8 copy (1).
ROWWISE_SECOND_CAST_BYTES = 2.0 + 2.0 + 1.0
# Extra HBM bytes per GEMM-input element under current scaling (TE csrc normalization.cpp: a Float8Quantizer takes
# FULLY_FUSED, a Float8CurrentScalingQuantizer FUSED_NORM_AMAX_FP8 = "compute norm and amax in high precision, then
# quantize"): a norm-fed input (QKV, FC1) is written in bf16 and read back by the cast, 2 + 2; any other input (output
# projection, FC2, the experts' permuted tokens) is read once more by the amax reduction before the cast, 2.
CURRENT_SCALING_NORM_FED_BYTES = 2.0 + 2.0
CURRENT_SCALING_AMAX_READ_BYTES = 2.0


# What an FP8 run keeps for the backward (TrainingSpec.fp8_activations): "te", Transformer Engine's FP8 copy of each GEMM
# input beside what the other ops keep in 16 bits (`activation_saving_bytes`); "deepseek", DeepSeek-V3's low-precision
# storage and communication (arXiv 2412.19437 Sec. 3.3.3, `deepseek_layer_bytes`), which no framework plantune emits
# runs (Megatron-LM keeps TE's copies; its activation_func_fp8_input_store, the SwiGLU input in FP8, is a
# TransformerConfig field without a command-line flag, arguments.py's exclude list)
ACTIVATION_RECIPES = ("te", "deepseek")
# DeepSeek-V3 report Sec. 3.3.3 (1): the inputs of the Linear after attention, which the attention backward reads too,
# kept once "in a customized E5M6 data format": 1 + 5 + 6 bits
E5M6_BYTES = 12 / 8
# Sec. 3.3.1: activations quantized "on a 1x128 tile basis", one FP32 scaling factor per tile: the blockwise recipe's
# block and scale (`BLOCK_SCALING`), 4 bytes a 128 elements
TILE_SCALE_BYTES = BLOCK_SCALING["blockwise"][1] / BLOCK_SCALING["blockwise"][0]


DEEPSEEK_NOTE = ("--fp8-activations deepseek is DeepSeek-V3's low-precision storage and dispatch (report Sec. 3.3.3), "
                 "planned here as their run; Megatron-LM keeps Transformer Engine's FP8 copies beside the 16-bit tensors "
                 "and dispatches in 16 bits (--emit megatron-lm refuses it): plan without --emit, or emit with "
                 "--fp8-activations te")
"""the stderr note `plan` prints, and why --emit megatron-lm refuses the recipe (planner.rules.model_violations)"""


def deepseek_layer_bytes(model: "ModelSpec", c: "Candidate", training: "TrainingSpec",
                         modules: tuple[str, ...] = ()) -> float:
    """Bytes per token one layer (the mean over the model's layers) keeps for its backward under DeepSeek-V3's
    low-precision storage (report Sec. 3.3.3), with Megatron's --recompute-modules ``modules`` re-run (Sec. 3.2.3's
    "recompute all RMSNorm operations and MLA up-projections": layernorm, mla_up_proj). Kept, per token:
    - each RMSNorm's input in BF16 (2h a norm: the layer input and the residual before the MLP), which its backward and
      its recompute read; its output, a Linear's input, cached in FP8 with its 1x128 tiles' scales ("cache activations
      in FP8 format for the backward pass of the Linear operator"), unless the norm is recomputed; the router's input
      in BF16 (the gating modules keep their precision, Sec. 3.3);
    - MLA (Eq. 1-11): the latents c^Q, c^KV and the rope key in BF16 (the latent norms' inputs), their norms' outputs in
      FP8, and Q, K, V in BF16 for the attention core unless the up-projections are recomputed; other attention Q, K, V
      in BF16; the attention output once, in E5M6 (`E5M6_BYTES`), for the core's backward and the output projection's;
    - MoE: the k dispatched FP8 tokens (the routed experts' FC1 input: the dispatch is in FP8), the SwiGLU inputs of
      the routed and shared experts in FP8, their outputs recomputed (Sec. 3.3.3 (2)); the shared expert's FC1 input
      in FP8 unless the norm is recomputed;
    - a dense layer's MLP, which Sec. 3.3.3 (2) does not name: the FC1 input and the FC2 input in FP8, the SwiGLU's own
      input in BF16 for its backward."""
    from planner.model import expert_ffn

    h, t = model.hidden, c.tp
    sp = t if c.sp else 1
    q8 = 1.0 + TILE_SCALE_BYTES
    norms = "layernorm" in modules
    glu = 2 if model.glu else 1
    att = 2.0 * h / sp + (0.0 if norms else q8 * h / sp)
    if model.kv_lora_rank:
        latent = (model.q_lora_rank or 0) + model.kv_lora_rank
        att += 2.0 * (latent + model.qk_rope_head_dim) + (0.0 if norms else q8 * latent)
        v = model.v_head_dim or model.head_dim
        if "mla_up_proj" not in modules:
            att += 2.0 * model.heads * (2 * (model.head_dim + model.qk_rope_head_dim) + v) / t
        out = model.heads * v
    else:
        att += 2.0 * (model.q_dim + 2 * model.kv_dim) / t
        out = model.q_dim
    att += (E5M6_BYTES + TILE_SCALE_BYTES) * out / t
    mlp_in = 2.0 * h / sp
    dense = 0.0
    if "mlp" not in modules:
        dense = (0.0 if norms else q8 * h / sp) + (q8 + 2 * glu) * model.ffn_hidden / t
    if not moe.is_moe(model):
        return att + mlp_in + dense
    e, k = expert_ffn(model), model.moe_topk * moe.capacity(training)
    if "moe" in modules:   # the whole block re-run (its all-to-all too): its input alone
        routed = 0.0 if norms else 2.0 * h / sp
    else:
        routed = (0.0 if norms else (2.0 + (q8 if model.shared_experts else 0.0)) * h / sp) \
            + k * q8 * (h + glu * e) / t \
            + (0.0 if "shared_experts" in modules else model.shared_experts * q8 * glu * e / t)
    share = moe.moe_layer_count(model) / model.layers
    return att + mlp_in + share * routed + (1 - share) * dense


def gemm_rate_factor(training: "TrainingSpec") -> float:
    """The FP8 GEMMs' rate relative to the FP8 peak's usual efficiency: ROWWISE_GEMM_EFFICIENCY under rowwise,
    BLOCK_SCALED_GEMM_EFFICIENCY under block scaling (scales read and applied per K-block in the GEMM)."""
    if training.precision != "fp8":
        return 1.0
    if training.fp8_recipe == "rowwise":
        return ROWWISE_GEMM_EFFICIENCY
    return BLOCK_SCALED_GEMM_EFFICIENCY if training.fp8_recipe in BLOCK_SCALING else 1.0


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
    elif training.fp8_recipe == "mxfp8" and not cluster.gpu.mx_block_scaling:
        out.append(("fp8_needs_hardware", f"{cluster.gpu.id}'s tensor cores take no MX block scales (MXFP8 is "
                                          "Blackwell's: B200, GB200; Megatron-LM 'mxfp8 for Blackwell architecture "
                                          "only'); use --fp8-recipe blockwise or tensorwise"))
    if fw not in FRAMEWORKS_WITH_FP8:
        out.append(("framework_limit", f"FP8 training is not in {fw}; use --framework megatron-lm "
                                       "(Transformer Engine) or fsdp (torchtitan float8)"))
    return out


def weight_bytes(base: float, precision: str) -> float:
    """Bytes per parameter of the forward's weights: bf16 kept as is (TE keeps bf16 weights and fp32
    master weights), plus the cached FP8 weight and transpose."""
    return base + FP8_WEIGHT_CACHE_BYTES if precision == "fp8" else base


def fp8_param_gather(c: "Candidate", training: "TrainingSpec") -> bool:
    """Whether plan runs FP8 with Megatron-LM's --fp8-param-gather: FP8 there, with the distributed optimizer it
    needs."""
    # arguments.py: under --optimizer-cpu-offload, --fp8-param-gather only with --fp8-recipe delayed
    return (training.precision == "fp8" and training.framework == "megatron-lm" and c.zero >= 1
            and not (offload.optimizer_fraction(c, training) and training.fp8_recipe != "delayed"))


def param_gather_bytes(c: "Candidate", training: "TrainingSpec", half: int) -> int:
    """Bytes per parameter the distributed optimizer's all-gather carries: under --fp8-param-gather the FP8
    weights, 1 byte (arguments.py help); otherwise the 16-bit weights."""
    return 1 if fp8_param_gather(c, training) else half


def fc1_input_copies(model: "ModelSpec", training: "TrainingSpec") -> float:
    """FC1 inputs per token, in units of h, whose saved copy FP8 shrinks (mean over layers): a dense MLP's norm output,
    1; a MoE layer's expert GroupedLinear input, the k permuted copies x capacity, 16-bit in
    `moe.dispatch_activation_sbh`
    (the dispatcher's permute backward needs only the row map, so under FP8 only TE's FP8 copy stays)."""
    if not moe.is_moe(model):
        return 1.0
    n = moe.moe_layer_count(model)
    return (n * model.moe_topk * moe.capacity(training) + (model.layers - n)) / model.layers


def activation_saving_bytes(c: "Candidate", precision: str, sbh: float, f_ratio: float,
                            flash_attention: bool = True, fc1_copies: float = 1.0) -> float:
    """Bytes per layer and micro-batch that FP8 saves on stored activations. TE Linear keeps its quantized
    input (1 byte) for the weight gradient instead of the 16-bit one: the QKV and FC1 inputs (the norms'
    outputs) and the FC2 input (the activation's output) shrink from 2 to 1 byte. The output projection's
    input is the attention core's output, which FlashAttention keeps in bf16 for its own backward (it reads O):
    TE's FP8 copy comes on top, 1 byte more. In Korthikanti et al. 2022's units (bytes per s·b·h): QKV and
    FC1 inputs 1 each (split by TP only with SP; FC1 ``fc1_copies``, `fc1_input_copies`), FC2 input f/h, projection
    input -1 (split by TP)."""
    if precision != "fp8":
        return 0.0
    t = c.tp
    proj = -1 if flash_attention else 1
    return sbh * ((1 + fc1_copies) / (t if c.sp else 1) + (proj + f_ratio) / t)


def cast_traffic_bytes(model: "ModelSpec", c: "Candidate", precision: str, tokens: int,
                       recipe: str = "delayed", framework: str = "megatron-lm") -> float:
    """HBM bytes of quantizing one layer's GEMM inputs in the forward (QKV, projection, FC1, FC2); MoE layers
    quantize each token's k permuted copies (`planner.moe.mlp_gemm_input_widths`). Current scaling
    (``recipe`` tensorwise) adds the bf16 round trip of the norm-fed inputs and the amax read of the others.
    Block scaling (mxfp8, blockwise) takes each block's amax in the cast itself (no amax pass), but the norm cannot
    emit it (TE normalization.cpp: MXFP8 and block quantizers take UNFUSED, "compute norm in high precision, then
    quantize"): the norm-fed inputs' bf16 round trip; both copies carry their scales (`block_scale_bytes`); torchao
    (``framework`` fsdp) reads the input again for the second axis."""
    if precision != "fp8":
        return 0.0
    t, h = c.tp, model.hidden
    fc1, fc2 = moe.mlp_gemm_input_widths(model, c)
    elements = tokens * (h + model.q_dim / t + fc1 + fc2)
    out = CAST_BYTES_PER_ELEMENT * elements
    if recipe in ("tensorwise", "rowwise"):   # current scaling: the amax pass first
        # norm-fed: the QKV input and a dense FC1's (a MoE layer's FC1 reads the permuted tokens: amax read)
        norm_fed = h + (h if not moe.is_moe(model) else 0.0)
        out += tokens * (CURRENT_SCALING_NORM_FED_BYTES * norm_fed
                         + CURRENT_SCALING_AMAX_READ_BYTES * (h + model.q_dim / t + fc1 + fc2 - norm_fed))
    if recipe == "rowwise":
        out += ROWWISE_SECOND_CAST_BYTES * elements
    if recipe in BLOCK_SCALING:
        norm_fed = h + (h if not moe.is_moe(model) else 0.0)
        out += tokens * CURRENT_SCALING_NORM_FED_BYTES * norm_fed + block_scale_bytes(recipe) * elements
        if framework == "fsdp":
            out += BLOCK_SECOND_AXIS_READ_BYTES * elements
    return out


def block_scale_bytes(recipe: str) -> float:
    """Scale bytes per quantized element under block scaling, both copies (one per axis): 2 x bytes / block."""
    block, scale = BLOCK_SCALING[recipe]
    return 2 * scale / block


def cast_ops(lo: "LayerOps", model: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
             cluster: "ClusterSpec") -> "LayerOps":
    """The layer's op list with FP8's quantization of the GEMM inputs (`cast_traffic_bytes`) added: a memory-bound
    op."""
    casts = cast_traffic_bytes(model, c, training.precision, tokens, training.fp8_recipe, training.framework)
    if not casts:
        return lo
    return replace(lo, ops=lo.ops + (bytes_op("fp8_casts", casts, cluster),))


__all__ = ["ACTIVATION_RECIPES", "BLOCK_SCALING", "DEEPSEEK_NOTE", "E5M6_BYTES", "FP8_RECIPES",
           "FRAMEWORKS_WITH_FP8", "TILE_SCALE_BYTES", "activation_saving_bytes", "block_scale_bytes", "cast_ops",
           "cast_traffic_bytes", "compute_precision", "deepseek_layer_bytes", "fc1_input_copies",
           "fp8_param_gather", "gemm_rate_factor", "param_gather_bytes", "violations", "weight_bytes"]


def require_hardware(gpu: object, precision: str) -> None:
    """One line and exit 2 before planning when --precision fp8 names an accelerator without FP8."""
    from planner.errors import InputError

    if precision == "fp8" and getattr(gpu, "peak_fp8_flops", None) is None:
        raise InputError(f"--precision fp8: {getattr(gpu, 'id', gpu)} has no FP8 tensor cores (H100, H200, B200 and "
                         "MI300X do); use --precision bf16 or --gpu H100")
