"""The Optuna study over the planner's survivors: storage, sampler, analytic top-k, search, confirmation.

    >>> from search.study import Progress, TuneSettings, open_study, run
    >>> study = open_study(settings, space, inputs)
    >>> run(study, objective, space, settings, Progress(total=len(space), budget_s=7200))   # search, confirm

Sampler design (`SurvivorSampler`): after the enqueued analytic top-k, ``--sampler ei`` (the default)
probes the unprobed survivor with the largest expected improvement over the best measured time per
sample, under the refitted per-term model (`search.calibration.TermModel`: a global level and
corrections of compute, TP, PP and DP time, regularised toward 1) and its uncertainty (the
parameters' posterior through the candidate's term mix, plus the measured residual spread); every
survivor's terms are cached once, so a choice costs no planner call. ``tpe``: Optuna's TPE proposes
a point of the structured space (log2 tp, pp, mbs, vpp; ZeRO stage; recompute; flags) and the
proposal is mapped to the nearest survivor that is not measured, not running, not queued and not
implied out of memory (`SearchSpace.nearest`, ties to the better calibrated prediction). The mapped
survivor, never the raw proposal, becomes the trial's parameters, so a configuration the planner
ruled out is never probed. ``random`` picks uniformly among the unprobed survivors; ``grid`` walks
them in (tp, pp, dp, mbs, ...) order; ``analytic`` in the refitted CostParams order; ``planner`` in
the plan's own order (no learning).

Storage: any Optuna RDB URL (``sqlite:///tune.db`` by default; ``postgresql://...`` for many
workers) with a heartbeat, so a trial left RUNNING by a killed tuner is failed after the grace
period and re-queued by ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback``
before Optuna 4.9) on the next run. Several workers share a study safely: the sampler skips
configurations other workers run or queued, and of two trials that still race to the same
configuration the lower-numbered one probes while the other is answered from its result.

Budget: no trial starts once the budget is spent, and the search phase stops early enough to leave
the confirmation probes their (mean probe wall time) share; a running probe is bounded by
``--probe-timeout``, not by the budget.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TextIO

import optuna
from optuna.samplers import BaseSampler, RandomSampler, TPESampler

from planner import CostParams
from planner.space import RECOMPUTE

from search._base import NOT_FINAL, PROBED, TuneError
from search.calibration import Terms, TermModel, expected_improvement
from search.objective import Ledger, Objective, ProbeFailed, TrialRecord
from search.space import SearchSpace, config_key, params_of

SAMPLERS = ("ei", "tpe", "random", "grid", "analytic", "planner")
INPUTS_ATTR = "plantune_inputs"
OPEN_ATTEMPTS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneSettings:
    study_name: str
    storage_url: str = "sqlite:///tune.db"
    budget_s: float | None = None
    max_probes: int | None = None
    """search-phase probes in the study, all runs together (None: until the space is exhausted)"""
    top_k: int = 3
    sampler: str = "ei"
    seed: int | None = None
    startup_trials: int = 4
    """measurements before TPE models the space (the analytic top-k count); random survivors until then"""
    confirm_top: int = 3
    repeats: int = 2
    heartbeat_s: int = 60
    grace_s: int = 120
    max_retry: int = 3


# -- the sampler --------------------------------------------------------------------------------

def grid_order(space: SearchSpace) -> list[str]:
    def key(e):
        c = e.candidate
        return (c.tp, c.pp, c.dp, c.mbs, RECOMPUTE.index(c.recompute), c.zero, c.sp, c.vpp, c.hybrid)
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
        self._fit_key: tuple | None = None
        self._fit = TermModel()

    def order(self, study: optuna.Study) -> dict[str, int]:
        """Survivor -> rank under the study's latest calibration (CostParams over the cached terms)."""
        cal = study.user_attrs.get("calibration") or {}
        params = CostParams(compute_scale=float(cal.get("compute_scale", 1.0)),
                            comm_scale=float(cal.get("comm_scale", 1.0)))
        key = (round(params.compute_scale, 4), round(params.comm_scale, 4))
        if key not in self._orders:
            self._orders[key] = rank_by(self.space, lambda k: self._terms[k].step_s(params) / self._gbs[k])
        return self._orders[key]

    def term_model(self, study: optuna.Study, ledger: Ledger | None = None) -> TermModel:
        """The refitted per-term model of every measurement so far (cached by the measurements)."""
        data = measured_data(ledger or Ledger.of(study), self.space, self._terms)
        key = tuple((k, round(s, 9)) for k, s in data)
        if key != self._fit_key:
            self._fit_key = key
            self._fit = TermModel.fit([(self._terms[k], s) for k, s in data])
        return self._fit

    def ei_pick(self, study: optuna.Study, remaining: list[str], ledger: Ledger | None = None) -> str:
        """The remaining survivor with the largest expected improvement (per-sample step time, log) over
        the best measured so far, under the refitted term model and its measured error; ties (and no
        measurement yet) to the refitted order."""
        ledger = ledger or Ledger.of(study)
        fit = self.term_model(study, ledger)
        order = rank_by(self.space, lambda k: fit.predict_step_s(self._terms[k]) / self._gbs[k])
        data = measured_data(ledger, self.space, self._terms)
        if not data:
            return min(remaining, key=lambda k: order.get(k, len(order)))
        best = min(math.log(s / self._gbs[k]) for k, s in data)

        def score(k: str) -> tuple[float, int]:
            mean, sd = fit.predict_log(self._terms[k])
            return (-expected_improvement(mean - math.log(self._gbs[k]), sd, best), order.get(k, len(order)))
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
            proposal = self._inner.sample_relative(study, trial, search_space)
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


