"""Step time, throughput and TFLOPs for one candidate: a list of named terms (`TERMS`) over one `StepContext`.

The step is the sum of `TERMS` (planner.terms: each a small pure function ``seconds(ctx)``, with its kind, the
breakdown line it adds to, whether it fills a pipeline slot, what it can hide under and the flag that turns that on,
its source and the fitted constants it reads from planner.constants). `estimate_time` builds the context once
(`step_context`: the layer's compute, the busiest stage, its parameters, the DP traffic), evaluates every term,
and sums them (`planner.terms.StepTime`); `TimeBreakdown`'s lines, `--explain`'s term table, the JSON and `tune`'s
refit (search.calibration) all read that one list. A new term: a function here or in its feature's module
(context_parallel.RING_EXCHANGE, moe.ALL_TO_ALL, moe.EXPERT_GRAD_REDUCE), a `Term` declaration, one entry in TERMS.

Physics: every GEMM of a layer timed at peak x a GEMM efficiency that penalises tile and wave quantization and short
inner dimensions; memory-bound element-wise work at HBM bandwidth; TP all-reduces on the TP group's link; 1F1B with
its bubble (m + (p - 1) / v slots) and p2p sends; DP gradient reduction or ZeRO/FSDP gathers on the DP group's
bottleneck link; overlaps where the framework makes them (FSDP prefetch; Megatron-LM's --overlap-grad-reduce,
--overlap-param-gather, --tp-comm-overlap, interleaved p2p: `TrainingSpec.overlap`); the optimizer step at HBM
bandwidth. FLOPs come from `planner.flops` only; what each framework does differently from `planner.framework`.
Validated on every published dev table by `python tests/bench/validate.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner import attention, context_parallel, cuda_graphs, dualpipe, flops, fp8, fsdp_parallel, moe, offload, ops, pipeline_engine, recompute
from planner.constants import MEGATRON_CHUNK_HOST_S, RANKING_ERROR, SHARDED_OVERLAP
from planner.framework import Framework, get_framework, overlaps, padded_vocab
from planner.hardware import ClusterSpec
from planner.ops import GemmContext, LayerOps, gemm_s
from planner.memory import (layer_params, layers_per_stage, param_bytes, shard_group_size, stage_params,
                            training_param_bytes, with_state_dtype)
from planner.model import ModelSpec
from planner.pipeline_split import megatron_lm_split
from planner.space import Candidate, TrainingSpec
from planner.terms import COMMUNICATION, COMPUTE, FIXED, MEMORY, Overlap, StepTime, Term, evaluate, scale_of
from planner.step_context import StepContext, memoized, memoized_term
from planner.topology import Topology, collective_time_s

# Bytes per logit the cross-entropy reads and writes, forward and backward: 16-bit logits read, fp32
# softmax written and read back, 16-bit gradient written (Megatron's vocab-parallel cross-entropy).
LOSS_BYTES_PER_LOGIT = 6
# torchtitan's cross-entropy on an fp32 copy of the logits (its model's output(h).float() in 2024-04, loss_fn's
# pred.float() from 2024-10; not compiled in 2024-12: "compiling loss function causes CUDA errors"), as eager PyTorch
# runs it, forward + backward per logit: the upcast r2 w4 6, log_softmax over a 128K row (cunn_SoftMaxForward: a max
# pass, a sum-exp pass, a write pass) r4 r4 r4 w4 16, nll_loss_backward's zero-filled fp32 gradient w4 4,
# log_softmax_backward (a sum pass, then r4 r4 w4) 16, the upcast's backward r4 w2 6: 48
FP32_LOSS_BYTES_PER_LOGIT = 48


def fp32_logits(training: TrainingSpec) -> bool:
    """The loss runs on an fp32 copy of the logits: torchtitan (the fsdp framework's default trainer)."""
    return training.framework == "fsdp" and not training.fsdp_trainer


# How far apart two candidates' predictions must be before the ranking between them means something: RANKING_ERROR
# (planner.constants). Closer candidates are tied.


def tied(best_step_s: float, step_s: float) -> bool:
    """``step_s`` is within the model's measured ranking error of the best prediction."""
    return step_s <= best_step_s * (1 + RANKING_ERROR)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostParams:
    """The cost model's efficiency factors: what `tune` refits from measured probes."""

    compute_scale: float = 1.0
    """multiplies compute time (measured/predicted for compute-bound probes)"""
    comm_scale: float = 1.0
    """multiplies communication time"""
    class_scales: tuple[tuple[str, float], ...] = ()
    """(op class, factor) pairs, fitted by tune from probes' profiled seconds by class (search.calibration
    .class_scales): a candidate's compute is scaled by its classes' share-weighted mean (`class_params`), on top
    of compute_scale"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """A candidate's step time by line (each the sum of its `TERMS`), seconds."""

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
    terms: StepTime | None = None
    """the terms every line above is the sum of (`TERMS`): what `tune` caches and refits"""
    params: CostParams = CostParams()
    """the CostParams the lines are under"""


def gemm_context(cluster: ClusterSpec, training: TrainingSpec, precision: str | None = None) -> GemmContext:
    """GEMMs at ``precision``'s peak (default the training's; FP8 runs the attention core and LM head in bf16)."""
    acc = cluster.gpu
    precision = precision or training.precision
    peak = acc.peak_flops(precision)
    base = acc.gemm_efficiency if cluster.matmul_efficiency is None else cluster.matmul_efficiency
    if precision == "fp8":
        base *= fp8.gemm_rate_factor(training)   # torchao rowwise float8
    ratio = min(1.0, acc.peak_fp32_flops / peak) if precision in ("bf16", "fp16", "fp8") else 1.0
    # the fused attention core timed on this machine (tune calibrate): flash attention only (an unfused core is
    # GEMMs and element-wise ops the list already has)
    attention = cluster.attention_efficiency if training.flash_attention else None
    return GemmContext(peak=peak, sm_count=acc.sm_count, base=base, cuda_core_ratio=ratio,
                       attention_efficiency=attention)


def attention_kernel(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> tuple[str, str, str]:
    """(kernel, why, one line for the plan's header) of the attention core this run uses (planner.attention)."""
    fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)   # torch.compile
    kernel, why = attention.default_kernel(training, cluster.gpu, fw.eager)
    g = gemm_context(cluster, training, fp8.compute_precision(training.precision))
    if g.attention_efficiency is not None:
        return kernel, why, (f"attention: {kernel} ({attention.KERNELS[kernel]}; {why}) at "
                             f"{g.attention_efficiency:.3g} of peak, timed by tune calibrate")
    rate = attention.attention_rate(cluster.gpu, kernel, model)
    return kernel, why, attention.describe(kernel, why, rate, model, training.seq_len, cluster.gpu, g.peak)


def attention_context(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, fw: Framework) -> GemmContext:
    """The attention core's rate: the 16-bit GEMMs' (Transformer Engine never runs it in FP8) with the kernel's
    published rate on this GPU (planner.attention) unless `tune calibrate` timed it here (attention_efficiency)."""
    g = gemm_context(cluster, training, fp8.compute_precision(training.precision))
    if g.attention_efficiency is not None:
        return g
    kernel, _ = attention.default_kernel(training, cluster.gpu, fw.eager)
    return replace(g, attention_rate=attention.attention_rate(cluster.gpu, kernel, model))


def op_list_key(cand: Candidate) -> tuple:
    """The candidate fields `layer_op_list` reads: plan() builds one op list per distinct key."""
    return (cand.tp, cand.sp, cand.mbs, cand.cp, cand.ep, cand.etp)


def layer_key(cand: Candidate) -> tuple:
    """The candidate fields `layer_compute_s` reads (the op list's, what recompute re-runs, the chunks a rank runs):
    plan() computes it once per distinct key."""
    return (*op_list_key(cand), *recompute.time_key(cand), cand.pp, cand.vpp)


def chunk_host_s(model: ModelSpec, cand: Candidate, training: TrainingSpec) -> float:
    """Host seconds a layer pays, each forward and each backward, of Megatron-LM's per-chunk schedule work: a
    model-chunk pass (forward_step / backward_step and its P2P posts, megatron/core/pipeline_parallel/schedules.py)
    costs MEGATRON_CHUNK_HOST_S, shared by the chunk's layers: VPP chunks over the rank's layers. Exposed only after
    a host sync (`planner.ops.LayerOps.exposed_chunk_s`)."""
    if training.framework != "megatron-lm":
        return 0.0
    return MEGATRON_CHUNK_HOST_S * cand.vpp / max(1, layers_per_stage(model, cand.pp))


def layer_op_list(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec) -> LayerOps:
    """One layer's operations on one GPU for one micro-batch on one CP rank: the dense layer (planner.ops), edited by
    each feature: multi-latent attention, CP's ring attention, the MoE MLP, FP8's casts."""
    fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)   # torch.compile
    g = gemm_context(cluster, training)
    g_core = attention_context(model, cluster, training, fw)
    rank = context_parallel.rank_model(model, cand.cp) if cand.cp > 1 else model   # s/CP tokens on a CP rank
    tokens = rank.seq_len * cand.mbs
    lo = ops.layer_ops(rank, cand, cluster, training, g, g_core, fw)
    lo = moe.latent_attention_ops(lo, rank, cand, tokens, g, g_core)
    lo = context_parallel.ring_attention(lo, cand, model, cluster, training.framework,
                                         compiled=training.framework == "fsdp" and training.torch_compile)
    lo = moe.expert_ops(lo, rank, cand, training, tokens, g, cluster)
    lo = fp8.cast_ops(lo, rank, cand, training, tokens, cluster)
    return cuda_graphs.graphed_ops(lo, rank, training)   # the MoE router's host work; what CUDA graphs capture


