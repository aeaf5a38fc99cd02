"""`Progress`: what a running tune says on stderr, a line per trial and one live line while a probe runs.
"""

from __future__ import annotations

import os
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
INDENT = " " * 7
"""continuation rows of a folded line start under the text after ``[tune] ``"""
BRIEF_ORDER = ("tp", "pp", "cp", "ep", "etp", "vpp", "dp", "mbs", "recompute", "zero", "sp", "hybrid")
BRIEF_DEFAULTS = {"recompute": "none", "zero": "0", "sp": "0", "hybrid": "0", "cp": "1", "ep": "1", "etp": "1",
                  "vpp": "1", "offload": "", "opt_offload": "0"}


def brief(config: str) -> str:
    """A configuration for a narrow line: the degrees first (tp, pp, cp, ep, vpp), then dp, mbs and what differs from
    the defaults (recompute=none, zero=0); gas, which GBS / (mbs x dp) gives, left out.
    ``tp=8,pp=16,dp=2,mbs=1,gas=64,recompute=full,zero=1,vpp=4,cp=16,ep=8`` ->
    ``tp=8,pp=16,cp=16,ep=8,vpp=4,dp=2,mbs=1,recompute=full,zero=1``."""
    items = dict(part.split("=", 1) for part in config.split(",") if "=" in part)
    items.pop("gas", None)
    keep = [k for k in BRIEF_ORDER if k in items and BRIEF_DEFAULTS.get(k) != items[k]]
    keep += [k for k in items if k not in BRIEF_ORDER and BRIEF_DEFAULTS.get(k) != items[k]]
    return ",".join(f"{k}={items[k]}" for k in keep)


def clock(seconds: float) -> str:
    """M:SS under an hour, else H:MM:SS (the narrow line's times)."""
    s = max(0, int(seconds))
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else hms(s)


def fold(line: str, width: int) -> str:
    """``line`` in rows of at most ``width`` characters, broken after a ' ' or ',' (continuations indented by
    `INDENT`): a permanent line on a narrow terminal, where the terminal's own wrap would split a configuration or a
    number anywhere."""
    width = max(width, len(INDENT) + 20)      # a terminal too narrow to fold into: rows of 27, the terminal wraps
    rows, rest = [], line
    while len(rest) > width:
        cut = max(rest.rfind(" ", 0, width), rest.rfind(",", 0, width - 1) + 1)
        if cut <= len(INDENT):            # one unbroken word longer than the row: cut it where the row ends
            cut = width
        rows.append(rest[:cut].rstrip())
        rest = INDENT + rest[cut:].lstrip()
    rows.append(rest)
    return "\n".join(rows)


def terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to: $COLUMNS, else the stream's own terminal (stderr may be the
    terminal while stdout is piped), else stdout's, else `LIVE_WIDTH`."""
    columns = shutil.get_terminal_size((0, 0)).columns if "COLUMNS" in os.environ else 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = shutil.get_terminal_size((LIVE_WIDTH, 24)).columns
    return columns if columns > 0 else LIVE_WIDTH
STEP_MARK = "[probe] step "
"""the line probes.train's rank 0 prints after each timed step: ``[probe] step N 0.123456 s``"""


def last_step_time(workdir: Path | None) -> tuple[int, float] | None:
    """(step, seconds) of the latest timed step rank 0 of a running probe printed, or None."""
    if workdir is None:
        return None
    for log in sorted(Path(workdir).glob("logs/*/attempt_*/0/stdout.log")):
        tail = _tail(log, 4096)
        if tail is None:
            continue
        for line in reversed(tail.splitlines()):
            if line.startswith(STEP_MARK):
                try:
                    step, seconds = line[len(STEP_MARK):].split()[:2]
                    return int(step), float(seconds)
                except ValueError:
                    break
    return _last_framework_step(Path(workdir) / "torchrun.stdout")


