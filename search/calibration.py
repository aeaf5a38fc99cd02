"""Refit the planner's cost model to measured step times, over cached term breakdowns (cheap).

    >>> from search.calibration import Measurement, refit
    >>> params = refit(model, cluster, training, [Measurement(candidate=c, step_time_s=28.0)])

A candidate's predicted step time is a sum of terms the planner already computed
(`planner.cost.TimeBreakdown`): compute, TP all-reduces, PP bubble and p2p, exposed DP
communication, and the rest (optimizer step, anything newer). `Terms` caches them once per
candidate; every refit after that is arithmetic over the cache, never a new `planner.estimate`.

The fit over the cache:

- `refit` -> `planner.CostParams` (compute_scale a, comm_scale b), as `tune` records and emits:
  t(a, b) = a·compute + b·(tp + p2p + dp) + bubble·(a·f + b·(1 - f)) + rest, where f is the
  compute share of a pipeline slot (the bubble is (p-1)/v slots of compute + TP + p2p). We minimise
  sum_i (log measured_i - log t_i)^2 + RIDGE·((log a)^2 + (log b)^2) by Gauss-Newton in (log a, log b);
  the ridge keeps a scale no measurement informs at 1. Exact for `planner.cost` except the
  overlap max() of sharded DP communication, which the cache freezes at the unscaled value.
- `residual_sigma`: the measured spread around that refit, what `--sampler ei` takes as every prediction's
  error (a per-term model with a per-candidate posterior, measured on tests/bench/bench_search.py, needed
  more probes and was dropped).

Pure Python, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import Candidate, ClusterSpec, CostParams, ModelSpec, TrainingSpec, estimate
from planner.cost import TimeBreakdown
from planner.topology import Topology

RIDGE = 1e-2
"""refit(): weight of the prior log(scale) = 0 against one measurement's squared log error"""
ITERATIONS = 8
SCALE_RANGE = (0.02, 50.0)
"""scales are clamped to this range (a probe 50x off the model is a broken probe, not a calibration)"""

SIGMA_PRIOR = 0.07
"""prior residual spread (log) of the plan's step time on one configuration, before probes say otherwise:
FITTED as the median, over the 17 replay tables of tests/bench/bench_search.py (seed 003, tr11, Hagemann),
of each table's spread of log(measured / planned) after its own global scale (column "resid sd"; 0.02-0.18).
`--sampler ei` gives every candidate the same spread (`residual_sigma`), so its choice does not depend on this value"""
SIGMA_PRIOR_WEIGHT = 2.0
"""how many measurements the prior spread counts as"""


@dataclass(frozen=True, slots=True)
class Terms:
    """A candidate's predicted step time split into the parts the fits scale (seconds)."""

    compute: float
    tp: float
    p2p: float
    bubble: float
    dp: float
    rest: float
    bubble_compute_share: float
    """share of a pipeline slot that is compute (the rest of the slot is TP and p2p communication)"""

    @classmethod
    def of(cls, time: TimeBreakdown) -> "Terms":
        # the framework's fixed per-micro-batch cost (in p2p and in the bubble's slots) is neither compute nor
        # comm: the planner leaves it unscaled by CostParams, so it goes to `rest` here too
        compute, tp = time.compute_s, time.tp_comm_s
        p2p, bubble = time.pp_p2p_s - time.pp_overhead_s, time.pp_bubble_s - time.bubble_overhead_s
        dp = time.dp_comm_s
        rest = max(time.step_time_s - (compute + tp + p2p + bubble + dp), 0.0)
        slot = compute + tp + p2p
        return cls(compute=compute, tp=tp, p2p=p2p, bubble=bubble, dp=dp, rest=rest,
                   bubble_compute_share=compute / slot if slot > 0 else 1.0)

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.p2p + self.bubble + self.dp + self.rest

    def step_s(self, params: CostParams) -> float:
        """Step time under CostParams (a, b), from the cache."""
        a, b = params.compute_scale, params.comm_scale
        f = self.bubble_compute_share
        return (a * self.compute + b * (self.tp + self.p2p + self.dp)
                + self.bubble * (a * f + b * (1 - f)) + self.rest)

    def parts(self) -> tuple[float, float, float, float]:
        """(compute + rest, tp, bubble + p2p, dp)."""
        return (self.compute + self.rest, self.tp, self.bubble + self.p2p, self.dp)


def terms_of(time: TimeBreakdown) -> Terms:
    return Terms.of(time)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    candidate: Candidate
    step_time_s: float
    """measured seconds per optimizer step of the full configuration"""


