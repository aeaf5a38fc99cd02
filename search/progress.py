"""`Progress`: what a running tune says on stderr, a line per trial and one live line while a probe runs.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from search.objective import Ledger, TrialRecord
from search.report import best, short, summarize
from search.space import SearchSpace


def hms(seconds: float) -> str:
    """H:MM:SS."""
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
                           f"{hms(self.elapsed_s)} elapsed" + (f", {hms(left)} of the budget left"
                                                                if left is not None else "")])

    def update(self, ledger: Ledger, space: SearchSpace, last: TrialRecord | None = None) -> None:
        self.done = len(ledger.done_keys(space) & set(space.keys))
        self.probes = sum(1 for r in ledger.records if r.counted)
        top = best(summarize(ledger.records))     # the one rule the table and the final line use
        if top is not None:
            self.best = f"best {top.median_tflops:.4g} TFLOPs/GPU ({short(top.config)})"
        if last is not None:
            what = f"{last.value:.4g} TFLOPs/GPU" if last.state == "COMPLETE" and last.value is not None else \
                (last.reason[:160] or last.state)
            wall = last.attrs.get("probe_wall_s")
            self._write(f"[tune] trial {last.number} {last.phase} {short(last.config or '?')}: "
                        f"{last.outcome or last.state}"
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
        parts = [f"[tune] probe {n}{self._of()}: trial {number} {short(label or '?')}",
                 f"{hms(time.monotonic() - started)} of {hms(timeout_s)}" if timeout_s else
                 f"{hms(time.monotonic() - started)} elapsed"]
        step = last_step_time(workdir)
        parts.append(f"step {step[0]}: {step[1]:.3g} s" if step else "no timed step yet")
        parts.append(self.best or "no measurement yet")
        left = self.remaining_s()
        if left is not None:
            parts.append(f"{hms(left)} of the budget left")
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


__all__ = ["LIVE_WIDTH", "Progress", "STEP_MARK", "hms", "last_step_time"]
