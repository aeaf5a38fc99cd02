"""The Optuna study over the planner's survivors: storage, sampler, analytic top-k, search, confirmation.

    >>> from search.study import Progress, TuneSettings, open_study, run
    >>> study = open_study(settings, space, inputs)
    >>> run(study, objective, space, settings, Progress(total=len(space), budget_s=7200))   # search, confirm

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

Storage: any Optuna RDB URL (``sqlite:///tune.db`` by default; ``postgresql://...`` for many
workers) with a heartbeat, so a trial left RUNNING by a killed tuner is failed after the grace
period and re-queued by ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback``
before Optuna 4.9) on the next run. Several workers share a study safely: the sampler skips
configurations other workers run or queued, and of two trials that still race to the same
configuration the lower-numbered one probes while the other is answered from its result.

Limits (`run`): ``--budget`` is this run's wall-clock time, every probe included: no probe starts after
it, a probe still running at its end is stopped and recorded ``interrupted`` (probed again by the next
run), and the search stops early enough to leave the confirmation re-probes their share (their count
x the mean probe time, at most half the budget); time left after confirming goes back to the search.
``--max-probes`` counts probes that ran (`TrialRecord.counted`) over the whole study, confirmation
re-probes included, with the same share (at most half) kept for confirmation.

Faults: a RUNNING trial whose tuner ran on this host and is gone (its pid is dead) is failed at once
and probed again; one with no worker recorded (killed between ask() and the first heartbeat) after
``--grace-s`` (at most `ORPHAN_S`); one whose tuner (any host) recorded its worker but never a heartbeat,
``--grace-s`` after it started; others by the heartbeat (``--grace-s`` after the last one). Before printing a
result, `run` waits for trials RUNNING
elsewhere (or re-runs them once their tuner is found dead), so no best is printed while a
configuration is unmeasured.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from dataclasses import dataclass
from typing import TextIO

import optuna
from optuna.samplers import BaseSampler, RandomSampler, TPESampler

from planner import CostParams
from planner.space import RECOMPUTE

from search._base import NOT_FINAL, TuneError
from search.calibration import SIGMA_PRIOR, Terms, expected_improvement, refit_terms, residual_sigma
from search.objective import (RESOURCES_ATTR, WAIT_POLL_S, Ledger, Objective, ProbeFailed, TrialRecord,
                              worker_dead)
from search.report import best, summarize
from search.space import SearchSpace, config_key, params_of
from search.trial_attrs import TrialAttrs

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
    top_k: int | None = None
    """the plan's best K probed first; None: `default_top_k` of the sampler"""
    sampler: str = "ei"
    seed: int | None = None
    startup_trials: int = 4
    """measurements before TPE models the space (the analytic top-k count); random survivors until then"""
    confirm_top: int = 3
    repeats: int = 2
    heartbeat_s: int = 60
    grace_s: int = 120
    max_retry: int = 3


def default_top_k(sampler: str) -> int:
    """--top-k when not given: 1 for ei (measured on tests/bench/bench_search.py: top-1 needs the fewest probes to
    the best, dev tables and robustness benchmark alike; --loto chooses it on every held-out table), 3 for the
    others (TPE models after a few measurements)."""
    return 1 if sampler == "ei" else 3


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
        self._refit_key: tuple | None = None
        self._refit: tuple[CostParams, float] = (CostParams(), SIGMA_PRIOR)

    def order(self, study: optuna.Study) -> dict[str, int]:
        """Survivor -> rank under the study's latest calibration (CostParams over the cached terms)."""
        cal = study.user_attrs.get("calibration") or {}
        params = CostParams(compute_scale=float(cal.get("compute_scale", 1.0)),
                            comm_scale=float(cal.get("comm_scale", 1.0)))
        key = (round(params.compute_scale, 4), round(params.comm_scale, 4))
        if key not in self._orders:
            self._orders[key] = rank_by(self.space, lambda k: self._terms[k].step_s(params) / self._gbs[k])
        return self._orders[key]

    def refitted(self, study: optuna.Study, ledger: Ledger | None = None) -> tuple[CostParams, float, list]:
        """(CostParams refitted to every measurement so far, their residual spread, the data), from the cached
        terms (cached by the measurements)."""
        data = measured_data(ledger or Ledger.of(study), self.space, self._terms)
        key = tuple((k, round(s, 9)) for k, s in data)
        if key != self._refit_key:
            pairs = [(self._terms[k], s) for k, s in data]
            params = refit_terms(pairs)
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