def predicted_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, candidate: Candidate,
                     params: CostParams, *, topology: Topology | None = None) -> float:
    est = estimate(model, cluster, training, candidate, params=params, topology=topology)
    if est.time is None:
        raise ValueError(f"the planner cannot time {candidate.label()}")
    return est.time.step_time_s


def measured_terms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                   measurements: list[Measurement]) -> list[tuple[Terms, float]]:
    """(terms, measured step) for each usable measurement: one planner estimate each, one topology."""
    usable = [m for m in measurements if m.step_time_s and m.step_time_s > 0 and math.isfinite(m.step_time_s)]
    if not usable:
        return []
    topology = Topology(cluster)
    out = []
    for m in usable:
        est = estimate(model, cluster, training, m.candidate, topology=topology)
        if est.time is None:
            raise ValueError(f"the planner cannot time {m.candidate.label()}")
        out.append((Terms.of(est.time), m.step_time_s))
    return out


def _params(theta: tuple[float, float]) -> CostParams:
    return CostParams(compute_scale=math.exp(theta[0]), comm_scale=math.exp(theta[1]))


def refit_terms(data: list[tuple[Terms, float]], *, ridge: float = RIDGE) -> CostParams:
    """`refit` over cached terms: the (log a, log b) Gauss-Newton with the analytic Jacobian."""
    if not data:
        return CostParams()
    lo, hi = (math.log(x) for x in SCALE_RANGE)
    theta = (0.0, 0.0)
    for _ in range(ITERATIONS):
        a, b = math.exp(theta[0]), math.exp(theta[1])
        res, jac = [], []
        for t, measured in data:
            f = t.bubble_compute_share
            ca = a * (t.compute + t.bubble * f)                  # d t / d log a
            cb = b * (t.tp + t.p2p + t.dp + t.bubble * (1 - f))  # d t / d log b
            pred = ca + cb + t.rest
            res.append(math.log(measured) - math.log(pred))
            jac.append((ca / pred, cb / pred))
        a11 = sum(j[0] * j[0] for j in jac) + ridge
        a12 = sum(j[0] * j[1] for j in jac)
        a22 = sum(j[1] * j[1] for j in jac) + ridge
        g1 = sum(j[0] * r for j, r in zip(jac, res)) - ridge * theta[0]
        g2 = sum(j[1] * r for j, r in zip(jac, res)) - ridge * theta[1]
        det = a11 * a22 - a12 * a12
        if det <= 0:
            break
        d1, d2 = (a22 * g1 - a12 * g2) / det, (a11 * g2 - a12 * g1) / det
        theta = (min(max(theta[0] + d1, lo), hi), min(max(theta[1] + d2, lo), hi))
        if abs(d1) < 1e-7 and abs(d2) < 1e-7:
            break
    return _params(theta)


def refit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
          *, ridge: float = RIDGE) -> CostParams:
    """CostParams that best explain the measured step times (CostParams() when there are none)."""
    return refit_terms(measured_terms(model, cluster, training, measurements), ridge=ridge)


def rms_log_error(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
                  params: CostParams) -> float:
    """Root-mean-square of log(measured / predicted): 0.1 is about 10% off."""
    data = measured_terms(model, cluster, training, measurements)
    if not data:
        return 0.0
    errs = [math.log(step / t.step_s(params)) for t, step in data]
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def residual_sigma(data: list[tuple[Terms, float]], params: CostParams) -> float:
    """Spread (log) of measured vs predicted under ``params``, shrunk toward `SIGMA_PRIOR` (worth
    `SIGMA_PRIOR_WEIGHT` measurements): what one configuration's refitted prediction may be off by."""
    res2 = sum(math.log(step / t.step_s(params)) ** 2 for t, step in data)
    return math.sqrt((SIGMA_PRIOR_WEIGHT * SIGMA_PRIOR ** 2 + res2) / (SIGMA_PRIOR_WEIGHT + len(data)))


def expected_improvement(mean: float, sd: float, best: float) -> float:
    """E[max(best - Y, 0)] for Y ~ N(mean, sd^2): the expected gain in log step time over ``best``
    (minimisation; Jones, Schonlau & Welch 1998, Eq. 15)."""
    if sd <= 0:
        return max(best - mean, 0.0)
    z = (best - mean) / sd
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return (best - mean) * cdf + sd * pdf


__all__ = ["Measurement", "Terms", "expected_improvement", "measured_terms",
           "predicted_step_s", "refit", "refit_terms", "residual_sigma", "rms_log_error", "terms_of"]