# -- storage and study ----------------------------------------------------------------------------

def open_storage(settings: TuneSettings):
    """An RDBStorage with heartbeat and retry of stale trials (SQLite or any SQLAlchemy URL)."""
    url = settings.storage_url
    if "://" not in url:
        raise TuneError(f"--storage {url!r} is not a database URL; e.g. sqlite:///tune.db or "
                        "postgresql://user@host/db")
    storages = optuna.storages
    retry_cls = getattr(storages, "RetryHeartbeatStaleTrialCallback", None)
    kwargs = {"heartbeat_interval": settings.heartbeat_s, "grace_period": settings.grace_s}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if retry_cls is not None:
            kwargs["heartbeat_stale_trial_callback"] = retry_cls(max_retry=settings.max_retry)
        else:
            kwargs["failed_trial_callback"] = storages.RetryFailedTrialCallback(max_retry=settings.max_retry)
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return storages.RDBStorage(url, engine_kwargs=engine, **kwargs)
        except (ImportError, ValueError) as err:
            raise TuneError(f"--storage {url}: {str(err).splitlines()[0]}") from None
        except Exception as err:  # noqa: BLE001 -- SQLAlchemy's errors, without importing SQLAlchemy here
            if not type(err).__module__.startswith("sqlalchemy"):
                raise
            # Workers starting together race to create Optuna's tables (a unique-key violation on
            # PostgreSQL's catalog): the loser retries and finds them created.
            if attempt == OPEN_ATTEMPTS - 1 or "connect" in str(err).lower() and "refused" in str(err).lower():
                raise TuneError(f"--storage {url}: cannot open the database: {str(err).splitlines()[0]}") from None
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def open_study(settings: TuneSettings, space: SearchSpace, inputs: dict) -> optuna.Study:
    """Create the study, or load it by name; refuse to continue a study made for other inputs."""
    sampler = SurvivorSampler(space, strategy=settings.sampler, seed=settings.seed,
                              startup_trials=settings.startup_trials)
    study = optuna.create_study(study_name=settings.study_name, storage=open_storage(settings), sampler=sampler,
                                direction="maximize", load_if_exists=True)
    stored = study.user_attrs.get(INPUTS_ATTR)
    if stored is None:
        study.set_user_attr(INPUTS_ATTR, inputs)
    elif stored != inputs:
        diff = sorted(k for k in set(stored) | set(inputs) if stored.get(k) != inputs.get(k))
        raise TuneError(f"study {settings.study_name!r} in {settings.storage_url} was made for other inputs "
                        f"({', '.join(diff)} differ); rerun with the same flags, or pick a new --study name")
    return study


