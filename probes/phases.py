"""Where a probe's wall time goes: rank 0 marks the end of each phase, the launcher adds what it saw.

    >>> marks = PhaseMarks(out)            # probes.train, rank 0: marks.mark("start") ... marks.mark("steps")
    >>> phases_of(read_marks(workdir), spawned=t0, stopped=t1, ended=t2)
    {'launch': 3.1, 'rendezvous': 0.4, 'build': 1.2, 'warmup': 0.6, 'steps': 2.9, 'teardown': 0.8}

Rank 0 writes ``phase-marks.json`` in its probe folder (epoch seconds, rewritten whole after each mark, so a
probe that is killed leaves the marks it reached): ``start`` (its own code runs: Python and torch imported),
``rendezvous`` (process groups initialised), ``build`` (model, optimizer and data on the device), ``warmup``
(the untimed steps done) and ``steps`` (the timed steps done). The launcher knows when it spawned the
probe, when it decided to stop it or saw it end, and when the last process was gone. `phases_of` turns these
into seconds per phase (`probes.result.PHASES`): the phase a probe was in when it was stopped gets the time
up to the stop, everything after that (killing, the result, the exit) is teardown. No torch here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

MARKS_FILE = "phase-marks.json"
MARKS = ("start", "rendezvous", "build", "warmup", "steps")
"""the end of each of the probe's own phases, in order (``start``: the end of launch)"""
LAUNCHED = {"start": "launch", "rendezvous": "rendezvous", "build": "build", "warmup": "warmup", "steps": "steps"}
"""mark -> the phase it ends"""


class PhaseMarks:
    """Rank 0's marks, written to ``out/phase-marks.json`` as they come (a no-op when ``out`` is None)."""

    def __init__(self, out: Path | None) -> None:
        self.path = None if out is None else Path(out) / MARKS_FILE
        self.marks: dict[str, float] = {}

    def mark(self, name: str, at: float | None = None) -> None:
        if name not in MARKS:
            raise ValueError(f"unknown phase mark {name!r}; one of {MARKS}")
        self.marks[name] = time.time() if at is None else at
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.marks))
            os.replace(tmp, self.path)


def read_marks(workdir: Path) -> dict[str, float]:
    """The marks rank 0 left in ``workdir`` ({} when none: it never got to its own code)."""
    try:
        raw = json.loads((Path(workdir) / MARKS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in raw.items() if k in MARKS and isinstance(v, (int, float))}


def phases_of(marks: dict[str, float], *, spawned: float, stopped: float, ended: float,
              queue_s: float = 0.0) -> dict[str, float]:
    """Seconds per phase of one probe: ``spawned`` when the launcher started it (after any queue), ``stopped``
    when the launcher saw it end or decided to stop it, ``ended`` when its last process was gone (epoch seconds);
    ``queue_s`` the wait for an allocation before ``spawned``. Phases sum to queue + (ended - spawned)."""
    out = {"queue": max(queue_s, 0.0)}
    last = spawned
    for name in MARKS:
        at = marks.get(name)
        if at is None or at < last:
            out[LAUNCHED[name]] = max(min(stopped, ended) - last, 0.0)
            last = max(min(stopped, ended), last)
            break
        at = min(at, ended)
        out[LAUNCHED[name]] = at - last
        last = at
    out["teardown"] = max(ended - last, 0.0)
    return out


__all__ = ["LAUNCHED", "MARKS", "MARKS_FILE", "PhaseMarks", "phases_of", "read_marks"]
