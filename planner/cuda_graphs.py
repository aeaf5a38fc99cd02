"""CUDA graphs as Megatron-LM captures them (``--cuda-graph-impl``, ``--cuda-graph-scope``): which host launches they
remove from a layer's time, which combinations Megatron refuses, and the flags.

Sources: Megatron-LM megatron/training/arguments.py (``--cuda-graph-scope`` help: "attn" captures
TransformerLayer._forward_attention(), "mlp" _forward_mlp() of a dense layer, "moe" _forward_mlp() of a MoE layer,
"moe_router" _forward_mlp() up to MoELayer.router() with the shared experts when not overlapped, "moe_preprocess"
MoELayer.preprocess(), "full_iteration" the whole training iteration; no scope: the whole layer; full_iteration with
--cuda-graph-impl local only, the others with transformer_engine) and megatron/core/transformer/transformer_config.py
(__post_init__'s CUDA-graph checks, quoted in `violations`). The deprecated ``--enable-cuda-graph`` /
``--external-cuda-graph`` are the same two implementations (arguments.py maps them to local / transformer_engine).

Time: a captured region is replayed by one graph launch, so its ops' host launches (each op of the layer's list
launching alike: `planner.ops.LayerOps.host_s` spread evenly over the ops launched before the dispatcher's sync, an
ASSUMPTION) and, for the MoE router scope, Megatron-Core's router and preprocess host work (`MOE_ROUTER_HOST_S`,
fitted) drop out of the layer's host time; one `KERNEL_LAUNCH_S` per graph launch is left. Megatron-Core's dropless
dispatcher still syncs with the host after the graphed router / preprocess (token_dispatcher.py: with
moe_preprocess captured the D2H copy moves to "before_ep_alltoall", the sync stays), so what it launches after the
sync (the per-expert GEMMs, `planner.moe.sync_host_s`) stays eager; only the drop-and-pad ``moe`` scope and
``full_iteration`` (no sync: --moe-pad-expert-input-to-capacity) capture those too.

Memory: NOT modelled. A graph's private memory pool holds the captured region's intermediate tensors, which the eager
run allocates too; the static input / output buffers of each captured callable add a few activation-sized tensors
per layer and micro-batch in flight. No published figure here to check a number against, so plan adds nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from planner import recompute_modes
from planner.constants import KERNEL_LAUNCH_S, MOE_ROUTER_HOST_S
from planner.model import is_moe, moe_layer_count
from planner.space import CUDA_GRAPH_SCOPES as SCOPES  # noqa: F401  (the names: planner.space)

if TYPE_CHECKING:
    from planner.model import ModelSpec
    from planner.ops import LayerOps
    from planner.space import Candidate, TrainingSpec

ATTENTION_OPS = {"norms": 0.5, "rope": 1, "qkv": 1, "qkv_layout": 1, "attn_scores": 1, "softmax_dropout": 1,
                 "attn_values": 1, "proj": 1, "residual": 0.5, "q_down": 1, "q_up": 1, "q_proj": 1, "kv_down": 1,
                 "kv_up": 1}
"""ops of TransformerLayer._forward_attention (input norm, attention, its bias-dropout-add: half of the layer's two
norms and two residual adds), weight = launches counted"""
DENSE_MLP_OPS = {"norms": 0.5, "residual": 0.5, "fc1": 1, "mlp_act": 1, "fc2": 1}
"""_forward_mlp of a dense layer"""
ROUTER_OPS = {"norms": 0.5, "router": 1, "router_topk": 1, "shared_fc1": 1, "shared_act": 1, "shared_fc2": 1}
"""_forward_mlp up to MoELayer.router(): the pre-MLP norm, the router, the shared experts (when not overlapped)"""
PREPROCESS_OPS = {"moe_permute": 1}
"""MoELayer.preprocess(): the dispatcher's first permutation"""


def impl(scopes: tuple[str, ...]) -> str:
    """Megatron's --cuda-graph-impl for the scopes: local for full_iteration (arguments.py: 'full_iteration ... only
    supported with --cuda-graph-impl=local'), else transformer_engine; "none" without graphs."""
    if not scopes:
        return "none"
    return "local" if "full_iteration" in scopes else "transformer_engine"


