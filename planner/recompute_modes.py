"""Activation recompute modes as names: which exist, how a name parses (``block-4`` -> Mode("block", 4)), which each
framework runs. A ground-floor module (specs read it); what each mode re-runs is `planner.recompute`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

CLASSIC = ("none", "selective", "full")
"""the modes every target has (tune's search space orders these by memory)"""
PARTIAL = ("block", "uniform")
"""Megatron's --recompute-method, N set per candidate (``block-N``, ``uniform-N``)"""
TORCHTITAN = ("selective-op", "selective-layer")
OPTIONS = CLASSIC + PARTIAL + TORCHTITAN
"""what ``--recompute`` accepts (``block-N``, ``uniform-N``, ``selective-layer-N`` too)"""
PLAN_DEFAULT = CLASSIC + ("block",)
"""`plan`'s default list: the classic modes and Megatron's block recompute at the smallest N that fits"""
FRAMEWORK_MODES = {"megatron-lm": CLASSIC + PARTIAL, "megatron-deepspeed": CLASSIC,
                   "fsdp": ("none", "full") + TORCHTITAN}
"""which modes each framework can run (torchtitan has no Megatron-style attention-core recompute: plantune's
``selective`` on FSDP is emitted as op-level SAC, the closest it has; kept for the classic tables)"""


@dataclass(frozen=True, slots=True)
class Mode:
    kind: str
    """none | selective | full | block | uniform | selective-op | selective-layer"""
    n: int = 0
    """N of block-N / uniform-N / selective-layer-N; 0 for a search token (block, uniform) or a mode without N"""


@functools.lru_cache(maxsize=256)   # pure over a name (a Mode is frozen); plan() reads a few modes ~100k times
def parse(mode: str) -> Mode | None:
    """``"block-4"`` -> Mode("block", 4); None when ``mode`` is no recompute mode."""
    if mode in CLASSIC or mode == "selective-op":
        return Mode(mode)
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
    return m is not None and (search or m.kind not in PARTIAL or m.n > 0)


def kind(mode: str) -> str:
    m = parse(mode)
    return m.kind if m else mode
