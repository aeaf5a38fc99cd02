"""Memory per GPU: weights, gradients, optimizer states, activations, logits, buffers, context.

All sizes in bytes. The busiest pipeline stage decides: the first stage holds the embedding and
the most micro-batches in flight (1F1B), the last holds the LM head and the logits; both are
computed and the larger is reported.

Sources: seed 001 (18 bytes/param for mixed-precision AdamW and its variants); Rajbhandari et
al. 2020 (ZeRO stages, arXiv 1910.02054); Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 and
Sec. 4 (activations with TP, SP, selective/full recompute, 1F1B in-flight micro-batches);
seed 003 "calibration" (CUDA context); DeepSpeed's default bucket sizes (5e8 elements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import context_parallel, fp8, moe
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec

# PyTorch's caching allocator holds more than the tensors alive (block rounding, fragmentation
# under changing activation shapes): Megatron's memory report shows "max reserved" a few percent
# above "max allocated". Applied to the dynamic part (activations, logits).
ALLOCATOR_OVERHEAD = 1.05


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamBytes:
    """Bytes per parameter before sharding, split the way ZeRO shards them."""

    weights: float
    """the copy the forward uses (bf16/fp16, or fp32)"""
    master: float
    """fp32 master weights of mixed precision"""
    grads: float
    optimizer: float
    """optimizer states (Adam: two moments)"""

    @property
    def total(self) -> float:
        return self.weights + self.master + self.grads + self.optimizer


def param_bytes(precision: str, optimizer: str) -> ParamBytes:
    """Seed 001 'Anatomy of Model's Memory': weights + grads + optimizer states per parameter."""
    if optimizer == "adamw-bf16":
        # seed 001: AnyPrecisionAdamW in pure bf16: "only 8 bytes per parameter"
        return ParamBytes(weights=2, master=0, grads=2, optimizer=4)
    states = {"adamw": 8, "adamw-8bit": 2, "sgd": 4, "lion": 4, "adafactor": 4}[optimizer]  # seed 001
    if precision == "fp32":
        return ParamBytes(weights=4, master=0, grads=4, optimizer=states)  # 16 for AdamW
    return ParamBytes(weights=fp8.weight_bytes(2, precision), master=4, grads=4, optimizer=states)  # seed 001: 2+4 + 4 + 8 = 18


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage (`memory_breakdown` returns the busiest stage)."""

    stage: str
    """which pipeline stage is the busiest: first | last | only"""
    params_on_gpu: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    """optimizer states and fp32 master weights, after ZeRO/FSDP sharding"""
    activations_bytes: float
    logits_bytes: float
    buffers_bytes: float
    context_bytes: float

    @property
    def static_bytes(self) -> float:
        """weights + grads + optimizer: what seed 004's 18-bytes rule bounds"""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return (self.static_bytes + self.activations_bytes + self.logits_bytes + self.buffers_bytes
                + self.context_bytes)

    @property
    def total_gb(self) -> float:
        return self.total_bytes / 1e9


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    """The busiest stage's layer count: DeepSpeed's uneven split puts ceil(L/PP) on some stages."""
    return math.ceil(model.layers / pp)


def stage_params(model: ModelSpec, cand: Candidate, stage: str) -> int:
    """Parameters one GPU holds on ``stage`` (first | last | only), split by TP."""
    layers = layers_per_stage(model, cand.pp) * (moe.mean_non_expert_layer_params(model) if moe.is_moe(model)
                                                 else model.params_per_layer)   # routed experts: moe.add_expert_states
    word = model.vocab * model.hidden
    embedding_in = model.embedding_params - (0 if model.tied_embeddings else word)
    if stage == "only":
        total = model.params
    elif stage == "first":
        total = layers + embedding_in
    else:  # last: the LM head (a second copy of the tied word embedding under PP, Megatron) + final norm
        total = layers + word + model.norm_params
    return math.ceil(total / cand.tp)


