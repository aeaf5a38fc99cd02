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
- per op class (`class_scales`): a probe run with a profiled step carries its compute seconds by op class (GEMM,
  attention, element-wise; probes.train.op_class); `probe_class_seconds` is the planner's figure for the same step
  (planner.cost.class_seconds: the op list's class seconds x the probe's layers on rank 0 x micro-batches, the LM
  head on a one-stage probe). Each class's scale is sum(measured) / sum(predicted) over the probes, so the class
  that was off is corrected, not every class alike; `planner.CostParams.class_scales` carries them and the
  planner scales a candidate's compute by its classes' share-weighted mean (planner.cost.class_params; `Terms`
  keeps each candidate's class seconds for that). compute_scale and comm_scale are then refitted on top.
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
from planner.cost import OP_CLASSES, TimeBreakdown, class_mix, class_seconds
from planner.memory import layers_per_stage
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
    classes: tuple[tuple[str, float], ...] = ()
    """the compute term's seconds by op class (planner.cost.class_seconds), for CostParams.class_scales"""

    @classmethod
    def of(cls, time: TimeBreakdown, classes: dict[str, float] | None = None) -> "Terms":
        if time.terms is None:
            raise ValueError("a TimeBreakdown without its terms (planner.cost.estimate_time builds them)")
        return cls(time.terms, tuple((classes or {}).items()))

    @property
    def total(self) -> float:
        return self.step.step_s(CostParams())

    def params_for(self, params: CostParams) -> CostParams:
        """``params`` with its class scales folded into the compute scale for this candidate (the planner's
        planner.cost.class_params, from the cached class seconds)."""
        if not params.class_scales:
            return params
        return CostParams(compute_scale=params.compute_scale * class_mix(dict(self.classes), params.class_scales),
                          comm_scale=params.comm_scale)

    def step_s(self, params: CostParams) -> float:
        """Step time under CostParams (a, b, class scales), from the cache: `StepTime.step_s`, the planner's own
        sum."""
        return self.step.step_s(self.params_for(params))

    def parts(self) -> tuple[float, float, float, float]:
        """(compute + rest, tp, bubble + p2p, dp) at CostParams(): the breakdown's lines grouped."""
        per_mb, bubble, per_step = self.step.groups(CostParams())
        tp = per_mb.get("tp_comm_s", 0.0)
        pp = per_mb.get("pp_p2p_s", 0.0) + bubble
        dp = per_step.get("dp_comm_s", 0.0)
        return (self.total - tp - pp - dp, tp, pp, dp)


def terms_of(time: TimeBreakdown) -> Terms:
    return Terms.of(time)


def candidate_classes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, candidate: Candidate,
                      memo: dict | None = None) -> dict[str, float]:
    """The compute term's seconds by op class for ``candidate`` (a stage's ceil(L/PP) layers and the LM head, one
    micro-batch, as planner.cost.class_params takes them): what `Terms` keeps so that class scales apply from the
    cache."""
    return class_seconds(model, candidate, cluster, training, layers=layers_per_stage(model, candidate.pp),
                         head=True, layer_memo=memo)


def probe_class_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, candidate: Candidate,
                        layers_run: int | None = None) -> dict[str, float]:
    """The planner's seconds by op class of a probe's profiled step on rank 0: the first pipeline stage's share of
    the ``layers_run`` layers (default all), every micro-batch, and the LM head when the probe has one stage."""
    layers = (layers_run or model.layers) / candidate.pp
    one = class_seconds(model, candidate, cluster, training, layers=layers, head=candidate.pp == 1)
    return {c: candidate.gas * v for c, v in one.items()}


