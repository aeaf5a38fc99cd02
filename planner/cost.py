"""Step time, throughput and TFLOPs for one candidate: small pure functions, one TimeBreakdown.

Model: every GEMM of a layer timed at peak x a GEMM efficiency that penalises tile and wave
quantization and short inner dimensions; memory-bound element-wise work timed at HBM bandwidth;
TP all-reduces on the TP group's link, not overlapped (Megatron); 1F1B pipeline with its bubble
(m + p - 1 micro-batch slots, interleaving divides the bubble by v) and p2p sends; DP gradient
all-reduce or ZeRO/FSDP gathers on the DP group's bottleneck link, overlapped only where the
framework overlaps; optimizer step at HBM bandwidth. FLOPs come from `planner.flops` only; what
each framework does differently (p2p splitting, per-micro-batch cost, stage balancing, ZeRO traffic,
host launch time, vocabulary padding) from `planner.framework`. Validated on every published dev table
by `python tests/bench/validate.py`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from planner import context_parallel, flops, fp8, fsdp_parallel, moe, pipeline_engine, recompute
from planner.framework import Framework, get_framework, padded_vocab
from planner.hardware import ClusterSpec
from planner.memory import layers_per_stage, param_bytes, shard_group_size, stage_params, training_param_bytes
from planner.model import ModelSpec
from planner.pipeline_split import megatron_lm_split
from planner.space import Candidate, TrainingSpec
from planner.topology import Topology, collective_time_s

# Tile of the GEMM kernels cuBLAS picks for large shapes (128x128 thread-block tiles; NVIDIA "Matrix
# Multiplication Background" user guide, "Tile Quantization").
GEMM_TILE = 128
# Inner size at which a GEMM is half as efficient as a long one (k / (k + GEMM_K_HALF)): short inner
# dimensions cannot hide load latency. FITTED by hand on Megatron-LM 2021 Table 1 and Korthikanti 2022
# Table 5 (small-hidden rows), checked on seed 003 (hidden 2048).
GEMM_K_HALF = 64
# 16-bit tensor-core GEMMs want every dimension a multiple of 8 elements (NVIDIA "Matrix Multiplication
# Background" user guide, "Tensor Core Requirements"). The attention's batched GEMMs (QK^T, AV) over a
# head_dim that is not are modelled at the CUDA-core FP32 rate (datasheet `peak_fp32_flops`): checked on
# the BLOOM tr11 NHEADS table (head_dim 108 = 13824/128 ran 1.30x slower than head_dim 144) and the 02-20
# tables (head_dim 150). Dense GEMMs with h/TP not a multiple of 8 (tr8-104B at TP4: 2900) ran within the
# noise of aligned ones; dense GEMMs with an odd-sized dimension (a vocabulary of 50257 unpadded) run at
# about half speed: nanoGPT (karpathy/nanoGPT model.py, "vocab_size ... padded up to nearest multiple of
# 64 for efficiency") measured ~25% faster GPT-2 training from 50257 -> 50304, the LM head being ~30% of
# the FLOPs; also the DeepSpeed autotuning HF GPT-2 dev tables.
TENSOR_CORE_MULTIPLE = 8
DENSE_ALIGNMENT, DENSE_MISALIGNED_EFFICIENCY = 4, 0.5
# Fraction of HBM bandwidth element-wise kernels (norms, dropout, softmax, optimizer) sustain: copy
# kernels reach 80-90% of HBM peak (BabelStream results on V100/A100), fused PyTorch kernels less.
# FITTED by hand on seed 003's V100 tables (no-recompute vs recompute rows) and Korthikanti 2022 Table 5.
ELEMENTWISE_BW_EFFICIENCY = 0.7
# Share of the ZeRO-3/FSDP gathers hidden under compute by prefetching (Zhao et al. 2023, PyTorch FSDP,
# arXiv 2304.11277 Sec. 3.3: forward/backward prefetch overlaps the next all-gather with this layer's
# compute). FITTED by hand on the torchtitan and fms-fsdp dev tables and Narayanan 2021 Table 2 ZeRO-3
# rows (where communication dominates and the compute hides under it).
SHARDED_OVERLAP = 0.8
# Bytes per logit the cross-entropy reads and writes, forward and backward: 16-bit logits read, fp32
# softmax written and read back, 16-bit gradient written (Megatron's vocab-parallel cross-entropy).
LOSS_BYTES_PER_LOGIT = 6


# How far apart two candidates' predictions must be before the ranking between them means something:
# the spread of predicted/measured throughput inside one table of published runs (sd of the log ratio,
# 0.096 over the 30 dev tables: `python tests/bench/validate.py`). Closer candidates are tied.
RANKING_ERROR = 0.10


def tied(best_step_s: float, step_s: float) -> bool:
    """``step_s`` is within the model's measured ranking error of the best prediction."""
    return step_s <= best_step_s * (1 + RANKING_ERROR)


