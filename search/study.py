"""The tune study's run: the search over the planner's survivors, then confirmation re-probes.

    >>> from search.study import run
    >>> study = open_study(settings, space, inputs)                           # search.storage
    >>> run(study, objective, space, settings, Progress(total=len(space), budget_s=7200))   # search, confirm

The parts: `search.settings` (TuneSettings), `search.sampler` (which survivor next), `search.storage`
(storage, stale-trial recovery), `search.progress` (what it says while it runs).

Limits (`run`): ``--budget`` is this run's wall-clock time, every probe included: no probe starts after
it, a probe still running at its end is stopped and recorded ``interrupted`` (probed again by the next
run), and the search stops early enough to leave the confirmation re-probes their share (their count
x the mean probe time, at most half the budget); time left after confirming goes back to the search.
``--max-probes`` counts probes that ran (`TrialRecord.counted`) over the whole study, confirmation
re-probes included, with the same share (at most half) kept for confirmation.
"""

from __future__ import annotations

import time
import warnings

import optuna
from optuna.trial import TrialState

from search import pruning
from search.accounting import gpu_seconds
from search._base import PICK_PHASE
from search.objective import RESOURCES_ATTR, WAIT_POLL_S, Ledger, Objective, ProbeFailed, TrialRecord
from search.progress import Progress, hms
from search.report import best, short, summarize
from search.settings import TuneSettings, default_top_k
from search.space import SearchSpace, params_of
from search.storage import reap, recover, requeue
from search.trial_attrs import TrialAttrs


def _confirm_reserve(ledger: Ledger, settings: TuneSettings) -> int:
    """Confirmation re-probes to keep room for: those of the current best still to run, or, before the first
    confirmation, all that --confirm-top x --repeats plans."""
    pending = len(confirmation_slots(ledger, settings.confirm_top, settings.repeats))
    started = any(r.phase == "confirm" for r in ledger.records)
    return max(pending, 0 if started else settings.confirm_top * settings.repeats)


def _mean_probe_s(ledger: Ledger) -> float:
    walls = [float(r.attrs.get("probe_wall_s") or 0.0) for r in ledger.records if r.counted]
    return sum(walls) / len(walls) if walls else 0.0


def gpu_hours_spent(ledger: Ledger, progress: Progress) -> float:
    """GPU-hours the probes of this run held (search.accounting: phase seconds x their GPUs)."""
    run_started = time.time() - progress.elapsed_s - 1.0
    return sum(gpu_seconds([r for r in ledger.records if (r.started or 0.0) >= run_started]).values()) / 3600


def limits_reached(ledger: Ledger, settings: TuneSettings, progress: Progress) -> bool:
    """--max-probes probes ran, or a budget (wall clock, GPU-hours) is spent: nothing more starts."""
    if settings.max_probes is not None and sum(1 for r in ledger.records if r.counted) >= settings.max_probes:
        return True
    if progress.spent:
        return True
    if settings.budget_gpuh is not None and gpu_hours_spent(ledger, progress) >= settings.budget_gpuh:
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