def storage_url(url: str) -> str:
    """The URL to open: refuse in-memory SQLite (the study would vanish), name PostgreSQL's driver explicitly
    (SQLAlchemy 2.1 picks psycopg 3 for a bare postgresql://, plantune[tune] installs psycopg2)."""
    if "://" not in url:
        raise TuneError(f"--storage {url!r} is not a database URL; e.g. sqlite:///tune.db or "
                        "postgresql://user@host/db")
    scheme, rest = url.split("://", 1)
    if scheme.startswith("sqlite") and (rest.strip("/") in ("", ":memory:") or "mode=memory" in rest):
        raise TuneError(f"--storage {url} is an in-memory database: the study would be lost when tune exits; "
                        "give a file, e.g. sqlite:///tune.db")
    if scheme in ("postgresql", "postgres"):
        import importlib.util

        driver = next((d for d in ("psycopg2", "psycopg") if importlib.util.find_spec(d) is not None), None)
        if driver is None:
            raise TuneError(f"--storage {url}: no PostgreSQL driver is installed: pip install 'plantune[tune]'")
        return f"postgresql+{driver}://{rest}"
    return url


def open_storage(settings: TuneSettings):
    """An RDBStorage with heartbeat and retry of stale trials (SQLite or any SQLAlchemy URL)."""
    url = storage_url(settings.storage_url)
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
            raise TuneError(f"--storage {settings.storage_url}: {str(err).splitlines()[0]}") from None
        except Exception as err:  # noqa: BLE001 -- SQLAlchemy's errors, without importing SQLAlchemy here
            if not type(err).__module__.startswith("sqlalchemy"):
                raise
            # Workers starting together race to create Optuna's tables (a unique-key violation on
            # PostgreSQL's catalog): the loser retries and finds them created.
            if attempt == OPEN_ATTEMPTS - 1 or "connect" in str(err).lower() and "refused" in str(err).lower() \
                    or "unable to open database file" in str(err):
                raise TuneError(f"--storage {settings.storage_url}: cannot open the database: "
                                f"{str(err).splitlines()[0]}") from None
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


ORPHAN_S = 60.0
"""a RUNNING trial that has not recorded its worker this long after it started is dead: a live tuner records
it right after ask() (`Objective.__call__`), so it was killed in between"""


def heartbeat_recorded(study: optuna.Study, trial_id: int) -> bool | None:
    """Whether the storage holds a heartbeat of this trial (None: not an RDB storage, or Optuna's tables
    changed). Optuna's own stale-trial rule (`fail_stale_trials`) skips a RUNNING trial with no heartbeat
    at all, so `reap` gives it a bound of its own."""
    storage = getattr(study._storage, "_backend", study._storage)
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(storage.scoped_session) as session:
            return session.query(models.TrialHeartbeatModel).filter(
                models.TrialHeartbeatModel.trial_id == trial_id).count() > 0
    except (ImportError, AttributeError):
        return None