@dataclass(frozen=True, slots=True)
class GemmContext:
    """What a GEMM's time depends on besides its shape."""

    peak: float
    sm_count: int
    base: float
    """large-GEMM fraction of peak: the catalog's, or fitted to this machine's timed GEMMs (planner.calibration)"""
    cuda_core_ratio: float
    """CUDA-core rate / tensor-core peak, for shapes tensor cores cannot take"""


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
    pp_overhead_s: float = 0.0
    """the framework's fixed per-micro-batch cost inside pp_p2p_s (neither compute nor comm: CostParams leave it)"""
    bubble_overhead_s: float = 0.0
    """the same cost inside pp_bubble_s (its share of the bubble's slots)"""
    tied_embedding_s: float = 0.0
    """inside dp_comm_s: the tied word embedding's gradient all-reduce between the first and last stages"""
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


@functools.lru_cache(maxsize=1 << 16)   # pure: a plan asks for a few hundred shapes, tens of thousands of times
def _gemm_s(m: int, n: int, k: int, g: GemmContext, batch: int = 1, attention: bool = False) -> float:
    if min(m, n, k) <= 0:  # a dimension split to nothing (vocab 1 over TP 2) does no work
        return 0.0
    eff = gemm_efficiency(m, n, k, batch=batch, sm_count=g.sm_count, base=g.base)
    if attention and (n % TENSOR_CORE_MULTIPLE or k % TENSOR_CORE_MULTIPLE):
        eff = min(eff, g.base) * g.cuda_core_ratio
    elif n % DENSE_ALIGNMENT or k % DENSE_ALIGNMENT:
        eff *= DENSE_MISALIGNED_EFFICIENCY
    return 2.0 * m * n * k * batch / (g.peak * eff)


def gemm_context(cluster: ClusterSpec, training: TrainingSpec, precision: str | None = None) -> GemmContext:
    """GEMMs at ``precision``'s peak (default the training's; FP8 runs the attention core and LM head in bf16)."""
    acc = cluster.gpu
    precision = precision or training.precision
    peak = acc.peak_flops(precision)
    base = acc.gemm_efficiency if cluster.matmul_efficiency is None else cluster.matmul_efficiency
    if precision == "fp8":
        base *= fp8.gemm_rate_factor(training)   # torchao rowwise float8
    ratio = min(1.0, acc.peak_fp32_flops / peak) if precision in ("bf16", "fp16", "fp8") else 1.0
    return GemmContext(peak=peak, sm_count=acc.sm_count, base=base, cuda_core_ratio=ratio)


