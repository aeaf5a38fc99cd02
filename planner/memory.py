"""Memory per GPU: weights, gradients, optimizer states, activations, logits, buffers, context.

All sizes in bytes. The busiest pipeline stage decides: the first stage holds the embedding and
the most micro-batches in flight (1F1B), the last holds the LM head and the logits; both are
computed and the larger is reported.

Sources: seed 001 (18 bytes/param for mixed-precision AdamW and its variants); Rajbhandari et
al. 2020 (ZeRO stages, arXiv 1910.02054); Megatron-LM's theoretical_memory_usage.py (18 / 6 + 12/d
bytes per parameter, 4 bytes per logit); Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 and
Sec. 4 (activations with TP, SP, selective/full recompute, 1F1B in-flight micro-batches); torchtitan's
activation checkpointing (op-level SAC keeps every other matmul output, layer SAC every N-th block);
seed 003 "calibration" (CUDA context); DeepSpeed's default bucket sizes (5e8 elements).

`verdict` is the one memory rule: the predicted total against device memory minus the headroom.
tests/bench/memory_fit.py measures it on the dev data (Hagemann et al.'s OOM sheets, BLOOM tr11
nvidia-smi peaks, torchtitan and fms-fsdp runs).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

from planner import context_parallel, dualpipe, fp8, fsdp_parallel, moe, offload, pipeline_engine, recompute
from planner.constants import ALLOCATOR_OVERHEAD, DEEPSPEED_FP16_RESERVED_BYTES, DEEPSPEED_PINNED_PARTITION_BYTES
from planner.framework import get_framework
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.pipeline_split import StageSplit, megatron_lm_split
from planner.space import Candidate, TrainingSpec, candidate_with

# PyTorch's caching allocator's overhead on the dynamic part (activations, logits): ALLOCATOR_OVERHEAD, fitted
# (planner.constants).


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
    grads_fp32: float = 0.0
    """DeepSpeed's fp32 gradient partition, sharded with the optimizer (ZeRO-1/2 stage_1_and_2.py)"""
    reserved: float = 0.0
    """held by the caching allocator without a live tensor, sharded with the gradients: counted by nvidia-smi and
    max_memory_reserved (`reported_bytes`); of it, what must fit counts only the share the allocator cannot give back
    (`pinned_reserve`). DEEPSPEED_FP16_RESERVED_BYTES under DeepSpeed's fp16 ZeRO optimizer"""

    @property
    def total(self) -> float:
        """live bytes a parameter (``reserved`` apart)"""
        return self.weights + self.master + self.grads + self.optimizer + self.grads_fp32


def deepspeed_optimizer(framework: str) -> bool:
    """Whether DeepSpeed's engine runs the step, so its optimizer too (FP16_Optimizer at ZeRO 0, its ZeRO optimizer
    above) and its gradient buckets: the framework's `deepspeed_engine` trait (planner.framework)."""
    return get_framework(framework).deepspeed_engine


@functools.lru_cache(maxsize=64)   # pure over three names; plan() asks for it a few times per candidate
def param_bytes(precision: str, optimizer: str, framework: str = "megatron-lm") -> ParamBytes:
    """Seed 001 'Anatomy of Model's Memory': weights + grads + optimizer states per parameter.

    Where the gradients live depends on the framework: Megatron-LM accumulates them in an fp32
    main-grad buffer (theoretical_memory_usage.py: 18 bytes, 6 + 12/d with the distributed optimizer);
    DeepSpeed keeps 16-bit gradients plus an fp32 copy of the rank's partition (ZeRO paper Sec. 5.1:
    2Ψ + 2Ψ + KΨ/Nd, K = 12; stage_1_and_2.py's fp32 grad partition adds 4Ψ/Nd); FSDP keeps only the
    sharded fp32 parameters, fp32 gradients and states (16Ψ/N) and casts to 16 bits per layer in flight.
    """
    if optimizer == "adamw-bf16":
        # seed 001: AnyPrecisionAdamW in pure bf16: "only 8 bytes per parameter"
        return ParamBytes(weights=2, master=0, grads=2, optimizer=4)
    states = {"adamw": 8, "adamw-8bit": 2, "sgd": 4, "lion": 4, "adafactor": 4}[optimizer]  # seed 001
    if precision == "fp32":
        return ParamBytes(weights=4, master=0, grads=4, optimizer=states)  # 16 for AdamW
    if deepspeed_optimizer(framework) and precision == "bf16":
        # FITTED choice between the two accountings: bf16 runs of Hagemann et al.'s sheets (Llama 13B at TP1 PP1 ran
        # on 80 GB) need the ZeRO paper's 16-bit gradients; fp16 runs (seed 003, tr11 nvidia-smi peaks) follow 18
        return ParamBytes(weights=2, master=4, grads=2, optimizer=states, grads_fp32=4)  # ZeRO paper Sec. 5.1 + fp32 partition
    if deepspeed_optimizer(framework) and precision == "fp16":
        # DeepSpeed's fp16 ZeRO optimizer: 16-bit gradients live (runtime/zero/stage_1_and_2.py, ZeRO paper Sec. 5.1's
        # 2Ψ + 2Ψ + 12Ψ/Nd), fp32 master and Adam partitioned. The runs' nvidia-smi peaks follow 18 (seed 003, tr11):
        # the 2 bytes beyond the live 16 are the allocator's reserve (DEEPSPEED_FP16_RESERVED_BYTES), of which what
        # must fit counts the pinned share (`pinned_reserve`). ZeRO 0 and ZeRO-1 over one rank: the step's fp32
        # gradients instead (`deepspeed_fp16_step_grad_bytes`)
        return ParamBytes(weights=2, master=4, grads=2, optimizer=states, reserved=DEEPSPEED_FP16_RESERVED_BYTES)
    if framework == "fsdp":
        # FSDP mixed precision: fp32 sharded params (torchtitan float8 also casts per layer in flight)
        return ParamBytes(weights=4, master=0, grads=4, optimizer=states)
    # seed 001 / Megatron: 2+4 + 4 + 8 = 18; FP8 adds Transformer Engine's cached FP8 weight and transpose (planner.fp8)
    return ParamBytes(weights=fp8.weight_bytes(2, precision), master=4, grads=4, optimizer=states)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage (`memory_breakdown` returns the busiest stage)."""

    stage: str
    """which pipeline stage is the busiest: first | last | only; under DualPipe, which rank: end | middle"""
    params_on_gpu: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    """optimizer states and fp32 master weights, after ZeRO/FSDP sharding"""
    activations_bytes: float
    logits_bytes: float
    buffers_bytes: float
    context_bytes: float
    step_bytes: float = 0.0
    """DeepSpeed's fp16 optimizer step: the fp32 gradient copies it allocates after the last backward
    (`deepspeed_fp16_step_grad_bytes`), when the activations are gone; 0 for every other step"""
    reserved_bytes: float = 0.0
    """held by the caching allocator without a live tensor and given back before an OOM (`ParamBytes.reserved` less
    ``pinned_bytes``): in what nvidia-smi and max_memory_reserved show (`reported_bytes`), not in ``total_bytes``"""
    pinned_bytes: float = 0.0
    """the share of the allocator's reserve it cannot give back (`pinned_reserve`): in ``static_bytes``"""

    @property
    def static_bytes(self) -> float:
        """weights + grads + optimizer (and the reserve pinned beside them): what seed 004's 18-bytes rule bounds"""
        return model_states_bytes(self.weights_bytes, self.grads_bytes, self.optimizer_bytes, self.pinned_bytes)

    @property
    def total_bytes(self) -> float:
        return total_bytes(self.static_bytes, self.activations_bytes, self.logits_bytes, self.buffers_bytes,
                           self.context_bytes, self.step_bytes)

    @property
    def total_gb(self) -> float:
        return self.total_bytes / 1e9


def model_states_bytes(weights: float, grads: float, optimizer: float, pinned: float = 0.0) -> float:
    return weights + grads + optimizer + pinned


def total_bytes(static: float, activations: float, logits: float, buffers: float, context: float,
                step: float = 0.0) -> float:
    """One GPU's total: the model states (`model_states_bytes`), then the rest, summed in this order (the one place
    the sum is written: `MemoryBreakdown` and `PlanMemory` give the same float). The optimizer step's transient
    ``step`` and the activations and logits never live together: DeepSpeed's engine steps after the last
    micro-batch's backward (runtime/pipe/schedule.py TrainSchedule: OptimizerStep at the batch's last step), when
    the activations are freed."""
    if step > activations + logits:
        return static + step + buffers + context
    return static + activations + logits + buffers + context


def layers_per_stage(model: ModelSpec, pp: int) -> int:
    """The busiest stage's layer count: DeepSpeed's uneven split puts ceil(L/PP) on some stages."""
    return math.ceil(model.layers / pp)


def stage_layers(model: ModelSpec, cand: Candidate, framework: str, stage: str) -> int:
    """Transformer layers charged to the ``stage`` (first | last | only) entry of the memory model.

    Megatron-LM: the split it runs (`planner.pipeline_split.megatron_lm_split`); the 'first' entry takes the larger
    of the first and a middle rank (stage 1 holds PP-1 micro-batches in flight, nearly as many as stage 0), so it
    bounds every rank but the last. Other frameworks: ceil(L/PP) on every stage (DeepSpeed's partitioning).
    """
    split = stage_split(model, cand, framework)
    if split is None:
        return layers_per_stage(model, cand.pp)
    if stage == "middle" and split.middle:   # a DualPipe middle rank's stages (`planner.dualpipe.MIDDLE`)
        return split.middle
    if stage == dualpipe.END:   # the first stage as DualPipe's end rank holds it (its middle ranks are charged apart)
        return split.first
    return split.last if stage == "last" else max(split.first, split.middle)