def reap(study: optuna.Study, grace_s: float) -> list[int]:
    """Fail RUNNING trials whose tuner is gone: its pid on this host is dead (at once); it never recorded
    which worker runs it (killed between ask() and the first heartbeat) for ``grace_s`` or `ORPHAN_S`; or it
    recorded its worker (on any host) but never a heartbeat for ``grace_s`` since it started (a live tuner's
    first heartbeat comes with the trial: `open_storage` always enables them; the heartbeat rule itself
    covers trials that did beat). They get outcome ``interrupted``, so `requeue` probes them again. Returns
    their numbers."""
    from optuna.trial import TrialState

    storage = study._storage
    reaped = []
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        r = TrialRecord.from_trial(t)
        old = r.started is not None and now - r.started > grace_s
        if worker_dead(r):
            why = f"its tuner ({r.attrs['worker']}) was killed while it ran"
        elif "worker" not in r.attrs and r.started is not None and now - r.started > min(grace_s, ORPHAN_S):
            why = "its tuner died before the trial started"
        elif "worker" in r.attrs and old and heartbeat_recorded(study, t._trial_id) is False:
            why = (f"its tuner ({r.attrs['worker']}) recorded no heartbeat in --grace-s {grace_s:g} s since the "
                   "trial started")
        else:
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")
            storage.set_trial_user_attr(t._trial_id, "reason", why + "; probed again")
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue                         # another tuner finished or failed it first
        reaped.append(t.number)
    return reaped


def requeue(study: optuna.Study, space: SearchSpace) -> int:
    """Queue (phase ``retry``) every configuration whose last attempt did not end it: Ctrl-C'd, killed, backend
    failures, stopped by the budget, ``invalid`` under other resources. Returns how many were queued."""
    ledger = Ledger.of(study)
    taken = ledger.done_keys(space) | ledger.running_keys(space) | ledger.waiting_keys(space)
    again = []
    for r in ledger.records:
        if (r.outcome in NOT_FINAL or r.stale) and r.config and r.phase != "confirm" and r.config not in taken:
            est = space.by_key(r.config)
            if est is not None:
                again.append(est)
                taken.add(r.config)
    for est in again:
        study.enqueue_trial(params_of(est.candidate), user_attrs=TrialAttrs.user_attrs(phase="retry"))
    return len(again)