def sharded_static_bytes(params: int, pb: ParamBytes, cand: Candidate, shard: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer+master) after ZeRO stage ``cand.zero`` over ``shard`` ranks (ZeRO paper Sec. 5)."""
    z = cand.zero
    weights = params * pb.weights / (shard if z >= 3 else 1)
    grads = params * pb.grads / (shard if z >= 2 else 1)
    optimizer = params * (pb.master + pb.optimizer) / (shard if z >= 1 else 1)
    return weights, grads, optimizer


def shard_group_size(cand: Candidate, gpus_per_node: int) -> int:
    """ZeRO/FSDP shards over the DP group; HYBRID_SHARD only inside a node (seed 002)."""
    if cand.hybrid:
        return max(1, min(cand.dp, gpus_per_node // cand.tp))
    return cand.dp * cand.cp   # Megatron's distributed optimizer shards over the DP x CP group


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    stored_bytes: float
    """kept from forward to backward, per layer and micro-batch"""
    working_bytes: float
    """transient: one layer's full activations while it is (re)computed"""


def layer_activations(model: ModelSpec, cand: Candidate, training: TrainingSpec) -> LayerActivations:
    """Korthikanti et al. 2022 Table 2, generalised to GQA and GLU MLPs, in bytes per layer.

    Per micro-batch of b sequences of length s, 16-bit activations: attention 11·sbh + 5·a·s²·b,
    MLP 19·sbh, norms 4·sbh = sbh·(34 + 5as/h) (Eq. 1). The 24·sbh that TP splits and the 10·sbh
    it does not (norms, QKV/MLP inputs, dropout masks) are kept apart; SP also splits the 10.
    FlashAttention drops the 5as²b score/softmax/dropout term. Full recompute stores only the
    layer input, 2·sbh (/t with SP).
    """
    s, b, h, t = model.seq_len, cand.mbs, model.hidden, cand.tp
    f_ratio = moe.activation_ffn(model, training) / h   # == ffn_hidden / h for dense models
    # generalised split of the 34: attention 7 + 4·kv/h (Q, K, V, proj input, mask), MLP 2 + ffn outputs,
    # norms 4; which parts TP divides follows Korthikanti Sec. 4.1.
    attn_tp = 2 + 4 * model.kv_heads / model.heads + 2          # Q, K+V, proj input
    mlp_tp = f_ratio * (2 * (2 if model.glu else 1) + 2)        # fc1 output(s) + activation output
    not_tp = 2 + 1 + 2 + 1 + 4                                  # QKV input, attn dropout mask, MLP input, MLP mask, norms
    not_tp += moe.dispatch_activation_sbh(model, training)      # MoE: permuted tokens (0 for dense)
    sbh = s * b * h
    scores = 0.0 if training.flash_attention else 5 * model.heads * s * s * b / t
    not_tp_bytes = not_tp * sbh / (t if cand.sp else 1)
    full = not_tp_bytes + (attn_tp + mlp_tp) * sbh / t + scores
    full -= fp8.activation_saving_bytes(cand, training.precision, sbh, f_ratio)   # FP8 GEMM inputs
    if cand.recompute == "full":
        stored = 2 * sbh / (t if cand.sp else 1)
    elif cand.recompute == "selective":
        stored = full - scores   # Korthikanti Sec. 4.2: recompute only the attention core
    else:
        stored = full
    return LayerActivations(stored_bytes=stored, working_bytes=full if cand.recompute != "none" else 0.0)


def in_flight_microbatches(cand: Candidate) -> float:
    """Micro-batches whose activations the first stage holds under 1F1B: min(PP, GAS).

    Interleaved 1F1B holds (1 + (p-1)/(p·v)) times more (Korthikanti et al. 2022 Sec. 4.2.3).
    """
    m = min(cand.pp, cand.gas)
    if cand.vpp > 1:
        m *= 1 + (cand.pp - 1) / (cand.pp * cand.vpp)
    return m


def logits_bytes(model: ModelSpec, cand: Candidate) -> float:
    """LM-head output at the loss, 8·s·b·V/t bytes: 16-bit logits (2), the fp32 softmax that Megatron's
    vocab-parallel cross-entropy keeps for backward (4), the 16-bit logits gradient (2)
    (Korthikanti et al. 2022 Sec. 4.3 counts the output layer and fp32 loss on the last stage)."""
    return 8.0 * model.seq_len * cand.mbs * model.vocab / cand.tp