def layer_compute_s(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    memo: dict | None = None) -> tuple[float, float]:
    """(attention-core forward, forward + backward + recompute) seconds of one layer for one micro-batch on one CP
    rank: what reads only the candidate's `layer_key`. The host launches a layer's kernels asynchronously: a pass
    takes the longer of the GPU's work and the host's (`planner.ops.LayerOps.forward_s`). ``memo``: plan()'s dict,
    which keeps the op list by `op_list_key` across recompute modes, and what recompute re-runs by its key."""
    if memo is None:
        lo = layer_op_list(model, cand, cluster, training)
        rc = recompute.recomputed_of(model, cand, training.framework)
    else:   # plan() asks ~10,000 layer keys: the two lookups written out (`memoized`)
        ops_key = ("ops", *op_list_key(cand))
        lo = memo.get(ops_key)
        if lo is None:
            lo = memo[ops_key] = layer_op_list(model, cand, cluster, training)
        rc = recomputed_in(memo, model, cand, training)
    return lo.seconds(ops.ATTENTION), lo.layer_s(rc, chunk_host_s(model, cand, training))


def recomputed_in(memo: dict, model: ModelSpec, cand: Candidate, training: TrainingSpec) -> recompute.Recomputed:
    """`recompute.recomputed_of` ``cand``, once per (recompute, PP, VPP) in plan()'s ``memo``."""
    key = ("recomputed", cand.recompute, cand.pp, cand.vpp)   # full, block-N, selective, op-level SAC
    rc = memo.get(key)
    if rc is None:
        rc = memo[key] = recompute.recomputed_of(model, cand, training.framework)
    return rc


def layer_op_rows(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec) -> list[dict]:
    """`plan --explain`'s op table: one layer's operations (`layer_op_list`) with forward, backward and recomputed
    seconds, share of the layer's time, forward FLOPs and bytes, and a last row for the host's launches when they,
    not the GPU, set the layer's time (`planner.ops.LayerOps.rows`)."""
    return layer_op_list(model, cand, cluster, training).rows(recompute.recomputed_of(model, cand, training.framework),
                                                              chunk_host_s(model, cand, training))


def head_seconds(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, fw: Framework, g16: GemmContext,
                 tokens: int, fp32_loss: bool = False) -> tuple[float, float]:
    """(GEMM, element-wise) seconds of one micro-batch's LM head over the padded vocabulary and its cross-entropy
    over the logits, forward + 2x backward (``fp32_loss``: on an fp32 copy, `fp32_logits`)."""
    vocab_t = padded_vocab(model.vocab, cand.tp, fw) // cand.tp
    loss_bytes = FP32_LOSS_BYTES_PER_LOGIT if fp32_loss else 3 * LOSS_BYTES_PER_LOGIT
    return (3 * gemm_s(tokens, vocab_t, model.hidden, g16),
            loss_bytes * tokens * vocab_t / ops.elementwise_bw(cluster))


OP_CLASSES = (ops.GEMM, ops.ATTENTION, ops.ELEMENTWISE)
"""the op classes the compute term is made of (what `class_seconds` splits it into and CostParams.class_scales scale)"""


def class_seconds(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, *,
                  layers: float, head: bool, layer_memo: dict | None = None) -> dict[str, float]:
    """GPU seconds by op class (`OP_CLASSES`) of one micro-batch through ``layers`` layers -- each op forward,
    backward (2x) and what recompute re-runs (`planner.ops.LayerOps.layer_s`'s GPU side) -- and, with ``head``, the
    LM head (GEMM) and the cross-entropy (element-wise): the compute term's parts, the host's launches left out."""
    lo = memoized(layer_memo, ("ops", *op_list_key(cand)), lambda: layer_op_list(model, cand, cluster, training))
    rc = recompute.recomputed_of(model, cand, training.framework)
    again = {ops.GEMM: rc.matmul, ops.ATTENTION: rc.core, ops.ELEMENTWISE: rc.elementwise}
    out = {c: layers * lo.seconds(c) * (3 + rc.layers + again[c]) for c in OP_CLASSES}
    if head:
        fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)
        g16 = gemm_context(cluster, training, fp8.compute_precision(training.precision))
        head_gemm_s, loss_s = head_seconds(model, cand, cluster, fw, g16, model.seq_len * cand.mbs // cand.cp,
                                           fp32_logits(training))
        out[ops.GEMM] += head_gemm_s
        out[ops.ELEMENTWISE] += loss_s
    return out


