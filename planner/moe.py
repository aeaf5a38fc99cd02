"""Mixture-of-experts and multi-latent attention: shapes, parameters, FLOPs, memory split, time.

Small pure functions over a `ModelSpec` whose ``num_experts`` > 0 (MoE) or ``kv_lora_rank`` > 0
(DeepSeek's multi-latent attention, MLA). `planner.model`, `memory`, `cost`, `flops` and
`constraints` call them through one-line hooks.

Sources, per formula below: Jiang et al. 2024 "Mixtral of Experts" (arXiv 2401.04088) Sec. 2
(top-2 of 8 SwiGLU experts; 46.7B total, 12.9B active for 8x7B); DeepSeek-AI 2024
"DeepSeek-V3 Technical Report" (arXiv 2412.19437) Sec. 2.1 and 4.2 (MLA, 1 shared + 256 routed
experts, top-8, first 3 layers dense; 671B total, 37B active); Qwen3 Technical Report
(arXiv 2505.09388) Table 2 (Qwen3-30B-A3B: 48 layers, 128 experts, top-8); Megatron-Core MoE
(megatron/core/transformer/moe/: router, token dispatcher, grouped GEMM experts) for how EP and
expert tensor parallelism (ETP) shard experts and in which process groups.

What is approximated: per-stage counts use per-layer *averages* of dense and MoE layers (DeepSeek-V3's
three dense layers are spread over all stages); MLA's RoPE key and the compressed-KV path are counted
exactly as parameters and FLOPs, but activation memory treats MLA like GQA with ``kv_heads == heads``;
DeepSeek-V3's multi-token-prediction module is kept out of ``total_params`` and ``active_params`` (the report's
671B / 37B exclude it) but counted where it runs: memory and time of the last stage, and model FLOPs (as
Megatron counts them); the MTP layer's time is a mean layer's; Qwen3's
per-head q/k norms (256 parameters a layer) are ignored.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Callable

from planner.constants import KERNEL_LAUNCH_S
from planner.terms import COMMUNICATION, Overlap, Term
from planner.topology import collective_time_s
from planner.recompute import recomputed_of

if TYPE_CHECKING:  # no import cycle at run time: model.py calls into this module
    from planner.cost import StepContext
    from planner.model import ModelSpec
    from planner.space import Candidate, TrainingSpec
    from planner.topology import Topology

# Megatron-Core MoE routes dropless by default (no capacity factor, --moe-expert-capacity-factor None);
# the busiest expert then sees more than the average tokens. With the load-balancing loss the
# imbalance is small; a capacity factor (Fedus et al. 2021 "Switch Transformers", arXiv 2101.03961,
# Sec. 2.2: capacity = tokens/experts x capacity factor, 1.0-1.25 in their runs) bounds it.
DROPLESS_CAPACITY = 1.0
# Per local expert, the launches a Megatron-Core MoE layer's forward makes after the dispatcher's host sync:
# Transformer Engine GroupedLinear's FC1 and FC2 GEMMs, one cuBLAS call each per expert split (m_splits); under FP8
# also each GEMM input's quantization per split (TE split_quantize), so 4.
MOE_KERNELS_PER_EXPERT = 2
# Host seconds per such launch: KERNEL_LAUNCH_S, fitted (planner.constants).


# -- shape --------------------------------------------------------------------------------------------
def is_moe(m: "ModelSpec") -> bool:
    return m.num_experts > 0


def expert_ffn(m: "ModelSpec") -> int:
    """One routed expert's FFN width (Megatron ``--moe-ffn-hidden-size``; defaults to ffn_hidden)."""
    return m.moe_ffn_hidden or m.ffn_hidden


def moe_layer_count(m: "ModelSpec") -> int:
    """Layers with experts: every ``moe_layer_freq``-th layer after the first ``first_dense_layers``
    (Megatron ``--moe-layer-freq``; DeepSeek-V3 ``first_k_dense_replace`` = 3)."""
    if not is_moe(m):
        return 0
    return -(-(m.layers - m.first_dense_layers) // m.moe_layer_freq)   # layers f, f+k, f+2k, ... below L


def dense_layer_count(m: "ModelSpec") -> int:
    return m.layers - moe_layer_count(m)


def mlp_params(m: "ModelSpec", ffn: int) -> int:
    """One (SwiGLU or GELU) MLP of width ``ffn``: (3 or 2)·h·ffn weights (+ biases)."""
    h = m.hidden
    biases = ((2 if m.glu else 1) * ffn + h) if m.bias else 0
    return (3 if m.glu else 2) * h * ffn + biases


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def attention_params(m: "ModelSpec") -> int:
    """Q, K, V, O (+ biases). MLA (DeepSeek-V3 report Eq. 1-11): q down (h·q_lora) + norm + q up
    (q_lora·heads·(nope+rope)); kv down (h·(kv_lora+rope)) + norm + kv up (kv_lora·heads·(nope+v));
    output heads·v·h. Otherwise Q and O are heads·head_dim wide, K and V kv_heads·head_dim."""
    h, a = m.hidden, m.heads
    if m.kv_lora_rank:
        nope, rope, v = m.head_dim, m.qk_rope_head_dim, m.v_head_dim or m.head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * (nope + rope)) if m.q_lora_rank \
            else h * a * (nope + rope)
        kv = h * (m.kv_lora_rank + rope) + m.kv_lora_rank + m.kv_lora_rank * a * (nope + v)
        return q + kv + a * v * h
    q, kv = m.q_dim, m.kv_dim
    biases = (q + 2 * kv + h) if m.bias else 0
    return h * (q + 2 * kv) + q * h + biases


