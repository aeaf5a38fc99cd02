"""Mixture-of-experts and multi-latent attention: FLOPs, memory split, time (shapes and parameters: planner.model,
re-exported here for the modules that read them beside the rest).

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
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Callable

from planner import dualpipe
from planner.constants import FLEX_LINK_EFFICIENCY, KERNEL_LAUNCH_S, LINK_EFFICIENCY
# the shape and parameter counts live in planner.model; the ones other modules read beside this module's
from planner.model import (attention_core_flops, attention_matmul_flops, attention_params,  # noqa: F401
                           dense_layer_count, expert_ffn, expert_layer_params, is_moe, layer_forward_matmul_flops,
                           mean_expert_layer_params, mean_non_expert_layer_params, mlp_matmul_flops, moe_layer_count,
                           mtp_expert_params, mtp_non_expert_params, mtp_params, needs_own_shape, router_params)
from planner.terms import COMMUNICATION, Overlap, Term
from planner.ops import bytes_op, gemm_op
from planner.topology import collective_time_s
from planner.recompute import recomputed_of
from planner.step_context import memoized_term

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.model import ModelSpec
    from planner.ops import GemmContext, LayerOps
    from planner.step_context import StepContext
    from planner.space import Candidate, TrainingSpec
    from planner.topology import Topology

# Megatron-Core MoE routes dropless by default (no capacity factor, --moe-expert-capacity-factor None);
# the busiest expert then sees more than the average tokens. With the load-balancing loss the
# imbalance is small; a capacity factor (Fedus et al. 2021 "Switch Transformers", arXiv 2101.03961,
# Sec. 2.2: capacity = tokens/experts x capacity factor, 1.0-1.25 in their runs) bounds it.
DROPLESS_CAPACITY = 1.0
# Per local expert, the GEMM launches a Megatron-Core MoE layer's forward makes after the dispatcher's host sync:
# Transformer Engine GroupedLinear's FC1 and FC2 GEMMs, one cuBLAS call each per expert split (m_splits); under FP8
# also each GEMM input's quantization per split (TE split_quantize), `QUANTIZE_KERNELS` launches each.
MOE_KERNELS_PER_EXPERT = 2
# Kernels one FP8 quantization of a GEMM input launches: Transformer Engine's current (tensorwise) scaling computes the
# amax, then the scale, then casts (transformer_engine/pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::
# quantize_impl: nvte_compute_amax_with_config, nvte_compute_scale_from_amax, nvte_quantize_v2): 3; delayed scaling
# (scale from the amax history), MXFP8 and blockwise (scales computed inside the cast kernel) one nvte_quantize: 1.
QUANTIZE_KERNELS = {"tensorwise": 3}
# Host seconds per such launch: KERNEL_LAUNCH_S, fitted (planner.constants).
# HBM bytes per router score [tokens x experts], forward: Megatron-Core's router (megatron/core/transformer/moe/
# router.py TopKRouter.routing, fused under --moe-router-fusion) reads the fp32 logits (4), writes the fp32 probs (4)
# and the bool routing map (1) over all experts, and the auxiliary load-balancing loss reads the probs again (4): 13.
ROUTER_BYTES_PER_SCORE = 13


# -- shape (parameters: planner.model) --------------------------------------------------------------------------------------------


# -- multi-token prediction (DeepSeek-V3 report Sec. 2.2, Fig. 3) ----------------------------------------


def mtp_forward_flops(m: "ModelSpec", tokens: int, layer_flops: float, logits_flops: float) -> float:
    """Forward FLOPs of the MTP modules: the projection 2·t·2h·h, a layer and a second LM head each (Megatron-
    Bridge flop_utils.py adds mtp_num_layers layers and (1 + mtp_num_layers) logits)."""
    return m.mtp_layers * (2.0 * tokens * 2 * m.hidden * m.hidden + layer_flops + logits_flops)


# -- FLOPs --------------------------------------------------------------------------------------------


# -- memory -------------------------------------------------------------------------------------------
def expert_params_on_gpu(m: "ModelSpec", c: "Candidate", layers_on_stage: int) -> int:
    """Routed-expert parameters one GPU holds: experts / EP, each split by ETP (Megatron-Core
    ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``)."""
    if not is_moe(m):
        return 0
    return routed_share(layers_on_stage * mean_expert_layer_params(m), c)


def routed_share(params: float, c: "Candidate") -> int:
    """Of ``params`` routed-expert parameters (a stage's, the MTP layers'), those one GPU holds: over EP, each expert
    split by ETP."""
    return math.ceil(params / (c.ep * c.etp))


def routed_params(m: "ModelSpec", layers_on_stage: int, *, last_stage: bool = False) -> tuple[float, int]:
    """(the routed experts of ``layers_on_stage`` layers, on the last stage the MTP layers' experts) before EP and
    ETP split them: what `add_expert_states` reads of the model and the stage (a plan keeps it per stage)."""
    if not is_moe(m):
        return 0.0, 0
    return layers_on_stage * mean_expert_layer_params(m), mtp_expert_params(m) if last_stage else 0


def expert_data_parallel(c: "Candidate") -> int:
    """Expert data-parallel size: the ranks holding the same experts, TP·CP·DP / (ETP·EP)
    (Megatron-Core parallel_state: the expert grid tp=ETP, ep, dp=expert-DP under each PP stage);
    the distributed optimizer shards expert states over it."""
    return max(1, c.tp * c.cp * c.dp // (c.etp * c.ep))


def add_expert_states(c: "Candidate", routed: tuple[float, int], pb: object, states: tuple[int, float, float, float],
                      shard_fn: Callable) -> tuple[int, float, float, float]:
    """(params, weights, grads, optimizer) of the non-expert part plus the routed experts (`routed_params` of the
    stage: its layers' and, on the last stage, the MTP layers' experts), whose ZeRO/distributed-optimizer sharding
    runs over the expert data-parallel group."""
    layers, mtp = routed
    n = routed_share(layers, c) if layers else 0
    if mtp:
        n += routed_share(mtp, c)
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
def expert_ops(lo: "LayerOps", m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
               g: "GemmContext", cluster: "ClusterSpec") -> "LayerOps":
    """The layer's op list with a MoE model's MLP as it runs, as a mean over layers: on the MoE layers the router
    GEMM, the shared experts (split by TP), the routed experts as one grouped GEMM over the E/EP local experts, each
    with tokens·k·EP/E rows (balanced routing, x the capacity factor on the busiest rank) and expert_ffn/ETP columns
    (`planner.ops.gemm_s`' tile and wave quantization prices the small per-expert row counts, where grouped GEMMs
    lose efficiency), the token permutation into top-k expert slots and back (Megatron-Core moe_utils
    permute/unpermute: read T·h, write T·k·h; read T·k·h, write the weighted sum T·h, 16-bit) and the experts'
    activation (read 2·f, write f with SwiGLU: 6 bytes; 4 with GELU); the dense MLP on the other layers. The routed
    GEMMs run after the dispatcher's host sync (`host_sync_s`)."""
    if not is_moe(m):
        return lo
    h, t = m.hidden, c.tp
    glu = 2 if m.glu else 1
    share = moe_layer_count(m) / m.layers
    dense = [op.scaled(1 - share) for op in lo.ops if op.name in ("fc1", "mlp_act", "fc2") and share < 1]
    ffn = expert_ffn(m)
    rows, local = routed_rows(m, c, training, tokens)
    sync_host = sync_host_s(m, c, training)
    sp_tokens = tokens // (t if c.sp else 1)   # the router and the permutation run on the SP shard
    experts = [gemm_op("router", sp_tokens, m.num_experts, h, g),
               bytes_op("router_topk", ROUTER_BYTES_PER_SCORE * sp_tokens * m.num_experts, cluster),
               bytes_op("moe_permute", 2 * h * tokens * (2 + 2 * m.moe_topk * capacity(training))
                        / max(1, t if c.sp else 1), cluster),
               bytes_op("moe_sort_chunks", sort_chunks_bytes(m, c, training, tokens), cluster),
               gemm_op("expert_fc1", rows, glu * ffn // c.etp, h, g, local, after_sync=sync_host > 0),
               bytes_op("expert_act", (6 if m.glu else 4) * tokens * m.moe_topk * capacity(training) * ffn / c.etp
                        / tp_per_etp(c), cluster),
               gemm_op("expert_fc2", rows, h, max(1, ffn // c.etp), g, local, after_sync=sync_host > 0)]
    if m.shared_experts:
        width = m.shared_experts * ffn
        experts += [gemm_op("shared_fc1", tokens, glu * width // t, h, g),
                    bytes_op("shared_act", (6 if m.glu else 4) * tokens * width / t, cluster),
                    gemm_op("shared_fc2", tokens, h, max(1, width // t), g)]
    out = lo.replace_ops(("fc1", "mlp_act", "fc2"), dense + [op.scaled(share) for op in experts])
    return replace(out, sync_host_s=out.sync_host_s + sync_host)


def latent_attention_ops(lo: "LayerOps", m: "ModelSpec", c: "Candidate", tokens: int, g: "GemmContext",
                         g_core: "GemmContext") -> "LayerOps":
    """The layer's op list with DeepSeek's multi-latent attention in place of Q/K/V and the core (DeepSeek-V3 report
    Eq. 1-11; Megatron-Core multi_latent_attention.py): the q and kv down-projections on every TP rank (duplicated
    linears), the up-projections split by heads over TP, the core over heads/TP with q/k width nope+rope and v width
    v_head_dim, the output projection row-parallel. FLOPs are `attention_matmul_flops`' split by TP."""
    if not m.kv_lora_rank:
        return lo
    t, h, s, a = c.tp, m.hidden, m.seq_len, m.heads
    nope, rope, v = m.head_dim, m.qk_rope_head_dim, m.v_head_dim or m.head_dim
    heads = c.mbs * max(1, a // t)
    q = ([gemm_op("q_down", tokens, m.q_lora_rank, h, g), gemm_op("q_up", tokens, a * (nope + rope) // t,
                                                                   m.q_lora_rank, g)]
         if m.q_lora_rank else [gemm_op("q_proj", tokens, a * (nope + rope) // t, h, g)])
    mla = q + [gemm_op("kv_down", tokens, m.kv_lora_rank + rope, h, g),
               gemm_op("kv_up", tokens, a * (nope + v) // t, m.kv_lora_rank, g),
               gemm_op("attn_scores", s, s, nope + rope, g_core, heads, attention=True),
               gemm_op("attn_values", s, v, s, g_core, heads, attention=True),
               gemm_op("proj", tokens, h, a * v // t, g)]
    return lo.replace_ops(("qkv", "attn_scores", "attn_values", "proj"), mla)


def routed_rows(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int) -> tuple[int, int]:
    """(rows per local expert, local experts) of the routed experts' grouped GEMM: each GPU dispatches its share of
    the tokens' k copies, 1/(TP/ETP) of them (the TP group's sequence-parallel shards regroup as ETP x expert-DP:
    Megatron-Core parallel_state's expert grid; the same share `all_to_all_layer_s` sends), so each of the E/EP local
    experts gets tokens·k·EP/E / (TP/ETP) rows (balanced routing, x the capacity factor)."""
    return (max(1, math.ceil(tokens * m.moe_topk * c.ep / m.num_experts * capacity(training) / tp_per_etp(c))),
            max(1, m.num_experts // c.ep))


def sort_chunks_bytes(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int) -> float:
    """Forward HBM bytes of the alltoall dispatcher's second permutation: after the dispatch all-to-all the rows a GPU
    received arrive grouped by source rank and are regrouped by local expert, and before the combine they are put
    back (Megatron-Core token_dispatcher.py MoEAlltoAllTokenDispatcher: ``sort_chunks_by_idxs`` in
    dispatch_postprocess and combine_preprocess when num_local_experts > 1, dropless): each a read and a write of the
    received tokens·k·cap/(TP/ETP) rows of h 16-bit values, 2 x 2 x 2 bytes a value. 0 with one local expert and on
    torchtitan (its grouped GEMM takes the all-to-all's order through index offsets)."""
    if not is_moe(m) or m.num_experts // c.ep <= 1 or training.moe_dispatcher != "alltoall" \
            or training.framework != "megatron-lm":
        return 0.0   # the allgather and flex dispatchers permute straight into local-expert order
    return 8.0 * tokens * m.moe_topk * capacity(training) * m.hidden / tp_per_etp(c)


def tp_per_etp(c: "Candidate") -> int:
    """TP ranks per expert-TP group: the share of the tokens' copies one GPU's experts run is 1 / this."""
    return max(1, c.tp // c.etp)


def routed_gemm_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
                  gemm_s: Callable[..., float]) -> float:
    """Forward seconds of one MoE layer's routed experts: a grouped GEMM over the E/EP local experts, each with
    tokens·k·EP/E rows (balanced routing, x the capacity factor) and expert_ffn/ETP columns (SwiGLU: FC1 2x wide)."""
    glu = 2 if m.glu else 1
    rows, local_experts = routed_rows(m, c, training, tokens)
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
    host-bound). The CUDA-graph scopes moe_router / moe_preprocess replay the router and preprocess, before the sync,
    as one graph (`planner.cuda_graphs`); these launches, after it, stay eager unless drop-and-pad lets the whole
    MoE layer be captured.
    """
    host = sync_host_s(m, c, training)
    if not host:
        return 0.0, 0.0
    return host, routed_gemm_s(m, c, training, tokens, gemm_s) * moe_layer_count(m) / m.layers


def quantize_kernels(training: "TrainingSpec") -> int:
    """Kernels one FP8 quantization launches under the training's recipe (`QUANTIZE_KERNELS`, 1 unless listed)."""
    return QUANTIZE_KERNELS.get(training.fp8_recipe, 1)


def sync_host_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec") -> float:
    """`host_sync_s`' host seconds: the launches after Megatron's dispatcher sync, as a mean over all layers."""
    local = m.num_experts // c.ep if is_moe(m) else 0
    if not is_moe(m) or (c.ep <= 1 and local <= 1) or training.framework != "megatron-lm":
        return 0.0   # torchtitan runs the experts as one torch._grouped_mm; a capacity factor syncs too
    per_expert = MOE_KERNELS_PER_EXPERT * (1 + (quantize_kernels(training) if training.precision == "fp8" else 0))
    return per_expert * local * KERNEL_LAUNCH_S * moe_layer_count(m) / m.layers


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
    gpn = topology.domain   # the node, or an NVLink domain spanning nodes (GB200 NVL72: EP across trays on NVLink)
    members = min(group, max(1, gpn // stride))          # ranks of the group on one node (NVLink domain)
    intra = collective_s(topology.strided_link(stride, members), kind="all_gather",
                         message_bytes=message_bytes * members / group, group=members)
    if members >= group:
        return intra
    nodes = -(-group // members)
    nic = topology.rail_link(topology.strided_link(stride, group))   # one GPU's share of the node's NICs
    return max(intra, collective_s(nic, kind="all_gather", message_bytes=message_bytes, group=nodes))


DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
"""Megatron-Core's MoE token dispatchers (megatron/core/transformer/moe/token_dispatcher.py):
MoEAlltoAllTokenDispatcher, MoEAllGatherTokenDispatcher, and MoEFlexTokenDispatcher over DeepEP or HybridEP
(--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep|hybridep). All four sync with the host
before the experts when dropless (`sync_host_s`): the alltoall one for its splits, the allgather one for
tokens_per_expert (.cpu()), the flex one for the received token counts its grouped GEMM needs."""


def ranks_per_token(m: "ModelSpec", ep: int) -> float:
    """Expected EP ranks a token's k experts land on, experts placed E/EP a rank and the k chosen uniformly (balanced
    routing): EP·(1 - C(E - E/EP, k) / C(E, k)) (the chance that none of its k falls on a given rank). DeepEP sends a
    token once to each such rank (deepseek-ai/DeepEP deep_ep/buffer.py get_dispatch_layout: is_token_in_rank), not k
    copies. DeepSeek-V3's node-limited routing (at most 4 nodes a token, report Sec. 2.1.2) sends fewer across nodes;
    not counted."""
    e, k = m.num_experts, m.moe_topk
    if ep <= 1 or k >= e:
        return float(min(ep, k) or 1)
    return ep * (1 - math.comb(e - e // ep, k) / math.comb(e, k))


def dispatch_bytes(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int,
                   bytes_per_value: float) -> float:
    """What one GPU sends in one dispatch (and again in the combine), as an all-to-all's per-GPU message
    (`all_to_all_s`), by dispatcher: alltoall, every token's k copies (x capacity; no deduplication of copies bound
    for one GPU), 1/(TP/ETP) of them per GPU; flex (DeepEP / HybridEP), each token once per EP rank holding any of
    its experts (`ranks_per_token`); allgather, every GPU's tokens gathered to every EP rank and reduce-scattered
    back, an all-gather of EP x tokens·h, priced as the all-to-all whose per-GPU message moves the same bytes."""
    per_token = m.hidden * bytes_per_value / tp_per_etp(c)
    if training.moe_dispatcher == "allgather":
        return c.ep * tokens * per_token
    if training.moe_dispatcher in ("deepep", "hybridep"):
        return tokens * ranks_per_token(m, c.ep) * capacity(training) * per_token
    return tokens * m.moe_topk * capacity(training) * per_token


# DeepSeek-V3 report Sec. 3.3.3: the dispatch (the activation before the MoE up-projections) and the activation
# gradient before the down-projections go in FP8, 1 byte and an FP32 scale per 1x128 tile (Sec. 3.3.1); the forward and
# backward combines stay BF16 (the tile scale is planner.fp8.TILE_SCALE_BYTES, which this module sits below:
# tests/test_fp8_deepseek.py holds the two equal)
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128


def all_to_all_layer_s(m: "ModelSpec", c: "Candidate", training: "TrainingSpec", tokens: int, topology: "Topology",
                       collective_s: Callable[..., float], bytes_per_value: float,
                       recomputed_layers: float | None = None) -> float:
    """Mean per-layer seconds of the EP all-to-all: dispatch and combine in the forward, both again in
    the backward (and the forward pair again under full recompute), not overlapped (Megatron-Core's
    token dispatcher without --overlap-moe-expert-parallel-comm). Each GPU sends `dispatch_bytes` (by dispatcher)
    over the EP group, which strides by ETP (Megatron-Core parallel_state's expert grid ETP x EP x expert-DP):
    `all_to_all_s`; the flex dispatcher's kernels at FLEX_LINK_EFFICIENCY of the links, not NCCL's LINK_EFFICIENCY.
    ``recomputed_layers``: `planner.recompute.recomputed_of(...).layers` when the caller has it."""
    if not is_moe(m) or c.ep <= 1:
        return 0.0
    per = all_to_all_s(topology, c.etp, c.ep, dispatch_bytes(m, c, training, tokens, bytes_per_value), collective_s)
    if recomputed_layers is None:
        recomputed_layers = recomputed_of(m, c, training.framework).layers
    calls = 4 + 2 * recomputed_layers   # full (or --recompute-modules moe): the pair again; block-N: its share
    total = calls * per
    if training.deepseek_fp8_storage:
        # DeepSeek-V3 (report Sec. 3.3.3): the dispatch and the activation gradient before the down-projections (the
        # combine's backward) in FP8 with their tiles' scales, the combine and the dispatch's backward in BF16
        low = all_to_all_s(topology, c.etp, c.ep, dispatch_bytes(m, c, training, tokens, FP8_DISPATCH_BYTES),
                           collective_s)
        total = calls / 2 * (per + low)
    if training.moe_dispatcher in ("deepep", "hybridep"):
        total *= LINK_EFFICIENCY / FLEX_LINK_EFFICIENCY   # its kernels, not NCCL's, drive the links
    return total * moe_layer_count(m) / m.layers


def expert_grad_reduce_s(m: "ModelSpec", c: "Candidate", stage_layers: int, link: object,
                         collective_s: Callable[..., float], bytes_per_grad: float) -> float:
    """Routed-expert gradients reduced over the expert data-parallel group after the last micro-batch
    (Megatron DDP keeps expert parameters in their own buckets and group)."""
    edp = expert_data_parallel(c)
    if not is_moe(m) or edp <= 1:
        return 0.0
    n = expert_params_on_gpu(m, c, stage_layers)
    return collective_s(link, kind="all_reduce", message_bytes=n * bytes_per_grad, group=edp)


@memoized_term(lambda ctx: (ctx.cand.ep, ctx.cand.etp, ctx.cand.tp, ctx.tokens, ctx.stage_layers,
                           ctx.rc.layers + ctx.rc.moe))
def all_to_all_term_s(ctx: "StepContext") -> float:
    """The term: the busiest stage's EP all-to-alls for one micro-batch (the EP group strides by ETP)."""
    return ctx.stage_layers * all_to_all_layer_s(ctx.model, ctx.cand, ctx.training, ctx.tokens, ctx.topology,
                                                 collective_time_s, ctx.half, ctx.rc.layers + ctx.rc.moe)


@memoized_term(lambda ctx: (ctx.cand.tp, ctx.cand.cp, ctx.cand.dp, ctx.cand.ep, ctx.cand.etp, ctx.stage_layers,
                           ctx.cand.pp > 1))
def expert_grad_reduce_term_s(ctx: "StepContext") -> float:
    """The term: routed-expert gradients reduced over the expert-DP group once a step."""
    c, m = ctx.cand, ctx.model
    edp = expert_data_parallel(c)
    link = is_moe(m) and edp > 1 and ctx.topology.dp_link(c.etp * c.ep, edp)
    return (expert_grad_reduce_s(m, c, ctx.stage_layers, link, collective_time_s, ctx.half)
            * dualpipe.parameter_copies(ctx.training.pp_schedule, c.pp))   # DualPipe: two stages' experts


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
    if ctx.cand.pp > 1 and ctx.training.pp_schedule in dualpipe.SCHEDULES:
        # DualPipe / DualPipeV: a forward chunk's dispatch and combine run beside another micro-batch's backward chunk
        # and back (DeepSeek-V3 report Sec. 3.2.1, Fig. 4), but in the chunks the schedule runs alone
        return Overlap(under="compute", window=1.0,
                       exposed_min=dualpipe.unmerged_share(ctx.training.pp_schedule, ctx.cand.pp, ctx.cand.gas))
    if "ep-a2a" in ctx.overlaps:
        return Overlap(under="compute", window=1.0,
                       exposed_min=unmerged_share(ctx.cand.pp, ctx.cand.vpp, ctx.cand.gas))
    if "shared-expert" in ctx.overlaps and shared_expert_share(ctx.model):
        return Overlap(under="compute", window=shared_expert_share(ctx.model))
    return None


ALL_TO_ALL = Term(name="ep_all_to_all", kind=COMMUNICATION, group="ep_comm_s", per_microbatch=True,
                  seconds=all_to_all_term_s, source="Megatron-Core MoE alltoall token dispatcher (dispatch + combine, "
                                               "forward and backward; allgather and flex dispatchers by their "
                                               "bytes); nccl-tests alltoall busbw",
                  constants=("LINK_EFFICIENCY", "FLEX_LINK_EFFICIENCY"), overlap=all_to_all_overlap,
                  hides_under="compute",
                  flag="Megatron --overlap-moe-expert-parallel-comm (--overlap ep-a2a) or --moe-shared-expert-overlap "
                       "(--overlap shared-expert); DeepSeek's DualPipe (--pp-schedule DualPipe / DualPipeV)")
EXPERT_GRAD_REDUCE = Term(name="expert_grad_reduce", kind=COMMUNICATION, group="dp_comm_s", per_microbatch=False,
                          seconds=expert_grad_reduce_term_s,
                          source="Megatron DDP: expert parameters in their own buckets and expert-DP group",
                          constants=("LINK_EFFICIENCY",))


__all__ = ["ALL_TO_ALL", "EXPERT_GRAD_REDUCE", "FP8_DISPATCH_BYTES", "add_expert_states", "all_to_all_layer_s",
           "all_to_all_s", "attention_params", "capacity", "DISPATCHERS", "dispatch_bytes", "dispatcher_flags",
           "ranks_per_token",
           "dense_layer_count", "expert_data_parallel", "expert_ffn", "expert_grad_reduce_s", "expert_params_on_gpu",
           "routed_params", "routed_share",
           "expert_ops", "host_sync_s", "sync_host_s", "is_moe", "latent_attention_ops", "layer_forward_matmul_flops",
           "moe_layer_count", "mtp_forward_flops", "mtp_non_expert_params", "mtp_params", "needs_own_shape",
           "routed_gemm_s", "routed_rows"]


# -- input --------------------------------------------------------------------------------------------


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
    if fw == "megatron-lm" and training.moe_dispatcher == "allgather" and "ep-a2a" in (training.overlap or ()):
        out.append(("framework_limit", "--overlap ep-a2a needs the alltoall or flex dispatcher (transformer_config.py: "
                                       "'overlap_moe_expert_parallel_comm is supported with alltoall/flex token "
                                       "dispatcher'); use --moe-dispatcher alltoall, deepep or hybridep"))
    if fw == "megatron-lm" and training.moe_dispatcher != "alltoall" and "shared-expert" in (training.overlap or ()):
        out.append(("framework_limit", "--overlap shared-expert works with the alltoall dispatcher only "
                                       "(transformer_config.py: 'moe_shared_expert_overlap only works with alltoall "
                                       "token dispatcher'); use --moe-dispatcher alltoall"))
    if fw == "megatron-lm" and training.moe_dispatcher == "deepep" and c.tp * c.ep <= 1:
        out.append(("framework_limit", "the flex dispatcher's DeepEP backend needs TP x EP > 1 "
                                       "(token_dispatcher.py: 'DeepEP dispatcher requires TPxEP > 1'); set EP > 1 "
                                       "or use --moe-dispatcher alltoall"))
    if fw == "megatron-lm" and training.moe_dispatcher == "deepep" and training.moe_capacity_factor:
        out.append(("framework_limit", "DeepEP cannot pad experts to capacity (transformer_config.py: 'Flex token "
                                       "dispatcher with deepep backend does not support "
                                       "moe_pad_expert_input_to_capacity'); drop --moe-capacity-factor or use "
                                       "another dispatcher"))
    if c.ep > 1 and training.precision == "fp16":
        out.append(("framework_limit", "Megatron refuses expert parallelism with fp16 ('Expert parallelism is not "
                                       "supported with fp16 training'); use bf16 or fp8"))
    return out


def dispatcher_flags(training: "TrainingSpec") -> list[list[str]]:
    """Megatron-LM's flags for the training's dispatcher (TransformerConfig moe_token_dispatcher_type,
    moe_flex_dispatcher_backend)."""
    d = training.moe_dispatcher
    if d in ("deepep", "hybridep"):
        return [["--moe-token-dispatcher-type", "flex"], ["--moe-flex-dispatcher-backend", d]]
    return [["--moe-token-dispatcher-type", d]]


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