def class_params(params: CostParams, model: ModelSpec, cand: Candidate, cluster: ClusterSpec,
                 training: TrainingSpec, layer_memo: dict | None = None) -> CostParams:
    """``params`` with its per-class scales folded into the compute scale for ``cand``: each class's share of a
    stage's compute (`class_seconds` of ceil(L/PP) layers and the LM head) times its scale
    (CostParams.class_scales; unnamed classes 1)."""
    if not params.class_scales:
        return params
    parts = class_seconds(model, cand, cluster, training, layers=layers_per_stage(model, cand.pp), head=True,
                          layer_memo=layer_memo)
    return replace(params, compute_scale=params.compute_scale * class_mix(parts, params.class_scales),
                   class_scales=())


def class_mix(parts: dict[str, float], class_scales: tuple[tuple[str, float], ...]) -> float:
    """The share-weighted mean of the class scales over ``parts`` (seconds by class): 1 when nothing is scaled."""
    total = sum(parts.values())
    if total <= 0:
        return 1.0
    scales = dict(class_scales)
    return sum(v * scales.get(c, 1.0) for c, v in parts.items()) / total


def plan_constants(cluster: ClusterSpec, training: TrainingSpec) -> tuple[Framework, GemmContext, tuple[str, ...]]:
    """What a step's context reads from the cluster and the training alone: the framework as run (torch.compile),
    the LM head's GEMM rate (bf16 under FP8) and the overlaps (one plan computes them once)."""
    fw = fsdp_parallel.runtime_framework(get_framework(training.framework), training)   # torch.compile
    g16 = gemm_context(cluster, training, fp8.compute_precision(training.precision))   # LM head: bf16 under FP8
    return fw, g16, overlaps(training)


def stage_compute(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, fw: Framework,
                  g16: GemmContext, tokens: int, layer_memo: dict | None) -> tuple[float, float, int, float, float]:
    """(attention-core forward, layer, layers on the busiest stage, its compute, LM head and loss) seconds of one
    micro-batch: what reads the candidate's `layer_key`, PP and VPP only."""
    core, layer_s = layer_compute_s(model, cand, cluster, training, layer_memo)
    shape = stage_shape(model, cand, cluster, training, fw, g16, tokens, layer_memo)
    return (core, layer_s, *stage_of(model, cand, training, fw, layer_s, shape))


def stage_shape(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, fw: Framework,
                g16: GemmContext, tokens: int, layer_memo: dict | None) -> tuple:
    """What `stage_of` reads besides the layer's seconds: (ceil(L/PP) layers, the LM head and loss seconds,
    Megatron-LM's split or None), of TP, tokens, PP and VPP only."""
    # LM head GEMM (forward + 2x backward) over the padded vocabulary, and the cross-entropy over the logits
    fp32_loss = fp32_logits(training)
    head_key = ("head_seconds", cand.tp, tokens, fp32_loss)   # TP, tokens, loss dtype
    head = None if layer_memo is None else layer_memo.get(head_key)
    if head is None:
        head = head_seconds(model, cand, cluster, fw, g16, tokens, fp32_loss)
        if layer_memo is not None:
            layer_memo[head_key] = head
    head_gemm_s, loss_s = head
    split = (megatron_lm_split(model.layers, cand.pp, cand.vpp, model.mtp_layers)
             if training.framework == "megatron-lm" else None)
    return layers_per_stage(model, cand.pp), head_gemm_s + loss_s, split


def stage_of(model: ModelSpec, cand: Candidate, training: TrainingSpec, fw: Framework, layer_s: float,
             shape: tuple) -> tuple[int, float, float]:
    """(layers on the busiest stage, its compute, LM head and loss) seconds of one micro-batch from one layer's
    seconds and the stage's `stage_shape`."""
    lps, logits_s, split = shape
    # MTP modules (DeepSeek-V3) on the last stage: a (mean) layer and a second LM head each (moe.mtp_forward_flops)
    logits_s += model.mtp_layers * (layer_s + logits_s)
    if cand.pp == 1:
        stage_compute = lps * layer_s + logits_s
    elif split is not None and training.pp_schedule == dualpipe.DUALPIPE:
        # DualPipe: rank i runs stage i for half the micro-batches and stage PP-1-i for the other half (DeepSeek-V3
        # report Sec. 3.2.1), so an end rank's mean micro-batch is half the first stage's and half the last's
        stage_compute = max(split.middle * layer_s, (split.first * layer_s + split.last * layer_s + logits_s) / 2)
        lps = split.busiest
    elif split is not None:   # the busiest rank of the split Megatron-LM runs (the last also runs the LM head)
        stage_compute = max(split.first * layer_s, split.middle * layer_s, split.last * layer_s + logits_s)
        lps = split.busiest
    elif fw.balances_stages:   # DeepSpeed's PipelineModule partition (planner.pipeline_engine)
        stage_compute, lps = pipeline_engine.stage_compute_s(model.layers, cand.pp, layer_s, logits_s)
    else:
        stage_compute = lps * layer_s + logits_s   # the last stage: its layers and the LM head
    return lps, stage_compute, logits_s


def busiest_stage(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                  layer_memo: dict | None) -> tuple[float, float, int, float, float]:
    """`stage_compute` of ``cand``, once per `layer_key` (which holds PP and VPP) in ``layer_memo`` when given
    (`tflops_ceilings` fills it for the candidates plan() ranks)."""
    key = ("stage_compute", *layer_key(cand))
    found = None if layer_memo is None else layer_memo.get(key)
    if found is not None:   # plan()'s ceilings and scores ask most keys more than once
        return found
    fw, g16, _ = memoized(layer_memo, ("plan_constants",), lambda: plan_constants(cluster, training))
    tokens = model.seq_len * cand.mbs // cand.cp   # tokens on one CP rank
    found = stage_compute(model, cand, cluster, training, fw, g16, tokens, layer_memo)
    if layer_memo is not None:
        layer_memo[key] = found
    return found


