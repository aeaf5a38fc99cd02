"""Activation recompute modes: their names, which layers and ops each re-runs, and how each framework spells them.

Modes (``Candidate.recompute``):
- ``none``; ``selective`` (Megatron: the attention core, Korthikanti et al. 2022 Sec. 4.2); ``full`` (every layer's
  input kept, the whole forward re-run: Megatron ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1``).
- ``block-N``: Megatron ``--recompute-granularity full --recompute-method block --recompute-num-layers N``: the first N
  layers of each model chunk (each virtual stage under interleaving) are checkpointed, the others keep everything
  (megatron/core/transformer/transformer_block.py ``_checkpointed_forward``; transformer_config.py
  ``recompute_method``: "block will recompute the input activations for only a set number of transformer layers per
  pipeline stage"). ``self.num_layers_per_pipeline_rank = len(self.layers)`` there is the chunk's layer count.
- ``uniform-N``: ``--recompute-method uniform --recompute-num-layers N``: the chunk's layers in units of N, only each
  unit's input kept; the backward re-runs a whole unit at once (``uniform-1`` is ``full``).
- ``selective-op`` / ``selective-layer-N``: torchtitan's ``activation_checkpoint.mode = "selective"`` with
  ``selective_ac_option = "op"`` (op-level SAC: every other matmul output saved, the attention output saved) or
  ``"N"`` (every N-th transformer block fully checkpointed; ``selective-layer`` = N 2).

- ``modules:<a>+<b>...``: Megatron-LM's module-level recompute, ``--recompute-granularity selective
  --recompute-modules a b`` (megatron/core/transformer/transformer_config.py ``recompute_modules``: core_attn, moe_act,
  layernorm, mla_up_proj, mlp, moe, shared_experts; ``selective`` is ``modules:core_attn``, Megatron's default). What
  each module frees and re-runs: `planner.memory.layer_activations` and `module_matmul_share`.

Search tokens (``--recompute`` lists): ``block`` and ``uniform`` without N, ``modules`` without a list; `plan`
resolves ``block`` to the smallest N that fits (`planner.rank.smallest_partial`), since a larger N only re-runs more of
the forward; ``modules`` to the first of `MODULE_SETS` that fits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.model import (attention_core_flops, expert_ffn, is_moe, layer_forward_matmul_flops, mlp_matmul_flops,
                           moe_layer_count, router_params)
from planner.pipeline_split import megatron_lm_split
from planner.recompute_modes import (CLASSIC, FRAMEWORK_MODES, MODULE_SETS, MODULES, OPTIONS, PARTIAL,  # noqa: F401
                                     PLAN_DEFAULT, SEARCHED, TORCHTITAN, Mode, is_valid, kind, parse)

if TYPE_CHECKING:
    from planner.model import ModelSpec
    from planner.space import Candidate

def chunk_layers(model: ModelSpec, pp: int, vpp: int, framework: str) -> int:
    """Layers of the largest model chunk (one virtual stage of the busiest pipeline rank): what Megatron's
    ``--recompute-num-layers`` counts in (transformer_block.py: ``num_layers_per_pipeline_rank = len(self.layers)``)."""
    split = (megatron_lm_split(model.layers, pp, vpp, model.mtp_layers)
             if framework == "megatron-lm" and pp > 1 else None)
    stage = split.busiest if split is not None else -(-model.layers // pp)
    return -(-stage // vpp)


def checkpointed_layers(mode: str, stage_layers: int, vpp: int) -> float:
    """Layers of a ``stage_layers``-layer pipeline rank (``vpp`` chunks) that keep only their input; the others keep
    all their activations. block-N: N per chunk (min(N, chunk)); full, uniform-N: all; selective-layer-N: every N-th."""
    m = parse(mode)
    if m is None or m.kind in ("none", "selective", "selective-op", "modules"):
        return 0.0
    if m.kind == "block":
        return min(stage_layers, vpp * m.n)
    if m.kind == "selective-layer":
        return stage_layers / m.n
    return float(stage_layers)


def kept_inputs(mode: str, stage_layers: int, vpp: int) -> float:
    """Layer inputs the checkpointed layers of such a rank keep: one per checkpointed layer, or under uniform-N one
    per unit of N layers of each chunk (transformer_block.py checkpoints ``custom(l, l + N)``)."""
    m = parse(mode)
    if m is not None and m.kind == "uniform":
        return vpp * -(-(-(-stage_layers // vpp)) // max(m.n, 1))
    return checkpointed_layers(mode, stage_layers, vpp)


@dataclass(frozen=True, slots=True)
class Recomputed:
    """What the backward re-runs, as shares of one layer's forward."""

    layers: float
    """share of the layers whose whole forward is re-run (full: 1; block-N: N·VPP / layers on the rank)"""
    core: float
    """share of the layers whose attention core alone is re-run (selective: 1)"""
    matmul: float
    """share of a layer's forward matmul FLOPs re-run besides those (op-level SAC: the matmuls it does not save)"""
    moe: float = 0.0
    """share of the MoE layers whose whole MoE block (dispatch, experts, combine) is re-run (modules:moe)"""
    elementwise: float = 0.0
    """share of a layer's element-wise ops re-run besides whole layers (op-level SAC: all of them, as it saves only
    the outputs of its save list, matmuls and attention, and marks every other op PREFER_RECOMPUTE)"""