def class_scales(pairs: list[tuple[dict, dict]]) -> tuple[tuple[str, float], ...]:
    """(class, sum measured / sum predicted) over probes' (predicted, measured) seconds by class, for each op class
    (planner.cost.OP_CLASSES) both sides have; clamped to SCALE_RANGE. Classes no probe times stay at 1."""
    out = []
    for c in OP_CLASSES:
        pred = sum(float(p.get(c) or 0.0) for p, m in pairs if (p.get(c) or 0) > 0 and (m.get(c) or 0) > 0)
        meas = sum(float(m.get(c) or 0.0) for p, m in pairs if (p.get(c) or 0) > 0 and (m.get(c) or 0) > 0)
        if pred > 0 and meas > 0:
            out.append((c, min(max(meas / pred, SCALE_RANGE[0]), SCALE_RANGE[1])))
    return tuple(out)


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
                   measurements: list[Measurement], *, classes: bool = False) -> list[tuple[Terms, float]]:
    """(terms, measured step) for each usable measurement: one planner estimate each, one topology; ``classes``:
    with each candidate's compute seconds by op class (`candidate_classes`)."""
    usable = [m for m in measurements if m.step_time_s and m.step_time_s > 0 and math.isfinite(m.step_time_s)]
    if not usable:
        return []
    topology = Topology(cluster)
    out, memo = [], {}
    for m in usable:
        est = estimate(model, cluster, training, m.candidate, topology=topology)
        if est.time is None:
            raise ValueError(f"the planner cannot time {m.candidate.label()}")
        by_class = candidate_classes(model, cluster, training, m.candidate, memo) if classes else None
        out.append((Terms.of(est.time, by_class), m.step_time_s))
    return out


def params_dict(params: CostParams) -> dict:
    """CostParams as tune records them (trial and study attributes, JSON): the class scales only when fitted."""
    d: dict = {"compute_scale": params.compute_scale, "comm_scale": params.comm_scale}
    if params.class_scales:
        d["class_scales"] = dict(params.class_scales)
    return d


def params_from(d: dict | None) -> CostParams:
    """`params_dict`'s inverse (missing names: 1)."""
    d = d or {}
    return CostParams(compute_scale=float(d.get("compute_scale", 1.0)), comm_scale=float(d.get("comm_scale", 1.0)),
                      class_scales=tuple((str(c), float(v)) for c, v in (d.get("class_scales") or {}).items()))


def _params(theta: tuple[float, float], class_scales: tuple = ()) -> CostParams:
    return CostParams(compute_scale=math.exp(theta[0]), comm_scale=math.exp(theta[1]), class_scales=class_scales)


def refit_terms(data: list[tuple[Terms, float]], *, ridge: float = RIDGE,
                class_scales: tuple[tuple[str, float], ...] = ()) -> CostParams:
    """`refit` over cached terms: the (log a, log b) Gauss-Newton with the analytic Jacobian, on top of fixed
    ``class_scales`` (`class_scales`; the terms need their classes, `Terms.classes`)."""
    if not data:
        return CostParams(class_scales=class_scales)
    lo, hi = (math.log(x) for x in SCALE_RANGE)
    theta = (0.0, 0.0)
    for _ in range(ITERATIONS):
        res, jac = [], []
        for t, measured in data:
            # d t / d log a, d t / d log b, the unscaled rest (class scales: a constant factor on a per candidate)
            ca, cb, rest = t.step.parts(t.params_for(_params(theta, class_scales)))
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
    return _params(theta, class_scales)


def refit(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
          *, ridge: float = RIDGE, class_scales: tuple[tuple[str, float], ...] = ()) -> CostParams:
    """CostParams that best explain the measured step times (CostParams() when there are none), on top of per-class
    scales (`class_scales`, from profiled probes) when given."""
    data = measured_terms(model, cluster, training, measurements, classes=bool(class_scales))
    return refit_terms(data, ridge=ridge, class_scales=class_scales)


def rms_log_error(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, measurements: list[Measurement],
                  params: CostParams) -> float:
    """Root-mean-square of log(measured / predicted): 0.1 is about 10% off."""
    data = measured_terms(model, cluster, training, measurements, classes=bool(params.class_scales))
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


__all__ = ["Measurement", "Terms", "candidate_classes", "class_scales", "expected_improvement", "measured_terms",
           "params_dict", "params_from",
           "predicted_step_s", "probe_class_seconds", "refit", "refit_terms", "residual_sigma", "rms_log_error",
           "terms_of"]
