"""`SurvivorSampler`: which of the planner's survivors a tune study probes next.

Sampler design (`SurvivorSampler`): after the enqueued analytic top-k (1 by default with ei), ``--sampler ei``
(the default) probes the unprobed survivor with the largest expected improvement over the best measured
time per sample, under the planner's terms refitted to every measurement (`refit_terms`: compute and
communication scales, the CostParams `tune` records) with the measured residual spread as the error of
every prediction; so a probe that shows communication (TP, PP, DP) cheaper or dearer than planned
re-orders the rest. Every survivor's terms are cached once, so a choice costs no planner call. Measured
on tests/bench/bench_search.py: a per-term model with a per-candidate posterior (the exploration EI adds)
never moved a choice on the dev tables and trailed this refit on the robustness benchmark.
``tpe``: Optuna's TPE proposes
a point of the structured space (log2 tp, pp, mbs, vpp; ZeRO stage; recompute; flags) and the
proposal is mapped to the nearest survivor that is not measured, not running, not queued and not
implied out of memory (`SearchSpace.nearest`, ties to the better calibrated prediction). The mapped
survivor, never the raw proposal, becomes the trial's parameters, so a configuration the planner
ruled out is never probed. ``random`` picks uniformly among the unprobed survivors; ``grid`` walks
them in (tp, pp, dp, mbs, ...) order; ``analytic`` in the refitted CostParams order; ``planner`` in
the plan's own order (no learning).
"""

from __future__ import annotations

import math
import random

import optuna
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import TrialState, create_trial

from planner import CostParams

from search._base import PICK_PHASE, TuneError, recompute_sort_key
from search.calibration import (SIGMA_PRIOR, Terms, candidate_classes, class_scales, expected_improvement, params_from,
                                refit_terms, residual_sigma)
from search.objective import Ledger
from search.settings import SAMPLERS
from search.space import SearchSpace, config_key, params_of


def grid_order(space: SearchSpace) -> list[str]:
    def key(e):
        c = e.candidate
        return (c.tp, c.pp, c.dp, c.mbs, recompute_sort_key(c.recompute), c.zero, c.sp, c.vpp, c.hybrid)
    return [config_key(e.candidate) for e in sorted(space.survivors, key=key)]


def rank_by(space: SearchSpace, seconds_per_sample) -> dict[str, int]:
    """Survivor -> rank by a predicted time per sample (smaller first); ties to the planner's order."""
    ranked = sorted(enumerate(space.keys), key=lambda ik: (seconds_per_sample(ik[1]), ik[0]))
    return {k: i for i, (_, k) in enumerate(ranked)}


def measured_data(ledger: Ledger, space: SearchSpace, terms: dict) -> list[tuple[str, float]]:
    """(config, measured step time) of every measurement of a survivor of this space, in trial order."""
    out = []
    for r in sorted(ledger.records, key=lambda r: r.number):
        step = r.attrs.get("measured_step_s")
        if r.measured and step and r.config in terms and float(step) > 0:
            out.append((r.config, float(step)))
    return out


def _measurements_only(study: optuna.Study) -> optuna.Study:
    """What TPE learns from: the study's probes as an in-memory study, each trial's measured value without the
    `PICK_CONSTRAINT` every probe carries (Optuna 5's TPE ranks constrained trials by violation, not value) and
    without tune's pick trials (a median of probes it already has)."""
    shadow = optuna.create_study(direction="maximize", sampler=RandomSampler(seed=0))
    shadow.add_trials([create_trial(state=t.state, value=t.value, params=t.params, distributions=t.distributions)
                       for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                       if t.user_attrs.get("phase") != PICK_PHASE])
    return shadow