def recover(study: optuna.Study, space: SearchSpace, top_k: int) -> dict[str, int]:
    """Before searching: fail stale RUNNING trials (re-queued by the retry callback), re-queue
    Ctrl-C'd and backend-failed ones, queue the analytic top-k. Returns counts of what was queued."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    ledger = Ledger.of(study)
    taken = ledger.done_keys(space) | ledger.running_keys(space) | ledger.waiting_keys(space)
    interrupted = []
    for r in ledger.records:
        if r.outcome in NOT_FINAL and r.config and r.phase != "confirm" and r.config not in taken:
            est = space.by_key(r.config)
            if est is not None:
                interrupted.append(est)
                taken.add(r.config)
    for est in interrupted:
        study.enqueue_trial(params_of(est.candidate), user_attrs={"phase": "retry"})
    analytic = 0
    for est in space.survivors[:top_k]:
        key = config_key(est.candidate)
        if key not in taken:
            study.enqueue_trial(params_of(est.candidate), user_attrs={"phase": "analytic"})
            taken.add(key)
            analytic += 1
    return {"interrupted": len(interrupted), "analytic": analytic}


# -- progress -------------------------------------------------------------------------------------

def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Progress on stderr: a line per finished trial, and on a terminal one live line while probing
    (configurations done/total, best measured TFLOPs, elapsed and remaining budget)."""

    def __init__(self, *, total: int, budget_s: float | None, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total = total
        self.budget_s = budget_s
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.best = ""
        self._live = False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def remaining_s(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.elapsed_s

    def status(self) -> str:
        left = self.remaining_s()
        return " | ".join([f"{self.done}/{self.total} configs", self.best or "no measurement yet",
                           f"{_hms(self.elapsed_s)} elapsed" + (f", {_hms(left)} left" if left is not None else "")])

    def update(self, ledger: Ledger, space: SearchSpace, last: TrialRecord | None = None) -> None:
        self.done = len(ledger.done_keys(space) & set(space.keys))
        ok = [r for r in ledger.records if r.measured]
        if ok:
            top = max(ok, key=lambda r: r.value or 0.0)
            self.best = f"best {top.value:.4g} TFLOPs/GPU ({_short(top.config)})"
        if last is not None:
            what = f"{last.value:.4g} TFLOPs/GPU" if last.state == "COMPLETE" and last.value is not None else \
                (last.reason[:120] or last.state)
            self._write(f"[tune] trial {last.number} {last.phase} {_short(last.config)}: {last.outcome or last.state}"
                        f" {what} | {self.status()}", live=False)

    def probing(self, number: int, label: str) -> None:
        if self.tty:
            self._write(f"[tune] {self.status()} | probing trial {number}: {_short(label)}", live=True)

    def _write(self, line: str, *, live: bool) -> None:
        if not self.enabled:
            return
        if self._live:
            self.stream.write("\r\x1b[2K")
        self.stream.write(line if live else line + "\n")
        self._live = live
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._live:
            self.stream.write("\n")
            self.stream.flush()
            self._live = False


def _short(label: str | None) -> str:
    """tp=1,pp=2,mbs=4,recompute=full,zero=1 (dp and gas follow from them)."""
    if not label:
        return "?"
    return ",".join(p for p in label.split(",") if not p.startswith(("dp=", "gas=")))


# -- the run --------------------------------------------------------------------------------------

def _search_done(ledger: Ledger, space: SearchSpace, settings: TuneSettings, progress: Progress) -> bool:
    """The space is exhausted, the probe limit is hit, or the budget needs the rest (for confirmation)."""
    taken = ledger.done_keys(space) | ledger.running_keys(space)
    if not [k for k in space.keys if k not in taken]:
        return True
    probes = [r for r in ledger.records if r.outcome in PROBED and r.phase != "confirm"
              and "duplicate_of" not in r.attrs]
    if settings.max_probes is not None and len(probes) >= settings.max_probes:
        return True
    left = progress.remaining_s()
    if left is not None:
        walls = [float(r.attrs.get("probe_wall_s") or 0.0) for r in probes]
        mean = sum(walls) / len(walls) if walls else 0.0
        if left <= mean * (1 + settings.confirm_top * settings.repeats):
            return True
    return False


class _Stopper:
    """Optuna callback: progress line, then `study.stop()` when `_search_done`."""

    def __init__(self, space: SearchSpace, settings: TuneSettings, progress: Progress) -> None:
        self.space, self.settings, self.progress = space, settings, progress

    def __call__(self, study: optuna.Study, trial) -> None:
        ledger = Ledger.of(study)
        self.progress.update(ledger, self.space, TrialRecord.from_trial(trial))
        if _search_done(ledger, self.space, self.settings, self.progress):
            study.stop()


def search(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
           progress: Progress) -> None:
    """Probe until the space is exhausted, --max-probes, or the budget (keeping time for confirmation)."""
    ledger = Ledger.of(study)
    progress.update(ledger, space)
    if _search_done(ledger, space, settings, progress):
        return
    timeout = progress.remaining_s()
    study.optimize(objective, timeout=timeout, catch=(ProbeFailed,), callbacks=[_Stopper(space, settings, progress)],
                   gc_after_trial=False)


def confirmation_slots(ledger: Ledger, confirm_top: int, repeats: int) -> list[tuple[str, int]]:
    """(config, repeat) still to probe: the ``confirm_top`` best measured configurations, ``repeats`` each."""
    if confirm_top <= 0 or repeats <= 0:
        return []
    first = {}
    for r in sorted(ledger.records, key=lambda r: r.number):
        if r.measured and r.phase != "confirm" and r.config not in first:
            first[r.config] = r.value or 0.0
    top = sorted(first, key=lambda k: -first[k])[:confirm_top]
    present = {r.slot for r in ledger.records if r.phase == "confirm" and r.slot
               and (r.final or r.state in ("RUNNING", "WAITING"))}
    return [(k, i) for k in top for i in range(1, repeats + 1) if f"{k}#confirm{i}" not in present]


def confirm(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
            progress: Progress) -> int:
    """Re-probe the best few; returns how many confirmation trials this run queued."""
    timeout = progress.remaining_s()
    if timeout is not None and timeout <= 0:
        return 0
    slots = confirmation_slots(Ledger.of(study), settings.confirm_top, settings.repeats)
    slots = [(k, i) for k, i in slots if space.by_key(k) is not None]
    for key, i in slots:
        study.enqueue_trial(params_of(space.by_key(key).candidate),
                            user_attrs={"phase": "confirm", "repeat": i, "slot": f"{key}#confirm{i}"})
    waiting = [r for r in Ledger.of(study).records if r.state == "WAITING" and r.phase == "confirm"]
    if waiting:
        study.optimize(objective, n_trials=len(waiting), timeout=timeout, catch=(ProbeFailed,),
                       callbacks=[lambda s, t: progress.update(Ledger.of(s), space, TrialRecord.from_trial(t))],
                       gc_after_trial=False)
    return len(slots)


def run(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
        progress: Progress) -> list[TrialRecord]:
    """Recover, search, confirm; the study's trials as records at the end."""
    recover(study, space, settings.top_k)
    try:
        search(study, objective, space, settings, progress)
        confirm(study, objective, space, settings, progress)
    finally:
        progress.close()
    return Ledger.of(study).records


__all__ = ["INPUTS_ATTR", "Progress", "SAMPLERS", "SurvivorSampler", "TuneSettings", "confirm", "confirmation_slots",
           "grid_order", "open_storage", "open_study", "recover", "run", "search"]