def violations(m: "ModelSpec", c: "Candidate", cluster: object, training: "TrainingSpec",
               framework: str | None = None) -> list[tuple[str, str]]:
    """(reason value, detail) for each CUDA-graph combination Megatron-LM refuses for this model and layout."""
    s = training.cuda_graphs
    if not s or (framework or training.framework) != "megatron-lm":
        return []
    out: list[tuple[str, str]] = []
    moe_scopes = [x for x in s if x in ("moe", "moe_router", "moe_preprocess")]
    if moe_scopes and not is_moe(m):
        out.append(("framework_limit", f"--cuda-graphs {','.join(moe_scopes)} on a dense model (transformer_config."
                                       "py: 'moe cuda graph is only supported for MoE'); use attn, mlp or layer"))
    if "mlp" in s and is_moe(m) and moe_layer_count(m) == m.layers:
        out.append(("framework_limit", "--cuda-graphs mlp with no dense layer (transformer_config.py: 'mlp cuda graph "
                                       "is only supported for dense layers'); use moe_router or attn"))
    dropless = is_moe(m) and not training.moe_capacity_factor
    if dropless and any(x in s for x in ("moe", "full_iteration", "layer")):
        out.append(("framework_limit", "a dropless MoE syncs with the host in its dispatcher, which no graph can "
                                       "hold (transformer_config.py: 'moe cuda graph is only supported with "
                                       "drop-padding MoE'); add --moe-capacity-factor (padded to capacity) or use "
                                       "--cuda-graphs moe_router,moe_preprocess"))
    if "moe_preprocess" in s and training.moe_capacity_factor and training.moe_dispatcher == "alltoall" \
            and "moe" not in s:
        out.append(("framework_limit", "--cuda-graphs moe_preprocess with a capacity factor (transformer_config.py: "
                                       "'moe_preprocess cuda graph is not supported when there are DtoH copies and "
                                       "synchronizations in the preprocess step'); drop moe_preprocess"))
    mode = recompute_modes.parse(c.recompute)
    kind = mode.kind if mode else c.recompute
    if kind not in ("none", "selective", "modules") and s != ("full_iteration",):
        out.append(("framework_limit", f"recompute={c.recompute} with layer CUDA graphs (transformer_config.py: "
                                       "'full recompute is only supported with full iteration CUDA graph'); use "
                                       "none, selective or module recompute, or --cuda-graphs full_iteration"))
    if mode is not None and "moe" in mode.modules and "moe_router" in s:
        out.append(("framework_limit", "recompute of the moe module with --cuda-graphs moe_router (transformer_"
                                       "config.py: 'moe recompute is not supported with moe_router CUDA graph with: "
                                       "--cuda-graph-impl transformer_engine'); recompute other modules"))
    if "ep-a2a" in (training.overlap or ()) and (impl(s) != "transformer_engine" or "moe" in s or "mlp" in s):
        out.append(("framework_limit", "--overlap ep-a2a takes transformer_engine graphs without the moe and mlp "
                                       "scopes (transformer_config.py: 'CUDA graph scope on moe and mlp is not "
                                       "supported with overlap_moe_expert_parallel_comm'); use attn or moe_router"))
    return out


def graphed_ops(lo: "LayerOps", m: "ModelSpec", training: "TrainingSpec") -> "LayerOps":
    """The layer's op list with its host time as Megatron-LM runs it: the MoE router and preprocess's host work
    (`MOE_ROUTER_HOST_S` a MoE layer forward, Megatron-LM's dropless MoE only) added, then what the CUDA-graph scopes
    capture taken out (see the module's docstring)."""
    if training.framework != "megatron-lm":
        return lo
    s = training.cuda_graphs
    moe_share = moe_layer_count(m) / m.layers if is_moe(m) else 0.0
    router = MOE_ROUTER_HOST_S * moe_share if lo.sync_host_s else 0.0   # dropless Megatron MoE (planner.moe)
    if not s:
        return replace(lo, host_s=lo.host_s + router) if router else lo
    if s == ("full_iteration",):   # one graph a step: no per-layer launches left
        return replace(lo, host_s=0.0, sync_host_s=0.0)
    pre = [op for op in lo.ops if not op.after_sync]
    weights: dict[str, float] = {}
    for scope, table in (("attn", ATTENTION_OPS), ("mlp", DENSE_MLP_OPS), ("moe_router", ROUTER_OPS),
                         ("moe_preprocess", PREPROCESS_OPS)):
        if scope in s or "layer" in s:
            for name, w in table.items():
                weights[name] = max(weights.get(name, 0.0), w)   # norms / residual: each half once
    if "shared-expert" in (training.overlap or ()) and "moe_router" in s:   # on their own stream: not in the graph
        for name in ("shared_fc1", "shared_act", "shared_fc2"):
            weights.pop(name, None)
    if "moe" in s or "layer" in s:   # the whole MoE MLP (drop-and-pad: no sync)
        for op in pre:
            if op.name not in ATTENTION_OPS and op.name not in DENSE_MLP_OPS:
                weights[op.name] = 1
        weights["norms"] = weights["residual"] = 1 if "attn" in s or "layer" in s else 0.5
    captured = sum(weights.get(op.name, 0.0) for op in pre) / len(pre) if pre else 0.0
    graphs = sum(x in s for x in ("attn", "mlp", "moe", "moe_router", "layer"))   # one replay per captured callable
    router_left = 0.0 if any(x in s for x in ("moe_router", "moe", "layer")) else router
    sync = 0.0 if any(x in s for x in ("moe", "layer")) else lo.sync_host_s
    return replace(lo, host_s=lo.host_s * (1 - min(1.0, captured)) + router_left + graphs * KERNEL_LAUNCH_S,
                   sync_host_s=sync)


def megatron_lm_args(training: "TrainingSpec", c: "Candidate") -> list[tuple[str, ...]]:
    """Megatron-LM's flags for the scopes: --cuda-graph-impl and --cuda-graph-scope (none for the whole layer);
    full_iteration also --no-check-for-nan-in-loss-and-grad (arguments.py asserts it) and, with EP > 1,
    --moe-pad-experts-for-cuda-graph-inference (arguments.py: 'must be set when using CUDA graphs with expert
    parallelism' under the local implementation)."""
    s = training.cuda_graphs
    if not s:
        return []
    args: list[tuple[str, ...]] = [("--cuda-graph-impl", impl(s))]
    if s != ("layer",):
        args.append(("--cuda-graph-scope", *s))
    if "full_iteration" in s:
        args.append(("--no-check-for-nan-in-loss-and-grad",))
        if c.ep > 1:
            args.append(("--moe-pad-experts-for-cuda-graph-inference",))
    return args


__all__ = ["ATTENTION_OPS", "DENSE_MLP_OPS", "PREPROCESS_OPS", "ROUTER_OPS", "SCOPES", "graphed_ops", "impl",
           "megatron_lm_args", "violations"]