def stage_split(model: ModelSpec, cand: Candidate, framework: str) -> StageSplit | None:
    """The split `stage_layers` charges: Megatron-LM's (`planner.pipeline_split.megatron_lm_split`) under PP, else
    None (ceil(L/PP) on every stage). All a stage's model states read of VPP (`PlanMemory.states_of`)."""
    if framework != "megatron-lm" or cand.pp <= 1:
        return None
    return megatron_lm_split(model.layers, cand.pp, cand.vpp, model.mtp_layers)


def layer_params(model: ModelSpec) -> float:
    """Parameters of one layer as a stage holds them (MoE: the non-expert ones; experts: moe.add_expert_states)."""
    return moe.mean_non_expert_layer_params(model) if moe.is_moe(model) else model.params_per_layer


def stage_params(model: ModelSpec, cand: Candidate, stage: str, framework: str = "", mtp_embedding: bool = True) -> int:
    """Parameters one GPU holds on ``stage`` (first | middle | last | only), split by TP. ``mtp_embedding``: whether
    Megatron's last stage keeps its own copy of the word embedding for the MTP layers (False where the first stage's
    is on the same GPU: DualPipe's end rank)."""
    layers = stage_layers(model, cand, framework, stage) * layer_params(model)
    word = model.vocab * model.hidden
    embedding_in = model.embedding_params - (0 if model.tied_embeddings else word)
    if stage == "only":   # routed experts are added (over EP) by moe.add_expert_states, not here
        total = model.params - moe.moe_layer_count(model) * moe.expert_layer_params(model)
    elif stage in ("first", dualpipe.END):   # END: the first stage of DualPipe's end rank
        total = layers + embedding_in
    elif stage == "middle":
        total = layers
    else:  # last: the LM head (a second copy of the tied word embedding under PP, Megatron) + final norm
        total = layers + word + model.norm_params
    if stage in ("last", "only"):   # DeepSeek-V3's MTP module sits after the last layer (Megatron: on the last stage)
        total += moe.mtp_non_expert_params(model)
    if stage == "last" and mtp_embedding and model.mtp_layers and not model.tied_embeddings \
            and framework == "megatron-lm":
        # Megatron-LM builds the word embedding on the MTP rank as well (megatron/core/models/gpt/gpt_model.py: "if
        # self.pre_process or self.mtp_process: self.embedding = ..."); DeepSeek's DualPipe puts the first and the last
        # stage on one rank so that the MTP module shares the main model's (DeepSeek-V3 report Sec. 3.2.3)
        total += word
    return math.ceil(total / cand.tp)


def sharded_static_bytes(params: int, pb: ParamBytes, cand: Candidate, shard: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer+master) after ZeRO stage ``cand.zero`` over ``shard`` ranks (ZeRO paper Sec. 5)."""
    z = cand.zero
    weights = params * pb.weights / (shard if z >= 3 else 1)
    grads = params * pb.grads / (shard if z >= 2 else 1)
    optimizer = params * (pb.master + pb.optimizer + pb.grads_fp32) / (shard if z >= 1 else 1)
    return weights, grads, optimizer


def shard_group_size(cand: Candidate, gpus_per_node: int) -> int:
    """ZeRO/FSDP shards over the DP group; HYBRID_SHARD only inside a node (seed 002)."""
    if cand.hybrid:
        return max(1, min(cand.dp, gpus_per_node // cand.tp))
    return cand.dp * cand.cp   # Megatron's distributed optimizer shards over the DP x CP group


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """One layer's activation bytes for one micro-batch on one GPU (`layer_activations`)."""

    stored_bytes: float
    """kept from forward to backward, per layer and micro-batch (the mean over the layers for selective-layer-N;
    block-N and uniform-N: `stored_layer_bytes` counts a rank's layers from the two below)"""
    working_bytes: float
    """transient: one layer's full activations while it is (re)computed"""
    input_bytes: float = 0.0
    """kept by a checkpointed layer (or unit of layers): its input"""
    full_bytes: float = 0.0
    """kept by a layer that is not checkpointed"""


def layer_activations(model: ModelSpec, cand: Candidate, training: TrainingSpec) -> LayerActivations:
    """Korthikanti et al. 2022 Table 2, generalised to GQA and GLU MLPs, in bytes per layer.

    Per micro-batch of b sequences of length s, 16-bit activations: attention 11·sbh + 5·a·s²·b,
    MLP 19·sbh, norms 4·sbh = sbh·(34 + 5as/h) (Eq. 1). The 24·sbh that TP splits and the 10·sbh
    it does not (norms, QKV/MLP inputs, dropout masks) are kept apart; SP also splits the 10.
    FlashAttention drops the 5as²b score/softmax/dropout term. Full recompute stores only the
    layer input, 2·sbh (/t with SP).

    Norms count as fused (keeping only their input), as in Megatron-LM / Megatron-DeepSpeed (apex, Transformer
    Engine) and torchtitan: its Llama-2 13B without activation checkpointing ran at local batch 2, seq 4096 on 80 GB
    (dev table torchtitan_2024_04_a100), which the unfused count does not allow. ``training.fused_norm`` False counts
    PyTorch's unfused RMSNorm (Hagemann et al.'s sheets without their "RMS kernel").
    """
    s, b, h, t = model.seq_len, cand.mbs, model.hidden, cand.tp
    f_ratio = moe.activation_ffn(model, training) / h   # == ffn_hidden / h for dense models
    kv = model.kv_heads / model.heads
    # generalised split of the 34: attention 7 + 4·kv/h (Q, K, V, proj input, mask), MLP 2 + ffn outputs,
    # norms 4; which parts TP divides follows Korthikanti Sec. 4.1.
    # without FlashAttention, GQA's K and V are expanded to every query head before the two batched GEMMs, which save
    # the expanded copies (megatron/core/transformer/dot_product_attention.py repeat_interleave; TE's unfused backend
    # and Hugging Face's eager repeat_kv alike): 4 bytes an element, as multi-head attention
    saved_kv = kv if training.flash_attention else 1.0
    attn_tp = 2 + 4 * saved_kv + 2                              # Q, K+V, proj input
    if training.eager_ops and training.flash_attention and training.framework != "megatron-lm":
        # a Megatron-style trainer calling flash-attn on its own [s, b, n, h] tensors copies them to flash's
        # [(b s), n, h] layout and the output back (Aleph-Alpha/scaling attention.py flash_attention: rearrange before
        # and after flash_attn_varlen_func): the output flash saves for its backward and the projection's input are two
        # tensors (Megatron-LM's flash attention is Transformer Engine's, whatever its element-wise fusions)
        attn_tp += 2
    mlp_tp = f_ratio * (2 * (2 if model.glu else 1) + 2)        # fc1 output(s) + activation output
    if model.glu and (training.framework != "megatron-lm" or training.eager_ops):
        mlp_tp += 2 * f_ratio   # SwiGLU: the product act(gate)·up is a fourth ffn-wide tensor (down-proj input)
    # Megatron-LM's fused SwiGLU (default; --no-bias-swiglu-fusion turns it off: ``eager_ops``) saves only its input,
    # the FC1 output (megatron/core/fusions/fused_bias_swiglu.py save_for_backward(input)): gate and up, then the FC2
    # input; unfused, silu(gate) is saved by the product as well (megatron/core/transformer/mlp.py glu)
    not_tp = 2 + 1 + 2 + 1 + 4                                  # QKV input, attn dropout mask, MLP input, MLP mask, norms
    if not model.dropout:
        not_tp -= 2   # Llama-family recipes train without dropout (ModelSpec.dropout): no masks to keep
    if not training.fused_norm:
        # an unfused norm, x·rsqrt(mean(x²))·w, also keeps the normalised x before the weight (autograd saves it
        # for w's gradient): 2 more bytes per element for each of the layer's two norms
        not_tp += 2 * 2
    not_tp += moe.dispatch_activation_sbh(model, training)      # MoE: permuted tokens (0 for dense)
    sbh = s * b * h
    # without FlashAttention: the softmax output (2·as²b, the AV GEMM's input and the softmax backward's), and with
    # dropout its mask and output (as²b + 2·as²b): Korthikanti's 5as²b. Megatron-Core's DotProductAttention without
    # dropout keeps the probabilities alone (megatron/core/transformer/dot_product_attention.py: softmax, then
    # nn.Dropout(0), which returns its input; the H200 Megatron-LM peaks of tests/bench/gpu_runs); the other trainers
    # keep Korthikanti's count: Hagemann et al.'s Llama sheets OOM where the probabilities alone would fit
    per_score = 2 if training.framework == "megatron-lm" and not model.dropout else 5
    scores = 0.0 if training.flash_attention else per_score * model.heads * s * s * b / t
    not_tp_bytes = not_tp * sbh / (t if cand.sp else 1)
    full = not_tp_bytes + (attn_tp + mlp_tp) * sbh / t + scores
    full -= fp8.activation_saving_bytes(cand, training.precision, sbh, f_ratio, training.flash_attention,
                                        fp8.fc1_input_copies(model, training))   # FP8 GEMM inputs
    deepseek = training.deepseek_fp8_storage
    if deepseek:   # DeepSeek-V3's low-precision storage (report Sec. 3.3.3), tensor by tensor
        full = fp8.deepseek_layer_bytes(model, cand, training) * s * b + scores
    layer_input = 2 * sbh / (t if cand.sp else 1)
    mode = recompute.parse(cand.recompute)
    kind = mode.kind if mode else cand.recompute
    if kind == "selective":
        stored = full - scores   # Korthikanti Sec. 4.2: recompute only the attention core
    elif kind == "selective-op":
        # torchtitan op-level SAC ("save every other mm"): of wq, wk, wv, wo, w1, (w3,) w2 it keeps the 1st, 3rd, ...
        # outputs (wq, wv, w1, and w2 with GLU), plus the attention output and the layer input (measured on the probe,
        # which runs the same policy: tests/test_probes_op_sac.py)
        kept = recompute.op_sac_kept_width(model, f_ratio * h) / h
        stored = layer_input + (2 * kept + 2) * sbh / t
    elif kind == "full":
        stored = layer_input
    elif kind == "modules" and deepseek:
        stored = max(layer_input, fp8.deepseek_layer_bytes(model, cand, training, mode.modules) * s * b
                     + (0.0 if "core_attn" in mode.modules else scores))
    elif kind == "modules":
        stored = max(layer_input, full - _module_saved_bytes(model, cand, training, mode.modules, sbh, scores, kv))
    elif kind == "selective-layer":
        n = mode.n   # torchtitan layer SAC: every n-th block checkpointed (its input kept)
        stored = (layer_input + (n - 1) * full) / n
    else:   # none; block-N and uniform-N: stored_layer_bytes counts the checkpointed layers' inputs and the others
        stored = full
    if kind == "none":
        # no transient on top: the stored activations are freed layer by layer as the backward runs
        return LayerActivations(stored_bytes=stored, working_bytes=0.0)
    # a recomputed layer's backward runs on top of all it re-saved; without FlashAttention it also materialises the
    # gradient of the s x s probabilities (16-bit; Megatron's fused softmax backward then works in place): 2·a·s²·b/t
    score_grad = 0.0 if training.flash_attention else 2 * model.heads * s * s * b / t
    # uniform-N re-runs a unit of N layers at once (transformer_block.py: checkpoint_handler(custom(l, l + N)))
    unit = mode.n if mode is not None and mode.kind == "uniform" else 1
    return LayerActivations(stored_bytes=stored, working_bytes=unit * full + score_grad, input_bytes=layer_input,
                            full_bytes=full)


