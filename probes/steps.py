"""Timed steps as a running probe reports them, and the callback that may stop it early.

    >>> watch = StepWatch(on_step, StepTail(workdir))     # on_step(index, seconds) -> reason to stop, or None
    >>> run_with_timeout(argv, ..., watch=watch)         # polls watch(); a reason stops the probe (pruned)

`probes.train`'s rank 0 prints ``[probe] step N 0.123456 s`` after each timed step (`STEP_MARK`); torchrun
writes it to ``logs/<run>/attempt_0/0/stdout.log`` in the probe's folder (probes.launch). `StepTail` reads the
complete lines added to that file since its last read. `StepWatch` hands each new timed step to the backend's
``on_step`` callback (the tuner's pruner, `search.objective`) with its index among the timed steps (0, 1, ...),
and keeps the steps seen and the reason the callback gave for stopping. No torch here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

STEP_MARK = "[probe] step "
"""what probes.train's rank 0 prints after each timed step: ``[probe] step N 0.123456 s``"""
RANK0_STDOUT = "logs/*/attempt_*/0/stdout.log"
"""torchrun's copy of rank 0's stdout under a probe folder (torchrun_argv(log_dir=workdir / "logs"))"""

OnStep = Callable[[int, float], Optional[str]]
"""on_step(index among the timed steps, seconds) -> a one-line reason to stop the probe now, or None"""


def parse_step(line: str) -> tuple[int, float] | None:
    """(step, seconds) of a `STEP_MARK` line, or None for any other line."""
    if not line.startswith(STEP_MARK):
        return None
    try:
        step, seconds = line[len(STEP_MARK):].split()[:2]
        return int(step), float(seconds)
    except ValueError:
        return None


class StepTail:
    """The timed steps rank 0 of a probe in ``workdir`` printed since the last `read` (complete lines only)."""

    def __init__(self, workdir: Path, pattern: str = RANK0_STDOUT) -> None:
        self.workdir = Path(workdir)
        self.pattern = pattern
        self.path: Path | None = None
        self.offset = 0

    def read(self) -> list[tuple[int, float]]:
        if self.path is None:
            found = sorted(self.workdir.glob(self.pattern))
            if not found:
                return []
            self.path = found[0]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        steps = []
        for line in chunk[:end].decode(errors="replace").splitlines():
            parsed = parse_step(line.strip())
            if parsed is not None:
                steps.append(parsed)
        return steps


class StepWatch:
    """Polled while a probe runs: passes new timed steps to ``on_step``; returns (and keeps) its reason to stop."""

    def __init__(self, on_step: OnStep, tail: StepTail) -> None:
        self.on_step = on_step
        self.tail = tail
        self.steps: list[float] = []
        self.stop_reason: str | None = None

    def __call__(self) -> str | None:
        if self.stop_reason is not None:
            return self.stop_reason
        for _, seconds in self.tail.read():
            self.steps.append(seconds)
            reason = self.on_step(len(self.steps) - 1, seconds)
            if reason:
                self.stop_reason = reason
                return reason
        return None


__all__ = ["OnStep", "RANK0_STDOUT", "STEP_MARK", "StepTail", "StepWatch", "parse_step"]
