"""Refit the planner's cost model to measured step times, over cached term breakdowns (cheap).

    >>> from search.calibration import Measurement, refit
    >>> params = refit(model, cluster, training, [Measurement(candidate=c, step_time_s=28.0)])

A candidate's predicted step time is the planner's list of named terms (`planner.terms.StepTime`, built by
`planner.cost.TERMS`): `Terms` caches it once per candidate; every refit after that is arithmetic over the cache,
never a new `planner.estimate`.

The fit over the cache:

- `refit` -> `planner.CostParams` (compute_scale a, comm_scale b), as `tune` records and emits: t(a, b) is
  `StepTime.step_s`, the very sum the planner makes, with compute terms times a and communication terms times b
  (pipeline bubble and overlaps re-taken at the new scales); memory, host and fixed terms stay. We minimise
  sum_i (log measured_i - log t_i)^2 + RIDGE·((log a)^2 + (log b)^2) by Gauss-Newton in (log a, log b), the
  Jacobian from `StepTime.parts` (t is piecewise linear and homogeneous in (a, b) on each side of an overlap's
  max(), so a·dt/da and b·dt/db are its compute and communication parts); the ridge keeps a scale no
  measurement informs at 1. At (1, 1) it equals `planner.estimate` for every term (tests/test_terms.py).
- `residual_sigma`: the measured spread around that refit, what `--sampler ei` takes as every prediction's
  error (a per-term model with a per-candidate posterior, measured on tests/bench/bench_search.py, needed
  more probes and was dropped).

Pure Python, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import Candidate, ClusterSpec, CostParams, ModelSpec, TrainingSpec, estimate
from planner.constants import SIGMA_PRIOR
from planner.cost import TimeBreakdown
from planner.terms import StepTime
from planner.topology import Topology

RIDGE = 1e-2
"""refit(): weight of the prior log(scale) = 0 against one measurement's squared log error"""
ITERATIONS = 8
SCALE_RANGE = (0.02, 50.0)
"""scales are clamped to this range (a probe 50x off the model is a broken probe, not a calibration)"""

SIGMA_PRIOR_WEIGHT = 2.0
"""how many measurements the prior spread counts as"""


@dataclass(frozen=True, slots=True)
class Terms:
    """A candidate's predicted step time as the planner's own terms (`planner.terms.StepTime`): the refit scales
    exactly what the planner sums, term by term (`planner.terms.scale_of`: compute terms by compute_scale,
    communication terms by comm_scale, the rest as they are; overlaps re-taken at the new scales)."""

    step: StepTime

    @classmethod
    def of(cls, time: TimeBreakdown) -> "Terms":
        if time.terms is None:
            raise ValueError("a TimeBreakdown without its terms (planner.cost.estimate_time builds them)")
        return cls(time.terms)

    @property
    def total(self) -> float:
        return self.step.step_s(CostParams())

    def step_s(self, params: CostParams) -> float:
        """Step time under CostParams (a, b), from the cache: `StepTime.step_s`, the planner's own sum."""
        return self.step.step_s(params)

    def parts(self) -> tuple[float, float, float, float]:
        """(compute + rest, tp, bubble + p2p, dp) at CostParams(): the breakdown's lines grouped."""
        per_mb, bubble, per_step = self.step.groups(CostParams())
        tp = per_mb.get("tp_comm_s", 0.0)
        pp = per_mb.get("pp_p2p_s", 0.0) + bubble
        dp = per_step.get("dp_comm_s", 0.0)
        return (self.total - tp - pp - dp, tp, pp, dp)


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
        res, jac = [], []
        for t, measured in data:
            ca, cb, rest = t.step.parts(_params(theta))   # d t / d log a, d t / d log b, the unscaled rest
            pred = ca + cb + rest
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