class SurvivorSampler(BaseSampler):
    """Proposes only survivors that still need a probe (see the module docstring)."""

    def __init__(self, space: SearchSpace, *, strategy: str = "tpe", seed: int | None = None,
                 startup_trials: int = 4) -> None:
        if strategy not in SAMPLERS:
            raise TuneError(f"--sampler {strategy!r}: use one of {', '.join(SAMPLERS)}")
        self.space = space
        self.strategy = strategy
        self._rng = random.Random(seed)
        self._inner = TPESampler(seed=seed, multivariate=True, n_startup_trials=startup_trials,
                                 constant_liar=False) if strategy == "tpe" else RandomSampler(seed=seed)
        self._distributions = space.distributions()
        self._grid = grid_order(space)
        self._plain = {k: i for i, k in enumerate(space.keys)}
        self._orders: dict[tuple[float, float], dict[str, int]] = {}
        self._terms = {config_key(e.candidate): Terms.of(e.time) for e in space.survivors}
        self._gbs = {config_key(e.candidate): e.candidate.global_batch for e in space.survivors}
        self._refit_key: tuple | None = None
        self._classed = False
        self._refit: tuple[CostParams, float] = (CostParams(), SIGMA_PRIOR)

    def _with_classes(self) -> None:
        """Give the cached terms each survivor's compute seconds by op class (once, when class scales appear)."""
        if self._classed:
            return
        plan, memo = self.space.plan, {}
        for e in self.space.survivors:
            k = config_key(e.candidate)
            self._terms[k] = Terms(self._terms[k].step, tuple(candidate_classes(
                plan.model, plan.cluster, plan.training, e.candidate, memo).items()))
        self._classed = True

    def order(self, study: optuna.Study) -> dict[str, int]:
        """Survivor -> rank under the study's latest calibration (CostParams over the cached terms)."""
        params = params_from(study.user_attrs.get("calibration"))
        key = (round(params.compute_scale, 4), round(params.comm_scale, 4),
               tuple((c, round(v, 4)) for c, v in params.class_scales))
        if params.class_scales:
            self._with_classes()
        if key not in self._orders:
            self._orders[key] = rank_by(self.space, lambda k: self._terms[k].step_s(params) / self._gbs[k])
        return self._orders[key]

    def refitted(self, study: optuna.Study, ledger: Ledger | None = None) -> tuple[CostParams, float, list]:
        """(CostParams refitted to every measurement so far, their residual spread, the data), from the cached
        terms (cached by the measurements)."""
        ledger = ledger or Ledger.of(study)
        data = measured_data(ledger, self.space, self._terms)
        scales = class_scales(ledger.class_pairs())
        key = (tuple((k, round(s, 9)) for k, s in data), scales)
        if key != self._refit_key:
            if scales:
                self._with_classes()
            pairs = [(self._terms[k], s) for k, s in data]
            params = refit_terms(pairs, class_scales=scales)
            self._refit_key, self._refit = key, (params, residual_sigma(pairs, params) if pairs else SIGMA_PRIOR)
        return (*self._refit, data)

    def ei_pick(self, study: optuna.Study, remaining: list[str], ledger: Ledger | None = None) -> str:
        """The remaining survivor with the largest expected improvement (per-sample step time, log) over the best
        measured so far: its prediction under the refitted CostParams (compute and communication scales,
        `refit_terms`), with the measured residual spread as its error; ties (and no measurement yet) to the
        refitted order. Every candidate gets the same spread, so this is the refitted model's best prediction:
        a per-candidate parameter uncertainty was measured to cost probes
        (tests/bench/bench_search.py)."""
        params, sigma, data = self.refitted(study, ledger)
        order = rank_by(self.space, lambda k: self._terms[k].step_s(params) / self._gbs[k])
        if not data:
            return min(remaining, key=lambda k: order.get(k, len(order)))
        best = min(math.log(s / self._gbs[k]) for k, s in data)

        def score(k: str) -> tuple[float, int]:
            mean = math.log(self._terms[k].step_s(params) / self._gbs[k])
            return (-expected_improvement(mean, sigma, best), order.get(k, len(order)))
        return min(remaining, key=score)

    def infer_relative_search_space(self, study, trial) -> dict:
        return {n: d for n, d in self._distributions.items() if not d.single()}

    def sample_relative(self, study, trial, search_space) -> dict:
        if not search_space:
            return {}
        ledger = Ledger.of(study, exclude=trial.number)
        exclude = ledger.done_keys(self.space) | ledger.running_keys(self.space) | ledger.waiting_keys(self.space)
        remaining = [k for k in self.space.keys if k not in exclude]
        if not remaining:       # all taken (another worker raced us): any survivor, answered from storage
            remaining = self.space.keys
            exclude = set()
        order = self.order(study)
        if self.strategy == "grid":
            pick = next(k for k in self._grid if k in set(remaining))
        elif self.strategy == "analytic":
            pick = min(remaining, key=lambda k: order.get(k, len(order)))
        elif self.strategy == "planner":
            plain = self._plain
            pick = min(remaining, key=lambda k: plain[k])
        elif self.strategy == "ei":
            pick = self.ei_pick(study, remaining, ledger)
        elif self.strategy == "random":
            pick = self._rng.choice(remaining)
        else:
            proposal = self._inner.sample_relative(_measurements_only(study), trial, search_space)
            if proposal:
                pick = config_key(self.space.nearest(proposal, exclude=exclude, order=order).candidate)
            else:
                pick = self._rng.choice(remaining)
        params = params_of(self.space.by_key(pick).candidate)
        return {n: params[n] for n in search_space}

    def sample_independent(self, study, trial, param_name, param_distribution):
        # Reached only for parameters outside the relative space: constants of the space.
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self._inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self._inner.after_trial(study, trial, state, values)


__all__ = ["SurvivorSampler", "grid_order", "measured_data", "rank_by"]