def layer_forward_s(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    g: GemmContext, fw: Framework) -> tuple[float, float, float]:
    """(matmul seconds, attention-core seconds, element-wise seconds) of one layer's forward for one micro-batch."""
    acc = cluster.gpu
    t, s, b, h = cand.tp, model.seq_len, cand.mbs, model.hidden
    tokens = s * b
    ffn_out = model.ffn_hidden * (2 if model.glu else 1)
    dense = (_gemm_s(tokens, (model.q_dim + 2 * model.kv_dim) // t, h, g)
             + _gemm_s(tokens, h, model.q_dim // t, g)
             + _gemm_s(tokens, ffn_out // t, h, g)
             + _gemm_s(tokens, h, model.ffn_hidden // t, g))
    heads = b * max(1, model.heads // t)
    d = model.head_dim
    if training.precision == "fp8":   # the attention core never runs in FP8 (Transformer Engine)
        g = gemm_context(cluster, training, fp8.compute_precision(training.precision))
    core = _gemm_s(s, s, d, g, heads, attention=True) + _gemm_s(s, d, s, g, heads, attention=True)
    # element-wise traffic, bytes (16-bit): 2 norms r/w 8·Th, 2 bias-dropout-add 14·Th (both split by SP),
    # Q/K/V and context layout copies between [s,b,a,d] and [b·a,s,d] 16·Th/t, activation r/w 4·T·f/t
    # (6 with GLU), scale-mask-softmax + dropout on scores 9·b·a·s²/t without flash
    th = tokens * h
    elementwise = (22 * th / (t if cand.sp else 1) + 16 * th / t
                   + (6 if model.glu else 4) * tokens * model.ffn_hidden / t)
    if not training.flash_attention:
        elementwise += 9 * b * model.heads * s * s / t
    # FP8 quantization of the GEMM inputs
    elementwise += fp8.cast_traffic_bytes(model, cand, training.precision, tokens, training.fp8_recipe)
    elementwise *= fw.elementwise_traffic
    return dense, core, elementwise / (acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)


def layer_key(cand: Candidate) -> tuple:
    """The candidate fields `layer_compute_s` reads: plan() computes it once per distinct key."""
    return (cand.tp, cand.sp, cand.mbs, cand.cp, cand.ep, cand.etp, *recompute.time_key(cand))


def layer_compute_s(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    ) -> tuple[float, float]:
    """(attention-core forward, forward + backward + recompute) seconds of one layer for one micro-batch on one CP
    rank: what reads only the candidate's `layer_key`."""
    acc = cluster.gpu
    fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)   # torch.compile
    g = gemm_context(cluster, training)
    tokens = model.seq_len * cand.mbs // cand.cp   # tokens on one CP rank
    dense, core, elem = context_parallel.layer_forward_s(layer_forward_s, model, cand, cluster, training, g, fw)
    # MoE: grouped expert GEMMs (at the FP8 peak under FP8) instead of the dense MLP
    dense += moe.mlp_time_adjustment_s(model, cand, training, tokens,
                                       lambda m, n, k, batch=1: _gemm_s(m, n, k, g, batch))
    elem += moe.elementwise_extra_bytes(model, cand, training, tokens) * fw.elementwise_traffic / (
        acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)   # MoE: token permutation, expert activations
    # the host launches a layer's kernels asynchronously: a pass takes the longer of the GPU's work and
    # the host's (framework.host_s_per_layer_forward, times this host's measured speed from a calibration, 1 without;
    # the backward launches about twice as many kernels)
    host = fw.host_s_per_layer_forward * cluster.host_scale
    # MoE: the dispatcher's host sync; what is launched after it runs at the longer of its GPU and host time
    sync_host, sync_gpu = moe.host_sync_s(model, cand, training, tokens,
                                          lambda m, n, k, batch=1: _gemm_s(m, n, k, g, batch))
    fwd = max(dense + core + elem - sync_gpu, host) + max(sync_gpu, sync_host)
    rc = recompute.recomputed_of(model, cand, training.framework)   # full, block-N, selective, op-level SAC ...
    extra = rc.layers * fwd + rc.core * core + rc.matmul * dense
    # backward = 2x forward (seed 001 "forward vs backward"); it launches the experts' kernels without a sync
    layer_s = fwd + max(2 * (dense + core + elem), 2 * (host + sync_host)) + extra
    return core, layer_s


def estimate_time(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                  topology: Topology, params: CostParams = CostParams(),
                  layer_memo: dict | None = None) -> TimeBreakdown:
    """One candidate's step time, by term. ``layer_memo``: a dict plan() keeps for one plan, `layer_compute_s` by
    `layer_key` (the same floats, computed once)."""
    acc = cluster.gpu
    fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)   # torch.compile
    g16 = gemm_context(cluster, training, fp8.compute_precision(training.precision))   # LM head: bf16 under FP8
    tokens = model.seq_len * cand.mbs // cand.cp   # tokens on one CP rank
    half = 2 if training.precision in ("bf16", "fp16", "fp8") else 4
    if layer_memo is None:
        core, layer_s = layer_compute_s(model, cand, cluster, training)
    else:
        key = layer_key(cand)
        parts = layer_memo.get(key)
        if parts is None:
            parts = layer_memo[key] = layer_compute_s(model, cand, cluster, training)
        core, layer_s = parts

    # TP: 2 all-reduces forward, 2 backward, 2 more when the forward is recomputed (Megatron Sec. 3.1)
    rc = recompute.recomputed_of(model, cand, training.framework)
    tp_msgs = 4 + 2 * rc.layers
    tp_link = topology.tp_link(cand.tp)
    tp_layer_s = tp_msgs * collective_time_s(tp_link, kind="all_reduce", message_bytes=tokens * model.hidden * half,
                                             group=cand.tp) * params.comm_scale
    tp_layer_s *= fsdp_parallel.tp_exposed_fraction(training)   # torchtitan async TP
    # CP: ring attention's exposed K/V exchange (CP group strides by TP); EP: MoE all-to-all (EP group strides by ETP)
    cp_layer_s = context_parallel.ring_exchange_exposed_s(model, cand, training, cand.cp > 1 and topology.dp_link(
        cand.tp, cand.cp), collective_time_s, core, half) * params.comm_scale
    ep_layer_s = moe.all_to_all_layer_s(model, cand, training, tokens, topology, collective_time_s,
                                        half) * params.comm_scale

    lps = layers_per_stage(model, cand.pp)
    # LM head GEMM (forward + 2x backward) over the padded vocabulary, and the cross-entropy over the logits
    vocab_t = padded_vocab(model.vocab, cand.tp, fw) // cand.tp
    logits_s = 3 * _gemm_s(tokens, vocab_t, model.hidden, g16)
    logits_s += 3 * LOSS_BYTES_PER_LOGIT * tokens * vocab_t / (acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)
    # MTP modules (DeepSeek-V3) on the last stage: a (mean) layer and a second LM head each (moe.mtp_forward_flops)
    logits_s += model.mtp_layers * (layer_s + logits_s)
    split = megatron_lm_split(model.layers, cand.pp, cand.vpp) if training.framework == "megatron-lm" else None
    if cand.pp == 1:
        stage_compute = lps * layer_s + logits_s
    elif split is not None:   # the busiest rank of the split Megatron-LM runs (the last also runs the LM head)
        stage_compute = max(split.first * layer_s, split.middle * layer_s, split.last * layer_s + logits_s)
        lps = split.busiest
    elif fw.balances_stages:   # DeepSpeed's PipelineModule partition (planner.pipeline_engine)
        stage_compute, lps = pipeline_engine.stage_compute_s(model.layers, cand.pp, layer_s, logits_s)
    else:
        stage_compute = lps * layer_s + logits_s   # the last stage: its layers and the LM head
    params_gpu = max(stage_params(model, cand, s, training.framework)
                     for s in (("only",) if cand.pp == 1 else ("first", "last")))
    if fw.deepspeed_engine and cand.zero <= 1:   # DeepSpeed adds each micro-batch's gradients (planner.pipeline_engine)
        stage_compute += pipeline_engine.grad_accumulation_s(
            params_gpu, training.precision, acc.memory_bw_bytes_per_s * ELEMENTWISE_BW_EFFICIENCY)
    stage_compute *= params.compute_scale
    stage_tp = lps * tp_layer_s
    stage_cp, stage_ep = lps * cp_layer_s, lps * ep_layer_s

    # p2p between stages: activation forward, its gradient backward; Megatron's scatter-gather sends 1/t,
    # DeepSpeed's pipeline engine the activation as 1/t and the gradient whole (planner.framework)
    p2p = overhead = 0.0
    if cand.pp > 1:
        pp_link = topology.pp_link(cand.tp, cand.dp * cand.cp, cand.pp)
        act = tokens * model.hidden * half
        sends = (act / cand.tp if fw.p2p_activation_split else act) + (act / cand.tp if fw.p2p_grad_split else act)
        p2p = cand.vpp * collective_time_s(pp_link, kind="send", message_bytes=sends, group=2) * params.comm_scale
        if fw.deepspeed_engine:   # blocking send and receive, one after the other (planner.pipeline_engine)
            p2p *= pipeline_engine.p2p_serialization(cand.pp)
        # the framework's cost per micro-batch and stage (DeepSpeed's partitioned-activation pipeline, TP > 1)
        if cand.tp > 1:
            overhead = fw.microbatch_overhead_s
            p2p += overhead

    slot = stage_compute + stage_tp + stage_cp + stage_ep + p2p
    # (PP-1)/VPP slots (1F1B, interleaved); torchtitan's zero-bubble schedules fewer
    bubble_slots = fsdp_parallel.bubble_slots(fsdp_parallel.schedule(cand, training), cand.pp, cand.vpp, cand.recompute)
    compute_s = cand.gas * stage_compute
    tp_s = cand.gas * stage_tp
    cp_s, ep_s = cand.gas * stage_cp, cand.gas * stage_ep
    pp_p2p_s = cand.gas * p2p
    bubble_s = bubble_slots * slot

    # DP / ZeRO / FSDP
    shard = shard_group_size(cand, cluster.gpus_per_node)
    dp_link = topology.dp_link(cand.tp, cand.dp * cand.cp)   # gradients reduce over DP x CP (tp-cp-dp rank order)
    grad_bytes = params_gpu * half
    dp_s = 0.0
    if cand.dp * cand.cp > 1:
        if cand.zero >= 3:
            shard_link = topology.dp_link(cand.tp, shard)   # HYBRID_SHARD: the shard group stays inside a node
            if fw.sharded_gather_per_rail and shard_link.kind == "inter":
                shard_link = topology.rail_link(shard_link)
            gather = collective_time_s(shard_link, kind="all_gather", message_bytes=grad_bytes, group=shard)
            scatter = collective_time_s(shard_link, kind="reduce_scatter", message_bytes=grad_bytes, group=shard)
            # parameters all-gathered for the forward and again for the backward, gradients reduce-scattered
            # (Rajbhandari et al. 2020, ZeRO, Sec. 7.2.2: 3x the parameters per step), per micro-batch; a
            # recomputed forward gathers them once more (checkpointed layers re-run their forward; torchtitan
            # under PP: once per step)
            gathers, scatters = fsdp_parallel.sharded_collectives(cand, training, rc.layers)
            comm = gathers * gather + scatters * scatter
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
            bf16_optimizer = pipeline_engine.bf16_optimizer_dp_traffic(training)   # the bigscience fork under bf16
            if bf16_optimizer is not None:
                dp_s *= bf16_optimizer
            else:
                dp_s *= (fw.zero12_traffic if cand.zero >= 1 else 1.0) * dp_traffic_factor(cand, training, half)
            if dp_link.kind == "inter":
                dp_s /= fw.dp_inter_node_efficiency
            if training.framework == "fsdp":
                dp_s = max(dp_s * (1 - SHARDED_OVERLAP), dp_s - compute_s)

    # tied input/output embeddings under PP: the first and last stages all-reduce the word embedding's gradient
    # every step, after the backward, not overlapped (Megatron-LM _allreduce_embedding_grads; DeepSpeed
    # PipelineModule.allreduce_tied_weight_gradients); the two stages are (PP-1)·TP·DP ranks apart
    tied_s = 0.0
    if model.tied_embeddings and cand.pp > 1:
        emb_bytes = padded_vocab(model.vocab, cand.tp, fw) // cand.tp * model.hidden * pipeline_engine.reduce_bytes(
            training, half)   # BF16_Optimizer all-reduces the fp32 gradient
        tied_link = topology.strided_link((cand.pp - 1) * cand.tp * cand.cp * cand.dp, 2)
        tied_s = collective_time_s(tied_link, kind="all_reduce", message_bytes=emb_bytes, group=2) * params.comm_scale
        dp_s += tied_s

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
                         dp_comm_s=dp_s, optimizer_s=optimizer_s, step_time_s=step,
                         model_flops=flops.model_flops_per_iteration(model, gbs),
                         hardware_flops=flops.hardware_flops_per_iteration(model, gbs, rc),
                         pp_overhead_s=cand.gas * overhead, bubble_overhead_s=bubble_slots * overhead,
                         tied_embedding_s=tied_s, cp_comm_s=cp_s, ep_comm_s=ep_s)


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


def dp_traffic_factor(cand: Candidate, training: TrainingSpec, half: int) -> float:
    """Data-parallel bus bytes relative to a 16-bit gradient all-reduce. Megatron-LM reduces its main-grad buffer as
    it keeps it: fp32 under bf16/FP8 unless --grad-reduce-in-bf16 (arguments.py accumulate_allreduce_grads_in_fp32 ->
    DistributedDataParallelConfig.grad_reduce_in_fp32); the distributed optimizer then all-gathers the 16-bit (or,
    with --fp8-param-gather, FP8) weights: ZeRO-0 reduce/half, ZeRO-1/2 (reduce + gather) / (2·half)."""
    # the main-grad buffer as memory counts it (fp16: 2 bytes; bf16: 4 unless --grad-reduce-in-bf16)
    reduce = training_param_bytes(training).grads if training.framework == "megatron-lm" else half
    if cand.zero == 0:
        return reduce / half
    return (reduce + fp8.param_gather_bytes(cand, training, half)) / (2 * half)