def router_params(m: "ModelSpec") -> int:
    """The gate: h x experts (Mixtral ``block_sparse_moe.gate``)."""
    return m.hidden * m.num_experts


def expert_layer_params(m: "ModelSpec") -> int:
    """Routed experts of one MoE layer: what EP and ETP shard."""
    return m.num_experts * mlp_params(m, expert_ffn(m))


def moe_layer_non_expert_params(m: "ModelSpec") -> int:
    """One MoE layer without its routed experts: attention, router, shared experts (and their sigmoid gate, h x 1:
    Qwen2MoeSparseMoeBlock shared_expert_gate), norms and the other vectors (ModelSpec.layer_vector_params)."""
    shared = mlp_params(m, m.shared_experts * expert_ffn(m)) if m.shared_experts else 0
    gate = m.hidden if m.moe_shared_gate else 0
    return attention_params(m) + router_params(m) + shared + gate + m.layer_vector_params


def dense_layer_params(m: "ModelSpec") -> int:
    return attention_params(m) + mlp_params(m, m.ffn_hidden) + m.layer_vector_params


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def layers_params(m: "ModelSpec") -> int:
    """All transformer layers."""
    n_moe = moe_layer_count(m)
    return (dense_layer_count(m) * dense_layer_params(m)
            + n_moe * (moe_layer_non_expert_params(m) + expert_layer_params(m)))


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def active_layers_params(m: "ModelSpec") -> int:
    """All layers counting only the ``moe_topk`` routed experts a token goes through (Mixtral Sec. 2)."""
    n_moe = moe_layer_count(m)
    active_experts = m.moe_topk * mlp_params(m, expert_ffn(m))
    return dense_layer_count(m) * dense_layer_params(m) + n_moe * (moe_layer_non_expert_params(m) + active_experts)


def total_params(m: "ModelSpec") -> int:
    return m.embedding_params + layers_params(m) + m.norm_params


def active_params(m: "ModelSpec") -> int:
    """Parameters one token touches: Mixtral's 12.9B of 46.7B, DeepSeek-V3's 37B of 671B."""
    return m.embedding_params + active_layers_params(m) + m.norm_params


# -- multi-token prediction (DeepSeek-V3 report Sec. 2.2, Fig. 3) ----------------------------------------
def mtp_non_expert_params(m: "ModelSpec") -> int:
    """What TP shards of the MTP modules: each has RMSNorms on the hidden state and on the next token's embedding,
    a projection M_k of [h; h] -> h (2h·h), one transformer layer (DeepSeek-V3's is a MoE layer: HF layer 61) and
    a final norm; the embedding and output head are the main model's (report Sec. 2.2, 'shared')."""
    if not m.mtp_layers:
        return 0
    layer = moe_layer_non_expert_params(m) if is_moe(m) else dense_layer_params(m)
    return m.mtp_layers * (2 * m.hidden * m.hidden + 3 * m.norm_params + layer)


def mtp_expert_params(m: "ModelSpec") -> int:
    """The MTP layers' routed experts (sharded over EP x ETP like the others)."""
    return m.mtp_layers * expert_layer_params(m) if is_moe(m) else 0


def mtp_params(m: "ModelSpec") -> int:
    """All MTP parameters: DeepSeek-V3's HF checkpoint (685B) holds 14B beyond the report's 671B, i.e. these
    plus its own copies of the embedding and output head (2·V·h)."""
    return mtp_non_expert_params(m) + mtp_expert_params(m)


def mtp_forward_flops(m: "ModelSpec", tokens: int, layer_flops: float, logits_flops: float) -> float:
    """Forward FLOPs of the MTP modules: the projection 2·t·2h·h, a layer and a second LM head each (Megatron-
    Bridge flop_utils.py adds mtp_num_layers layers and (1 + mtp_num_layers) logits)."""
    return m.mtp_layers * (2.0 * tokens * 2 * m.hidden * m.hidden + layer_flops + logits_flops)


def mean_layer_params(m: "ModelSpec") -> int:
    return round(layers_params(m) / m.layers)


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def mean_non_expert_layer_params(m: "ModelSpec") -> float:
    """Per-layer average of what TP (not EP) shards: attention, norms, router, shared and dense MLPs."""
    return (dense_layer_count(m) * dense_layer_params(m) + moe_layer_count(m) * moe_layer_non_expert_params(m)) / m.layers


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def mean_expert_layer_params(m: "ModelSpec") -> float:
    return moe_layer_count(m) * expert_layer_params(m) / m.layers


