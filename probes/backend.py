"""Where probes run: the `ProbeBackend` interface and `LocalBackend` (torchrun on this machine).

    >>> from probes.backend import LocalBackend
    >>> result = LocalBackend(nproc=2).run(spec, workdir=Path("runs/probe-0001"), timeout_s=120)

A backend takes a `ProbeSpec`, a folder it owns, and a wall-clock limit, and always returns a
`ProbeResult` (ok | oom | timeout | crash | invalid); it never raises for a failed probe and
never leaves a process behind. The SLURM backend (probes/slurm.py) subclasses `ProbeBackend`
and wraps `probes.launch.torchrun_argv` in srun. No torch import here.
"""

from __future__ import annotations

from pathlib import Path

from probes.extent import probe_world
from probes.launch import run_local
from probes.result import ProbeResult, ProbeSpec


class ProbeBackend:
    """Runs one probe. Subclasses implement `run`."""

    name = "base"

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        raise NotImplementedError(f"{type(self).__name__}.run")


class LocalBackend(ProbeBackend):
    """torchrun with ``nproc`` processes on this machine (default: the candidate's TP*CP*PP*DP)."""

    name = "local"

    def __init__(self, nproc: int | None = None, *, env: dict | None = None) -> None:
        self.nproc = nproc
        self.env = dict(env or {})

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        nproc = self.nproc if self.nproc is not None else probe_world(spec)
        return run_local(spec, nproc=nproc, workdir=Path(workdir), timeout_s=timeout_s, env=self.env)


__all__ = ["LocalBackend", "ProbeBackend"]
