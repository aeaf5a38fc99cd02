"""Ctrl-C and SIGTERM stop `tune` between two writes to the study's storage, never inside one.

Python raises a signal's exception wherever the main thread is. Inside a commit to the study's database
(SQLAlchemy, sqlite3, psycopg, optuna's storages) that leaves the session half-written: optuna's next write then
fails (`StorageInternalError`), the interrupted trial is never told, and `tune` ends with a traceback and exit 1
instead of the trial recorded "interrupted" and exit 130 / 143. That happened once in a full suite run on a loaded
2-core machine (tests/test_tune_local.py::test_sigterm_records_the_trial_interrupted_and_exits_143, 2026-11-28):
a probe reports every timed step to the study, so a signal often lands in a write.

Under `deferred_interrupts()` a signal that lands inside such a write is kept and raised as soon as the write has
returned (a SIGALRM timer looks again every `RETRY_S`); a second signal of the same kind while one waits is raised
at once, so a stuck database never makes `tune` unstoppable.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

RETRY_S = 0.02
"""how often a kept signal looks again whether the storage write it landed in has returned"""
STORAGE_CODE = ("/sqlalchemy/", "/optuna/storages/", "/sqlite3/", "/psycopg2/", "/psycopg/")
"""source folders of the code that writes the study: a signal landing under any of them waits"""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a SLURM time limit, `kill`): stops the tuner like Ctrl-C, recorded with its own message."""


def in_storage_write(frame: FrameType | None) -> bool:
    """Whether ``frame`` or any frame that called it runs the study's storage code."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if any(part in name for part in STORAGE_CODE):
            return True
        frame = frame.f_back
    return False


class _Keeper:
    """The signal handlers: raise, or keep the signal until the storage write returns."""

    def __init__(self) -> None:
        self.kept: type[KeyboardInterrupt] | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        exc = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        if self.kept is exc or not in_storage_write(frame):     # the second of a kind, or a safe place: now
            self._raise(exc)
        self.kept = self.kept or exc
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self.kept is None:
            return
        if in_storage_write(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        self._raise(self.kept)

    def _raise(self, exc: type[KeyboardInterrupt]) -> None:
        self.kept = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise exc()


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt and SIGTERM `Terminated`, never inside a storage write (main thread only)."""
    keeper = _Keeper()
    handlers = {signal.SIGTERM: keeper.on_signal, signal.SIGALRM: keeper.on_alarm}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # not where the shell made Ctrl-C ignored
        handlers[signal.SIGINT] = keeper.on_signal
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in previous.items():
            signal.signal(s, h)
    if keeper.kept is not None:            # kept in the run's last write: raised, not lost
        raise keeper.kept()