def confirmation_slots(ledger: Ledger, confirm_top: int, repeats: int,
                       prune: bool = False) -> list[tuple[str, int]]:
    """(config, repeat) still to probe: the ``confirm_top`` best measured configurations, ``repeats`` each; with
    ``prune``, not those clearly behind the best (`search.pruning.behind`: a re-probe would be pruned)."""
    if confirm_top <= 0 or repeats <= 0:
        return []
    first = {}
    for r in sorted(ledger.records, key=lambda r: r.number):
        if r.measured and r.phase != "confirm" and r.config not in first:
            first[r.config] = r.value or 0.0
    top = sorted(first, key=lambda k: -first[k])[:confirm_top]
    if prune:
        ref = pruning.reference(ledger.records)
        top = [k for k in top if not pruning.behind(ref, k, first[k])]
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
    prunes = objective.settings.prune and getattr(objective.backend, "reports_steps", False)
    slots = confirmation_slots(ledger, settings.confirm_top, settings.repeats, prune=prunes)
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
                          + ", ".join(f"{r.number} {short(r.config or '?')} on {r.attrs.get('worker', '?')}"
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
    if settings.budget_gpuh is not None:
        objective.gpu_budget = lambda: settings.budget_gpuh * 3600 - gpu_hours_spent(Ledger.of(study), progress) * 3600
    if settings.budget_s is not None or settings.budget_gpuh is not None:
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
    except KeyboardInterrupt:
        progress.close()
        record_pick(study, space)          # the pick of the trials finished so far
        raise
    finally:
        progress.close()
    record_pick(study, space)              # what the table will say, said in the study
    if limits_reached(Ledger.of(study), settings, progress):
        _say_left(study, space, settings, progress)
    return Ledger.of(study).records


PICK_ATTR = "tune_pick"
"""study attribute: tune's pick as the table names it (configuration, median, agreement, the trials measuring it)"""


def record_pick(study: optuna.Study, space: SearchSpace) -> optuna.trial.FrozenTrial | None:
    """Record tune's pick in the study, so that Optuna's own API says what tune says.

    Why a trial of its own: Optuna ranks trials by their value, and a trial's value is frozen when it finishes.
    tune's pick is a verdict over trials: the best median among configurations whose re-probes agree (`best`),
    known only after the re-probes, and often not the highest single probe (one noisy first probe can read
    higher than every re-probe of it). No value a probe's trial could carry when it finishes would keep the pick
    on top honestly, so:

    - every probe's trial carries the constraint `PICK_CONSTRAINT` = 1 (Optuna: infeasible; here: one probe is a
      measurement, not an answer), its value staying the measured TFLOPs (`search.sampler` gives TPE those values
      without the constraint);
    - the pick is one added COMPLETE trial (phase `PICK_PHASE`, no constraint), the configuration's parameters, its
      median as the value, the trials it summarises in its attributes; `Study.best_trial` (the best feasible trial)
      is then this trial; a new one is added only when the pick or its median changes;
    - `PICK_ATTR` on the study holds the same, always the latest.

    optuna-dashboard 0.21's "best trial" box is the highest value whatever the constraints (storage.get_best_trial):
    there the pick is the trial whose phase is ``pick`` (and the study's note, where optuna_dashboard is installed).
    A later pick whose median is below an earlier pick trial's value leaves `Study.best_trial` on the earlier one
    (finished trials cannot change): returned trial != best_trial then, and `tune` says so.
    Returns the pick's trial, or None when nothing was measured (or the pick lies outside this run's space)."""
    records = Ledger.of(study).records
    pick = best(summarize(records))
    if pick is None or space.by_key(pick.config) is None:
        return None
    attrs = TrialAttrs.user_attrs(phase=PICK_PHASE, pick_config=pick.config, median_tflops=pick.median_tflops,
                                  measurements=list(pick.tflops), measured_in_trials=list(pick.trials),
                                  confirmed=pick.confirmed, agreement=pick.agreement)
    study.set_user_attr(PICK_ATTR, attrs)
    picks = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
             if t.user_attrs.get("phase") == PICK_PHASE]
    if picks and all(picks[-1].user_attrs.get(k) == v for k, v in attrs.items()):
        return picks[-1]
    study.add_trial(optuna.trial.create_trial(params=params_of(space.by_key(pick.config).candidate),
                                              distributions=space.distributions(), value=pick.median_tflops,
                                              user_attrs=attrs))
    _note_for_dashboard(study, attrs)
    return study.get_trials(deepcopy=False)[-1]


def pick_line(study: optuna.Study) -> str | None:
    """Where the study records tune's pick, in one line (None before any pick was recorded)."""
    picks = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
             if t.user_attrs.get("phase") == PICK_PHASE]
    if not picks:
        return None
    n = picks[-1].number
    try:
        top = study.best_trial.number
    except ValueError:
        top = None
    if top == n:
        return (f"the study records this pick as trial {n}: Optuna's best_trial (optuna.load_study(...).best_trial); "
                "in optuna-dashboard the trial whose phase is pick")
    return (f"the study records this pick as trial {n}, but Optuna's best_trial is trial {top}, an earlier pick "
            "whose median was higher (a finished trial cannot change); trust trial " + str(n))


def _note_for_dashboard(study: optuna.Study, attrs: dict) -> None:
    """The pick at the top of the study's page in optuna-dashboard (its public save_note), when it is installed."""
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    save_note(study, f"**tune's pick**: `{attrs['pick_config']}`, {attrs['median_tflops']:.4g} model TFLOPs/GPU "
                     f"measured ({attrs['agreement']}); the trial whose phase is `pick`. The best-trial box shows "
                     "the highest single probe, which re-probes may not have confirmed.")


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
    gpuh = gpu_hours_spent(ledger, progress)
    which = (f"--max-probes {settings.max_probes} reached ({counted} probes)"
             if settings.max_probes is not None and counted >= settings.max_probes else
             f"--budget {settings.budget_gpuh:g}gpuh spent ({gpuh:.3g} GPU-h)"
             if settings.budget_gpuh is not None and (gpuh >= settings.budget_gpuh or settings.budget_s is None) else
             f"--budget {hms(settings.budget_s or 0)} spent")
    if left:
        progress.note(f"{which}; {len(left)} configuration(s) not probed yet: rerun the same command with a larger "
                      "limit to continue the study")


__all__ = ["PICK_ATTR", "await_others", "confirm", "confirmation_slots", "limits_reached", "pick_line", "record_pick",
           "run", "search"]