def _tail(log: Path, size: int) -> str | None:
    """The last ``size`` bytes of ``log`` as text, or None when it cannot be read (not written yet)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _last_framework_step(log: Path) -> tuple[int, float] | None:
    """(iteration, seconds) of the latest iteration line a Megatron probe printed (probes.megatron: torchrun's
    ``--tee`` output in the probe folder), or None."""
    tail = _tail(log, 8192)
    if tail is None:
        return None
    from probes.megatron import parse_iteration_line

    for line in reversed(tail.splitlines()):
        it = parse_iteration_line(line)
        if it is not None:
            return it.iteration, it.step_time_s
    return None


class Progress:
    """Progress on stderr. A line per finished trial; while a probe runs, on a terminal a line naming the probe and
    its layout, then one live line redrawn every second whose changing fields come first (elapsed vs the probe's
    timeout, the latest step time, best so far, budget left; then which probe) and which is made to fit the
    terminal's width field by field (`probe_line`); in a log (not a terminal) the whole line when the probe starts and
    then every ``log_every_s``. On a terminal narrower than a line, permanent lines are folded (`fold`), never cut."""

    def __init__(self, *, total: int, budget_s: float | None, stream: TextIO | None = None,
                 enabled: bool = True, max_probes: int | None = None, planned: int | None = None,
                 probe_timeout_s: float | None = None, log_every_s: float = 60.0, program: str = "") -> None:
        self.total = total
        self.budget_s = budget_s
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.max_probes = max_probes
        self.planned = planned
        self.probe_timeout_s = probe_timeout_s
        self.program = program
        """what measures the probes (search.probe_choice), named on each probe's line; "" names nothing"""
        self.started = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.tick_s = 1.0 if self.tty else log_every_s
        self.done = 0
        self.probes = 0
        self.spent = False
        self.top: tuple[float, str] | None = None
        """(median TFLOPs, configuration) of the best so far, by the table's rule (`search.report.best`)"""
        self._live = False
        self._lock = threading.Lock()
        self._current: tuple | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def best(self) -> str:
        """The best so far in words (the per-trial lines' and the log's form)."""
        return "" if self.top is None else f"best {self.top[0]:.4g} TFLOPs/GPU ({short(self.top[1])})"

    def remaining_s(self) -> float | None:
        if self.budget_s is None:
            return None
        return 0.0 if self.spent else self.budget_s - self.elapsed_s

    def spend(self) -> None:
        """The budget is over (a probe was stopped at its end), whatever the clock says."""
        self.spent = True

    def status(self, *, narrow: bool = False) -> str:
        left = self.remaining_s()
        best = self.best if not narrow or self.top is None else f"best {self.top[0]:.4g} ({brief(self.top[1])})"
        budget = "" if left is None else f", {hms(left)} {'left' if narrow else 'of the budget left'}"
        return " | ".join([f"{self.done}/{self.total} configs", best or "no measurement yet",
                           f"{hms(self.elapsed_s)} elapsed{budget}"])

    def update(self, ledger: Ledger, space: SearchSpace, last: TrialRecord | None = None) -> None:
        self.done = len(ledger.done_keys(space) & set(space.keys))
        self.probes = sum(1 for r in ledger.records if r.counted)
        top = best(summarize(ledger.records))     # the one rule the table and the final line use
        if top is not None:
            self.top = (top.median_tflops, top.config)
        if last is not None:
            self._write(self.result_line(last, self._width() if self.tty else None), live=False)

    def result_line(self, last: TrialRecord, width: int | None = None) -> str:
        """A finished trial: one line in a log; on a terminal narrower than it, the trial (configuration in `brief`
        form) and the study's status, folded to ``width``."""
        what = f"{last.value:.4g} TFLOPs/GPU" if last.state == "COMPLETE" and last.value is not None else \
            (last.reason[:160] or last.state)
        wall = last.attrs.get("probe_wall_s")
        took = f" ({wall:.0f} s)" if isinstance(wall, (int, float)) and wall >= 1 else ""
        said = last.outcome or last.state
        line = f"[tune] trial {last.number} {last.phase} {short(last.config or '?')}: {_outcome(said, what)}{took}" \
               f" | {self.status()}"
        if width is None or len(line) <= width:
            return line
        if not (last.state == "COMPLETE" and last.value is not None):
            what = last.reason or last.state       # folded, so whole: a reason's fix is at its end
        head = f"[tune] trial {last.number} {last.phase} {brief(last.config or '?')}:"
        folded = fold(f"{head} {_outcome(said, what)}{took}", width)
        return folded + "\n" + fold(INDENT + self.status(narrow=True), width)

    def note(self, text: str) -> None:
        line = f"[tune] {text}"
        self._write(fold(line, self._width()) if self.tty else line, live=False)

    def _of(self) -> str:
        if self.max_probes is not None:
            return f" of {self.max_probes}"
        return f" of at most {self.planned}" if self.planned else ""

    def start_line(self, width: int | None = None) -> str:
        """The probe that starts and its layout (a terminal's permanent line above the live one)."""
        if self._current is None:
            return ""
        number, label, _, _, _ = self._current
        by = f" by {self.program}" if self.program else ""
        line = f"[tune] probe {self.probes + 1}{self._of()}: trial {number} {short(label or '?')}{by}"
        if width is None or len(line) <= width:
            return line
        return fold(f"[tune] probe {self.probes + 1}{self._of()}: trial {number} {brief(label or '?')}", width)

    def probe_line(self, width: int | None = None) -> str:
        """The live line: what changes first (elapsed vs the timeout, the latest step time, best so far, budget
        left), then which probe. Made to fit ``width`` by shorter forms field by field: the best's configuration
        goes first, then words ("0:01:23 of 0:10:00" -> "1:23/10:00", "TFLOPs/GPU" -> "TF/GPU"), then the probe's
        layout is cut ("…"); the changing fields are cut only on a terminal too narrow even for them."""
        if self._current is None:
            return ""
        number, label, started, timeout_s, workdir = self._current
        ran = time.monotonic() - started
        step = last_step_time(workdir)
        left = self.remaining_s()
        n = f"{self.probes + 1}{self._of()}"
        full = [f"{hms(ran)} of {hms(timeout_s)}" if timeout_s else f"{hms(ran)} elapsed",
                f"step {step[0]}: {step[1]:.3g} s" if step else "no timed step yet",
                self.best or "no measurement yet",
                *([f"{hms(left)} of the budget left"] if left is not None else []),
                f"probe {n}: trial {number} {short(label or '?')}" + (f" by {self.program}" if self.program else "")]
        line = "[tune] " + " | ".join(full)
        if width is None or len(line) <= width:
            return line
        full[2] = f"best {self.top[0]:.4g} TFLOPs/GPU" if self.top else full[2]
        full[-1] = f"probe {n}: trial {number} {brief(label or '?')}"
        line = "[tune] " + " | ".join(full)
        if len(line) <= width:
            return line
        n_of = f"{self.probes + 1}/{self.max_probes or self.planned}" if (self.max_probes or self.planned) else \
            f"{self.probes + 1}"
        compact = [f"{clock(ran)}/{clock(timeout_s)}" if timeout_s else f"{clock(ran)} elapsed",
                   f"step {step[0]} {step[1]:.3g}s" if step else "no step yet",
                   f"best {self.top[0]:.4g} TF/GPU" if self.top else "no best yet",
                   *([f"{hms(left)} left"] if left is not None else [])]
        head = "[tune] " + " | ".join(compact) + " | "
        tail = f"#{n_of} trial {number} {brief(label or '?')}"      # the start line above names it in full
        if len(head) + len(tail) > width:
            tail = f"trial {number} {brief(label or '?')}"
        room = width - len(head)
        if room >= len(tail):
            return head + tail
        if room >= 2:
            return head + tail[:room - 1] + "…"
        return (head.rstrip(" |"))[:max(width - 1, 1)] + "…"

    def probing(self, number: int, label: str, *, timeout_s: float | None = None, workdir=None) -> None:
        """A probe starts: on a terminal its start line, then the live line redrawn until `probe_ended`; in a log
        the whole line now and every ``log_every_s``."""
        self.probe_ended()
        self._current = (number, label, time.monotonic(), timeout_s, workdir)
        if not self.enabled:
            return
        if self.tty:
            self._write(self.start_line(self._width()), live=False)
            self._write(self.probe_line(self._width()), live=True)
        else:
            self._write(self.probe_line(), live=False)
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="tune-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            line = self.probe_line(self._width() if self.tty else None)
            if line:
                self._write(line, live=self.tty)

    def probe_ended(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
        self._current = None

    def _width(self) -> int:
        """The usable width of a terminal row: its columns less one (a line that fills the last column makes some
        terminals wrap, and "\r" would then redraw only the last row)."""
        return terminal_width(self.stream) - 1

    def _write(self, line: str, *, live: bool) -> None:
        if not self.enabled:
            return
        if live:                # a live line longer than the terminal wraps, and "\r" then redraws only its last row
            width = self._width()
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


__all__ = ["LIVE_WIDTH", "Progress", "STEP_MARK", "brief", "clock", "fold", "hms", "last_step_time",
           "terminal_width"]


def _outcome(said: str, what: str) -> str:
    """The outcome and what it measured or why, the outcome said once ("pruned after 1 timed step: ...", not
    "pruned pruned after ...")."""
    return what if what.split(" ", 1)[0].rstrip(":") == said else f"{said} {what}"