def recomputed(model: ModelSpec, mode: str, stage_layers: int, vpp: int) -> Recomputed:
    """What ``mode`` re-runs on a rank of ``stage_layers`` layers (the slowest rank sets the step)."""
    k = kind(mode)
    if k == "selective":
        return Recomputed(0.0, 1.0, 0.0)
    if k == "selective-op":
        # torchtitan activation_checkpoint.py _custom_policy: an op outside op_sac_save_list (mm, SDPA,
        # reduce_scatter, max) is PREFER_RECOMPUTE, so the norms, RoPE, SwiGLU and casts between them re-run
        return Recomputed(0.0, 0.0, op_sac_matmul_share(model), elementwise=1.0)
    if k == "modules":
        mods = parse(mode).modules
        return Recomputed(0.0, float("core_attn" in mods), module_matmul_share(model, mods),
                          float("moe" in mods and _moe_layers(model) > 0))
    return Recomputed(checkpointed_layers(mode, stage_layers, vpp) / max(stage_layers, 1), 0.0, 0.0)


def recomputed_of(model: ModelSpec, cand: "Candidate", framework: str) -> Recomputed:
    """`recomputed` on the candidate's busiest pipeline rank (Megatron-LM's split; ceil(L/PP) elsewhere)."""
    return recomputed(model, cand.recompute, chunk_layers(model, cand.pp, cand.vpp, framework) * cand.vpp, cand.vpp)


def _moe_layers(model: ModelSpec) -> int:
    return moe_layer_count(model) if is_moe(model) else 0


@functools.lru_cache(maxsize=256)
def module_matmul_share(model: ModelSpec, modules: tuple[str, ...]) -> float:
    """Share of a layer's forward projection and MLP GEMM FLOPs (attention core excluded; the mean layer) that
    ``modules`` re-run in the backward: mla_up_proj the MLA up-projections (q_lora -> heads x (nope + rope), kv_lora
    -> heads x (nope + v)); mlp the dense layers' MLP (Megatron's transformer_layer.py recomputes it only where the
    layer is not MoE); shared_experts the shared experts; moe the routed experts (top-k), shared experts and router.
    core_attn is `Recomputed.core`; moe_act and layernorm re-run element-wise work only (output-discarding
    checkpoints of the expert activation and the two norms)."""
    per_token = layer_forward_matmul_flops(model, 1) - attention_core_flops(model, 1)
    n_moe = _moe_layers(model)
    dense_share = 1 - n_moe / model.layers
    f = 0.0
    if "mla_up_proj" in modules and model.kv_lora_rank:
        nope, rope, v = model.head_dim, model.qk_rope_head_dim, model.v_head_dim or model.head_dim
        f += 2.0 * model.heads * (model.q_lora_rank * (nope + rope) + model.kv_lora_rank * (nope + v))
    if "mlp" in modules:
        f += dense_share * mlp_matmul_flops(model, 1, model.ffn_hidden)
    if n_moe:
        share, e = n_moe / model.layers, expert_ffn(model)
        if "moe" in modules:
            f += share * (mlp_matmul_flops(model, 1, e) * (model.moe_topk + model.shared_experts)
                          + 2.0 * router_params(model))
        elif "shared_experts" in modules:
            f += share * mlp_matmul_flops(model, 1, e) * model.shared_experts
    return min(1.0, f / per_token) if per_token > 0 else 0.0


@functools.lru_cache(maxsize=64)   # pure in a frozen ModelSpec; plan() asks per row
def module_sets(model: ModelSpec) -> tuple[str, ...]:
    """`MODULE_SETS` whose every module the model has (none for a dense model without MLA)."""
    return tuple(s for s in MODULE_SETS if not module_problems(model, s))


@functools.lru_cache(maxsize=1024)
def module_problems(model: ModelSpec, mode: str) -> tuple[str, ...]:
    """The modules of ``mode`` the model lacks (Megatron's transformer_config.py refuses mla_up_proj without MLA and
    moe_act without MoE grouped GEMM; mlp is a no-op on an all-MoE model, moe and shared_experts without MoE)."""
    m = parse(mode)
    if m is None or m.kind != "modules":
        return ()
    n_moe = _moe_layers(model)
    lacks = {"mla_up_proj": not model.kv_lora_rank, "moe_act": not n_moe, "moe": not n_moe,
             "shared_experts": not (n_moe and model.shared_experts), "mlp": n_moe == model.layers}
    return tuple(name for name in m.modules if lacks.get(name))