def step_context(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                 topology: Topology, layer_memo: dict | None = None) -> StepContext:
    """What every term of ``cand``'s step reads, each part computed once per distinct value of the fields it reads
    when plan() gives its ``layer_memo``."""
    fw, g16, runs_overlaps = memoized(layer_memo, ("plan_constants",), lambda: plan_constants(cluster, training))
    tokens = model.seq_len * cand.mbs // cand.cp   # tokens on one CP rank
    half = 2 if training.precision in ("bf16", "fp16", "fp8") else 4
    core, layer_s, lps, stage_compute_s, logits_s = busiest_stage(model, cand, cluster, training, layer_memo)
    params_gpu = memoized(layer_memo, ("params_gpu", cand.tp, cand.pp, cand.vpp), lambda: max(
        stage_params(model, cand, s, training.framework) for s in (("only",) if cand.pp == 1 else ("first", "last")))
        if dualpipe.parameter_copies(training.pp_schedule, cand.pp) == 1 else   # DualPipe's end ranks hold the first and the last stage
        sum(stage_params(model, cand, s, training.framework, mtp_embedding=False) for s in ("first", "last")))
    shard = shard_group_size(cand, cluster.gpus_per_node)
    rc = recompute.recomputed_of(model, cand, training.framework) if layer_memo is None else \
        recomputed_in(layer_memo, model, cand, training)
    dp_traffic = memoized(   # every field dp_comm_s reads: TP, PP, VPP (params_gpu), DP, CP, ZeRO, hybrid, GAS, rc,
        layer_memo, ("dp_comm", cand.tp, cand.pp, cand.vpp, cand.dp, cand.cp, cand.zero, cand.hybrid, cand.gas,
                     cand.recompute, cand.opt_offload),   # the optimizer offload (FP8 param gather: planner.fp8)
        lambda: dp_comm_s(cand, training, topology, fw, params_gpu * half, shard, half, rc.layers))
    return StepContext(model=model, cand=cand, cluster=cluster, training=training, topology=topology, fw=fw,
                       tokens=tokens, half=half, core_s=core, layer_s=layer_s, rc=rc, stage_layers=lps,
                       stage_compute_s=stage_compute_s, head_s=logits_s, params_gpu=params_gpu, shard=shard,
                       overlaps=runs_overlaps, dp_traffic_s=dp_traffic, memo=layer_memo)


# -- the terms (planner.terms explains the declaration; TERMS below lists them) ------------------------------------
def compute_s(ctx: StepContext) -> float:
    """One micro-batch's GEMMs, attention, element-wise work and host time on the busiest stage; under DualPipe with
    EP, on the SMs its all-to-all kernels leave in the merged chunks (`planner.dualpipe.overlapped_compute_factor`)."""
    cand = ctx.cand
    if cand.ep > 1 and moe.is_moe(ctx.model):
        return ctx.stage_compute_s * dualpipe.overlapped_compute_factor(ctx.training.pp_schedule, cand.pp, cand.gas,
                                                                        ctx.cluster.gpu.sm_count)
    return ctx.stage_compute_s


@memoized_term(lambda ctx: (ctx.cand.tp, ctx.rc.layers, ctx.stage_layers, ctx.tokens))
def tp_comm_s(ctx: StepContext) -> float:
    """TP: 2 all-reduces forward, 2 backward, 2 more for each recomputed forward (Megatron Sec. 3.1; block-N: its
    share of the layers)."""
    cand = ctx.cand
    msgs = 4 + 2 * ctx.rc.layers
    return ctx.stage_layers * (msgs * collective_time_s(
        ctx.topology.tp_link(cand.tp), kind="all_reduce", message_bytes=ctx.tokens * ctx.model.hidden * ctx.half,
        group=cand.tp))


@memoized_term(lambda ctx: (ctx.cand.pp, ctx.cand.tp, ctx.cand.vpp, ctx.cand.dp, ctx.cand.cp, ctx.tokens,
                           ctx.stage_kind))
def pp_p2p_s(ctx: StepContext) -> float:
    """p2p between stages: activation forward, its gradient backward; Megatron's scatter-gather sends 1/t,
    DeepSpeed's pipeline engine both as 1/t too since v0.5.4 (planner.framework); vpp chunks."""
    cand, fw = ctx.cand, ctx.fw
    if cand.pp <= 1:
        return 0.0
    act = ctx.tokens * ctx.model.hidden * ctx.half
    sends = (act / cand.tp if fw.p2p_activation_split else act) + (act / cand.tp if fw.p2p_grad_split else act)
    p2p = cand.vpp * collective_time_s(ctx.topology.pp_link(cand.tp, cand.dp * cand.cp, cand.pp), kind="send",
                                       message_bytes=sends, group=2)
    if fw.deepspeed_engine:   # blocking send and receive, one after the other (planner.pipeline_engine)
        p2p *= pipeline_engine.p2p_serialization(cand.pp, ctx.stage_kind)
    return p2p


def grad_accumulation_s(ctx: StepContext) -> float:
    """DeepSpeed's engine (ZeRO 0-1) adds each micro-batch's gradients into the stage's gradient buffer: one
    memory-bound pass over the stage's parameters per micro-batch (planner.pipeline_engine)."""
    if not (ctx.fw.deepspeed_engine and ctx.cand.zero <= 1):
        return 0.0
    return pipeline_engine.grad_accumulation_s(ctx.accumulated_params or ctx.params_gpu, ctx.training.precision,
                                               ops.elementwise_bw(ctx.cluster))


def pp_microbatch_overhead_s(ctx: StepContext) -> float:
    """The framework's fixed cost per micro-batch and stage (DeepSpeed's partitioned-activation pipeline, TP > 1)."""
    return ctx.fw.microbatch_overhead_s if ctx.cand.pp > 1 and ctx.cand.tp > 1 else 0.0