# -- FLOPs --------------------------------------------------------------------------------------------
def attention_matmul_flops(m: "ModelSpec", tokens: int) -> float:
    """Forward projections (2 FLOPs per weight per token, no biases) plus the core QK^T and AV:
    2·2·tokens·s·heads·head_dim (Narayanan et al. 2021 Sec. 5.1), with MLA's q/k width nope+rope
    and v width v_head_dim."""
    weights = attention_params(m) - (m.q_lora_rank + m.kv_lora_rank if m.kv_lora_rank else 0)
    if m.bias and not m.kv_lora_rank:
        weights -= m.q_dim + 2 * m.kv_dim + m.hidden
    return 2.0 * tokens * weights + attention_core_flops(m, tokens)


def attention_core_flops(m: "ModelSpec", tokens: int) -> float:
    """QK^T and AV over the full s x s scores: 2·tokens·s·(q/k width + v width), MLA's widths nope+rope and
    v_head_dim."""
    qk = m.heads * (m.head_dim + m.qk_rope_head_dim) if m.kv_lora_rank else m.q_dim
    v = m.heads * (m.v_head_dim or m.head_dim) if m.kv_lora_rank else m.q_dim
    return 2.0 * tokens * m.seq_len * (qk + v)


def mlp_matmul_flops(m: "ModelSpec", tokens: int, ffn: int) -> float:
    return 2.0 * tokens * m.hidden * ffn * (3 if m.glu else 2)


@lru_cache(maxsize=256)   # pure in a frozen ModelSpec; plan() asks per candidate
def layer_forward_matmul_flops(m: "ModelSpec", tokens: int) -> float:
    """Mean forward matmul FLOPs of one layer: the active experts (top-k), shared experts, router and
    dense-layer MLPs averaged over all layers (Megatron-Core's MoE FLOPs in training.py
    ``num_floating_point_operations`` count top-k experts the same way)."""
    n_moe, n_dense = moe_layer_count(m), dense_layer_count(m)
    moe_mlp = (mlp_matmul_flops(m, tokens, expert_ffn(m)) * (m.moe_topk + m.shared_experts)
               + 2.0 * tokens * router_params(m)) if n_moe else 0.0
    dense_mlp = mlp_matmul_flops(m, tokens, m.ffn_hidden)
    return attention_matmul_flops(m, tokens) + (n_moe * moe_mlp + n_dense * dense_mlp) / m.layers


def needs_own_shape(m: "ModelSpec") -> bool:
    """Shapes the plain dense formula does not describe: MoE, MLA, or heads·head_dim != hidden."""
    return is_moe(m) or bool(m.kv_lora_rank) or m.q_dim != m.hidden


# -- memory -------------------------------------------------------------------------------------------
def expert_params_on_gpu(m: "ModelSpec", c: "Candidate", layers_on_stage: int) -> int:
    """Routed-expert parameters one GPU holds: experts / EP, each split by ETP (Megatron-Core
    ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``)."""
    if not is_moe(m):
        return 0
    return math.ceil(layers_on_stage * mean_expert_layer_params(m) / (c.ep * c.etp))


