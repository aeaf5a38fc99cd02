"""Refit the planner's cost model (`planner.CostParams`) to measured step times.

    >>> from search.calibration import Measurement, refit
    >>> params = refit(model, cluster, training, [Measurement(candidate=c, step_time_s=28.0)])

Model: predicted step time t(a, b) with a = compute_scale, b = comm_scale. We minimise

    sum_i (log measured_i - log t_i(a, b))^2 + RIDGE * (log a)^2 + RIDGE * (log b)^2

by Gauss-Newton in (log a, log b). The Jacobian row of a measurement is its step time's
sensitivity to each scale, d log t / d log a and d log t / d log b: the share of the step that is
compute (pipeline bubble included, since it scales with stage compute) and the share that is
exposed communication (TP all-reduces, p2p, DP), read from the planner by finite differences so
that overlap and max() terms are respected. The ridge term keeps a scale that no measurement
informs (e.g. comm_scale when every probe is compute-bound) at 1. Pure Python, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner import Candidate, ClusterSpec, CostParams, ModelSpec, TrainingSpec, estimate

RIDGE = 1e-2
"""weight of the prior log(scale) = 0 against one measurement's squared log error"""
ITERATIONS = 8
STEP_H = 1e-3
"""finite-difference step in log(scale)"""
SCALE_RANGE = (0.02, 50.0)
"""scales are clamped to this range (a probe 50x off the model is a broken probe, not a calibration)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    candidate: Candidate
    step_time_s: float
    """measured seconds per optimizer step of the full configuration"""


def predicted_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, candidate: Candidate,
                     params: CostParams) -> float:
    est = estimate(model, cluster, training, candidate, params=params)
    if est.time is None:
        raise ValueError(f"the planner cannot time {candidate.label()}")
    return est.time.step_time_s


def _params(theta: tuple[float, float]) -> CostParams:
    return CostParams(compute_scale=math.exp(theta[0]), comm_scale=math.exp(theta[1]))


def residuals_and_jacobian(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                           measurements: list[Measurement], theta: tuple[float, float]
                           ) -> tuple[list[float], list[tuple[float, float]]]:
    """r_i = log(measured / predicted) and J_i = (d log t / d log a, d log t / d log b) at ``theta``."""
    res, jac = [], []
    for m in measurements:
        base = math.log(predicted_step_s(model, cluster, training, m.candidate, _params(theta)))
        da = math.log(predicted_step_s(model, cluster, training, m.candidate,
                                       _params((theta[0] + STEP_H, theta[1])))) - base
        db = math.log(predicted_step_s(model, cluster, training, m.candidate,
                                       _params((theta[0], theta[1] + STEP_H)))) - base
        res.append(math.log(m.step_time_s) - base)
        jac.append((da / STEP_H, db / STEP_H))
    return res, jac


def refit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
          *, ridge: float = RIDGE) -> CostParams:
    """CostParams that best explain the measured step times (CostParams() when there are none)."""
    usable = [m for m in measurements if m.step_time_s and m.step_time_s > 0 and math.isfinite(m.step_time_s)]
    if not usable:
        return CostParams()
    lo, hi = (math.log(x) for x in SCALE_RANGE)
    theta = (0.0, 0.0)
    for _ in range(ITERATIONS):
        res, jac = residuals_and_jacobian(model, cluster, training, usable, theta)
        # normal equations of the ridge-regularised linearised problem, solved for the step (2x2)
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
        if abs(d1) < 1e-6 and abs(d2) < 1e-6:
            break
    return _params(theta)


def rms_log_error(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
                  params: CostParams) -> float:
    """Root-mean-square of log(measured / predicted): 0.1 is about 10% off."""
    if not measurements:
        return 0.0
    errs = [math.log(m.step_time_s / predicted_step_s(model, cluster, training, m.candidate, params))
            for m in measurements]
    return math.sqrt(sum(e * e for e in errs) / len(errs))


__all__ = ["Measurement", "predicted_step_s", "refit", "rms_log_error"]