def op_sac_matmuls(model: ModelSpec, ffn: float | None = None) -> list[tuple[float, float]]:
    """A layer's projections in forward order, wq, wk, wv, wo, w1, (w3,) w2, as (weight elements = forward FLOPs per
    token / 2, output width); ``ffn``: the MLP width the activations count (MoE: `planner.moe.activation_ffn`)."""
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    f = model.ffn_hidden if ffn is None else ffn
    mlp = [(h * f, f), (h * f, f), (f * h, h)] if model.glu else [(h * f, f), (f * h, h)]
    return [(h * q, q), (h * kv, kv), (h * kv, kv), (q * h, h)] + mlp


def op_sac_matmul_share(model: ModelSpec) -> float:
    """torchtitan op-level SAC (torchtitan/distributed/activation_checkpoint.py ``SelectiveAC``: "save all compute
    ops, except every second mm", attention output saved): of wq, wk, wv, wo, w1, w3, w2 the 2nd, 4th and 6th (wk, wo,
    w3; w2 without GLU) are re-run in the backward. Their share of the layer's dense forward matmul FLOPs (attention
    core excluded; it is saved). probes/gpt.py ``op_sac_contexts`` runs the same policy."""
    mms = [w for w, _ in op_sac_matmuls(model)]
    return sum(mms[1::2]) / sum(mms)


def op_sac_kept_width(model: ModelSpec, ffn: float | None = None) -> float:
    """Summed width of the matmul outputs op-level SAC keeps (the 1st, 3rd, ...: wq, wv, w1, and w2 with GLU)."""
    return sum(width for _, width in op_sac_matmuls(model, ffn)[0::2])


def time_key(cand: "Candidate") -> tuple:
    """The candidate fields `recomputed` reads besides the model (a cost memo's key part)."""
    return (cand.recompute, cand.pp, cand.vpp) if kind(cand.recompute) == "block" else (cand.recompute,)


# -- how each framework spells a mode ----------------------------------------------------------------------------

def megatron_lm_args(mode: str) -> list[tuple[str, ...]]:
    """Megatron-LM's flags (arguments.py: --recompute-granularity, --recompute-method, --recompute-num-layers)."""
    m = parse(mode)
    if m is None or m.kind == "none":
        return []
    if m.kind == "selective":
        return [("--recompute-granularity", "selective")]
    if m.kind == "modules":
        return [("--recompute-granularity", "selective"), ("--recompute-modules", *m.modules)]
    method, n = ("uniform", 1) if m.kind == "full" else (m.kind, m.n)
    return [("--recompute-granularity", "full"), ("--recompute-method", method), ("--recompute-num-layers", str(n))]


def plan_yaml_fields(mode: str) -> dict[str, object]:
    """The plan YAML's recompute keys, named as Megatron's arguments (granularity, method, num_layers)."""
    m = parse(mode)
    if m is None or m.kind == "none":
        return {"recompute_granularity": None}
    if m.kind in ("block", "uniform"):
        return {"recompute_granularity": "full", "recompute_method": m.kind, "recompute_num_layers": m.n}
    if m.kind == "modules":
        return {"recompute_granularity": "selective", "recompute_modules": list(m.modules)}
    return {"recompute_granularity": mode}


def from_plan_yaml(granularity: str | None, method: str | None, num_layers: int | None) -> str:
    """`plan_yaml_fields` read back."""
    if granularity is None:
        return "none"
    if method in PARTIAL and not (method == "uniform" and num_layers == 1):
        return f"{method}-{num_layers}"
    return granularity


def torchtitan_activation_checkpoint(mode: str) -> dict[str, str]:
    """torchtitan's [activation_checkpoint] table (torchtitan/config/job_config.py ActivationCheckpoint: mode
    none | selective | full, selective_ac_option "op" or an integer as a string)."""
    m = parse(mode)
    if m is not None and m.kind == "selective-layer":
        return {"mode": "selective", "selective_ac_option": str(m.n)}
    if m is not None and m.kind in ("selective", "selective-op"):
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": mode}


__all__ = ["CLASSIC", "FRAMEWORK_MODES", "MODULES", "MODULE_SETS", "Mode", "OPTIONS", "SEARCHED",
           "module_matmul_share", "module_problems", "PARTIAL", "PLAN_DEFAULT", "Recomputed", "TORCHTITAN",
           "checkpointed_layers", "chunk_layers", "from_plan_yaml", "is_valid", "kept_inputs", "kind", "megatron_lm_args",
           "op_sac_kept_width", "op_sac_matmul_share", "op_sac_matmuls", "parse", "plan_yaml_fields", "recomputed",
           "recomputed_of", "time_key",
           "torchtitan_activation_checkpoint"]
