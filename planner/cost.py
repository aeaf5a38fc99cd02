"""Step time, throughput and TFLOPs for one candidate: small pure functions, one TimeBreakdown.

Model: every GEMM of a layer timed at peak x a GEMM efficiency that penalises tile and wave
quantization and short inner dimensions; memory-bound element-wise work timed at HBM bandwidth;
TP all-reduces on the TP group's link, not overlapped (Megatron); 1F1B pipeline with its bubble
(m + p - 1 micro-batch slots, interleaving divides the bubble by v) and p2p sends; DP gradient
all-reduce or ZeRO/FSDP gathers on the DP group's bottleneck link, overlapped only where the
framework overlaps; optimizer step at HBM bandwidth. FLOPs come from `planner.flops` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import context_parallel, flops, fp8, moe
from planner.hardware import ClusterSpec
from planner.memory import layers_per_stage, param_bytes, shard_group_size, stage_params
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec
from planner.topology import Topology, collective_time_s

# Tile of the GEMM kernels cuBLAS picks for large shapes (128x128 thread-block tiles; NVIDIA "Matrix
# Multiplication Background" user guide, "Tile Quantization") and the inner size at which a GEMM is
# half as efficient as a long one. The large-GEMM ceiling is the accelerator's `gemm_efficiency`.
GEMM_TILE = 128
GEMM_K_HALF = 64
# Fraction of HBM bandwidth element-wise kernels (norms, dropout, softmax, optimizer) sustain
# (STREAM-like copies reach 80-90% of HBM peak; fused PyTorch kernels somewhat less).
ELEMENTWISE_BW_EFFICIENCY = 0.7
# Element-wise traffic relative to Megatron's fused kernels (fused layernorm, bias-GeLU, bias-dropout-
# add, softmax): an eager PyTorch model under FSDP (seed 002: a Hugging Face Llama) runs RMSNorm,
# RoPE and SwiGLU as several unfused kernels each, reading and writing the activations ~2x as often.
UNFUSED_TRAFFIC = {"megatron-deepspeed": 1.0, "megatron-lm": 1.0, "fsdp": 2.0}
# Share of the ZeRO-3/FSDP gathers hidden under compute by prefetching (seed 002: FSDP overlaps
# all-gathers with the forward/backward).
SHARDED_OVERLAP = 0.8


@dataclass(frozen=True, slots=True, kw_only=True)
class CostParams:
    """The cost model's efficiency factors: what `tune` refits from measured probes."""

    compute_scale: float = 1.0
    """multiplies compute time (measured/predicted for compute-bound probes)"""
    comm_scale: float = 1.0
    """multiplies communication time"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    compute_s: float
    """pipeline-critical-path compute of the step, bubble excluded"""
    tp_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    """exposed (not overlapped) DP / ZeRO / FSDP communication"""
    optimizer_s: float
    step_time_s: float
    model_flops: float
    hardware_flops: float
    cp_comm_s: float = 0.0
    """exposed ring-attention K/V exchange (context parallel)"""
    ep_comm_s: float = 0.0
    """MoE all-to-all dispatch and combine (expert parallel)"""


def gemm_efficiency(m: int, n: int, k: int, *, batch: int, sm_count: int, base: float) -> float:
    """Fraction of peak for an (m x k) @ (k x n) GEMM repeated ``batch`` times.

    Tile quantization: tiles of GEMM_TILE^2 waste the part of the last tile outside the matrix;
    wave quantization: tiles run in waves of ``sm_count``, the last wave partly idle (NVIDIA
    "Matrix Multiplication Background" user guide, sections "Tile/Wave Quantization"); short
    inner dimensions cannot hide load latency: k / (k + GEMM_K_HALF).
    """
    tiles_m, tiles_n = math.ceil(m / GEMM_TILE), math.ceil(n / GEMM_TILE)
    tile_eff = (m * n) / (tiles_m * tiles_n * GEMM_TILE * GEMM_TILE)
    tiles = tiles_m * tiles_n * batch
    wave_eff = tiles / (math.ceil(tiles / sm_count) * sm_count)
    return base * tile_eff * wave_eff * k / (k + GEMM_K_HALF)


def _gemm_s(m: int, n: int, k: int, peak: float, sm: int, base: float, batch: int = 1) -> float:
    return 2.0 * m * n * k * batch / (peak * gemm_efficiency(m, n, k, batch=batch, sm_count=sm, base=base))


def layer_forward_s(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    base: float) -> tuple[float, float, float]:
    """(matmul seconds, attention-core seconds, element-wise seconds) of one layer's forward for one micro-batch."""
    acc = cluster.gpu
    peak, sm = acc.peak_flops(training.precision), acc.sm_count
    t, s, b, h = cand.tp, model.seq_len, cand.mbs, model.hidden
    tokens = s * b
    ffn_out = model.ffn_hidden * (2 if model.glu else 1)
    dense = (_gemm_s(tokens, (h + 2 * model.kv_dim) // t, h, peak, sm, base)
             + _gemm_s(tokens, h, h // t, peak, sm, base)
             + _gemm_s(tokens, ffn_out // t, h, peak, sm, base)
             + _gemm_s(tokens, h, model.ffn_hidden // t, peak, sm, base))
    heads = b * max(1, model.heads // t)
    d = model.head_dim
    peak = acc.peak_flops(fp8.compute_precision(training.precision))   # the attention core never runs in FP8
    core = _gemm_s(s, s, d, peak, sm, base, heads) + _gemm_s(s, d, s, peak, sm, base, heads)
    # element-wise traffic, bytes (16-bit): 2 norms r/w 8·Th, 2 bias-dropout-add 14·Th (both split by SP),
    # Q/K/V and context layout copies between [s,b,a,d] and [b·a,s,d] 16·Th/t, activation r/w 4·T·f/t
    # (6 with GLU), scale-mask-softmax + dropout on scores 9·b·a·s²/t without flash
    th = tokens * h
    elementwise = (22 * th / (t if cand.sp else 1) + 16 * th / t
                   + (6 if model.glu else 4) * tokens * model.ffn_hidden / t)
    if not training.flash_attention:
        elementwise += 9 * b * model.heads * s * s / t
    elementwise += fp8.cast_traffic_bytes(model, cand, training.precision, tokens)   # FP8 quantization of GEMM inputs
    elementwise *= UNFUSED_TRAFFIC[training.framework]
    return dense, core, elementwise / (acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)


def estimate_time(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                  topology: Topology, params: CostParams = CostParams()) -> TimeBreakdown:
    acc = cluster.gpu
    base = cluster.matmul_efficiency or acc.gemm_efficiency   # a calibration file's measurement wins
    peak, sm = acc.peak_flops(fp8.compute_precision(training.precision)), acc.sm_count   # LM head: bf16 under FP8
    tokens = model.seq_len * cand.mbs // cand.cp   # tokens on one CP rank
    half = 2 if training.precision in ("bf16", "fp16", "fp8") else 4

    dense, core, elem = context_parallel.layer_forward_s(layer_forward_s, model, cand, cluster, training, base)
    gemm_peak = acc.peak_flops(training.precision)   # MoE expert GEMMs run at the FP8 peak under FP8
    dense += moe.mlp_time_adjustment_s(model, cand, training, tokens, lambda m, n, k, batch=1: _gemm_s(
        m, n, k, gemm_peak, sm, base, batch))   # MoE: grouped expert GEMMs instead of the dense MLP
    elem += moe.elementwise_extra_bytes(model, cand, training, tokens) * UNFUSED_TRAFFIC[training.framework] / (
        acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)   # MoE: token permutation, expert activations
    fwd = dense + core + elem
    extra = fwd if cand.recompute == "full" else (core if cand.recompute == "selective" else 0.0)
    layer_s = 3 * (dense + core) + 3 * elem + extra   # backward = 2x forward (seed 001 "forward vs backward")

    # TP: 2 all-reduces forward, 2 backward, 2 more when the forward is recomputed (Megatron Sec. 3.1)
    tp_msgs = 4 + (2 if cand.recompute == "full" else 0)
    tp_link = topology.tp_link(cand.tp)
    tp_layer_s = tp_msgs * collective_time_s(tp_link, kind="all_reduce", message_bytes=tokens * model.hidden * half,
                                             group=cand.tp) * params.comm_scale
    # CP: ring attention's exposed K/V exchange (CP group strides by TP); EP: MoE all-to-all (EP group strides by ETP)
    cp_layer_s = context_parallel.ring_exchange_exposed_s(model, cand, training, cand.cp > 1 and topology.dp_link(
        cand.tp, cand.cp), collective_time_s, core, half) * params.comm_scale
    ep_layer_s = moe.all_to_all_layer_s(model, cand, training, tokens, cand.ep > 1 and topology.dp_link(
        cand.etp, cand.ep), collective_time_s, half) * params.comm_scale

    lps = layers_per_stage(model, cand.pp)
    # LM head GEMM (forward + 2x backward) and the cross-entropy over the logits: ~6 bytes per logit
    # read and written (16-bit logits, fp32 softmax), forward and backward (Megatron's vocab-parallel loss)
    logits_s = 3 * _gemm_s(tokens, model.vocab // cand.tp, model.hidden, peak, sm, base)
    logits_s += 3 * 6 * tokens * model.vocab / cand.tp / (acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)
    first_stage = lps * layer_s
    last_stage = lps * layer_s + logits_s
    if cand.pp == 1:
        stage_compute = first_stage + logits_s
    else:
        stage_compute = max(first_stage, last_stage)
    stage_compute *= params.compute_scale
    stage_tp = lps * tp_layer_s
    stage_cp, stage_ep = lps * cp_layer_s, lps * ep_layer_s

    # p2p between stages: activation forward, its gradient backward; Megatron's scatter-gather sends 1/t
    p2p = 0.0
    if cand.pp > 1:
        pp_link = topology.pp_link(cand.tp, cand.dp, cand.pp)
        p2p = 2 * cand.vpp * collective_time_s(pp_link, kind="send", message_bytes=tokens * model.hidden * half
                                               / cand.tp, group=2) * params.comm_scale

    slot = stage_compute + stage_tp + stage_cp + stage_ep + p2p
    bubble_slots = (cand.pp - 1) / cand.vpp
    compute_s = cand.gas * stage_compute
    tp_s = cand.gas * stage_tp
    cp_s, ep_s = cand.gas * stage_cp, cand.gas * stage_ep
    pp_p2p_s = cand.gas * p2p
    bubble_s = bubble_slots * slot

    # DP / ZeRO / FSDP
    params_gpu = max(stage_params(model, cand, s) for s in (("only",) if cand.pp == 1 else ("first", "last")))
    shard = shard_group_size(cand, cluster.gpus_per_node)
    dp_link = topology.dp_link(cand.tp, cand.dp * cand.cp)   # gradients reduce over DP x CP (tp-cp-dp rank order)
    grad_bytes = params_gpu * half
    dp_s = 0.0
    if cand.dp * cand.cp > 1:
        if cand.zero >= 3:
            shard_link = topology.dp_link(cand.tp, shard)   # HYBRID_SHARD: the shard group stays inside a node
            gather = collective_time_s(shard_link, kind="all_gather", message_bytes=grad_bytes, group=shard)
            scatter = collective_time_s(shard_link, kind="reduce_scatter", message_bytes=grad_bytes, group=shard)
            comm = cand.gas * (2 * gather + scatter)
            if cand.hybrid and cand.dp > shard:
                inter = topology.dp_link(cand.tp * shard, cand.dp // shard)
                comm += collective_time_s(inter, kind="all_reduce", message_bytes=grad_bytes / shard,
                                          group=cand.dp // shard)
            comm *= params.comm_scale
            dp_s = max(comm * (1 - SHARDED_OVERLAP), comm - compute_s)
        else:
            # all-reduce (ZeRO-0) or reduce-scatter + all-gather (ZeRO-1/2): the same bus traffic,
            # after the last micro-batch's backward (DeepSpeed's pipeline engine and Megatron's DDP)
            dp_s = collective_time_s(dp_link, kind="all_reduce", message_bytes=grad_bytes,
                                     group=cand.dp * cand.cp) * params.comm_scale
            if training.framework == "fsdp":
                dp_s = max(dp_s * (1 - SHARDED_OVERLAP), dp_s - compute_s)

    edp = moe.expert_data_parallel(cand)   # routed-expert gradients: their own reduce over the expert-DP group
    dp_s += moe.expert_grad_reduce_s(model, cand, lps, moe.is_moe(model) and edp > 1 and topology.dp_link(
        cand.etp * cand.ep, edp), collective_time_s, half) * params.comm_scale
    pb = param_bytes(training.precision, training.optimizer)
    shard_opt = shard if cand.zero >= 1 else 1
    opt_bytes = params_gpu / shard_opt * (2 * (pb.master + pb.optimizer) + pb.grads + pb.weights)
    opt_bytes += moe.expert_params_on_gpu(model, cand, lps) / (edp if cand.zero >= 1 else 1) * (
        2 * (pb.master + pb.optimizer) + pb.grads + pb.weights)
    optimizer_s = opt_bytes / (acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)

    step = compute_s + tp_s + cp_s + ep_s + pp_p2p_s + bubble_s + dp_s + optimizer_s
    gbs = cand.global_batch
    return TimeBreakdown(compute_s=compute_s, tp_comm_s=tp_s, pp_bubble_s=bubble_s, pp_p2p_s=pp_p2p_s,
                         dp_comm_s=dp_s, optimizer_s=optimizer_s, step_time_s=step, cp_comm_s=cp_s, ep_comm_s=ep_s,
                         model_flops=flops.model_flops_per_iteration(model, gbs),
                         hardware_flops=flops.hardware_flops_per_iteration(model, gbs, cand.recompute))


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    days_to_train: float | None
    gpu_hours_to_train: float | None


def throughput(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
               time: TimeBreakdown) -> Throughput:
    world = cand.world
    peak = cluster.gpu.peak_flops(fp8.compute_precision(training.precision))   # MFU against the bf16 peak under FP8
    model_tflops = flops.tflops_per_gpu(time.model_flops, time.step_time_s, world)
    hw_tflops = flops.tflops_per_gpu(time.hardware_flops, time.step_time_s, world)
    samples = cand.global_batch / time.step_time_s
    tokens = samples * model.seq_len
    days = hours = None
    if training.train_tokens:
        seconds = training.train_tokens / tokens
        days, hours = seconds / 86400, seconds * world / 3600
    return Throughput(samples_per_s=samples, tokens_per_s=tokens, model_tflops_per_gpu=model_tflops,
                      hardware_tflops_per_gpu=hw_tflops, mfu=model_tflops * 1e12 / peak,
                      hfu=hw_tflops * 1e12 / peak, days_to_train=days, gpu_hours_to_train=hours)
