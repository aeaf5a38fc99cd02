"""A signal that lands inside a write to the study's storage stops `tune` after the write, not in it.

The signal is raised from inside SQLAlchemy's execution of optuna's own write (an `after_cursor_execute` listener on
the storage's engine), on a real SQLite storage: the one moment that broke a SIGTERM test in a loaded full suite.
"""

from __future__ import annotations

import signal
import sys
import threading

import optuna
import pytest
from sqlalchemy import event

from search.interrupts import Terminated, deferred_interrupts, in_storage_write

HANG_S = 120
"""only stops a hung test: the kept signal is raised ~20 ms after the write returns"""


@pytest.fixture(autouse=True)
def _signals_as_at_a_terminal():
    """Ctrl-C live and SIGTERM at its default, as `tune` started from a shell has them, whatever an earlier test or
    library left in this xdist worker: two loaded full-suite runs (2026-11-29) ran this module where SIGINT was not
    Python's handler, and deferred_interrupts leaves such a SIGINT alone, so the SIGINT case failed or waited HANG_S."""
    previous = {s: signal.signal(s, h) for s, h in ((signal.SIGINT, signal.default_int_handler),
                                                    (signal.SIGTERM, signal.SIG_DFL))}
    yield
    for s, h in previous.items():
        signal.signal(s, h)


def _study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    return optuna.create_study(storage=storage, study_name="s"), storage.engine


def _signal_inside_the_write(engine, signum, statement_part, count=1):
    """Send ``signum`` ``count`` times to this process from inside SQLAlchemy when it first executes a statement
    containing ``statement_part`` (before the commit)."""
    sent = []

    def listener(conn, cursor, statement, *args):  # noqa: ARG001
        if statement_part in statement and not sent:
            for _ in range(count):
                sent.append(in_storage_write(sys._getframe()))
                signal.raise_signal(signum)

    event.listen(engine, "after_cursor_execute", listener)
    return sent


@pytest.mark.parametrize("signum,exc", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_inside_a_storage_write_waits_for_the_write(tmp_path, signum, exc):
    study, engine = _study(tmp_path)
    trial = study.ask()
    sent = _signal_inside_the_write(engine, signum, "UPDATE trials")
    with deferred_interrupts(), pytest.raises(exc):
        study.tell(trial, 1.5)                  # the signal lands inside this write ...
        assert sent == [True]                  # ... which returned whole; the signal is raised right after
        threading.Event().wait(HANG_S)
    told = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials[0]
    assert told.state.name == "COMPLETE" and told.value == 1.5
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL           # the handlers are put back


def test_a_second_signal_of_a_kind_is_raised_at_once(tmp_path):
    """A stuck write never makes tune unstoppable: SIGTERM twice inside one write raises inside it."""
    study, engine = _study(tmp_path)
    trial = study.ask()
    sent = _signal_inside_the_write(engine, signal.SIGTERM, "UPDATE trials", count=2)
    with deferred_interrupts(), pytest.raises((Terminated, optuna.exceptions.StorageInternalError)):
        study.tell(trial, 1.5)
    assert sent == [True, True]


def test_a_signal_kept_when_the_run_ends_is_raised_not_lost(tmp_path):
    """The last write of a run: the run returns before the timer looks again, and the signal still stops tune."""
    study, engine = _study(tmp_path)
    trial = study.ask()
    _signal_inside_the_write(engine, signal.SIGTERM, "UPDATE trials")
    with pytest.raises(Terminated), deferred_interrupts():
        study.tell(trial, 1.5)
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials[0].state.name == "COMPLETE"


def test_outside_a_write_the_signal_is_raised_where_it_lands():
    with deferred_interrupts(), pytest.raises(Terminated):
        assert not in_storage_write(sys._getframe())
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("not reached: the handler raises")


def test_without_the_deferral_the_same_signal_breaks_optunas_tell(tmp_path):
    """What the deferral prevents (the failure it was written for): the exception raised inside the write leaves
    optuna unable to record the trial."""
    study, engine = _study(tmp_path)
    trial = study.ask()

    def raise_terminated(signum, frame):  # noqa: ARG001
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        _signal_inside_the_write(engine, signal.SIGTERM, "UPDATE trials")
        with pytest.raises((Terminated, optuna.exceptions.StorageInternalError)):
            study.tell(trial, 1.5)
    finally:
        signal.signal(signal.SIGTERM, previous)
    told = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials[0]
    assert told.state.name == "RUNNING"


def test_an_ignored_ctrl_c_stays_ignored():
    """A tuner started with SIGINT ignored (`nohup`, `cmd &`) keeps it ignored inside and after the deferral."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)        # ignored: nothing raised
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
