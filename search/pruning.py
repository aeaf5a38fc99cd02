"""Stop a probe that is clearly behind: the step-time noise of this machine, the best so far, and the verdict.

    >>> ref = reference(ledger.records)             # None before the first measurement
    >>> verdict(ref, [3.1e-2, 3.0e-2], min_steps=2)  # each timed step as TFLOPs/GPU of the full configuration
    'after 2 timed steps its fastest ... behind ...'

A probe reports each timed step as it comes (`probes.steps`); the objective turns a step into the model
TFLOPs per GPU it would mean for the full configuration and asks `verdict` whether to stop. A probe stops
once it has run ``min_steps`` timed steps and even its *fastest* step, lifted by the margin, is below the
reference: the best configuration measured so far as `tune` names it (`search.report.best`: confirmed
ones first, the median of its measurements). The margin is the step-time noise measured on this machine
(`noise`: the largest coefficient of variation of any probe's timed steps, and half the spread of any
configuration measured more than once) times `NOISE_Z`, and never less than `MIN_MARGIN`, the spread
within which `tune` calls two measurements the same (`search.report.CONFIRM_SPREAD`).

Pruning never costs the study its eventual best: a pruned configuration is final only while it stays
clearly behind (`still_behind`): should the reference fall (confirmation re-probes measure the best lower
than its first probe) until a pruned probe's fastest step is within the margin, that configuration is
probed again (`search.objective.Ledger`). Confirmation re-probes are never pruned.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from search.report import CONFIRM_SPREAD, best, summarize

if TYPE_CHECKING:
    from search.objective import TrialRecord

MIN_MARGIN = CONFIRM_SPREAD
"""never prune a probe within this of the best: two measurements this close are the same to `tune`"""
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


def noise(records: list[TrialRecord]) -> float:
    """The step-time noise measured here (relative): the largest coefficient of variation of a probe's timed steps,
    and half the spread of the measurements of any configuration measured more than once."""
    cvs = [float(r.attrs.get("step_cv") or 0.0) for r in records if r.measured]
    by_config: dict[str, list[float]] = {}
    for r in records:
        if r.measured and r.value:
            by_config.setdefault(r.config or "", []).append(float(r.value))
    halves = [(max(v) - min(v)) / statistics.median(v) / 2 for v in by_config.values() if len(v) > 1]
    return max([0.0, *cvs, *halves])


def reference(records: list[TrialRecord]) -> Reference | None:
    """The best so far and the margin, or None before the first measurement (nothing to prune against)."""
    top = best(summarize(records))
    if top is None or not top.median_tflops:
        return None
    n = noise(records)
    return Reference(config=top.config, tflops=float(top.median_tflops), noise=n, margin=max(MIN_MARGIN, NOISE_Z * n))


def verdict(ref: Reference | None, step_tflops: list[float], *, min_steps: int = MIN_STEPS) -> str | None:
    """The reason to stop a probe whose timed steps so far mean ``step_tflops`` (model TFLOPs/GPU of the full
    configuration, one per step), or None to let it run."""
    if ref is None or len(step_tflops) < max(min_steps, 1):
        return None
    fastest = max(step_tflops)
    if fastest * (1 + ref.margin) >= ref.tflops:
        return None
    behind = 1 - fastest / ref.tflops
    return (f"pruned after {len(step_tflops)} timed steps: its fastest step means {fastest:.4g} TFLOPs/GPU, "
            f"{100 * behind:.0f}% behind the best so far ({ref.config}, {ref.tflops:.4g}); the margin is "
            f"{100 * ref.margin:.0f}% (step-time noise here {100 * ref.noise:.1f}%)")


def still_behind(record: TrialRecord, ref: Reference | None) -> bool:
    """A pruned trial's verdict still holds against the current reference (else its configuration is probed
    again): its fastest step, lifted by the current margin, is below the current best."""
    fastest = record.attrs.get("pruned_tflops")
    if ref is None or not fastest:
        return True
    return float(fastest) * (1 + ref.margin) < ref.tflops


__all__ = ["MIN_MARGIN", "MIN_STEPS", "NOISE_Z", "Reference", "noise", "reference", "still_behind", "verdict"]