def _module_saved_bytes(model: ModelSpec, cand: Candidate, training: TrainingSpec, modules: tuple[str, ...],
                        sbh: float, scores: float, kv: float) -> float:
    """Bytes per layer (the mean layer) Megatron-LM's --recompute-modules free, in `layer_activations`' terms:
    core_attn the score matrices (none under FlashAttention); layernorm the two norm outputs, the QKV and FC1/router
    inputs (2 + 2 bytes per sbh, split by SP); mla_up_proj MLA's Q, K and V (2 + 4·kv per sbh over TP); mlp the dense
    layers' MLP activations (f-wide: FC1 outputs and the FC2 input); moe_act the routed experts' FC2 input (2 bytes x
    top-k x capacity x expert width, output-discarding); shared_experts their MLP activations; moe the whole MoE
    block's (experts, shared experts, the permuted tokens) (megatron/core/transformer/transformer_layer.py,
    multi_latent_attention.py, moe/experts.py, moe/moe_layer.py)."""
    h, t = model.hidden, cand.tp
    sp = t if cand.sp else 1
    unit = 2 * (2 if model.glu else 1) + 2   # bytes per f-wide element of an MLP: FC1 output(s) and FC2 input
    n_moe = moe.moe_layer_count(model) if moe.is_moe(model) else 0
    share = n_moe / model.layers
    saved = scores if "core_attn" in modules else 0.0
    if "layernorm" in modules:
        saved += 4 * sbh / sp
    if "mla_up_proj" in modules and model.kv_lora_rank:
        saved += (2 + 4 * kv) * sbh / t
    if "mlp" in modules:
        saved += (1 - share) * model.ffn_hidden / h * unit * sbh / t
    if n_moe:
        e, cap = moe.expert_ffn(model), moe.capacity(training)
        if "moe" in modules:
            saved += share * e * (model.moe_topk * cap + model.shared_experts) / h * unit * sbh / t
            saved += moe.dispatch_activation_sbh(model, training) * sbh / sp
        else:
            if "moe_act" in modules:
                saved += share * 2 * e * model.moe_topk * cap / h * sbh / t
            if "shared_experts" in modules:
                saved += share * e * model.shared_experts / h * unit * sbh / t
    return saved


def in_flight_microbatches(cand: Candidate) -> float:
    """Micro-batches whose activations the first stage holds under 1F1B: min(PP, GAS).

    Interleaved 1F1B holds (1 + (p-1)/(p·v)) times more (Korthikanti et al. 2022 Sec. 4.2.3).
    """
    m = min(cand.pp, cand.gas)
    if cand.vpp > 1:   # never more than the step's micro-batches (torch ScheduleInterleaved1F1B caps its warm-up
        # at n_microbatches x stages per rank chunks: GAS whole-stage micro-batches)
        m = min(m * (1 + (cand.pp - 1) / (cand.pp * cand.vpp)), cand.gas)
    return m


# Bytes per logit at the loss's peak. Megatron keeps 4 (theoretical_memory_usage.py's "inputs to output layer and
# CE loss" term, 4·s·b·h·(1 + V/h)/t: the fp32 logits its vocab-parallel cross-entropy turns into softmax in place),
# but at the peak the 16-bit LM-head output coexists with that fp32 copy (gpt_model.py casts output.float() unless
# --fp16-lm-cross-entropy), and in backward the fp32 gradient with its 16-bit cast: 2 + 4 = 6. Seed 003's PP2 MBS16
# row OOMs on 32 GB only with the 6. PyTorch-eager trainers (torchtitan, HF/FSDP) cast the logits to fp32 for
# F.cross_entropy, which saves its own fp32 log-softmax: 2 + 4 + 4 = 10.
LOGIT_BYTES = {"megatron-lm": 6.0, "megatron-deepspeed": 6.0, "fsdp": 10.0, "deepspeed": 10.0}


def logits_bytes(model: ModelSpec, cand: Candidate, framework: str = "megatron-lm") -> float:
    """LM-head output at the loss on the last stage: LOGIT_BYTES·s·b·V/t, plus the LM-head input 4·s·b·h/t
    (Korthikanti et al. 2022 Sec. 4.3; Megatron's theoretical_memory_usage.py, whose steady state is 4 per logit)."""
    s, b = model.seq_len, cand.mbs
    return (LOGIT_BYTES.get(framework, 4.0) * s * b * model.vocab + 4.0 * s * b * model.hidden) / cand.tp


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
    if deepspeed_optimizer(training.framework):
        return nccl + 2 * min(5e8, params_on_gpu) * 2
    if training.framework == "fsdp" and cand.pp > 1:   # torchtitan under PP: the whole stage stays unsharded
        return nccl + fsdp_parallel.unsharded_stage_bytes(params_on_gpu, cand, training)
    if training.framework in ("fsdp", "megatron-lm") and cand.zero >= 2:   # FSDP; Megatron-FSDP (--use-megatron-fsdp)
        # 16-bit unsharded parameters (FSDP MixedPrecision param_dtype) and fp32 unsharded gradients (reduce_dtype)
        unsharded = (2.0 + 4.0) if training.precision != "fp32" else 8.0
        return nccl + 2 * model.params_per_layer / cand.tp * unsharded
    return nccl


def memory_breakdown(model: ModelSpec, cand: Candidate, cluster: ClusterSpec,
                     training: TrainingSpec) -> MemoryBreakdown:
    """Memory of the busiest GPU (bytes): the larger of the first and the last stage."""
    return max(stage_memory(model, cand, cluster, training), key=lambda m: m.total_bytes)


def pipeline_stages(cand: Candidate, training: TrainingSpec | None = None) -> tuple[str, ...]:
    """The stages the memory model charges: the first and the last under PP, else the only one; under DualPipe
    (``training``'s schedule) its ranks, each holding two stages: an end rank (the first and the last stage) and a
    middle one (`planner.dualpipe.ranks`)."""
    if cand.pp == 1:
        return ("only",)
    if training is not None and dualpipe.parameter_copies(training.pp_schedule, cand.pp) > 1:
        return dualpipe.ranks(cand.pp)
    return ("first", "last")


def stage_memory(model: ModelSpec, cand: Candidate, cluster: ClusterSpec,
                 training: TrainingSpec) -> list[MemoryBreakdown]:
    """Memory of a GPU on the first and on the last pipeline stage (one entry, 'only', without PP)."""
    pb = training_param_bytes(training)
    act = layer_activations(model, cand, training)
    return [_breakdown(stage, stage_states(model, cand, cluster, training, stage, pb),
                       stage_dynamic(model, cand, training, stage, act), cluster)
            for stage in pipeline_stages(cand, training)]


