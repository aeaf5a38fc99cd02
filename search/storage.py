"""The study in its storage: opening it (`open_storage`, `open_study`) and recovering trials left by
killed tuners (`reap`, `requeue`, `recover`).

Storage: any Optuna RDB URL (``sqlite:///tune.db`` by default; ``postgresql://...`` for many
workers) with a heartbeat, so a trial left RUNNING by a killed tuner is failed after the grace
period and re-queued by ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback``
before Optuna 4.9) on the next run. Several workers share a study safely: the sampler skips
configurations other workers run or queued, and of two trials that still race to the same
configuration the lower-numbered one probes while the other is answered from its result.

Faults: a RUNNING trial whose tuner ran on this host and is gone (its pid is dead) is failed at once
and probed again; one with no worker recorded (killed between ask() and the first heartbeat) after
``--grace-s`` (at most `ORPHAN_S`); one whose tuner (any host) recorded its worker but never a heartbeat,
``--grace-s`` after it started; others by the heartbeat (``--grace-s`` after the last one). Before printing a
result, `run` waits for trials RUNNING
elsewhere (or re-runs them once their tuner is found dead), so no best is printed while a
configuration is unmeasured.

"""

from __future__ import annotations

import time
import warnings

import optuna

from search._base import NOT_FINAL, TuneError
from search.objective import Ledger, TrialRecord, worker_dead
from search.sampler import SurvivorSampler
from search.settings import TuneSettings
from search.space import SearchSpace, config_key, params_of
from search.trial_attrs import TrialAttrs


INPUTS_ATTR = "plantune_inputs"
OPEN_ATTEMPTS = 5


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


__all__ = ["INPUTS_ATTR", "ORPHAN_S", "heartbeat_recorded", "open_storage", "open_study", "reap", "recover", "requeue",
           "storage_url"]