def expert_data_parallel(c: "Candidate") -> int:
    """Expert data-parallel size: the ranks holding the same experts, TP·CP·DP / (ETP·EP)
    (Megatron-Core parallel_state: the expert grid tp=ETP, ep, dp=expert-DP under each PP stage);
    the distributed optimizer shards expert states over it."""
    return max(1, c.tp * c.cp * c.dp // (c.etp * c.ep))


def add_expert_states(m: "ModelSpec", c: "Candidate", layers_on_stage: int, pb: object,
                      states: tuple[int, float, float, float],
                      shard_fn: Callable, *, last_stage: bool = False) -> tuple[int, float, float, float]:
    """(params, weights, grads, optimizer) of the non-expert part plus the routed experts (and, on the last
    stage, the MTP layers' experts), whose ZeRO/distributed-optimizer sharding runs over the expert
    data-parallel group."""
    n = expert_params_on_gpu(m, c, layers_on_stage)
    if last_stage and mtp_expert_params(m):
        n += math.ceil(mtp_expert_params(m) / (c.ep * c.etp))
    if not n:
        return states
    w, g, o = shard_fn(n, pb, c, expert_data_parallel(c))
    return states[0] + n, states[1] + w, states[2] + g, states[3] + o


def capacity(training: "TrainingSpec") -> float:
    """Headroom on the busiest expert's tokens: the capacity factor, or 1 when dropless."""
    return training.moe_capacity_factor or DROPLESS_CAPACITY


def activation_ffn(m: "ModelSpec", training: "TrainingSpec") -> float:
    """The FFN width the MLP activation formula sees per token: mean over layers of top-k experts
    x capacity + shared experts (MoE layers) and ffn_hidden (dense layers)."""
    if not is_moe(m):
        return m.ffn_hidden
    moe = expert_ffn(m) * (m.moe_topk * capacity(training) + m.shared_experts)
    return (moe_layer_count(m) * moe + dense_layer_count(m) * m.ffn_hidden) / m.layers


def dispatch_activation_sbh(m: "ModelSpec", training: "TrainingSpec") -> float:
    """Bytes per s·b·h a MoE layer keeps besides the MLP: the permuted (top-k copies, 16-bit) expert
    input and the unpermute buffer (Megatron-Core token_dispatcher keeps both for backward), 4·k·cap."""
    if not is_moe(m):
        return 0.0
    return 4 * m.moe_topk * capacity(training) * moe_layer_count(m) / m.layers


# -- time ---------------------------------------------------------------------------------------------
def mlp_time_adjustment_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
                          gemm_s: Callable[..., float]) -> float:
    """Mean forward MLP seconds of a layer minus what the dense formula charged (ffn_hidden over TP).

    MoE layers run the router GEMM, the shared experts (split by TP) and the routed experts as one
    grouped GEMM over the E/EP local experts, each with tokens·k·EP/E rows (balanced routing, x the
    capacity factor on the busiest rank) and ffn/ETP columns: `gemm_s` (tile and wave quantization)
    prices the small per-expert row counts, which is where grouped GEMMs lose efficiency.
    """
    if not is_moe(m):
        return 0.0
    h, t = m.hidden, c.tp
    glu = 2 if m.glu else 1

    def mlp(rows: int, ffn: int, split: int, batch: int = 1) -> float:
        return (gemm_s(rows, glu * ffn // split, h, batch=batch) + gemm_s(rows, h, max(1, ffn // split), batch=batch))

    dense = mlp(tokens, m.ffn_hidden, t)
    routed = routed_gemm_s(m, c, training, tokens, gemm_s)
    shared = mlp(tokens, m.shared_experts * expert_ffn(m), t) if m.shared_experts else 0.0
    router = gemm_s(tokens, m.num_experts, h)
    n_moe = moe_layer_count(m)
    mean = (n_moe * (routed + shared + router) + (m.layers - n_moe) * dense) / m.layers
    return mean - dense


def routed_gemm_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
                  gemm_s: Callable[..., float]) -> float:
    """Forward seconds of one MoE layer's routed experts: a grouped GEMM over the E/EP local experts, each with
    tokens·k·EP/E rows (balanced routing, x the capacity factor) and expert_ffn/ETP columns (SwiGLU: FC1 2x wide)."""
    glu = 2 if m.glu else 1
    local_experts = max(1, m.num_experts // c.ep)
    rows = max(1, math.ceil(tokens * m.moe_topk * c.ep / m.num_experts * capacity(training)))
    ffn = expert_ffn(m)
    return (gemm_s(rows, glu * ffn // c.etp, m.hidden, batch=local_experts)
            + gemm_s(rows, m.hidden, max(1, ffn // c.etp), batch=local_experts))


def host_sync_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
                gemm_s: Callable[..., float]) -> tuple[float, float]:
    """(host seconds, GPU seconds) of the part of a MoE layer's forward that runs after the host waits on the GPU,
    as means over all layers (0, 0 for dense models and for EP 1 with one local expert).

    Megatron-Core's dropless all-to-all dispatcher copies the per-expert token counts to the host and synchronizes
    before the EP all-to-all (megatron/core/transformer/moe/token_dispatcher.py, ``cuda_sync_point =
    "before_ep_alltoall"``: the all-to-all splits and the grouped GEMM's m_splits are host lists). The host then
    cannot run ahead of the GPU: what it launches after the sync (all-to-all, permute, per-expert FC1, activation,
    FC2, combine, unpermute; Transformer Engine's GroupedLinear issues one GEMM per local expert, FP8 one
    quantization per expert and GEMM input) runs no faster than it is launched, so that part takes the longer of
    its GPU time and ``kernels per expert x local experts x KERNEL_LAUNCH_S``. Megatron-Core MoE
    (arXiv 2603.07685, "Compute wall": small per-expert GEMMs and many kernel launches make fine-grained MoE
    host-bound; its CUDA-graph scopes moe_router / moe_preprocess remove exactly these launches).
    """
    local = m.num_experts // c.ep if is_moe(m) else 0
    if not is_moe(m) or (c.ep <= 1 and local <= 1) or training.framework != "megatron-lm":
        return 0.0, 0.0   # torchtitan runs the experts as one torch._grouped_mm; a capacity factor syncs too
    per_expert = MOE_KERNELS_PER_EXPERT * (2 if training.precision == "fp8" else 1)
    host = per_expert * local * KERNEL_LAUNCH_S
    gpu = routed_gemm_s(m, c, training, tokens, gemm_s)
    share = moe_layer_count(m) / m.layers
    return host * share, gpu * share


def mlp_gemm_input_widths(m: "ModelSpec", c: "Candidate") -> tuple[float, float]:
    """Per-token widths of the MLP GEMM inputs FP8 quantizes (FC1, FC2), mean over layers: a dense MLP reads h and
    ffn/TP; a MoE layer's GroupedLinear quantizes the permuted copies, k·h and k·expert_ffn/ETP (dropless), plus
    the shared experts' h and shared·expert_ffn/TP (Transformer Engine quantizes each TE linear's input)."""
    h, dense = m.hidden, (m.hidden, m.ffn_hidden / c.tp)
    if not is_moe(m):
        return dense
    fc1 = m.moe_topk * h + (h if m.shared_experts else 0)
    fc2 = m.moe_topk * expert_ffn(m) / c.etp + m.shared_experts * expert_ffn(m) / c.tp
    n_moe = moe_layer_count(m)
    mean = lambda moe_w, dense_w: (n_moe * moe_w + (m.layers - n_moe) * dense_w) / m.layers   # noqa: E731
    return mean(fc1, dense[0]), mean(fc2, dense[1])


def elementwise_extra_bytes(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int) -> float:
    """Mean forward HBM bytes a layer moves beyond the dense formula's (which charged the activation
    function on ffn_hidden/TP): MoE layers permute each token's hidden vector into top-k expert
    slots and back (Megatron-Core moe_utils permute/unpermute: read T·h, write T·k·h; read T·k·h,
    write the weighted sum T·h, 16-bit), and run the activation on k·capacity·expert_ffn/ETP per token
    (read 2·f, write f with SwiGLU: 6 bytes; 4 with GELU) plus the shared experts' on shared·ffn/TP."""
    if not is_moe(m):
        return 0.0
    act = 6 if m.glu else 4
    k = m.moe_topk * capacity(training)
    permute = 2 * m.hidden * tokens * (2 + 2 * k) / max(1, c.tp if c.sp else 1)
    experts = act * tokens * (k * expert_ffn(m) / c.etp + m.shared_experts * expert_ffn(m) / c.tp)
    dense_charge = act * tokens * m.ffn_hidden / c.tp
    n_moe = moe_layer_count(m)
    return n_moe * (permute + experts - dense_charge) / m.layers


def all_to_all_s(topology: "Topology", stride: int, group: int, message_bytes: float,
                 collective_s: Callable[..., float]) -> float:
    """Seconds of one all-to-all in which each GPU of the group {0, stride, 2·stride, ...} (``group`` ranks) sends
    ``message_bytes``, 1/group to each rank, while every GPU of a node runs one (all EP groups dispatch at once).

    With ``m`` members of the group on a node, a GPU sends (m-1)/n of its message to its own node over the
    intra-node link and (n-m)/n = 1 - 1/nodes_in_group to the other nodes, through its own share of the node's
    NICs: the node's NIC bandwidth / GPUs per node, since every GPU of the node sends off-node at the same time
    (an all-to-all is point-to-point, no ring: NCCL runs it as grouped send/recv; nccl-tests PERFORMANCE.md,
    alltoall busbw = algbw·(n-1)/n). Both parts run at once, so the longer counts; each is priced by the
    planner's alpha-beta (latency, bandwidth at that message size) as an all-gather moving the same bytes:
    intra (m-1)/m of the m/n kept on the node, inter (g-1)/g of the whole with g = nodes in the group.
    Inside one node (m = n) this is the all-gather of the whole message."""
    if group <= 1 or message_bytes <= 0:
        return 0.0
    gpn = topology.cluster.gpus_per_node
    members = min(group, max(1, gpn // stride))          # ranks of the group on one node
    intra = collective_s(topology.strided_link(stride, members), kind="all_gather",
                         message_bytes=message_bytes * members / group, group=members)
    if members >= group:
        return intra
    nodes = -(-group // members)
    nic = topology.rail_link(topology.strided_link(stride, group))   # one GPU's share of the node's NICs
    return max(intra, collective_s(nic, kind="all_gather", message_bytes=message_bytes, group=nodes))


def all_to_all_layer_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int, topology: "Topology",
                       collective_s: Callable[..., float], bytes_per_value: float,
                       recomputed_layers: float | None = None) -> float:
    """Mean per-layer seconds of the EP all-to-all: dispatch and combine in the forward, both again in
    the backward (and the forward pair again under full recompute), not overlapped (Megatron-Core's
    alltoall token dispatcher without --overlap-moe-expert-parallel-comm). Each GPU sends its tokens·k
    hidden vectors (x capacity; no deduplication of a token's copies bound for one GPU), over the EP group,
    which strides by ETP (Megatron-Core parallel_state's expert grid ETP x EP x expert-DP): `all_to_all_s`.
    ``recomputed_layers``: `planner.recompute.recomputed_of(...).layers` when the caller has it."""
    if not is_moe(m) or c.ep <= 1:
        return 0.0
    message = tokens * m.moe_topk * capacity(training) * m.hidden * bytes_per_value / max(1, c.tp // c.etp)
    per = all_to_all_s(topology, c.etp, c.ep, message, collective_s)
    if recomputed_layers is None:
        recomputed_layers = recomputed_of(m, c, training.framework).layers
    calls = 4 + 2 * recomputed_layers   # full (or --recompute-modules moe): the pair again; block-N: its share
    return calls * per * moe_layer_count(m) / m.layers


def expert_grad_reduce_s(m: "ModelSpec", c: "Candidate", stage_layers: int, link: object,
                         collective_s: Callable[..., float], bytes_per_grad: float) -> float:
    """Routed-expert gradients reduced over the expert data-parallel group after the last micro-batch
    (Megatron DDP keeps expert parameters in their own buckets and group)."""
    edp = expert_data_parallel(c)
    if not is_moe(m) or edp <= 1:
        return 0.0
    n = expert_params_on_gpu(m, c, stage_layers)
    return collective_s(link, kind="all_reduce", message_bytes=n * bytes_per_grad, group=edp)


def all_to_all_term_s(ctx: "StepContext") -> float:
    """The term: the busiest stage's EP all-to-alls for one micro-batch (the EP group strides by ETP)."""
    return ctx.stage_layers * all_to_all_layer_s(ctx.model, ctx.cand, ctx.training, ctx.tokens, ctx.topology,
                                                 collective_time_s, ctx.half, ctx.rc.layers + ctx.rc.moe)


def expert_grad_reduce_term_s(ctx: "StepContext") -> float:
    """The term: routed-expert gradients reduced over the expert-DP group once a step."""
    c, m = ctx.cand, ctx.model
    edp = expert_data_parallel(c)
    link = is_moe(m) and edp > 1 and ctx.topology.dp_link(c.etp * c.ep, edp)
    return expert_grad_reduce_s(m, c, ctx.stage_layers, link, collective_time_s, ctx.half)


def unmerged_share(pp: int, vpp: int, gas: int) -> float:
    """Share of a rank's micro-batch passes (model chunks under VPP) that run alone under Megatron's EP all-to-all
    overlap, which merges the forward of one micro-batch with the backward of another (megatron/core/pipeline_parallel
    combined_1f1b.py; Megatron-Core MoE docs, "EP communication overlap": "first FWD and last BWD can't be"
    merged): the warm-up forwards and the cool-down backwards of the (interleaved) 1F1B schedule, pp - 1 + 1 passes
    of gas, or (pp - 1)·2 + (vpp - 1)·pp + 1 chunks of gas·vpp (schedules.py's warm-up count)."""
    if vpp > 1:
        return min(1.0, ((pp - 1) * 2 + (vpp - 1) * pp + 1) / (gas * vpp))
    return min(1.0, pp / gas)


@lru_cache(maxsize=256)
def shared_expert_share(m: "ModelSpec") -> float:
    """Share of the mean layer's forward FLOPs (projections, attention core, experts, router) that are the shared
    experts' GEMMs: what --moe-shared-expert-overlap runs on its own stream beside the dispatch and combine."""
    if not is_moe(m) or not m.shared_experts:
        return 0.0
    shared = moe_layer_count(m) / m.layers * mlp_matmul_flops(m, 1, expert_ffn(m)) * m.shared_experts
    return shared / layer_forward_matmul_flops(m, 1)


def all_to_all_overlap(ctx: "StepContext") -> Overlap | None:
    """--overlap-moe-expert-parallel-comm: each micro-batch's dispatch and combine run beside the other merged
    micro-batch's attention and expert GEMMs, up to that compute (window 1), the unmerged passes' exposed.
    --moe-shared-expert-overlap: they run beside the same micro-batch's shared experts only (window: the shared
    experts' share of the compute, megatron/core/transformer/moe/shared_experts.py's side stream)."""
    if ctx.cand.ep <= 1:
        return None
    if "ep-a2a" in ctx.overlaps:
        return Overlap(under="compute", window=1.0,
                       exposed_min=unmerged_share(ctx.cand.pp, ctx.cand.vpp, ctx.cand.gas))
    if "shared-expert" in ctx.overlaps and shared_expert_share(ctx.model):
        return Overlap(under="compute", window=shared_expert_share(ctx.model))
    return None


ALL_TO_ALL = Term(name="ep_all_to_all", kind=COMMUNICATION, group="ep_comm_s", per_microbatch=True,
                  seconds=all_to_all_term_s, source="Megatron-Core MoE alltoall token dispatcher (dispatch + combine, "
                                               "forward and backward); nccl-tests alltoall busbw",
                  constants=("LINK_EFFICIENCY",), overlap=all_to_all_overlap, hides_under="compute",
                  flag="Megatron --overlap-moe-expert-parallel-comm (--overlap ep-a2a) or --moe-shared-expert-overlap "
                       "(--overlap shared-expert)")
EXPERT_GRAD_REDUCE = Term(name="expert_grad_reduce", kind=COMMUNICATION, group="dp_comm_s", per_microbatch=False,
                          seconds=expert_grad_reduce_term_s,
                          source="Megatron DDP: expert parameters in their own buckets and expert-DP group",
                          constants=("LINK_EFFICIENCY",))


__all__ = ["ALL_TO_ALL", "EXPERT_GRAD_REDUCE", "active_params", "add_expert_states", "all_to_all_layer_s",
           "all_to_all_s", "attention_params", "capacity",
           "dense_layer_count", "expert_data_parallel", "expert_ffn", "expert_grad_reduce_s", "expert_params_on_gpu",
           "host_sync_s", "is_moe", "layer_forward_matmul_flops", "mean_layer_params", "mlp_time_adjustment_s",
           "moe_layer_count", "mtp_forward_flops", "mtp_non_expert_params", "mtp_params", "needs_own_shape",
           "routed_gemm_s", "total_params"]


# -- input --------------------------------------------------------------------------------------------
def shape_problems(m: "ModelSpec") -> list[str]:
    """What makes a MoE / MLA shape meaningless (checked by ModelSpec on construction)."""
    out = []
    for name in ("num_experts", "moe_topk", "moe_ffn_hidden", "shared_experts", "first_dense_layers",
                 "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers"):
        value = getattr(m, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            out.append(f"{name} must be a non-negative integer, got {value!r}")
    if out:
        return out
    if not isinstance(m.moe_layer_freq, int) or m.moe_layer_freq < 1:
        out.append(f"moe_layer_freq must be an integer >= 1, got {m.moe_layer_freq!r}")
    if m.num_experts and not 0 < m.moe_topk <= m.num_experts:
        out.append(f"moe_topk {m.moe_topk} must be in 1..num_experts ({m.num_experts})")
    if m.num_experts and m.first_dense_layers >= m.layers:
        out.append(f"first_dense_layers {m.first_dense_layers} leaves no MoE layer of {m.layers}")
    if m.kv_lora_rank and not m.qk_rope_head_dim:
        out.append("multi-latent attention (kv_lora_rank > 0) needs qk_rope_head_dim")
    if not (isinstance(m.rope_scaling_factor, (int, float)) and m.rope_scaling_factor >= 1):
        out.append(f"rope_scaling_factor must be a number >= 1, got {m.rope_scaling_factor!r}")
    return out


def hf_fields(d: dict) -> dict:
    """MoE, MLA, explicit head_dim and rope-scaling keys of a Hugging Face config.json:
    MixtralForCausalLM (num_local_experts, num_experts_per_tok), Qwen3MoeForCausalLM (num_experts,
    moe_intermediate_size, decoder_sparse_step, head_dim), DeepseekV3ForCausalLM (n_routed_experts,
    n_shared_experts, first_k_dense_replace, moe_layer_freq, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim), and rope_scaling {rope_type|type, factor} (Llama 3.1, YaRN)."""
    out: dict = {}
    experts = d.get("num_local_experts") or d.get("n_routed_experts") or d.get("num_experts")
    if experts:
        out.update(num_experts=int(experts), moe_topk=int(d.get("num_experts_per_tok") or 2),
                   moe_ffn_hidden=int(d.get("moe_intermediate_size") or d.get("intermediate_size") or 0),
                   shared_experts=int(d.get("n_shared_experts") or 0),
                   moe_layer_freq=int(d.get("moe_layer_freq") or d.get("decoder_sparse_step") or 1),
                   first_dense_layers=int(d.get("first_k_dense_replace") or 0))
        if d.get("shared_expert_intermediate_size") and out["moe_ffn_hidden"]:   # Qwen2-MoE: shared width
            out["shared_experts"] = max(1, round(int(d["shared_expert_intermediate_size"]) / out["moe_ffn_hidden"]))
    if d.get("kv_lora_rank"):
        out.update(kv_lora_rank=int(d["kv_lora_rank"]), q_lora_rank=int(d.get("q_lora_rank") or 0),
                   qk_rope_head_dim=int(d.get("qk_rope_head_dim") or 0), v_head_dim=int(d.get("v_head_dim") or 0),
                   kv_channels=int(d.get("qk_nope_head_dim") or 0) or None)   # MLA's per-head width
    if d.get("num_nextn_predict_layers"):   # DeepseekV3ForCausalLM: the MTP modules
        out["mtp_layers"] = int(d["num_nextn_predict_layers"])
    scaling = d.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("factor"):
        out.update(rope_scaling=str(scaling.get("rope_type") or scaling.get("type") or ""),
                   rope_scaling_factor=float(scaling["factor"]))
    return out


YAML_KEYS = {"num_experts", "moe_topk", "moe_ffn_hidden", "shared_experts", "moe_layer_freq", "first_dense_layers",
             "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "rope_scaling",
             "rope_scaling_factor", "mtp_layers"}
"""plantune model YAML keys for the fields above (the ModelSpec field names)."""
YAML_DEFAULTS = {k: (1 if k == "moe_layer_freq" else 1.0 if k == "rope_scaling_factor" else "" if k == "rope_scaling"
                     else 0) for k in YAML_KEYS}
"""their defaults: a dense model's YAML leaves them out"""


# -- rules --------------------------------------------------------------------------------------------
FRAMEWORKS_WITH_MOE = ("megatron-lm", "fsdp")


def violations(m: "ModelSpec", c: "Candidate", cluster: object, training: "TrainingSpec",
               framework: str | None = None) -> list[tuple[str, str]]:
    """(reason value, detail) for every expert-parallel rule the candidate breaks on ``framework``
    (default: the training's; `planner.rules` passes each target's)."""
    fw = framework or training.framework
    out: list[tuple[str, str]] = []
    if not is_moe(m):
        if c.ep > 1 or c.etp > 1:
            out.append(("redundant", f"EP={c.ep}, ETP={c.etp} on a dense model: there are no experts to shard"))
        return out
    if fw not in FRAMEWORKS_WITH_MOE:
        out.append(("framework_limit", f"mixture-of-experts layers are not in {fw} (the BigScience "
                                       "fork has none); use --framework megatron-lm (Megatron-Core MoE) or fsdp "
                                       "(torchtitan)"))
    if m.num_experts % c.ep:
        out.append(("ep_divides_experts", f"{m.num_experts} experts % EP {c.ep} != 0 (Megatron arguments.py: 'Number "
                                          "of experts should be a multiple of expert model parallel_size')"))
    dense_grid = c.tp * c.cp * c.dp
    if dense_grid % (c.etp * c.ep):
        out.append(("ep_within_data_parallel", f"ETP({c.etp}) * EP({c.ep}) = {c.etp * c.ep} does not divide "
                                               f"TP*CP*DP = {dense_grid}: Megatron-Core lays the expert grid "
                                               "(ETP x EP x expert-DP) over the same ranks as TP x CP x DP"))
    if expert_ffn(m) % c.etp:
        out.append(("etp_divides_expert_ffn", f"expert FFN {expert_ffn(m)} % ETP {c.etp} != 0"))
    if fw == "megatron-lm" and c.ep > 1 and c.tp > 1 and not c.sp:
        out.append(("moe_needs_sequence_parallel", "MoE with EP and TP needs sequence parallelism "
                                                   "(megatron/core/transformer/moe/README.md); set sp=1"))
    if fw == "fsdp" and c.etp > 1:
        out.append(("framework_limit", "FSDP/torchtitan plans here have no expert tensor parallelism; use ETP=1"))
    if fw == "megatron-lm" and c.ep > 1 and "ep-a2a" in (training.overlap or ()):
        # megatron/core/transformer/transformer_config.py asserts under overlap_moe_expert_parallel_comm
        from planner import recompute as recompute_modes

        mode = recompute_modes.parse(c.recompute)
        if c.pp > 1 and c.vpp == 1:
            out.append(("framework_limit", "EP all-to-all overlap with PP > 1 needs interleaving "
                                           "(transformer_config.py: 'virtual_pipeline_model_parallel_size must be "
                                           "specified'); set vpp > 1 or drop --overlap ep-a2a"))
        if mode is not None and (mode.kind in ("full", "block", "uniform") or "moe" in mode.modules):
            out.append(("framework_limit", f"EP all-to-all overlap refuses recompute={c.recompute} (transformer_"
                                           "config.py: no full recompute, no recompute method, no moe module)"))
        if m.mtp_layers > 1 or (m.mtp_layers and c.pp == 1):
            out.append(("framework_limit", "EP all-to-all overlap takes one MTP layer, and with it PP > 1 "
                                           "(transformer_config.py)"))
        if "shared-expert" in training.overlap:
            out.append(("framework_limit", "--overlap ep-a2a and shared-expert exclude each other (transformer_"
                                           "config.py: 'disable moe_shared_expert_overlap when enabling "
                                           "overlap_moe_expert_parallel_comm'); keep one"))
    if c.ep > 1 and training.precision == "fp16":
        out.append(("framework_limit", "Megatron refuses expert parallelism with fp16 ('Expert parallelism is not "
                                       "supported with fp16 training'); use bf16 or fp8"))
    return out


def ep_choices(m: "ModelSpec", tp: int, cp: int, dp: int, options: tuple[int, ...] | None) -> list[tuple[int, int]]:
    """(EP, ETP) pairs to enumerate: EP over the divisors of the expert count that fit the expert grid
    (or the user's ``--ep`` list); ETP 1 or TP (Megatron-Core's default ETP = TP), only 1 for
    fine-grained experts narrower than the hidden size (megatron/core/transformer/moe/README.md:
    --expert-tensor-parallel-size "Recommended to set to 1 for fine-grained MoE models")."""
    if not is_moe(m):
        return [(1, 1)]
    out = []
    for etp in sorted({1, tp} if expert_ffn(m) >= m.hidden else {1}):
        grid = tp * cp * dp // etp if (tp * cp * dp) % etp == 0 else 0
        for ep in (options or [e for e in range(1, m.num_experts + 1) if m.num_experts % e == 0]):
            if options or (grid and grid % ep == 0):
                out.append((ep, etp))
    return out