def recover(study: optuna.Study, space: SearchSpace, top_k: int, grace_s: float = float("inf")) -> dict[str, int]:
    """Before searching: fail RUNNING trials of dead tuners (`reap`) and stale ones (heartbeat; re-queued by the
    retry callback), re-queue what did not end (`requeue`), queue the analytic top-k. Returns what was queued."""
    reap(study, grace_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    interrupted = requeue(study, space)
    ledger = Ledger.of(study)
    taken = ledger.done_keys(space) | ledger.running_keys(space) | ledger.waiting_keys(space)
    analytic = 0
    for est in space.survivors[:top_k]:
        key = config_key(est.candidate)
        if key not in taken:
            study.enqueue_trial(params_of(est.candidate), user_attrs=TrialAttrs.user_attrs(phase="analytic"))
            taken.add(key)
            analytic += 1
    return {"interrupted": interrupted, "analytic": analytic}


# -- progress -------------------------------------------------------------------------------------

def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


LIVE_WIDTH = 100
"""the live line's width when the terminal's cannot be read (shutil.get_terminal_size's fallback)"""
STEP_MARK = "[probe] step "
"""the line probes.train's rank 0 prints after each timed step: ``[probe] step N 0.123456 s``"""


def last_step_time(workdir: Path | None) -> tuple[int, float] | None:
    """(step, seconds) of the latest timed step rank 0 of a running probe printed, or None."""
    if workdir is None:
        return None
    for log in sorted(Path(workdir).glob("logs/*/attempt_*/0/stdout.log")):
        try:
            with open(log, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        for line in reversed(tail.splitlines()):
            if line.startswith(STEP_MARK):
                try:
                    step, seconds = line[len(STEP_MARK):].split()[:2]
                    return int(step), float(seconds)
                except ValueError:
                    break
    return None


class Progress:
    """Progress on stderr. A line per finished trial; while a probe runs, on a terminal one live line (probe n
    of N, elapsed vs its timeout, the latest step time, best so far, budget left) redrawn every second, in a
    log (not a terminal) the same as a line when the probe starts and then every ``log_every_s``."""

    def __init__(self, *, total: int, budget_s: float | None, stream: TextIO | None = None,
                 enabled: bool = True, max_probes: int | None = None, planned: int | None = None,
                 probe_timeout_s: float | None = None, log_every_s: float = 60.0) -> None:
        self.total = total
        self.budget_s = budget_s
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.max_probes = max_probes
        self.planned = planned
        self.probe_timeout_s = probe_timeout_s
        self.started = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.tick_s = 1.0 if self.tty else log_every_s
        self.done = 0
        self.probes = 0
        self.spent = False
        self.best = ""
        self._live = False
        self._lock = threading.Lock()
        self._current: tuple | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def remaining_s(self) -> float | None:
        if self.budget_s is None:
            return None
        return 0.0 if self.spent else self.budget_s - self.elapsed_s

    def spend(self) -> None:
        """The budget is over (a probe was stopped at its end), whatever the clock says."""
        self.spent = True

    def status(self) -> str:
        left = self.remaining_s()
        return " | ".join([f"{self.done}/{self.total} configs", self.best or "no measurement yet",
                           f"{_hms(self.elapsed_s)} elapsed" + (f", {_hms(left)} of the budget left"
                                                                if left is not None else "")])

    def update(self, ledger: Ledger, space: SearchSpace, last: TrialRecord | None = None) -> None:
        self.done = len(ledger.done_keys(space) & set(space.keys))
        self.probes = sum(1 for r in ledger.records if r.counted)
        top = best(summarize(ledger.records))     # the one rule the table and the final line use
        if top is not None:
            self.best = f"best {top.median_tflops:.4g} TFLOPs/GPU ({_short(top.config)})"
        if last is not None:
            what = f"{last.value:.4g} TFLOPs/GPU" if last.state == "COMPLETE" and last.value is not None else \
                (last.reason[:160] or last.state)
            wall = last.attrs.get("probe_wall_s")
            self._write(f"[tune] trial {last.number} {last.phase} {_short(last.config)}: {last.outcome or last.state}"
                        f" {what}" + (f" ({wall:.0f} s)" if isinstance(wall, (int, float)) and wall >= 1 else "")
                        + f" | {self.status()}", live=False)

    def note(self, text: str) -> None:
        self._write(f"[tune] {text}", live=False)

    def _of(self) -> str:
        if self.max_probes is not None:
            return f" of {self.max_probes}"
        return f" of at most {self.planned}" if self.planned else ""

    def probe_line(self) -> str:
        if self._current is None:
            return ""
        number, label, started, timeout_s, workdir = self._current
        n = self.probes + 1
        parts = [f"[tune] probe {n}{self._of()}: trial {number} {_short(label)}",
                 f"{_hms(time.monotonic() - started)} of {_hms(timeout_s)}" if timeout_s else
                 f"{_hms(time.monotonic() - started)} elapsed"]
        step = last_step_time(workdir)
        parts.append(f"step {step[0]}: {step[1]:.3g} s" if step else "no timed step yet")
        parts.append(self.best or "no measurement yet")
        left = self.remaining_s()
        if left is not None:
            parts.append(f"{_hms(left)} of the budget left")
        return " | ".join(parts)

    def probing(self, number: int, label: str, *, timeout_s: float | None = None, workdir=None) -> None:
        """A probe starts: its line now, then redrawn (terminal) or repeated (log) until `probe_ended`."""
        self.probe_ended()
        self._current = (number, label, time.monotonic(), timeout_s, workdir)
        if not self.enabled:
            return
        self._write(self.probe_line(), live=self.tty)
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="tune-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            line = self.probe_line()
            if line:
                self._write(line, live=self.tty)

    def probe_ended(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
        self._current = None

    def _write(self, line: str, *, live: bool) -> None:
        if not self.enabled:
            return
        if live:                # a live line longer than the terminal wraps, and "\r" then redraws only its last row
            width = shutil.get_terminal_size((LIVE_WIDTH, 24)).columns - 1
            line = line if len(line) <= width else line[:max(width - 1, 1)] + "…"
        with self._lock:
            if self._live:
                self.stream.write("\r\x1b[2K")
            self.stream.write(line if live else line + "\n")
            self._live = live
            self.stream.flush()

    def close(self) -> None:
        self.probe_ended()
        with self._lock:
            if self.enabled and self._live:
                self.stream.write("\n")
                self.stream.flush()
                self._live = False


def _short(label: str | None) -> str:
    """tp=1,pp=2,dp=4,mbs=4,recompute=full,zero=1 (gas follows from them)."""
    if not label:
        return "?"
    return ",".join(p for p in label.split(",") if not p.startswith("gas="))


# -- the run --------------------------------------------------------------------------------------

def _confirm_reserve(ledger: Ledger, settings: TuneSettings) -> int:
    """Confirmation re-probes to keep room for: those of the current best still to run, or, before the first
    confirmation, all that --confirm-top x --repeats plans."""
    pending = len(confirmation_slots(ledger, settings.confirm_top, settings.repeats))
    started = any(r.phase == "confirm" for r in ledger.records)
    return max(pending, 0 if started else settings.confirm_top * settings.repeats)


def _mean_probe_s(ledger: Ledger) -> float:
    walls = [float(r.attrs.get("probe_wall_s") or 0.0) for r in ledger.records if r.counted]
    return sum(walls) / len(walls) if walls else 0.0


def limits_reached(ledger: Ledger, settings: TuneSettings, progress: Progress) -> bool:
    """--max-probes probes ran, or the budget is spent: nothing more starts."""
    if settings.max_probes is not None and sum(1 for r in ledger.records if r.counted) >= settings.max_probes:
        return True
    left = progress.remaining_s()
    return left is not None and left <= 0


def _search_done(ledger: Ledger, space: SearchSpace, settings: TuneSettings, progress: Progress) -> bool:
    """The space is exhausted, or what is left of --max-probes / the budget belongs to the confirmation."""
    taken = ledger.done_keys(space) | ledger.running_keys(space)
    if not [k for k in space.keys if k not in taken]:
        return True
    if limits_reached(ledger, settings, progress):
        return True
    reserve = _confirm_reserve(ledger, settings)
    if settings.max_probes is not None:
        counted = sum(1 for r in ledger.records if r.counted)
        if counted >= settings.max_probes - min(reserve, settings.max_probes // 2):
            return True
    left = progress.remaining_s()
    if left is not None and settings.budget_s is not None:
        if left <= min(reserve * _mean_probe_s(ledger), settings.budget_s / 2):
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
    """Probe until the space is exhausted, or --max-probes / the budget leave only the confirmation's share."""
    ledger = Ledger.of(study)
    progress.update(ledger, space)
    if _search_done(ledger, space, settings, progress):
        return
    study.optimize(objective, timeout=progress.remaining_s(), catch=(ProbeFailed,),
                   callbacks=[_Stopper(space, settings, progress)], gc_after_trial=False)


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


class _ConfirmStopper:
    def __init__(self, space: SearchSpace, settings: TuneSettings, progress: Progress) -> None:
        self.space, self.settings, self.progress = space, settings, progress

    def __call__(self, study: optuna.Study, trial) -> None:
        ledger = Ledger.of(study)
        self.progress.update(ledger, self.space, TrialRecord.from_trial(trial))
        if limits_reached(ledger, self.settings, self.progress):
            study.stop()


def confirm(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
            progress: Progress) -> int:
    """Re-probe the best few, inside --max-probes and the budget; returns how many re-probes this run queued."""
    ledger = Ledger.of(study)
    if limits_reached(ledger, settings, progress):
        return 0
    slots = confirmation_slots(ledger, settings.confirm_top, settings.repeats)
    slots = [(k, i) for k, i in slots if space.by_key(k) is not None]
    if settings.max_probes is not None:
        slots = slots[:max(0, settings.max_probes - sum(1 for r in ledger.records if r.counted))]
    for key, i in slots:
        study.enqueue_trial(params_of(space.by_key(key).candidate),
                            user_attrs=TrialAttrs.user_attrs(phase="confirm", repeat=i, slot=f"{key}#confirm{i}"))
    waiting = [r for r in Ledger.of(study).records if r.state == "WAITING" and r.phase == "confirm"]
    if waiting:
        study.optimize(objective, n_trials=len(waiting), timeout=progress.remaining_s(), catch=(ProbeFailed,),
                       callbacks=[_ConfirmStopper(space, settings, progress)], gc_after_trial=False)
    return len(slots)


def await_others(study: optuna.Study, space: SearchSpace, settings: TuneSettings, progress: Progress) -> bool:
    """Wait while trials run elsewhere (another tuner, or a killed one not yet found dead): a result is not
    printed while a configuration is unmeasured. Returns True when trials were queued to probe here (a dead
    tuner's, or the heartbeat's retries), False when nothing runs any more or the budget is spent."""
    said = False
    while True:
        reaped = reap(study, settings.grace_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if reaped:
            requeue(study, space)
        ledger = Ledger.of(study)
        if any(r.state == "WAITING" for r in ledger.records):
            return True
        running = [r for r in ledger.records if r.state == "RUNNING"]
        left = progress.remaining_s()
        if not running or (left is not None and left <= 0):
            return False
        if not said:
            progress.note(f"waiting for {len(running)} trial(s) running elsewhere ("
                          + ", ".join(f"{r.number} {_short(r.config)} on {r.attrs.get('worker', '?')}"
                                      for r in running[:3])
                          + f"); a dead tuner's trial is probed again here once --grace-s {settings.grace_s} s "
                          "pass without its heartbeat")
            said = True
        time.sleep(WAIT_POLL_S)


def run(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
        progress: Progress) -> list[TrialRecord]:
    """Recover; then search, wait for trials running elsewhere, confirm the best, and search again while
    --max-probes and the budget allow; the study's trials as records at the end."""
    study.set_user_attr(RESOURCES_ATTR, objective.settings.resources)
    if settings.budget_s is not None:
        objective.deadline = progress.started + settings.budget_s
        objective.on_budget_cut = progress.spend
    recover(study, space, default_top_k(settings.sampler) if settings.top_k is None else settings.top_k,
            settings.grace_s)
    try:
        while True:
            before = len(study.get_trials(deepcopy=False))
            search(study, objective, space, settings, progress)
            if await_others(study, space, settings, progress):
                if limits_reached(Ledger.of(study), settings, progress):
                    break
                search(study, objective, space, settings, progress)
                _run_waiting(study, objective, space, settings, progress)
                continue
            confirm(study, objective, space, settings, progress)
            if len(study.get_trials(deepcopy=False)) == before or limits_reached(Ledger.of(study), settings,
                                                                                  progress):
                break
    finally:
        progress.close()
    if limits_reached(Ledger.of(study), settings, progress):
        _say_left(study, space, settings, progress)
    return Ledger.of(study).records


def _run_waiting(study: optuna.Study, objective: Objective, space: SearchSpace, settings: TuneSettings,
                 progress: Progress) -> None:
    """Probe the queued trials (retries of a dead tuner's) even when the search itself is done."""
    waiting = [r for r in Ledger.of(study).records if r.state == "WAITING"]
    if waiting and not limits_reached(Ledger.of(study), settings, progress):
        study.optimize(objective, n_trials=len(waiting), timeout=progress.remaining_s(), catch=(ProbeFailed,),
                       callbacks=[_ConfirmStopper(space, settings, progress)], gc_after_trial=False)


def _say_left(study: optuna.Study, space: SearchSpace, settings: TuneSettings, progress: Progress) -> None:
    ledger = Ledger.of(study)
    left = [k for k in space.keys if k not in ledger.done_keys(space)]
    counted = sum(1 for r in ledger.records if r.counted)
    which = (f"--max-probes {settings.max_probes} reached ({counted} probes)"
             if settings.max_probes is not None and counted >= settings.max_probes else
             f"--budget {_hms(settings.budget_s or 0)} spent")
    if left:
        progress.note(f"{which}; {len(left)} configuration(s) not probed yet: rerun the same command with a larger "
                      "limit to continue the study")


__all__ = ["INPUTS_ATTR", "Progress", "SAMPLERS", "SurvivorSampler", "TuneSettings", "await_others", "confirm",
           "confirmation_slots", "default_top_k", "grid_order", "heartbeat_recorded", "last_step_time", "open_storage",
           "open_study", "reap", "recover", "requeue", "run", "search", "storage_url"]