def host_offload_bytes(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Pinned host memory one GPU's offloads take (the busiest stage's): its CPU-optimizer share
    (`planner.offload.optimizer_host_bytes` of the whole optimizer shard) and its offloaded activations, the module
    inputs of every offloaded layer (`planner.offload.offloaded_layers`) for each micro-batch in flight on the first
    stage (`in_flight_microbatches`; DualPipe's PP + 1), split by CP like the GPU's. 0 without an offload."""
    f = offload.optimizer_fraction(cand, training)
    act_on = bool(cand.offload or training.activation_offload)
    if not f and not act_on:
        return 0.0
    pb = training_param_bytes(training)
    most = 0.0
    for stage in pipeline_stages(cand, training):
        host = _host_activation_bytes(model, cand, training, stage)
        if f:
            whole = stage_states(model, cand, cluster, training, stage, pb, opt_offload=0.0).optimizer
            host += offload.optimizer_host_bytes(whole, f, pb.master + pb.optimizer + pb.grads_fp32)
        most = max(most, host)
    return most


def _host_activation_bytes(model: ModelSpec, cand: Candidate, training: TrainingSpec, stage: str) -> float:
    """`host_offload_bytes`' activations on ``stage``: 0 without an activation offload."""
    if not (cand.offload or training.activation_offload):
        return 0.0
    _, lps, _, in_flight, _, tail = dynamic_frame(model, cand, training, stage)
    layers = in_flight * offload.offloaded_layers(lps, cand)
    if tail:   # a DualPipe end rank's chunks of its other stage
        layers += tail[0] * offload.offloaded_layers(tail[2], cand)
    return layers * offload.activation_offload_bytes(model, cand, training, model.seq_len * cand.mbs) / cand.cp


# Adam's two moments per parameter in the state dtype (bytes each): fp32 4 + 4 (seed 001); bf16 2 + 2, as DeepSeek-V3
# trained ("BF16 ... to track the first and second moments in the AdamW optimizer", report Sec. 3.3.3) and as
# Megatron-LM's precision-aware optimizer keeps them (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, arguments.py)
ADAM_MOMENT_BYTES = {"fp32": 4.0, "bf16": 2.0}


def with_state_dtype(pb: ParamBytes, training: TrainingSpec) -> ParamBytes:
    """``pb`` with Adam's moments in ``training.optimizer_state_dtype`` (`ADAM_MOMENT_BYTES`); the fp32 master weights
    and gradients unchanged (report Sec. 3.3.3: "the master weights ... and gradients ... are still retained in
    FP32")."""
    if training.optimizer_state_dtype == "fp32" or training.optimizer != "adamw":
        return pb
    return replace(pb, optimizer=2 * ADAM_MOMENT_BYTES[training.optimizer_state_dtype])


def training_param_bytes(training: TrainingSpec) -> ParamBytes:
    """Bytes per parameter for the run's precision, optimizer (and its state dtype) and framework, and its
    gradient-reduce dtype."""
    pb = with_state_dtype(param_bytes(training.precision, training.optimizer, training.framework), training)
    if training.framework == "megatron-lm" and pb.master and (
            training.grad_reduce_dtype == "bf16" or training.precision == "fp16"):
        # Megatron-LM's main-grad buffer is fp32 only under --bf16 (arguments.py: "bfloat16 requires gradient
        # accumulation and all-reduce to be done in fp32" -> grad_reduce_in_fp32); --fp16 keeps it in the params'
        # fp16 (param_and_grad_buffer grad_dtype), and --grad-reduce-in-bf16 turns the fp32 off
        pb = replace(pb, grads=2)
    if pipeline_engine.runs_bf16_optimizer(training):
        # BF16_Optimizer (the bigscience fork under bf16) keeps fp32 gradients for every parameter of the GPU beside
        # the bf16 ones (bf16_optimizer.py: fp32_groups_gradients_flat = zeros_like(bf16_groups_flat, fp32)), not a
        # DP partition; fp32 master weights and Adam states are partitioned over DP (ZeRO-1-like)
        pb = replace(pb, grads=pb.grads + pipeline_engine.CONSTANTS["bf16_fp32_grad_bytes_per_param"].value,
                     grads_fp32=0)
    return pb


# DeepSpeed at ZeRO 0 under fp16 (runtime/engine.py _configure_fp16_optimizer) keeps the 16-bit gradients (2 bytes a
# parameter, not the 18 rule's 4) and makes fp32 ones at each step. FP16_Optimizer, with a fused Adam (Megatron's
# AdamW: apex / DeepSpeed FusedAdam), flattens them (runtime/fp16/fused_optimizer.py step: _flatten_dense_tensors of
# [p.grad.to(fp32) for p in group]): the per-parameter fp32 copies and their concatenation, 4 + 4 bytes.
# FP16_UnfusedOptimizer, with any other optimizer (bitsandbytes' 8-bit Adam, SGD, ...), one fp32 copy per parameter
# (runtime/fp16/unfused_optimizer.py step: fp32_param.grad = fp16_param.grad.to(fp32)), 4 bytes.
# ZeRO-1 over one DP rank is DeepSpeed's ZeRO optimizer all the same (engine.py _configure_zero_optimizer: the stage,
# not the DP size, picks it), whose step flattens the rank's partition, here every gradient, to 16 bits and casts
# that to fp32 while the 16-bit gradients still live (runtime/zero/stage_1_and_2.py step:
# self.flatten(self.averaged_gradients[i]).to(fp32), then free_grad_in_param_list): 2 + 4 bytes ("zero1_one_rank")
FP16_STEP_GRAD_BYTES = {"fused": 8.0, "unfused": 4.0, "zero1_one_rank": 6.0}


def deepspeed_fp16_step_grad_bytes(cand: Candidate, training: TrainingSpec) -> float:
    """fp32 gradient bytes per parameter DeepSpeed's fp16 optimizer allocates at the step beside the 16-bit gradients:
    FP16_Optimizer at ZeRO 0, the ZeRO optimizer at ZeRO-1 over one DP rank (`deepspeed_zero1_one_rank`); 0 for
    every other step: ZeRO >= 1 over several ranks (the fitted 18 rule, `param_bytes`), bf16 BF16_Optimizer
    (`training_param_bytes`), other frameworks."""
    if not deepspeed_optimizer(training.framework) or training.precision != "fp16":
        return 0.0
    if deepspeed_zero1_one_rank(cand, training):
        return FP16_STEP_GRAD_BYTES["zero1_one_rank"]
    if cand.zero:
        return 0.0
    return FP16_STEP_GRAD_BYTES["fused" if training.optimizer == "adamw" else "unfused"]


def deepspeed_zero1_one_rank(cand: Candidate, training: TrainingSpec) -> bool:
    """ZeRO-1 over a single DP rank under DeepSpeed's fp16 engine: a layout of its own, not ZeRO 0 (the ZeRO optimizer,
    not FP16_Optimizer, runs the step: `deepspeed_fp16_step_grad_bytes`); planner.rules keeps it."""
    return cand.zero == 1 and cand.dp * cand.cp == 1 and training.precision == "fp16" \
        and deepspeed_optimizer(training.framework)


class StageStates(NamedTuple):
    """What a GPU on one stage holds whatever the micro-batch, GAS, SP or recompute (`stage_states`): bytes but
    ``params``; ``step``, ``reserved``, ``pinned``: `MemoryBreakdown.step_bytes`, ``reserved_bytes``,
    ``pinned_bytes``."""

    params: int
    weights: float
    grads: float
    optimizer: float
    buffers: float
    step: float
    reserved: float
    pinned: float
    static: float
    """`model_states_bytes` of the above, kept as `PlanMemory` reads it for every candidate"""


def _states(params: int, weights: float, grads: float, optimizer: float, buffers: float, step: float, reserved: float,
            pinned: float) -> StageStates:
    return StageStates(params, weights, grads, optimizer, buffers, step, reserved, pinned,
                       model_states_bytes(weights, grads, optimizer, pinned))


def stage_states(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, stage: str,
                 pb: ParamBytes, opt_offload: float | None = None, dense: dict | None = None) -> StageStates:
    """`StageStates` of a GPU on ``stage``: what reads only TP, PP, DP, CP, VPP,
    ZeRO, hybrid, EP and ETP (never the micro-batch, GAS, SP or recompute). ``pb``: `training_param_bytes`. Under
    DeepSeek's DualPipe an end rank holds the first and the last stage (DeepSeek-V3 report Table 2: 2x parameters):
    both stages' states, on either entry. ``opt_offload``: the share of the optimizer on the host, when not the
    candidate's (`planner.offload.optimizer_fraction`): the host-memory rule reads the whole optimizer (0). ``dense``:
    the caller's memo of `dense_states` by stage, for candidates that differ from ``cand`` in EP and ETP only."""
    f = offload.optimizer_fraction(cand, training) if opt_offload is None else opt_offload
    if stage in (dualpipe.END, dualpipe.MIDDLE):   # DualPipe: rank i holds stage i and stage PP-1-i
        a, b = ([_stage_states(model, cand, cluster, training, s, pb, f, dense) for s in (dualpipe.END, "last")]
                if stage == dualpipe.END else [_stage_states(model, cand, cluster, training, "middle", pb, f, dense)] * 2)
        # the communication buffers are the GPU's, not a stage's: once
        return _states(a.params + b.params, a.weights + b.weights, a.grads + b.grads, a.optimizer + b.optimizer,
                       max(a.buffers, b.buffers), a.step + b.step, a.reserved + b.reserved, a.pinned + b.pinned)
    return _stage_states(model, cand, cluster, training, stage, pb, f, dense)


class DenseStates(NamedTuple):
    """What `stage_states` holds of a stage before its routed experts are added: it reads no EP or ETP (`PlanMemory`
    keeps one per row of candidates that differ only in those)."""

    pb: ParamBytes
    """`training_param_bytes` as this layout stores them (DeepSpeed's fp16 step gradients, FP8 param gather)"""
    step_grads: float
    shard: int
    layers: int
    params: int
    weights: float
    grads: float
    optimizer: float
    routed: tuple[float, int]
    """`planner.moe.routed_params` of the stage: its routed experts before EP and ETP split them"""


def dense_states(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, stage: str,
                 pb: ParamBytes) -> DenseStates:
    """`DenseStates` of a GPU on ``stage``: the non-expert parameters and their ZeRO-sharded bytes."""
    step_grads = deepspeed_fp16_step_grad_bytes(cand, training)
    if step_grads:   # the 16-bit gradients; their fp32 copies at the step are the step's own term
        pb = replace(pb, grads=2, grads_fp32=0, reserved=0.0)
    if fp8.fp8_param_gather(cand, training):
        # --fp8-param-gather (ZeRO >= 1): the forward's weights as FP8 and its transpose, 2 bytes, no bf16 copy (the
        # embedding, norms and LM head stay bf16: 2 bytes as well)
        pb = replace(pb, weights=fp8.FP8_PARAM_BYTES)
    shard = shard_group_size(cand, cluster.gpus_per_node)
    lps = stage_layers(model, cand, training.framework, stage)
    params = stage_params(model, cand, stage, training.framework,
                          mtp_embedding=dualpipe.parameter_copies(training.pp_schedule, cand.pp) == 1)
    return DenseStates(pb, step_grads, shard, lps, params, *sharded_static_bytes(params, pb, cand, shard),
                       moe.routed_params(model, lps, last_stage=stage in ("last", "only")))


def _stage_states(model: ModelSpec, cand: Candidate, cluster: ClusterSpec, training: TrainingSpec, stage: str,
                  pb: ParamBytes, opt_offload: float, dense: dict | None = None) -> StageStates:
    known = None if dense is None else dense.get(stage)
    if known is None:
        known = dense_states(model, cand, cluster, training, stage, pb)
        if dense is not None:
            dense[stage] = known
    pb, step_grads, shard, lps, params, weights, grads, optimizer, routed = known
    params, weights, grads, optimizer = moe.add_expert_states(   # routed experts over EP (and the MTP layer's)
        cand, routed, pb, (params, weights, grads, optimizer), sharded_static_bytes)
    optimizer *= 1 - opt_offload   # the host's share (planner.offload)
    reserved = params * pb.reserved / (shard if cand.zero >= 2 else 1)   # sharded as the gradients are
    pinned = pinned_reserve(reserved, params, shard)
    return _states(params, weights, grads, optimizer, framework_buffers_bytes(params, cand, training, pb, model),
                   params * step_grads, reserved - pinned, pinned)   # step unsharded: ZeRO 0, or ZeRO-1's over 1 rank


def pinned_reserve(reserved: float, params: float, shard: int) -> float:
    """Of the allocator's ``reserved`` bytes beside ``params`` parameters ZeRO shards over ``shard`` ranks, those it
    cannot give back before an OOM, so what must fit: at most DEEPSPEED_PINNED_PARTITION_BYTES a parameter over the
    ranks (planner.constants: between the step's flat 16-bit and fp32 partitions, 6/N, and every partition-sized
    tensor stage_1_and_2.py allocates, 12/N). c10's CUDACachingAllocator frees its cached segments and retries a
    failed cudaMalloc; a segment a live tensor shares stays."""
    return min(reserved, DEEPSPEED_PINNED_PARTITION_BYTES * params / shard)


def dynamic_frame(model: ModelSpec, cand: Candidate, training: TrainingSpec,
                  stage: str) -> tuple[str, int, float, float, float, tuple[float, str, int] | None]:
    """What `stage_dynamic` reads of ``cand``'s TP, PP, VPP, MBS and GAS alone (never its recompute, offload, SP or
    CP): (the stage its stored activations are counted as, its layers, the embedding output, the micro-batches in
    flight, the logits before CP's split, and a DualPipe end rank's chunks of its other stage: (count, stage, layers)
    or None). `PlanMemory` keeps one per (TP, MBS, PP, VPP, GAS) and stage."""
    embed_out = 2.0 * model.seq_len * cand.mbs * model.hidden  # embedding output / pipeline input buffer
    fw = training.framework
    if stage in (dualpipe.END, dualpipe.MIDDLE):
        # DualPipe (`planner.dualpipe.peak_chunks`): the end rank PP chunks of the first stage and one of the last
        # (with its MTP layers and the loss's logits), a middle rank PP + 1 of its two middle stages
        shallow, deep = dualpipe.peak_chunks(cand.pp, cand.gas, 0 if stage == dualpipe.END else 1)
        if stage == dualpipe.MIDDLE:
            return "middle", stage_layers(model, cand, fw, "middle"), embed_out, float(shallow + deep), 0.0, None
        logits = ALLOCATOR_OVERHEAD * logits_bytes(model, cand, fw)
        tail = (float(deep), "last", stage_layers(model, cand, fw, "last")) if deep else None
        return dualpipe.END, stage_layers(model, cand, fw, dualpipe.END), embed_out, float(shallow), logits, tail
    lps = stage_layers(model, cand, fw, stage)
    in_flight = in_flight_microbatches(cand) if stage == "first" else 1.0
    if training.pp_schedule in dualpipe.SCHEDULES and stage != "only":
        # DualPipeV: PP + 1/2 of a rank's micro-batches in flight (DeepSeek-V3 report Table 2, in half-size stages),
        # the larger of its stages'; the LM head's logits on the first rank too (it holds the last stage)
        lps = max(lps, stage_layers(model, cand, fw, "first" if stage == "last" else "last"))
        in_flight = dualpipe.in_flight_microbatches(training.pp_schedule, cand.pp, cand.gas)
        stage = "last"
    logits = ALLOCATOR_OVERHEAD * logits_bytes(model, cand, fw) if stage in ("last", "only") else 0.0
    return stage, lps, embed_out, in_flight, logits, None


def stage_dynamic(model: ModelSpec, cand: Candidate, training: TrainingSpec, stage: str,
                  act: LayerActivations, frame: tuple | None = None, kept: float | None = None) -> tuple[float, float]:
    """(activations, logits) of a GPU on ``stage``, from ``act`` (`layer_activations` of the candidate): what reads
    TP, PP, VPP, CP, MBS and GAS besides ``act``'s TP, SP, MBS and recompute. ``frame``: `dynamic_frame` of ``cand``
    and ``stage`` when the caller keeps it; ``kept``: `_kept_bytes` of the stage when the caller keeps it (not of a
    DualPipe end rank; ``cand``'s recompute and offload are then not read)."""
    stage, lps, embed_out, in_flight, logits, tail = frame or dynamic_frame(model, cand, training, stage)
    if kept is None:
        kept = _kept_bytes(model, cand, training, stage, lps, act)
    held = in_flight * (kept + embed_out)
    if tail:   # a DualPipe end rank's chunks of its other stage
        held += tail[0] * (_kept_bytes(model, cand, training, tail[1], tail[2], act) + embed_out)
    activations = ALLOCATOR_OVERHEAD * (held + act.working_bytes)
    return context_parallel.split_activations(activations, logits, model, cand, training)


def _kept_bytes(model: ModelSpec, cand: Candidate, training: TrainingSpec, stage: str, lps: int,
                act: LayerActivations, offloaded: dict | None = None) -> float:
    """`stored_layer_bytes` of one micro-batch on the GPU, less the module inputs an activation offload puts on the
    host (planner.offload.modules_of). ``offloaded``: the caller's memo of `planner.offload.activation_offload_bytes`
    by what it reads (TP, SP, MBS, the offload; `PlanMemory`)."""
    stored = stored_layer_bytes(model, cand, stage, lps, act)
    if cand.offload or training.activation_offload:
        key = (cand.tp, cand.sp, cand.mbs, cand.offload)
        per_layer = None if offloaded is None else offloaded.get(key)
        if per_layer is None:
            per_layer = offload.activation_offload_bytes(model, cand, training, model.seq_len * cand.mbs)
            if offloaded is not None:
                offloaded[key] = per_layer
        stored -= offload.offloaded_layers(lps, cand) * min(per_layer, max(0.0, act.stored_bytes - act.input_bytes))
    return stored


def _kept_reads_vpp(mode: str, offload_set: str, training: TrainingSpec) -> bool:
    """Whether `_kept_bytes` reads VPP under recompute ``mode`` and the layout's activation offload ``offload_set``:
    block-N and uniform-N (`stored_layer_bytes`), or any activation offload (`planner.offload.offloaded_layers`)."""
    return recompute.kind(mode) in recompute.PARTIAL or bool(offload_set or training.activation_offload)


def stored_layer_bytes(model: ModelSpec, cand: Candidate, stage: str, lps: int, act: LayerActivations) -> float:
    """Activations the ``lps`` layers of a rank (and its MTP layers) keep for one micro-batch: ``act.stored_bytes``
    each, but under block-N / uniform-N the checkpointed layers (`planner.recompute.checkpointed_layers`) keep only
    their inputs (`planner.recompute.kept_inputs`) and the others all their activations."""
    mtp = model.mtp_layers if stage in ("last", "only") else 0   # MTP layers: a layer's activations each
    if recompute.kind(cand.recompute) not in recompute.PARTIAL:
        return (lps + mtp) * act.stored_bytes
    checkpointed = recompute.checkpointed_layers(cand.recompute, lps, cand.vpp)
    inputs = recompute.kept_inputs(cand.recompute, lps, cand.vpp)
    return inputs * act.input_bytes + (lps - checkpointed + mtp) * act.full_bytes


def _breakdown(stage: str, states: StageStates, dynamic: tuple[float, float], cluster: ClusterSpec) -> MemoryBreakdown:
    params, weights, grads, optimizer, buffers, step, reserved, pinned, _ = states
    return MemoryBreakdown(stage=stage, params_on_gpu=params, weights_bytes=weights, grads_bytes=grads,
                           optimizer_bytes=optimizer, activations_bytes=dynamic[0], logits_bytes=dynamic[1],
                           buffers_bytes=buffers, context_bytes=cluster.context_bytes, step_bytes=step,
                           reserved_bytes=reserved, pinned_bytes=pinned)


def _dynamic_key(c: Candidate, recompute: str, offload: str) -> tuple:
    """The fields `PlanMemory._dynamic_of` reads of ``c`` (``recompute``, ``offload`` in place of its own): its
    memo's key."""
    return c.tp, c.sp, c.mbs, recompute, c.pp, c.vpp, c.cp, c.gas, offload


class RowStates:
    """`PlanMemory.row`: the `PlanMemory.states_of` of each candidate of a row, and numbers for their values (a plain
    class: a NamedTuple's or dataclass's making would cost every `plan` process more at import than it saves in a
    small plan)."""

    __slots__ = ("states", "numbers", "number")

    def __init__(self, states: tuple[tuple, ...], numbers: tuple[int, ...], number: int) -> None:
        self.states = states
        self.numbers = numbers
        """a number for each of ``states``' values: equal numbers, equal floats (what reads only those answers
        alike)"""
        self.number = number
        """a number for the row's values"""


class PlanMemory:
    """`memory_breakdown` and its fit for the many candidates of one plan (create one per plan), exactly as they
    compute them, with each part computed once per distinct value of the fields it reads: `stage_states` per (TP, PP,
    DP x CP, VPP's split, ZeRO, hybrid, EP, ETP, optimizer offload; `states_of`), `layer_activations` per (TP, SP, MBS,
    recompute), `_kept_bytes` and `dynamic_frame` per what each reads, `stage_dynamic` per (TP, SP, MBS, recompute, PP,
    VPP, CP, GAS, offload). A candidate's busiest-stage total is then a sum (`total_bytes`); its `MemoryBreakdown` is
    built only when asked for. What reads only those values (a row's fits, `row_fits`) is answered once per distinct
    value (`row`'s numbers, `_dynamic_token`)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> None:
        self.model, self.cluster, self.training = model, cluster, training
        self.pb = training_param_bytes(training)
        self.usable_bytes = usable_bytes(cluster, training)
        self.context_bytes = cluster.context_bytes
        self._states: dict[tuple, tuple] = {}
        """per stage: `stage_states` and their `model_states_bytes`"""
        self._dense: dict[tuple, dict[str, DenseStates]] = {}
        """`dense_states` by stage, for the (EP, ETP) of one (TP, PP, DP, CP, VPP, ZeRO, hybrid, optimizer offload)"""
        self._layers: dict[tuple, LayerActivations] = {}
        """`layer_activations` by (TP, SP, MBS, recompute; block-N for every N)"""
        self._parts: dict[tuple, tuple[LayerActivations, bool, dict]] = {}
        """by (TP, SP, MBS, recompute, offload): `layer_activations`, whether `_kept_bytes` reads VPP, and
        `_kept_bytes` by (VPP where read, the stage's MTP layers, its layers)"""
        self._dynamic: dict[tuple, tuple] = {}
        """per stage: `stage_dynamic`"""
        self._numbered: dict[tuple, tuple[tuple, int]] = {}
        """`_dynamic_token`: `_dynamic` and the number of its value (`_dynamic_ids`)"""
        self._dynamic_ids: dict[tuple, int] = {}
        """a number for each distinct value of `_dynamic_of`: layouts whose fields differ can hold the same floats
        (MBS and CP both doubled: the same tokens a rank), and what reads only those floats (`row_fits`) is then
        answered once"""
        self._state_ids: dict[tuple, int] = {}
        """a number for each distinct value of `states_of` (layouts whose DP x CP is the same hold the same states)"""
        self._row_ids: dict[tuple[int, ...], int] = {}
        """a number for each distinct row of `states_of` values (`row`)"""
        self._room: dict[int, tuple[bool, ...]] = {}
        """`row_room` by the row's number"""
        self._states_fit: dict[int, tuple[bool, ...]] = {}
        """`row_states_fit` by the row's number"""
        self._row_fits: dict[tuple[int, int], list[bool]] = {}
        """`row_fits` by the numbers of the row's states and of its dynamic memory"""
        self._row_fits_off: dict[tuple[int, int], list[bool]] = {}
        """`row_fits_optimizer_off` by the same"""
        self._frames: dict[tuple, tuple] = {}
        """per stage: `dynamic_frame` and `_kept_bytes`' keys (`_new_frames`) by (TP, MBS, PP, VPP, GAS)"""
        self._offloaded: dict[tuple, float] = {}
        """`planner.offload.activation_offload_bytes` by (TP, SP, MBS, offload) (`_kept_bytes`)"""
        self._rows: dict[tuple, RowStates] = {}
        """`row`: `states_of` for each (EP, ETP) of a row"""
        self._by_mode: dict[tuple, dict[str, tuple]] = {}
        """`dynamic_by_mode`: `_dynamic_of` by (TP, SP, MBS, PP, VPP, CP, GAS), then by recompute mode"""

    def states_of(self, c: Candidate, ep: int, etp: int) -> tuple:
        """Per stage (`pipeline_stages` order): `stage_states` of ``c`` with EP ``ep`` and ETP ``etp``."""
        # what the states read: VPP only through the stages' layers (Megatron-LM's split; VPPs that split the layers
        # alike hold the same states); DP and CP only as the DP x CP group (`shard_group_size`, `moe.expert_data_
        # parallel`, `deepspeed_zero1_one_rank`), whether DP > 1 (`nccl_buffers_bytes`) and, under HYBRID_SHARD, DP
        # itself (`shard_group_size`): layouts of one TP and PP hold the same states whatever their CP
        split = stage_split(self.model, c, self.training.framework)
        dp = c.dp
        dense_key = (c.tp, c.pp, dp * c.cp, dp if c.hybrid else dp > 1, split.as_tuple() if split else None, c.zero,
                     c.hybrid, c.opt_offload)
        key = (*dense_key, ep, etp)
        states = self._states.get(key)
        if states is None:
            with_ep = c if (c.ep, c.etp) == (ep, etp) else candidate_with(c, ep=ep, etp=etp)
            dense = self._dense.get(dense_key)
            if dense is None:
                dense = self._dense[dense_key] = {}
            states = self._states[key] = tuple(stage_states(self.model, with_ep, self.cluster, self.training, stage,
                                                            self.pb, dense=dense)
                                               for stage in pipeline_stages(c, self.training))
        return states

    def _dynamic_of(self, c: Candidate, recompute: str | None = None, offload: str | None = None) -> tuple:
        """Per stage (`pipeline_stages` order): `stage_dynamic` of ``c`` (with ``recompute`` or ``offload`` instead of
        its own when given: `planner.rank.partial_mode` tries many N of one candidate, `offload_fitting` several
        module sets, and neither builds them)."""
        if recompute is None:
            recompute = c.recompute
        if offload is None:
            offload = c.offload
        key = _dynamic_key(c, recompute, offload)
        dynamic = self._dynamic.get(key)
        if dynamic is None:
            dynamic = self._dynamic[key] = self._new_dynamic(c, recompute, offload)
        return dynamic

    def _dynamic_token(self, c: Candidate, offload: str | None = None, recompute: str | None = None,
                       ) -> tuple[tuple, int]:
        """`_dynamic_of` ``c`` (with ``offload``, ``recompute``: as `_dynamic_of` takes them) and its value's number
        (`_dynamic_ids`), numbered when first asked."""
        if offload is None:
            offload = c.offload
        if recompute is None:
            recompute = c.recompute
        key = _dynamic_key(c, recompute, offload)
        known = self._numbered.get(key)
        if known is None:
            dynamic = self._dynamic.get(key) or self._dynamic_of(c, recompute, offload)
            known = self._numbered[key] = (dynamic, self._dynamic_ids.setdefault(dynamic, len(self._dynamic_ids)))
        return known

    def _new_dynamic(self, c: Candidate, recompute: str, offload: str) -> tuple:
        """`_dynamic_of` not yet known: `stage_dynamic` of each stage, its parts looked up by the fields each reads
        (`layer_activations` by TP, SP, MBS and recompute; `dynamic_frame` by TP, MBS, PP, VPP and GAS; `_kept_bytes`
        by TP, SP, MBS, recompute, offload, VPP and the stage's layers) and summed by `stage_dynamic`. ``c`` is built
        with ``recompute`` and ``offload`` only where a part is not known yet."""
        model, training = self.model, self.training
        tp, sp, mbs = c.tp, c.sp, c.mbs
        built = c if recompute == c.recompute and offload == c.offload else None
        parts_key = (tp, sp, mbs, recompute, offload)
        parts = self._parts.get(parts_key)
        if parts is None:
            mode_key = "block" if recompute.startswith("block-") else recompute   # `layer_activations` reads no N
            layer_key = (tp, sp, mbs, mode_key)                                 # of block-N (`stored_layer_bytes`)
            act = self._layers.get(layer_key)
            if act is None:
                built = built or candidate_with(c, recompute=recompute, offload=offload)
                act = self._layers[layer_key] = layer_activations(model, built, training)
            # `_kept_bytes` reads VPP only under block-N / uniform-N (`stored_layer_bytes`) or an activation offload
            # (`planner.offload.offloaded_layers`), and of the stage only whether it holds the MTP layers
            parts = self._parts[parts_key] = (act, _kept_reads_vpp(recompute, offload, training), {})
        act, reads_vpp, kept_memo = parts
        frame_key = (tp, mbs, c.pp, c.vpp, c.gas)
        frames = self._frames.get(frame_key)
        if frames is None:
            frames = self._frames[frame_key] = self._new_frames(c)
        out = []
        for frame, kept_keys in frames:
            stage, lps, embed_out, in_flight, logits, tail = frame
            if tail:   # a DualPipe end rank: `stage_dynamic` itself
                built = built or candidate_with(c, recompute=recompute, offload=offload)
                out.append(stage_dynamic(model, built, training, stage, act, frame))
                continue
            kept_key = kept_keys[reads_vpp]
            kept = kept_memo.get(kept_key)
            if kept is None:
                built = built or candidate_with(c, recompute=recompute, offload=offload)
                kept = kept_memo[kept_key] = _kept_bytes(model, built, training, stage, lps, act, self._offloaded)
            out.append(stage_dynamic(model, c, training, stage, act, frame, kept))
        return tuple(out)

    def _new_frames(self, c: Candidate) -> tuple:
        """Per stage: `dynamic_frame` of ``c``, and the keys of `_kept_bytes` within a (TP, SP, MBS, recompute,
        offload): (the MTP layers the stage holds, its layers) without VPP and with ``c``'s."""
        model, training, mtp = self.model, self.training, self.model.mtp_layers
        out = []
        for stage in pipeline_stages(c, training):
            frame = dynamic_frame(model, c, training, stage)
            held, lps = (mtp if frame[0] in ("last", "only") else 0), frame[1]
            out.append((frame, ((0, held, lps), (c.vpp, held, lps))))
        return tuple(out)

    def dynamic_offloaded(self, c: Candidate, offload: str) -> tuple:
        """`_dynamic_of` ``c`` with the activation-offload module set ``offload`` (the ``most`` `offload_fitting` and
        `both_offloads_fitting` take: plan() asks it once per row)."""
        return self._dynamic_of(c, offload=offload)

    def _busiest(self, states: tuple, dynamic: tuple) -> float:
        """The larger stage total, as `memory_breakdown` picks it."""
        context = self.context_bytes
        s, d = states[0], dynamic[0]
        total = total_bytes(s.static, d[0], d[1], s.buffers, context, s.step)
        if len(states) > 1:   # the first and the last stage
            s, d = states[1], dynamic[1]
            total = max(total, total_bytes(s.static, d[0], d[1], s.buffers, context, s.step))
        return total

    def _within(self, states: tuple, dynamic: tuple) -> bool:
        """``_busiest(states, dynamic) <= usable_bytes``: each stage's total within, each summed as `total_bytes`
        sums it (the same float; written out here, as this runs for every candidate of a plan)."""
        usable, context = self.usable_bytes, self.context_bytes
        for s, d in zip(states, dynamic):   # the first stage, and the last when there are two
            step = s.step
            if step > d[0] + d[1]:
                if s.static + step + s.buffers + context > usable:
                    return False
            elif s.static + d[0] + d[1] + s.buffers + context > usable:
                return False
        return True

    def leave_room(self, states: tuple) -> bool:
        """False when no activations can fit beside ``states`` (`states_of`): some stage's model states, buffers and
        CUDA context alone exceed the usable memory. `_within`'s sums then exceed it too, whatever the dynamic memory:
        each adds non-negative terms (the step, activations, logits) to the static bytes, and float addition is monotone
        in each operand. True (not known) under the training's own activation offload, which subtracts from the
        activations."""
        if self.training.activation_offload:
            return True
        usable, context = self.usable_bytes, self.context_bytes
        return all(s.static + s.buffers + context <= usable for s in states)

    def total_bytes(self, c: Candidate) -> float:
        """`memory_breakdown(...).total_bytes`: the busiest stage's total."""
        return self._busiest(self.states_of(c, c.ep, c.etp), self._dynamic_of(c))

    def fits(self, c: Candidate) -> bool:
        """`verdict(memory_breakdown(...)).fits`, without building the breakdown: ``total_bytes(c) <= usable_bytes``,
        every stage's total within (`_within`)."""
        return self._within(self.states_of(c, c.ep, c.etp), self._dynamic_of(c))

    def fits_under(self, c: Candidate, ep_etp: tuple[int, int] | None = None) -> Callable[[str], bool]:
        """`fits` of ``c`` (with EP, ETP ``ep_etp`` when given) and the recompute mode it is called with, that
        candidate not built and its model states looked up once (`planner.rank.partial_mode` tries several N)."""
        ep, etp = (c.ep, c.etp) if ep_etp is None else ep_etp
        return self.fits_under_states(c, self.states_of(c, ep, etp), self.dynamic_by_mode(c))

    def fits_under_states(self, c: Candidate, states: tuple, by_mode: dict[str, tuple]) -> Callable[[str], bool]:
        """`fits_under` from ``c``'s `states_of` (with its EP, ETP) and `dynamic_by_mode` (`planner.rank` asks the
        latter once per row: a row's candidates differ only in EP and ETP)."""
        within, dynamic_of = self._within, self._dynamic_of

        def fits(recompute: str) -> bool:
            dynamic = by_mode.get(recompute)
            if dynamic is None:
                dynamic = by_mode[recompute] = dynamic_of(c, recompute)
            return within(states, dynamic)
        return fits

    def offload_fitting(self, c: Candidate, ep: int, etp: int, sets: tuple[str, ...],
                        states: tuple | None = None, most: tuple | None = None) -> str | None:
        """The first of the activation-offload module ``sets`` under which ``c`` with EP ``ep`` and ETP ``etp`` fits,
        or None (no candidate built). Each set offloads more than the one before (`planner.offload.SEARCHED_SETS`):
        the last is asked first, as most layouts memory rules out do not fit even so. ``states``: `states_of` ``c``
        with ``ep``, ``etp`` when the caller has them (`row_states`); ``most``: ``c``'s `_dynamic_of` under ``sets[-1]``
        when the caller has it (one per row)."""
        within = self._within
        if states is None:
            states = self.states_of(c, ep, etp)
        if max(s.static + s.buffers + s.step for s in states) + self.context_bytes > self.usable_bytes:   # the states
            return None                                                                         # alone do not fit
        if not within(states, self._dynamic_of(c, offload=sets[-1]) if most is None else most):
            return None
        return next((s for s in sets if within(states, self._dynamic_of(c, offload=s))), None)

    def optimizer_offload_fitting(self, c: Candidate, ep: int, etp: int, fractions: tuple[float, ...]) -> float | None:
        """The first of the CPU optimizer offload ``fractions`` (`planner.offload.OPTIMIZER_FRACTIONS`, smallest first)
        under which ``c`` with EP ``ep`` and ETP ``etp`` fits, or None (no candidate built): the last is asked first,
        as most layouts memory rules out do not fit even so."""
        dynamic, usable, busiest, context = self._dynamic_of(c), self.usable_bytes, self._busiest, self.context_bytes
        # a bound from the row's states (cached): the whole optimizer off, nothing else changed; exact but where FP8
        # param gather turns off under the offload (planner.fp8), then the weights grow: never more than the exact
        if max(total_bytes(s.static - s.optimizer, d[0], d[1], s.buffers, context, s.step)
               for s, d in zip(self.states_of(c, ep, etp), dynamic)) > usable:
            return None
        states = self.states_of(candidate_with(c, opt_offload=fractions[-1]), ep, etp)
        if busiest(states, dynamic) > usable:
            return None
        return next((f for f in fractions
                     if busiest(self.states_of(candidate_with(c, opt_offload=f), ep, etp), dynamic) <= usable), None)

    def both_offloads_fitting(self, c: Candidate, ep: int, etp: int, sets: tuple[str, ...],
                              fractions: tuple[float, ...], states: tuple | None = None,
                              most: tuple | None = None) -> tuple[str, float] | None:
        """Where neither offload alone lets ``c`` (EP ``ep``, ETP ``etp``) fit: the activation-offload module set and
        CPU optimizer offload fraction that together do, or None (no candidate built). Megatron-LM runs both at once
        (arguments.py and transformer_config.py rule out neither with the other). The smallest fraction first (its
        CPU Adam adds to the step, `planner.offload.host_step_s`, where the copies of the module inputs hide under
        compute), then the first of ``sets`` (`planner.offload.SEARCHED_SETS`, smallest first) that fits with it; the
        largest pair is asked first, as most layouts memory rules out do not fit even so. ``states``, ``most``: as
        `offload_fitting` takes them."""
        within, usable, context = self._within, self.usable_bytes, self.context_bytes
        if most is None:
            most = self._dynamic_of(c, offload=sets[-1])
        # the bound `optimizer_offload_fitting` takes, under the largest set: the whole optimizer off, from the cache
        if max(total_bytes(s.static - s.optimizer, d[0], d[1], s.buffers, context, s.step)
               for s, d in zip(self.states_of(c, ep, etp) if states is None else states, most)) > usable:
            return None
        if not within(self.states_of(candidate_with(c, opt_offload=fractions[-1]), ep, etp), most):
            return None
        for f in fractions:
            states = self.states_of(candidate_with(c, opt_offload=f), ep, etp)
            if within(states, most):
                return next((m, f) for m in sets if within(states, self._dynamic_of(c, offload=m)))
        return None

    def host_offload_bytes(self, c: Candidate) -> float:
        """`host_offload_bytes` of ``c``, the whole optimizer from the cached states where the training offloads
        none of it itself (plan's search)."""
        f = offload.optimizer_fraction(c, self.training)
        if not f or self.training.optimizer_offload:
            return host_offload_bytes(self.model, c, self.cluster, self.training)
        pb = self.pb
        per_param = pb.master + pb.optimizer + pb.grads_fp32
        whole = self.states_of(candidate_with(c, opt_offload=0.0), c.ep, c.etp)
        return max(offload.optimizer_host_bytes(s.optimizer, f, per_param)
                   + _host_activation_bytes(self.model, c, self.training, stage)
                   for s, stage in zip(whole, pipeline_stages(c, self.training)))

    def dynamic_by_mode(self, c: Candidate) -> dict[str, tuple]:
        """`_dynamic_of` of ``c`` by recompute mode (filled as asked): the modes `partial_mode` tries for every (EP, ETP)
        of a row share one dict."""
        key = (c.tp, c.sp, c.mbs, c.pp, c.vpp, c.cp, c.gas, c.offload)
        by_mode = self._by_mode.get(key)
        if by_mode is None:
            by_mode = self._by_mode[key] = {}
        return by_mode

    def row_fits(self, head: Candidate, eps: tuple[tuple[int, int], ...], row: RowStates | None = None,
                 offload: str | None = None, recompute: str | None = None) -> list[bool]:
        """`fits` of each candidate of a row of `planner.space.Group`: ``head`` with each (EP, ETP) of ``eps`` (the
        row's candidates differ only in those), none of them built; once per distinct value of the row's states and
        dynamic memory, which is all it reads (the list is shared: not to be changed). ``row``: `row` of ``head`` and
        ``eps`` when the caller has it; ``offload``, ``recompute``: the activation-offload module set, the recompute
        mode in place of the row's (no candidate built)."""
        if row is None:
            row = self.row(head, eps)
        dynamic, number = self._dynamic_token(head, offload, recompute)
        key = (row.number, number)
        fits = self._row_fits.get(key)
        if fits is None:
            within = self._within
            fits = self._row_fits[key] = [within(st, dynamic) for st in row.states]
        return fits

    def row(self, head: Candidate, eps: tuple[tuple[int, int], ...]) -> RowStates:
        """`states_of` ``head`` with each (EP, ETP) of ``eps`` (a row's candidates), looked up once per row, with the
        numbers of their values."""
        key = (head.tp, head.pp, head.dp, head.cp, head.vpp, head.zero, head.hybrid, eps)
        row = self._rows.get(key)
        if row is None:
            states = tuple(self.states_of(head, ep, etp) for ep, etp in eps)
            ids = self._state_ids
            numbers = tuple(ids.setdefault(st, len(ids)) for st in states)
            row = self._rows[key] = RowStates(states, numbers,
                                              self._row_ids.setdefault(numbers, len(self._row_ids)))
        return row

    def row_states(self, head: Candidate, eps: tuple[tuple[int, int], ...]) -> tuple[tuple, ...]:
        """`states_of` ``head`` with each (EP, ETP) of ``eps`` (a row's candidates), looked up once per row."""
        return self.row(head, eps).states

    def row_states_fit(self, head: Candidate, eps: tuple[tuple[int, int], ...],
                       row: RowStates | None = None) -> tuple[bool, ...]:
        """Whether each candidate of a row has its model states, buffers, step and CUDA context within the usable
        memory (`offload_fitting`'s first test, the same sum), once per value of the row's states. ``row``: as
        `row_fits` takes it."""
        if row is None:
            row = self.row(head, eps)
        fit = self._states_fit.get(row.number)
        if fit is None:
            usable, context = self.usable_bytes, self.context_bytes
            fit = self._states_fit[row.number] = tuple(
                not max(s.static + s.buffers + s.step for s in st) + context > usable for st in row.states)
        return fit

    def row_room(self, head: Candidate, eps: tuple[tuple[int, int], ...],
                 row: RowStates | None = None) -> tuple[bool, ...]:
        """`leave_room` of each candidate of a row (`row_states`), looked up once per value of the row's states: rows
        that differ in MBS, GAS, SP or recompute share them. ``row``: as `row_fits` takes it."""
        if row is None:
            row = self.row(head, eps)
        room = self._room.get(row.number)
        if room is None:
            room = self._room[row.number] = tuple(self.leave_room(s) for s in row.states)
        return room

    def row_fits_optimizer_off(self, head: Candidate, eps: tuple[tuple[int, int], ...],
                               row: RowStates | None = None, offload: str | None = None) -> list[bool]:
        """Whether each candidate of a row could fit with its whole optimizer on the host (a bound: exact but where
        FP8 param gather turns off under the offload, whose weights then grow), from the row's cached states;
        `optimizer_offload_fitting` is asked only where it could, and with ``offload`` (the largest module set),
        `both_offloads_fitting` (its first bound). Once per value of the row's states and dynamic memory (the list is
        shared: not to be changed). ``row``, ``offload``: as `row_fits` takes them."""
        if row is None:
            row = self.row(head, eps)
        dynamic, number = self._dynamic_token(head, offload)
        key = (row.number, number)
        out = self._row_fits_off.get(key)
        if out is not None:
            return out
        usable, context = self.usable_bytes, self.context_bytes
        d0, d1 = dynamic[0], dynamic[-1]
        out = self._row_fits_off[key] = []
        for st in row.states:   # the first stage's (or the only one's) and the last's, as `_busiest` (unrolled)
            s0, s1 = st[0], st[-1]
            out.append(total_bytes(s0.static - s0.optimizer, d0[0], d0[1], s0.buffers, context, s0.step) <= usable
                       and total_bytes(s1.static - s1.optimizer, d1[0], d1[1], s1.buffers, context, s1.step) <= usable)
        return out

    def breakdown(self, c: Candidate) -> MemoryBreakdown:
        """`memory_breakdown(model, c, cluster, training)`, equal field for field: the stage `max` picks there (the
        first of the largest totals), the other not built."""
        stages, states, dynamic = pipeline_stages(c, self.training), self.states_of(c, c.ep, c.etp), self._dynamic_of(c)
        totals = [self._busiest((s,), (d,)) for s, d in zip(states, dynamic)]
        i = totals.index(max(totals))
        return _breakdown(stages[i], states[i], dynamic[i], self.cluster)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryVerdict:
    """Whether a layout fits: the predicted total against device memory minus the headroom."""

    fits: bool
    total_bytes: float
    usable_bytes: float
    """(1 - memory_headroom) x device memory"""
    stage: str

    @property
    def detail(self) -> str:
        return (f"predicted {self.total_bytes / 1e9:.1f} GB on the {self.stage} stage "
                f"{'<=' if self.fits else '>'} {self.usable_bytes / 1e9:.1f} GB usable")


def verdict(mem: MemoryBreakdown, cluster: ClusterSpec, training: TrainingSpec) -> MemoryVerdict:
    """The one memory verdict the rules use: the total must stay within (1 - headroom) of device memory."""
    usable = usable_bytes(cluster, training)
    return MemoryVerdict(fits=mem.total_bytes <= usable, total_bytes=mem.total_bytes, usable_bytes=usable,
                         stage=mem.stage)


MEASUREMENTS = ("nvidia-smi", "max_memory_reserved", "max_memory_allocated")
"""what a published memory figure counts (`reported_bytes`): the device's used memory as nvidia-smi shows it, or
PyTorch's allocator statistics torch.cuda.max_memory_reserved / max_memory_allocated"""


def reported_bytes(mem: MemoryBreakdown, cand: Candidate, cluster: ClusterSpec, measurement: str) -> float:
    """What a source's memory figure of kind ``measurement`` (`MEASUREMENTS`) reads for the plan's ``mem``, the stage
    the source measured; ``mem.total_bytes`` is what must fit, not what any of them shows.

    PyTorch's caching allocator reserves more than its live tensors, ALLOCATOR_OVERHEAD times them (block rounding,
    split blocks it keeps cached: Megatron's "max reserved" over "max allocated", planner.constants), for every
    tensor it hands out, the model states and DeepSpeed's buckets as much as the activations; the plan's total
    charges the overhead to the activations and logits only, whose blocks the step's churn leaves split (the cache
    of the static tensors the allocator gives back before an OOM, c10 CUDACachingAllocator's release of cached blocks
    on a failed cudaMalloc). max_memory_allocated counts the live tensors; max_memory_reserved the allocator's
    segments; nvidia-smi those, the CUDA context and NCCL's buffers (cudaMalloc'd outside the allocator), never more
    than the device's memory."""
    if measurement not in MEASUREMENTS:
        raise ValueError(f"unknown memory measurement {measurement!r}; use one of {', '.join(MEASUREMENTS)}")
    outside = nccl_buffers_bytes(cand)
    dynamic = (mem.activations_bytes + mem.logits_bytes) / ALLOCATOR_OVERHEAD
    states = mem.static_bytes + mem.buffers_bytes - outside
    if measurement == "max_memory_allocated":   # the step's tensors and the activations are never live together
        return states - mem.pinned_bytes + max(dynamic, mem.step_bytes)   # live tensors: no reserve
    # the allocator keeps the activations' freed blocks cached; the step's flat gradients, one tensor each, fit in
    # none of them and take segments of their own (c10 CUDACachingAllocator: a cached block serves only a request it
    # can hold, and segments never merge); and what it holds without a live tensor (``mem.reserved_bytes`` with the
    # pinned share in ``states``: DeepSpeed's fp16 ZeRO optimizer, planner.constants.DEEPSPEED_FP16_RESERVED_BYTES)
    reserved = ALLOCATOR_OVERHEAD * (states + mem.reserved_bytes + dynamic + mem.step_bytes)
    if measurement == "max_memory_reserved":
        return reserved
    return min(cluster.gpu.memory_bytes, reserved + outside + mem.context_bytes)


def usable_bytes(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Device memory minus the headroom kept free: what the predicted total must stay within."""
    return (1 - training.memory_headroom) * cluster.gpu.memory_bytes
