"""Activation recompute modes as names: which exist, how a name parses (``block-4`` -> Mode("block", 4)), which each
framework runs. A ground-floor module (specs read it); what each mode re-runs is `planner.recompute`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

CLASSIC = ("none", "selective", "full")
"""the modes every target has (tune's search space orders these by memory)"""
PARTIAL = ("block", "uniform")
"""Megatron's --recompute-method, N set per candidate (``block-N``, ``uniform-N``)"""
MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-LM's --recompute-modules (megatron-core 0.17.1 transformer_config.py: the allowed set, in its order)"""
MODULE_SETS = ("modules:mla_up_proj", "modules:moe_act", "modules:layernorm+mla_up_proj",
               "modules:layernorm+moe_act", "modules:moe_act+layernorm+mla_up_proj+mlp", "modules:mla_up_proj+mlp",
               "modules:shared_experts+moe_act+layernorm+mla_up_proj+mlp", "modules:moe")
"""what the ``modules`` search token tries, in order, the first that fits winning: NVIDIA's published MoE choices
(Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py: mla_up_proj; moe_act;
mla_up_proj + mlp; mla_up_proj + layernorm + moe_act; qwen3 and gpt-oss configs: moe_act, layernorm), then larger
sets, the whole MoE block last (it re-runs the all-to-all). A set whose modules a model lacks is skipped."""
SEARCHED = PARTIAL + ("modules",)
"""search tokens `plan` resolves per candidate (`planner.rank.partial_mode`)"""
TORCHTITAN = ("selective-op", "selective-layer")
OPTIONS = CLASSIC + PARTIAL + TORCHTITAN + ("modules",)
"""what ``--recompute`` accepts (``block-N``, ``uniform-N``, ``selective-layer-N`` too)"""
PLAN_DEFAULT = CLASSIC + ("block", "modules")
"""`plan`'s default list: the classic modes, Megatron's block recompute at the smallest N that fits and, for a model
with MoE or MLA layers, its module recompute at the first of `MODULE_SETS` that fits (`module_sets`)"""
FRAMEWORK_MODES = {"megatron-lm": CLASSIC + PARTIAL + ("modules",), "megatron-deepspeed": CLASSIC,
                   "fsdp": ("none", "full") + TORCHTITAN}
"""which modes each framework can run (torchtitan has no Megatron-style attention-core recompute: plantune's
``selective`` on FSDP is emitted as op-level SAC, the closest it has; kept for the classic tables)"""


@dataclass(frozen=True, slots=True)
class Mode:
    """A recompute mode as parsed: its kind, its N and its Megatron modules."""

    kind: str
    """none | selective | full | block | uniform | selective-op | selective-layer"""
    n: int = 0
    """N of block-N / uniform-N / selective-layer-N; 0 for a search token (block, uniform) or a mode without N"""
    modules: tuple[str, ...] = ()
    """Megatron's --recompute-modules of a ``modules:...`` mode (MODULES order); () for the search token"""


@functools.lru_cache(maxsize=256)   # pure over a name (a Mode is frozen); plan() reads a few modes ~100k times
def parse(mode: str) -> Mode | None:
    """``"block-4"`` -> Mode("block", 4); None when ``mode`` is no recompute mode."""
    if mode in CLASSIC or mode == "selective-op":
        return Mode(mode)
    if mode == "modules":
        return Mode("modules")
    if mode.startswith("modules:"):
        names = mode.removeprefix("modules:").split("+")
        if not names or any(n not in MODULES for n in names) or len(set(names)) != len(names):
            return None
        return Mode("modules", 0, tuple(sorted(names, key=MODULES.index)))
    for kind in PARTIAL + ("selective-layer",):
        if mode == kind:
            return Mode(kind, 2 if kind == "selective-layer" else 0)
        tail = mode.removeprefix(kind + "-")
        if tail != mode and tail.isdigit() and int(tail) > 0:
            return Mode(kind, int(tail))
    return None


def is_valid(mode: str, *, search: bool = False) -> bool:
    """A mode a candidate can carry (``search``: also the tokens ``block`` / ``uniform`` a list may hold)."""
    m = parse(mode)
    return m is not None and (search or (m.kind not in PARTIAL or m.n > 0) and (m.kind != "modules" or m.modules))


def kind(mode: str) -> str:
    m = parse(mode)
    return m.kind if m else mode
