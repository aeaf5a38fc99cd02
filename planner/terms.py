"""The step time as a list of named terms: what `plan` sums, `--explain` and the JSON show, and `tune` refits.

A term is one small pure function ``seconds(ctx) -> float`` over the candidate's `planner.step_context.StepContext`
(built once per candidate), declared as a `Term`:

- ``kind``: compute | communication | memory | host | fixed. `tune`'s refit (`planner.CostParams`) scales compute
  terms by ``compute_scale`` and communication terms by ``comm_scale``; memory-bound (the optimizer step), host and
  fixed terms are left as they are.
- ``group``: the line of the breakdown (`planner.cost.TimeBreakdown` field) it adds to.
- ``per_microbatch``: the seconds are one pipeline slot's (one micro-batch on the busiest stage); the 1F1B
  schedule runs gas + (pp - 1) / vpp such slots, the extra ones being the bubble. Otherwise seconds per step.
- ``overlap(ctx) -> Overlap | None``: how much of it hides under another term (``hides_under`` says what, in
  words; ``flag`` names the framework setting that turns the overlap on). Exposed = max(raw · exposed_min,
  raw - window · hider's per-micro-batch seconds).
- ``source``: one-line citation; ``constants``: the `planner.constants` names it reads (the one fitted table).

To add a term: write its ``seconds`` function beside the physics it models (planner/cost.py, or the feature's own
module: context_parallel.py, moe.py), declare a `Term`, and append it to `planner.cost.TERMS` (the order is the
order of summation inside a group). `evaluate` turns the declarations into a `StepTime` of `TermTime` values, which
everything downstream reads: `StepTime.step_s(params)` is the planner's step time and the refit's prediction alike
(one function), `StepTime.parts` its compute / communication / unscaled split for the refit's Jacobian.

No planner imports: pure arithmetic over the terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple

COMPUTE, COMMUNICATION, MEMORY, HOST, FIXED = "compute", "communication", "memory", "host", "fixed"
KINDS = (COMPUTE, COMMUNICATION, MEMORY, HOST, FIXED)


class Overlap(NamedTuple):
    """How a term hides under another on one candidate."""

    under: str
    """the name of the term it runs beside"""
    window: float
    """how much of that term it can hide under, in multiples of its (scaled) per-micro-batch seconds"""
    exposed_min: float = 0.0
    """share of the term that stays exposed however long the window (the last bucket, the first gather)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """A term's declaration (module level, one per kind of work)."""

    name: str
    kind: str
    group: str
    per_microbatch: bool
    seconds: Callable[[Any], float]
    source: str
    constants: tuple[str, ...] = ()
    overlap: Callable[[Any], Overlap | None] | None = None
    hides_under: str = ""
    flag: str = ""
    head: tuple = field(init=False, repr=False, compare=False)
    """(name, kind, group, per_microbatch): the first fields of each `TermTime` it gives, built once"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", (self.name, self.kind, self.group, self.per_microbatch))


class TermTime(NamedTuple):
    """One term of one candidate: what `tune` caches and refits (a named tuple: plan() makes ten per candidate)."""

    name: str
    kind: str
    group: str
    per_microbatch: bool
    seconds: float
    """raw (unscaled, nothing hidden): per pipeline slot if ``per_microbatch``, else per step"""
    overlap: Overlap | None = None


def scale_of(kind: str, params: Any) -> float:
    """The `CostParams` factor a term of ``kind`` is scaled by."""
    if kind == COMPUTE:
        return params.compute_scale
    if kind == COMMUNICATION:
        return params.comm_scale
    return 1.0


class Exposed(NamedTuple):
    """A term under given CostParams: exposed seconds per unit (slot or step) and how they split by scale."""

    term: TermTime
    seconds: float
    own: float
    """coefficient of the term's own scaled raw seconds in ``seconds``"""
    hider: float
    """coefficient (subtracted) of the hider's scaled per-micro-batch seconds"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Every term of one candidate and the pipeline schedule they run in."""

    terms: tuple[TermTime, ...]
    microbatches: int
    """gas: slots per step outside the bubble"""
    bubble_slots: float
    """(pp - 1) / vpp: the 1F1B bubble, in slots"""

    def by_name(self, name: str) -> TermTime | None:
        return next((t for t in self.terms if t.name == name), None)

    def exposed(self, params: Any) -> list[Exposed]:
        """Each term's exposed seconds per unit (per slot or per step) under ``params``."""
        scale = {COMPUTE: params.compute_scale, COMMUNICATION: params.comm_scale}
        raw = [t.seconds * scale.get(t.kind, 1.0) for t in self.terms]
        out = []
        for t, mine in zip(self.terms, raw):
            o = t.overlap
            if o is None:
                out.append(Exposed(t, mine, 1.0, 0.0))
                continue
            under = next(r for u, r in zip(self.terms, raw) if u.name == o.under)
            floor, beside = mine * o.exposed_min, mine - o.window * under
            out.append(Exposed(t, beside, 1.0, o.window) if beside > floor else Exposed(t, floor, o.exposed_min, 0.0))
        return out

    def groups(self, params: Any) -> tuple[dict[str, float], float, dict[str, float]]:
        """(per-micro-batch groups' seconds per step, bubble seconds, per-step groups' seconds): the breakdown lines."""
        slot_groups: dict[str, float] = {}
        step_groups: dict[str, float] = {}
        a, b = params.compute_scale, params.comm_scale
        raw = [t.seconds * (a if t.kind == COMPUTE else b if t.kind == COMMUNICATION else 1.0) for t in self.terms]
        for t, seconds in zip(self.terms, raw):   # `exposed`, inline: plan() sums ten terms per candidate
            o = t.overlap
            if o is not None:
                under = raw[next(i for i, u in enumerate(self.terms) if u.name == o.under)]
                seconds = max(seconds * o.exposed_min, seconds - o.window * under)
            where = slot_groups if t.per_microbatch else step_groups
            g = t.group
            where[g] = where[g] + seconds if g in where else seconds
        slot = 0.0
        for i, v in enumerate(slot_groups.values()):
            slot = v if i == 0 else slot + v
        per_step = {g: self.microbatches * v for g, v in slot_groups.items()}
        return per_step, self.bubble_slots * slot, step_groups

    def step_s(self, params: Any) -> float:
        """The step time under ``params``: the planner's (at CostParams()) and the refit's prediction."""
        return self.total(*self.groups(params))

    @staticmethod
    def total(per_mb: dict[str, float], bubble: float, per_step: dict[str, float]) -> float:
        """`step_s` from `groups`' lines (in their order: the planner's sum, bit for bit)."""
        total = 0.0
        for v in per_mb.values():
            total += v
        total += bubble
        for v in per_step.values():
            total += v
        return total

    def parts(self, params: Any) -> tuple[float, float, float]:
        """(seconds that scale with compute_scale, with comm_scale, with neither) of `step_s` under ``params``:
        each term's exposed seconds attributed to its own kind's scale and, for the part a hider takes off, to
        the hider's (so d step / d log a and d log b are the first two, exactly, on either side of an overlap)."""
        by_name = {t.name: t for t in self.terms}
        acc = {COMPUTE: 0.0, COMMUNICATION: 0.0, None: 0.0}
        for e in self.exposed(params):
            t = e.term
            units = self.microbatches + self.bubble_slots if t.per_microbatch else 1.0
            own_kind = t.kind if t.kind in (COMPUTE, COMMUNICATION) else None
            acc[own_kind] += units * e.own * t.seconds * scale_of(t.kind, params)
            if e.hider:
                h = by_name[t.overlap.under]
                h_kind = h.kind if h.kind in (COMPUTE, COMMUNICATION) else None
                acc[h_kind] -= units * e.hider * h.seconds * scale_of(h.kind, params)
        return acc[COMPUTE], acc[COMMUNICATION], acc[None]

    def step_seconds_by_term(self, params: Any) -> dict[str, tuple[float, float]]:
        """term -> (exposed seconds on the step outside the bubble, hidden seconds): what `--explain` lists."""
        out = {}
        for e in self.exposed(params):
            t = e.term
            n = self.microbatches if t.per_microbatch else 1
            out[t.name] = (n * e.seconds, n * (t.seconds * scale_of(t.kind, params) - e.seconds))
        return out

    def scaled(self, names: tuple[str, ...], factor: float) -> "StepTime":
        """The same step with the named terms' raw seconds times ``factor`` (benchmarks of a mis-scaled model)."""
        return replace(self, terms=tuple(t._replace(seconds=t.seconds * factor) if t.name in names else t
                                         for t in self.terms))


def evaluate(terms: tuple[Term, ...], ctx: Any, *, microbatches: int, bubble_slots: float) -> StepTime:
    make = TermTime._make   # plan() evaluates a dozen terms per candidate: the tuple from the declaration's head
    return StepTime(terms=tuple([make((*t.head, t.seconds(ctx), t.overlap(ctx) if t.overlap else None))
                                 for t in terms]),
                    microbatches=microbatches, bubble_slots=bubble_slots)


__all__ = ["COMMUNICATION", "COMPUTE", "FIXED", "HOST", "KINDS", "MEMORY", "Exposed", "Overlap", "StepTime", "Term",
           "TermTime", "evaluate", "scale_of"]