# NCCL keeps NCCL_BUFFSIZE (4 MiB default, NCCL environment-variable docs) per channel, per ring
# neighbour and direction for every communicator; 8 channels is typical inside NVLink nodes.
NCCL_BYTES_PER_COMMUNICATOR = 4 * 2**20 * 8 * 2 * 2


def nccl_buffers_bytes(cand: Candidate) -> float:
    """NCCL buffers: one communicator for the world, one per parallel group of size > 1, and under PP
    the embedding-tying group besides the stage-to-stage p2p."""
    comms = 1 + (cand.tp > 1) + (cand.dp > 1) + 2 * (cand.pp > 1)
    return comms * NCCL_BYTES_PER_COMMUNICATOR


def framework_buffers_bytes(params_on_gpu: int, cand: Candidate, training: TrainingSpec, pb: ParamBytes,
                            model: ModelSpec) -> float:
    """Communication buffers besides the model states: NCCL's, plus the framework's own.

    DeepSpeed (megatron-deepspeed): reduce and all-gather buckets, 5e8 elements each by default
    (deepspeed/runtime/zero/config.py), 16-bit, never more than the parameters. FSDP: the
    unsharded parameters and gradients of ~2 layers in flight (prefetch), seed 002. Megatron-LM
    keeps its fp32 grad buffer, already counted as grads.
    """
    nccl = nccl_buffers_bytes(cand)
    if training.framework == "megatron-deepspeed":
        return nccl + 2 * min(5e8, params_on_gpu) * 2
    if training.framework == "fsdp" and cand.zero >= 2:
        return nccl + 2 * model.params_per_layer / cand.tp * (pb.weights + pb.grads)
    return nccl


def memory_breakdown(model: ModelSpec, cand: Candidate, cluster: ClusterSpec,
                     training: TrainingSpec) -> MemoryBreakdown:
    """Memory of the busiest GPU (bytes): the larger of the first and the last stage."""
    return max(stage_memory(model, cand, cluster, training), key=lambda m: m.total_bytes)


def stage_memory(model: ModelSpec, cand: Candidate, cluster: ClusterSpec,
                 training: TrainingSpec) -> list[MemoryBreakdown]:
    """Memory of a GPU on the first and on the last pipeline stage (one entry, 'only', without PP)."""
    pb = param_bytes(training.precision, training.optimizer)
    shard = shard_group_size(cand, cluster.gpus_per_node)
    act = layer_activations(model, cand, training)
    lps = layers_per_stage(model, cand.pp)
    embed_out = 2.0 * model.seq_len * cand.mbs * model.hidden  # embedding output / pipeline input buffer
    stages = ("only",) if cand.pp == 1 else ("first", "last")
    out = []
    for stage in stages:
        params = stage_params(model, cand, stage)
        weights, grads, optimizer = sharded_static_bytes(params, pb, cand, shard)
        params, weights, grads, optimizer = moe.add_expert_states(model, cand, lps, pb, (params, weights, grads, optimizer),
                                                                  sharded_static_bytes)   # routed experts over EP
        in_flight = in_flight_microbatches(cand) if stage == "first" else 1.0
        activations = ALLOCATOR_OVERHEAD * (in_flight * (lps * act.stored_bytes + embed_out) + act.working_bytes)
        logits = ALLOCATOR_OVERHEAD * logits_bytes(model, cand) if stage in ("last", "only") else 0.0
        activations, logits = context_parallel.split_activations(activations, logits, model, cand, training)
        out.append(MemoryBreakdown(stage=stage, params_on_gpu=params, weights_bytes=weights, grads_bytes=grads,
                             optimizer_bytes=optimizer, activations_bytes=activations, logits_bytes=logits,
                             buffers_bytes=framework_buffers_bytes(params, cand, training, pb, model),
                             context_bytes=cluster.context_bytes))
    return out
