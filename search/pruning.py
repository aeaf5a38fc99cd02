"""Stop a probe that is clearly behind: the step-time noise of this machine, the best so far, and the verdict.

    >>> ref = reference(ledger.records)             # None before the first measurement
    >>> verdict(ref, [3.1e-2, 3.0e-2], min_steps=2)  # each timed step as TFLOPs/GPU of the full configuration
    'after 2 timed steps its fastest ... behind ...'

A probe reports each timed step as it comes (`probes.steps`); the objective turns a step into the model
TFLOPs per GPU it would mean for the full configuration and asks `verdict` whether to stop. A probe stops
once it has run ``min_steps`` timed steps and even its *fastest* step, lifted by the margin, is below the
reference -- or, after its first timed step already, when that step is behind by more than the largest
step-to-step spread measured here (`Reference.spread`: no step of any probe strayed that far from its
probe's median, so one step that far behind is not a hiccup). The reference is the best configuration measured so far as `tune` names it (`search.report.best`: confirmed
ones first, the median of its measurements). The margin is the step-time noise measured on this machine
(`noise`: the median coefficient of variation of the probes' timed steps, or half the median spread of the
configurations measured more than once when that is larger: the drift between probes) times `NOISE_Z`, and
never less than `MIN_MARGIN`, the ±5% within which `tune` calls repeated measurements confirmed
(`search.report.CONFIRM_SPREAD`). The fastest step is an optimistic estimate of a probe's steady step (a
step is slowed by interference, rarely sped up), so the rule errs towards letting a probe run.

Pruning never costs the study its eventual best: a pruned configuration is final only while it stays
clearly behind (`still_behind`): should the reference fall (confirmation re-probes measure the best lower
than its first probe) until a pruned probe's fastest step is within the margin it was pruned with, that
configuration is probed again (`search.objective.Ledger`). The reference configuration's own
confirmation re-probes are never pruned; another configuration's are, when clearly behind it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from search.report import CONFIRM_SPREAD, best, summarize

if TYPE_CHECKING:
    from search.objective import TrialRecord

MIN_MARGIN = CONFIRM_SPREAD / 2
"""never prune a probe within this of the best: measurements within ±5% of each other confirm one another"""
NOISE_Z = 3.0
"""the margin in units of the measured noise (a normal step lies within 3 sigma of its mean 99.7% of the time)"""
MIN_STEPS = 2
"""timed steps a probe runs before it may be pruned (one step can be an outlier)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    """What a running probe is compared with."""

    config: str
    tflops: float
    """the best configuration's median measured model TFLOPs per GPU"""
    noise: float
    """the step-time noise measured on this machine (relative)"""
    margin: float
    """max(MIN_MARGIN, NOISE_Z x noise)"""
    spread: float = 0.0
    """the largest (max - min) / median of one probe's timed steps measured here: a single step's margin"""

    def margin_after(self, steps: int) -> float:
        """The margin a probe must be behind by after ``steps`` timed steps (one step: also the largest spread)."""
        return self.margin if steps >= 2 else max(self.margin, self.spread)


def noise(records: list[TrialRecord]) -> float:
    """The step-time noise measured here (relative): the median coefficient of variation of the probes' timed steps,
    or half the median spread of the configurations measured more than once (between probes), the larger."""
    cvs = [float(r.attrs.get("step_cv") or 0.0) for r in records if r.measured]
    by_config: dict[str, list[float]] = {}
    for r in records:
        if r.measured and r.value:
            by_config.setdefault(r.config or "", []).append(float(r.value))
    halves = [(max(v) - min(v)) / statistics.median(v) / 2 for v in by_config.values() if len(v) > 1]
    return max(statistics.median(cvs) if cvs else 0.0, statistics.median(halves) if halves else 0.0)


def reference(records: list[TrialRecord]) -> Reference | None:
    """The best so far and the margin, or None before the first measurement (nothing to prune against)."""
    top = best(summarize(records))
    if top is None or not top.median_tflops:
        return None
    n = noise(records)
    spread = max([0.0, *(float(r.attrs.get("step_spread") or 0.0) for r in records if r.measured)])
    return Reference(config=top.config, tflops=float(top.median_tflops), noise=n, margin=max(MIN_MARGIN, NOISE_Z * n),
                     spread=spread)


def verdict(ref: Reference | None, step_tflops: list[float], *, min_steps: int = MIN_STEPS) -> str | None:
    """The reason to stop a probe whose timed steps so far mean ``step_tflops`` (model TFLOPs/GPU of the full
    configuration, one per step), or None to let it run."""
    n = len(step_tflops)
    if ref is None or not n:
        return None
    fastest = max(step_tflops)
    margin = ref.margin_after(n)
    if (n < max(min_steps, 1) and margin <= ref.margin) or fastest * (1 + margin) >= ref.tflops:
        return None
    behind = 1 - fastest / ref.tflops
    why = (f"step-time noise here {100 * ref.noise:.1f}%" if margin <= ref.margin else
           f"one step: the largest step spread measured here, {100 * ref.spread:.0f}%")
    return (f"pruned after {n} timed step{'s' if n > 1 else ''}: its fastest step means {fastest:.4g} TFLOPs/GPU, "
            f"{100 * behind:.0f}% behind the best so far ({ref.config}, {ref.tflops:.4g}); the margin is "
            f"{100 * margin:.0f}% ({why})")


def behind(ref: Reference | None, config: str, tflops: float) -> bool:
    """A configuration measured at ``tflops`` (a whole probe) is clearly behind the best: another one, and more than
    the margin slower. Its confirmation re-probes are not worth running (`search.study.confirmation_slots`)."""
    return ref is not None and config != ref.config and tflops * (1 + ref.margin) < ref.tflops


def still_behind(record: TrialRecord, ref: Reference | None) -> bool:
    """A pruned trial's verdict still holds against the current reference (else its configuration is probed
    again): its fastest step, lifted by the margin it was pruned with, is below the current best. (The margin is
    the one of its verdict: a noise estimate that grows as probes come does not reopen a verdict; a best that falls
    does.)"""
    fastest = record.attrs.get("pruned_tflops")
    if ref is None or not fastest:
        return True
    margin = record.attrs.get("pruned_margin")
    if margin is None:
        margin = ref.margin_after(int(record.attrs.get("pruned_steps") or 1))
    return float(fastest) * (1 + float(margin)) < ref.tflops


__all__ = ["MIN_MARGIN", "MIN_STEPS", "NOISE_Z", "Reference", "behind", "noise", "reference", "still_behind",
           "verdict"]