def dp_comm_s(cand: Candidate, training: TrainingSpec, topology: Topology, fw: Framework, grad_bytes: float,
              shard: int, half: int, recomputed_layers: float) -> float:
    """Data-parallel gradient traffic of a step: all-reduce (ZeRO-0) or reduce-scatter + all-gather (ZeRO-1/2)
    after the last micro-batch's backward (DeepSpeed's pipeline engine and Megatron's DDP); under ZeRO-3/FSDP the
    parameters all-gathered for the forward and again for the backward and the gradients reduce-scattered
    (Rajbhandari et al. 2020, ZeRO, Sec. 7.2.2: 3x the parameters per step), per micro-batch, once more for a
    recomputed forward (``recomputed_layers``: its share of the layers); torchtitan under PP once per step
    (planner.fsdp_parallel.sharded_collectives)."""
    if cand.dp * cand.cp <= 1:
        return 0.0
    if cand.zero >= 3:
        shard_link = topology.dp_link(cand.tp, shard)   # HYBRID_SHARD: the shard group stays inside a node
        if fw.sharded_gather_per_rail and shard_link.kind == "inter":
            shard_link = topology.rail_link(shard_link)
        gather = collective_time_s(shard_link, kind="all_gather", message_bytes=grad_bytes, group=shard)
        scatter = collective_time_s(shard_link, kind="reduce_scatter", message_bytes=grad_bytes, group=shard)
        gathers, scatters = fsdp_parallel.sharded_collectives(cand, training, recomputed_layers)
        comm = gathers * gather + scatters * scatter
        if cand.hybrid and cand.dp > shard:
            inter = topology.dp_link(cand.tp * shard, cand.dp // shard)
            comm += collective_time_s(inter, kind="all_reduce", message_bytes=grad_bytes / shard,
                                      group=cand.dp // shard)
        return comm
    dp_link = topology.dp_link(cand.tp, cand.dp * cand.cp)   # gradients reduce over DP x CP (tp-cp-dp rank order)
    dp_s = collective_time_s(dp_link, kind="all_reduce", message_bytes=grad_bytes, group=cand.dp * cand.cp)
    bf16_optimizer = pipeline_engine.bf16_optimizer_dp_traffic(training)   # the bigscience fork under bf16
    if bf16_optimizer is not None:
        dp_s *= bf16_optimizer
    else:
        dp_s *= (fw.zero12_traffic if cand.zero >= 1 else 1.0) * dp_traffic_factor(cand, training, half)
    if dp_link.kind == "inter":
        dp_s /= fw.dp_inter_node_efficiency
    return dp_s


def param_gather_share(ctx: StepContext) -> float:
    """Share of `dp_comm_s` that is Megatron-LM's distributed-optimizer parameter all-gather (the rest is the
    gradient reduce-scatter): `dp_traffic_factor`'s two parts; 0 elsewhere (DeepSpeed and FSDP are one term)."""
    cand, training = ctx.cand, ctx.training
    if training.framework != "megatron-lm" or cand.zero == 0 or cand.zero >= 3:
        return 0.0
    gather = fp8.param_gather_bytes(cand, training, ctx.half)
    return gather / (training_param_bytes(training).grads + gather)


def dp_grads_s(ctx: StepContext) -> float:
    """The gradient reduction (all of `dp_comm_s` but Megatron-LM's parameter all-gather)."""
    share = param_gather_share(ctx)
    return ctx.dp_traffic_s * (1 - share) if share else ctx.dp_traffic_s


def dp_param_gather_s(ctx: StepContext) -> float:
    """Megatron-LM's distributed optimizer all-gathers the updated 16-bit (or FP8) parameters after the step."""
    share = param_gather_share(ctx)
    return ctx.dp_traffic_s * share if share else 0.0


def ddp_bucket_share(ctx: StepContext) -> float:
    """One Megatron DDP bucket's share of the stage's parameters: buckets of max(40M, 1M x DP) parameters
    (megatron/core/distributed/distributed_data_parallel.py, bucket_size default), DP the gradient group (DP x CP)."""
    bucket = max(40_000_000, 1_000_000 * ctx.cand.dp * ctx.cand.cp)
    return min(1.0, bucket / max(1, ctx.params_gpu))


def backward_share(ctx: StepContext) -> float:
    """Backward (with its recomputed forward: the share of the layers re-run) share of a micro-batch's compute:
    backward = 2x forward (seed 001)."""
    r = ctx.rc.layers
    return (2 + r) / (3 + r)


def dp_grads_overlap(ctx: StepContext) -> Overlap | None:
    """ZeRO-3 / FSDP prefetch hides the gathers under the step's compute, up to SHARDED_OVERLAP of them. Megatron-LM
    with --overlap-grad-reduce reduces each bucket as its gradients are ready, under the last micro-batch's backward;
    the last bucket's reduce starts when the backward ends (megatron/core/distributed/param_and_grad_buffer.py)."""
    cand, training = ctx.cand, ctx.training
    if cand.zero >= 3 or training.framework == "fsdp":
        return Overlap(under="compute", window=cand.gas, exposed_min=1 - SHARDED_OVERLAP)
    if training.framework == "megatron-lm" and "grad-reduce" in ctx.overlaps:
        return Overlap(under="compute", window=backward_share(ctx), exposed_min=ddp_bucket_share(ctx))
    return None


def dp_param_gather_overlap(ctx: StepContext) -> Overlap | None:
    """--overlap-param-gather: each bucket's all-gather is waited for when the next step's forward reaches it, so it
    hides under the first micro-batch's forward but for the first bucket (distributed_data_parallel.py forward
    pre-hooks)."""
    if "param-gather" in ctx.overlaps:
        return Overlap(under="compute", window=1 - backward_share(ctx), exposed_min=ddp_bucket_share(ctx))
    return None


def tp_comm_overlap(ctx: StepContext) -> Overlap | None:
    """--tp-comm-overlap (Transformer Engine userbuffers, with SP): each all-gather / reduce-scatter is split into TP
    chunks pipelined with the GEMM's chunks, so all but one chunk's transfer hides under the layer's GEMMs
    (TransformerEngine comm_gemm_overlap, ring-exchange / pipelined split); the GEMMs taken as the stage's compute.
    torchtitan's async TP hides ASYNC_TP_HIDDEN of them (planner.fsdp_parallel.tp_exposed_fraction)."""
    cand = ctx.cand
    if cand.tp > 1 and cand.sp and "tp-comm" in ctx.overlaps:
        return Overlap(under="compute", window=1.0, exposed_min=1 / cand.tp)
    exposed = fsdp_parallel.tp_exposed_fraction(ctx.training)
    if exposed < 1.0:
        return Overlap(under="compute", window=1.0, exposed_min=exposed)
    return None


def pp_p2p_overlap(ctx: StepContext) -> Overlap | None:
    """Megatron's interleaved 1F1B with overlap_p2p_comm posts each chunk's sends and receives asynchronously and
    waits for them only before the chunk that needs them: they run beside the other chunks' compute
    (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving). Not overlapped in
    plain 1F1B (Megatron turns the option off without VPP)."""
    cand = ctx.cand
    if cand.pp > 1 and ctx.training.pp_schedule in dualpipe.SCHEDULES:
        # DualPipe: each chunk's PP sends run beside the other merged chunk's compute (DeepSeek-V3 report Sec.
        # 3.2.1), except the unmerged chunks' (planner.dualpipe.unmerged_share)
        return Overlap(under="compute", window=1.0,
                       exposed_min=dualpipe.unmerged_share(ctx.training.pp_schedule, cand.pp, cand.gas))
    if cand.vpp > 1 and ctx.training.framework == "megatron-lm" and "p2p" in ctx.overlaps:
        return Overlap(under="compute", window=1.0, exposed_min=0.0)
    return None


def tied_embedding_s(ctx: StepContext) -> float:
    """Tied input/output embeddings under PP: the first and last stages all-reduce the word embedding's gradient
    every step, after the backward, not overlapped (Megatron-LM _allreduce_embedding_grads; DeepSpeed
    PipelineModule.allreduce_tied_weight_gradients); the two stages are (PP-1)·TP·CP·DP ranks apart."""
    cand, model = ctx.cand, ctx.model
    if not (model.tied_embeddings and cand.pp > 1):
        return 0.0
    emb_bytes = padded_vocab(model.vocab, cand.tp, ctx.fw) // cand.tp * model.hidden * pipeline_engine.reduce_bytes(
        ctx.training, ctx.half)   # BF16_Optimizer all-reduces the fp32 gradient
    tied_link = ctx.topology.strided_link((cand.pp - 1) * cand.tp * cand.cp * cand.dp, 2)
    return collective_time_s(tied_link, kind="all_reduce", message_bytes=emb_bytes, group=2)


@memoized_term(lambda ctx: (ctx.cand.zero, ctx.shard, ctx.params_gpu, ctx.cand.tp, ctx.cand.cp, ctx.cand.dp,
                           ctx.cand.ep, ctx.cand.etp, ctx.stage_layers, ctx.cand.pp > 1, ctx.cand.opt_offload))
def optimizer_s(ctx: StepContext) -> float:
    """The optimizer step at HBM bandwidth: master weights and states read and written, gradients read, weights
    written (sharded by ZeRO-1+; the routed experts' over the expert-DP group)."""
    cand, training, model = ctx.cand, ctx.training, ctx.model
    pb = with_state_dtype(param_bytes(training.precision, training.optimizer), training)   # bf16 moments: half read
    per_param = 2 * (pb.master + pb.optimizer) + pb.grads + pb.weights
    if ctx.fw.foreach_optimizer and training.optimizer == "adamw":
        per_param = FOREACH_ADAMW_BYTES + CLIP_GRAD_NORM_BYTES   # eager PyTorch's optimizer: one pass an op
    shard_opt = ctx.shard if cand.zero >= 1 else 1
    opt_bytes = ctx.params_gpu / shard_opt * per_param
    edp = moe.expert_data_parallel(cand)
    opt_bytes += (moe.expert_params_on_gpu(model, cand, ctx.stage_layers) / (edp if cand.zero >= 1 else 1) * per_param
                  * dualpipe.parameter_copies(training.pp_schedule, cand.pp))   # DualPipe: two stages' experts
    f = offload.optimizer_fraction(cand, training)   # Megatron-LM's CPU offload: that share on the host (offload)
    return opt_bytes * (1 - f) / ops.elementwise_bw(ctx.cluster) + offload.host_step_s(f * opt_bytes / per_param,
                                                                                    ctx.cluster)


def fsdp_copy_out_s(ctx: StepContext) -> float:
    """FSDP2 (fully_shard, torchtitan) copies every gathered parameter out of the all-gather buffer into its own
    unsharded tensor on the compute stream (torch distributed/_composable/fsdp/_fsdp_collectives.py
    foreach_all_gather_copy_out: split_with_sizes_copy, read + write of the gathered 16-bit bytes), once per
    all-gather (`fsdp_parallel.sharded_collectives`); FSDP1 (fms-fsdp) gathers into its flat parameter in place."""
    cand, training = ctx.cand, ctx.training
    if training.framework != "fsdp" or training.fsdp_trainer or cand.zero < 3 or ctx.shard <= 1:
        return 0.0
    gathers, _ = fsdp_parallel.sharded_collectives(cand, training, ctx.rc.layers)
    return gathers * ctx.params_gpu * 2 * ctx.half / ops.elementwise_bw(ctx.cluster)


# HBM bytes per fp32 parameter of torch.optim.AdamW's default step on CUDA (foreach, not fused: torch/optim/adamw.py
# _multi_tensor_adamw, 2.x; torchtitan build_optimizers fused=False -> foreach=True; Hugging Face's own AdamW runs the
# same ops per tensor), one pass per op: _foreach_mul_ (weight decay) 8, _foreach_lerp_ (exp_avg, grad) 12,
# _foreach_mul_ (exp_avg_sq) 8, _foreach_addcmul_ (grad, grad) 12, _foreach_sqrt 8, _foreach_div_ 8, _foreach_add_ (eps) 8,
# _foreach_addcdiv_ (param, exp_avg, denom) 16: 80. The fused kernel (Megatron, DeepSpeed, fused=True) reads and writes
# each once (the seed-001 count above).
FOREACH_ADAMW_BYTES = 80
# clip_grad_norm_ (foreach) before the step, what torchtitan, fms-fsdp and the Hugging Face Trainer run (max norm 1.0):
# _foreach_norm reads each gradient 4, _foreach_mul_ by the clip coefficient 8
CLIP_GRAD_NORM_BYTES = 12


TERMS: tuple[Term, ...] = (
    Term(name="compute", kind=COMPUTE, group="compute_s", per_microbatch=True, seconds=compute_s,
         source="GEMMs at peak x tile/wave/inner-dimension efficiency (NVIDIA 'Matrix Multiplication Background'), "
                "element-wise at HBM bandwidth, backward = 2x forward (seed 001), host-bound passes (framework)",
         constants=("GEMM_K_HALF", "DENSE_MISALIGNED_EFFICIENCY", "ELEMENTWISE_BW_EFFICIENCY", "EAGER_HOST_S",
                    "MEGATRON_HOST_S", "KERNEL_LAUNCH_S", "ROWWISE_GEMM_EFFICIENCY",
                    "BLOCK_SCALED_GEMM_EFFICIENCY")),
    Term(name="grad_accumulation", kind=MEMORY, group="compute_s", per_microbatch=True, seconds=grad_accumulation_s,
         source="DeepSpeed engine (ZeRO 0-1): autograd adds each micro-batch's gradients into param.grad, at HBM "
                "bandwidth (planner.pipeline_engine)",
         constants=("ELEMENTWISE_BW_EFFICIENCY",)),
    Term(name="tp_comm", kind=COMMUNICATION, group="tp_comm_s", per_microbatch=True, seconds=tp_comm_s,
         overlap=tp_comm_overlap, hides_under="the layer's GEMMs, all but one of TP chunks (torchtitan async TP: "
                                              "ASYNC_TP_HIDDEN of them)",
         flag="--tp-comm-overlap (--overlap tp-comm; needs --sequence-parallel); torchtitan "
              "parallelism.enable_async_tensor_parallel (--async-tp)",
         source="Narayanan et al. 2021 Sec. 3.1 / Shoeybi et al. 2019: 2 all-reduces forward, 2 backward a layer",
         constants=("LINK_EFFICIENCY", "HALF_BANDWIDTH_BYTES_INTRA", "HALF_BANDWIDTH_BYTES_INTER",
                    "COLLECTIVE_LATENCY_S_INTRA", "COLLECTIVE_LATENCY_S_INTER", "ASYNC_TP_HIDDEN")),
    context_parallel.RING_EXCHANGE,
    moe.ALL_TO_ALL,
    offload.ACTIVATION_OFFLOAD,
    Term(name="pp_p2p", kind=COMMUNICATION, group="pp_p2p_s", per_microbatch=True, seconds=pp_p2p_s,
         overlap=pp_p2p_overlap, hides_under="the other model chunks' compute (interleaved 1F1B)",
         flag="Megatron overlap_p2p_comm (default with VPP; --overlap p2p); DeepSeek's DualPipe "
              "(--pp-schedule DualPipe)",
         source="Narayanan et al. 2021 Sec. 4.1 (scatter/gather p2p); DeepSpeed runtime/pipe/engine.py",
         constants=("LINK_EFFICIENCY",)),
    Term(name="pp_microbatch_overhead", kind=FIXED, group="pp_p2p_s", per_microbatch=True,
         seconds=pp_microbatch_overhead_s, source="DeepSpeed runtime/pipe/engine.py (partitioned activations)",
         constants=("DS_MICROBATCH_OVERHEAD_S",)),
    Term(name="dp_grads", kind=COMMUNICATION, group="dp_comm_s", per_microbatch=False, seconds=dp_grads_s,
         overlap=dp_grads_overlap,
         hides_under="the step's compute (ZeRO-3/FSDP prefetch); the last micro-batch's backward but the last "
                     "bucket (Megatron)",
         flag="FSDP forward/backward prefetch (default on); Megatron --overlap-grad-reduce (--overlap grad-reduce)",
         source="ring all-reduce / reduce-scatter + all-gather bus bytes (nccl-tests PERFORMANCE.md); ZeRO Sec. 7.2.2",
         constants=("LINK_EFFICIENCY", "SHARDED_OVERLAP", "DS_DP_INTER_NODE_EFFICIENCY")),
    Term(name="dp_param_gather", kind=COMMUNICATION, group="dp_comm_s", per_microbatch=False,
         seconds=dp_param_gather_s, overlap=dp_param_gather_overlap,
         hides_under="the next step's first forward but the first bucket",
         flag="Megatron --overlap-param-gather (--overlap param-gather)",
         source="Megatron distributed optimizer: reduce-scatter grads, all-gather params (distrib_optimizer.py)",
         constants=("LINK_EFFICIENCY",)),
    Term(name="tied_embedding", kind=COMMUNICATION, group="dp_comm_s", per_microbatch=False,
         seconds=tied_embedding_s, source="Megatron-LM _allreduce_embedding_grads; DeepSpeed allreduce_tied_weight_"
                                          "gradients", constants=("LINK_EFFICIENCY",)),
    moe.EXPERT_GRAD_REDUCE,
    Term(name="fsdp_copy_out", kind=MEMORY, group="dp_comm_s", per_microbatch=False, seconds=fsdp_copy_out_s,
         source="torch FSDP2 _fsdp_collectives.foreach_all_gather_copy_out (split_with_sizes_copy on the compute "
                "stream)", constants=("ELEMENTWISE_BW_EFFICIENCY",)),
    Term(name="optimizer", kind=MEMORY, group="optimizer_s", per_microbatch=False, seconds=optimizer_s,
         source="seed 001 bytes per parameter, read and written at HBM bandwidth",
         constants=("ELEMENTWISE_BW_EFFICIENCY",)),
)


def estimate_time(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                  topology: Topology, params: CostParams = CostParams(),
                  layer_memo: dict | None = None) -> TimeBreakdown:
    """One candidate's step time, by term (`TERMS`). ``layer_memo``: a dict plan() keeps for one plan, of what reads
    few of the candidate's fields (`layer_compute_s` by `layer_key`, the busiest stage's parameters by TP, PP, VPP,
    the FLOPs by global batch and what is recomputed): the same floats, computed once."""
    ctx = step_context(model, cand, cluster, training, topology, layer_memo)
    # (PP-1)/VPP slots (1F1B, interleaved); torchtitan's zero-bubble schedules fewer
    bubble = fsdp_parallel.bubble_slots(fsdp_parallel.schedule(cand, training), cand.pp, cand.vpp, cand.recompute)
    if ctx.fw.deepspeed_engine and cand.pp > 1:
        step = deepspeed_engine_step(ctx)
    else:
        step = evaluate(TERMS, ctx, microbatches=cand.gas, bubble_slots=bubble)
    gbs = cand.global_batch
    count = training.flops_attention
    model_flops = step_model_flops(model, cand, training, layer_memo)
    hardware_flops = memoized(layer_memo, ("hardware_flops", gbs, ctx.rc), lambda: flops.hardware_flops_per_iteration(
        model, gbs, ctx.rc, count, model_flops=model_flops))
    params = class_params(params, model, cand, cluster, training, layer_memo)
    return breakdown(step, params, model_flops=model_flops, hardware_flops=hardware_flops)


def step_model_flops(model: ModelSpec, cand: Candidate, training: TrainingSpec, layer_memo: dict | None) -> float:
    """`flops.model_flops_per_iteration` of ``cand``'s global batch, once per batch in ``layer_memo`` when given."""
    gbs = cand.global_batch
    return memoized(layer_memo, ("model_flops", gbs),
                    lambda: flops.model_flops_per_iteration(model, gbs, training.flops_attention))


FLOOR_MARGIN = 1e-9
"""relative slack of `tflops_ceiling` against float rounding (the step's sum is taken in another order; a
TFLOPs bucket in planner.rank is 1e-3 wide)"""


def tflops_ceiling(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                   layer_memo: dict | None = None) -> float:
    """An upper bound of ``cand``'s model TFLOPs per GPU under CostParams() (`estimate_time`, `throughput`) from its
    compute term alone: every other term's exposed seconds are >= 0, so the step takes at least the busiest stage's
    compute (`busiest_stage`) in each of its GAS slots and bubble slots. Under DeepSpeed's pipeline engine
    (`deepspeed_engine_step`) the step is GAS - 1 slots of its slowest stage and one pass of every stage (its bubble
    `pipeline_engine.pipeline_bubble_slots` times the slowest's slot), each stage's slot at least that stage's compute:
    at least (GAS - 1) x the busiest stage's compute + every stage's. What plan() reads to leave unscored the
    candidates that cannot reach its top rows (planner.rank)."""
    _, layer_s, _, compute, head_s = busiest_stage(model, cand, cluster, training, layer_memo)
    fw = memoized(layer_memo, ("plan_constants",), lambda: plan_constants(cluster, training))[0]
    return _ceiling_from(_ceiling_parts(model, cand, training, fw, layer_memo), layer_s, compute, head_s)


def ceiling_group(cand: Candidate) -> tuple:
    """The fields `tflops_ceiling` reads but the recompute mode: the op list's (`op_list_key`), PP and VPP (the stage
    split, the schedule's chunk host work, the bubble), DP and GAS (the slots, the global batch, the GPUs). The
    candidates of one group share all of their ceilings' work but the layer's recompute (`tflops_ceilings`)."""
    return (*op_list_key(cand), cand.pp, cand.vpp, cand.dp, cand.gas)


def tflops_ceilings(model: ModelSpec, cands: list[Candidate], cluster: ClusterSpec, training: TrainingSpec,
                    layer_memo: dict) -> list[float]:
    """`tflops_ceiling` of each of ``cands``, candidates of one `ceiling_group`, the same floats: the op list, the
    chunk host work, the stage's shape (`stage_shape`) and the slots and FLOPs (`_ceiling_parts`) computed once, the
    layer, the stage and the quotient once per recompute mode. What plan() ranks its survivors by (planner.rank)."""
    first = cands[0]
    fw, g16, _ = memoized(layer_memo, ("plan_constants",), lambda: plan_constants(cluster, training))
    lo = memoized(layer_memo, ("ops", *op_list_key(first)), lambda: layer_op_list(model, first, cluster, training))
    chunk = chunk_host_s(model, first, training)
    shape = stage_shape(model, first, cluster, training, fw, g16, model.seq_len * first.mbs // first.cp, layer_memo)
    parts = None if training.pp_schedule else _ceiling_parts(model, first, training, fw, layer_memo)
    core = lo.seconds(ops.ATTENTION)
    by_mode: dict[str, float] = {}
    out = []
    for cand in cands:
        mode = cand.recompute
        ceiling = by_mode.get(mode)
        if ceiling is None:   # layer_compute_s's layer and stage_compute's stage, as busiest_stage would give them
            layer_s = lo.layer_s(recomputed_in(layer_memo, model, cand, training), chunk)
            lps, compute, head_s = stage_of(model, cand, training, fw, layer_s, shape)
            layer_memo[("stage_compute", *layer_key(cand))] = (core, layer_s, lps, compute, head_s)   # its score's
            ceiling = by_mode[mode] = _ceiling_from(
                parts or _ceiling_parts(model, cand, training, fw, layer_memo), layer_s, compute, head_s)
        out.append(ceiling)
    return out


def _ceiling_parts(model: ModelSpec, cand: Candidate, training: TrainingSpec, fw: Framework,
                   layer_memo: dict | None) -> tuple:
    """What `tflops_ceiling` reads besides the layer's, the stage's and the LM head's seconds: (DeepSpeed engine's
    stages or None, the slots, the step's model FLOPs, the GPUs); the recompute mode only through a --pp-schedule's
    bubble (`fsdp_parallel.bubble_slots`)."""
    model_flops = step_model_flops(model, cand, training, layer_memo)
    if fw.deepspeed_engine and cand.pp > 1:
        return pipeline_engine.engine_stages(model.layers, cand.pp), cand.gas - 1, model_flops, cand.world
    slots = cand.gas + fsdp_parallel.bubble_slots(fsdp_parallel.schedule(cand, training), cand.pp, cand.vpp,
                                                  cand.recompute)
    return None, slots, model_flops, cand.world


def _ceiling_from(parts: tuple, layer_s: float, compute: float, head_s: float) -> float:
    """`tflops_ceiling` from its `_ceiling_parts` and a layer's seconds, the busiest stage's compute and the LM
    head's."""
    stages, slots, model_flops, world = parts
    if stages is not None:   # DeepSpeed's engine: GAS - 1 slots of the slowest stage, one pass of every stage
        per_stage = [st.compute_s(layer_s, head_s) for st in stages]   # deepspeed_engine_step's stage_compute_s
        floor_s = (slots * max(per_stage) + sum(st.count * c for st, c in zip(stages, per_stage))) \
            * (1 - FLOOR_MARGIN)
    else:
        floor_s = slots * compute * (1 - FLOOR_MARGIN)
    if floor_s <= 0:
        return math.inf
    return flops.tflops_per_gpu(model_flops, floor_s, world)


def engine_stage_params(ctx: StepContext, stage: pipeline_engine.EngineStage) -> int:
    """Parameters on one GPU of ``stage``: a middle stage holds its layers; the first and last stages
    (planner.memory.stage_params, charged ceil(L/PP) layers) the embedding and the LM head, less the layers the last
    stage lacks under DeepSpeed's partition."""
    model, cand = ctx.model, ctx.cand
    full = layers_per_stage(model, cand.pp)
    if stage.kind == "middle":
        return math.ceil(stage.layers * layer_params(model) / cand.tp)
    held = stage_params(model, cand, stage.kind, ctx.training.framework)
    return held - int((full - stage.layers) * layer_params(model) / cand.tp)


def deepspeed_engine_step(ctx: StepContext) -> StepTime:
    """DeepSpeed's pipeline engine: the terms of each kind of stage (first, middle, last: its layers, the LM head on
    the last, its parameters), the slowest stage's for the step's slots and every stage's pass for the
    bubble (planner.pipeline_engine.pipeline_bubble_slots; checked by tests/bench/ds_pipe_schedule.py)."""
    cand, unit = ctx.cand, CostParams()
    staged = []
    for st in pipeline_engine.engine_stages(ctx.model.layers, cand.pp):
        c = replace(ctx, memo=None, stage_layers=st.layers, accumulated_params=engine_stage_params(ctx, st),
                    stage_kind=st.kind,
                    stage_compute_s=st.compute_s(ctx.layer_s, ctx.head_s))
        step = evaluate(TERMS, c, microbatches=cand.gas, bubble_slots=0.0)
        staged.append((st.count, sum(step.groups(unit)[0].values()) / cand.gas, step))
    slowest = max(staged, key=lambda x: x[1])[2]
    return replace(slowest, bubble_slots=pipeline_engine.pipeline_bubble_slots([(n, s) for n, s, _ in staged]))


def term_rows(time: TimeBreakdown) -> list[dict]:
    """Each term of the step with its declaration (`TERMS`): seconds exposed on the step outside the bubble, seconds
    hidden under another term, kind, what it hides under and the flag that turns that on, source, constants."""
    if time.terms is None:
        return []
    decl = {t.name: t for t in TERMS}
    rows = []
    for name, (exposed, hidden) in time.terms.step_seconds_by_term(time.params).items():
        tt, d = time.terms.by_name(name), decl.get(name)
        rows.append({"name": name, "kind": tt.kind, "line": tt.group, "exposed_s": exposed, "hidden_s": hidden,
                     "per_microbatch": tt.per_microbatch, "overlaps": tt.overlap is not None,
                     "hides_under": d.hides_under if d else "",
                     "flag": d.flag if d else "", "source": d.source if d else "",
                     "constants": list(d.constants) if d else []})
    return rows


def breakdown(step: StepTime, params: CostParams, *, model_flops: float, hardware_flops: float) -> TimeBreakdown:
    """The breakdown's lines, each the sum of its terms (`StepTime.groups`), under ``params``."""
    per_mb, bubble, per_step = groups = step.groups(params)
    overhead = step.by_name("pp_microbatch_overhead")
    overhead_s = overhead.seconds if overhead else 0.0
    tied = step.by_name("tied_embedding")
    lines = dict(per_mb)
    for g, v in per_step.items():   # a group with terms of both kinds
        lines[g] = lines[g] + v if g in lines else v
    return TimeBreakdown(compute_s=lines.get("compute_s", 0.0), tp_comm_s=lines.get("tp_comm_s", 0.0),
                         pp_bubble_s=bubble, pp_p2p_s=lines.get("pp_p2p_s", 0.0),
                         dp_comm_s=lines.get("dp_comm_s", 0.0), optimizer_s=lines.get("optimizer_s", 0.0),
                         step_time_s=step.total(*groups), model_flops=model_flops, hardware_flops=hardware_flops,
                         pp_overhead_s=step.microbatches * overhead_s, bubble_overhead_s=step.bubble_slots * overhead_s,
                         tied_embedding_s=tied.seconds * scale_of(tied.kind, params) if tied else 0.0,
                         cp_comm_s=lines.get("cp_comm_s", 0.0), ep_comm_s=lines.get("ep_comm_s", 0.0),
                         terms=step, params=params)


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """What a step time gives: samples, tokens and FLOPs per second."""

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
