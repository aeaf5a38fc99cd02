"""Where probes run: the `ProbeBackend` interface and `LocalBackend` (torchrun on this machine).

    >>> from probes.backend import LocalBackend
    >>> result = LocalBackend(nproc=2).run(spec, workdir=Path("runs/probe-0001"), timeout_s=120)

A backend takes a `ProbeSpec`, a folder it owns, and a wall-clock limit, and always returns a
`ProbeResult` (ok | oom | timeout | crash | invalid); it never raises for a failed probe and
never leaves a process behind. The SLURM backend (probes/slurm.py) subclasses `ProbeBackend`
and wraps `probes.launch.torchrun_argv` in srun. No torch import here.
"""

from __future__ import annotations

import abc
from pathlib import Path

from probes.extent import probe_world
from probes.launch import run_local
from probes.result import ProbeResult, ProbeSpec
from probes.steps import OnStep
from probes.warm import WarmWorkers


class ProbeBackend(abc.ABC):
    """Where one probe runs: this machine (`LocalBackend`), a SLURM allocation (probes.slurm.SlurmBackend), the user's
    own Megatron command on either (probes.megatron.MegatronProbe), or a table of earlier measurements
    (search.replay.ReplayBackend). The contract every one keeps (tests/test_backend_contract.py):

    - `run` returns a `ProbeResult` whose status is one of ok | oom | timeout | crash | invalid; it does not raise
      for a configuration that fails or cannot run (that is ``invalid`` with a reason), only for a backend that
      cannot work at all (`search.BackendError` and the like);
    - an ``ok`` result has a finite step time > 0 (``step_time_median_s``), samples per second > 0, the number of
      ranks that ran (``world_size`` >= 1), its wall time (``wall_s``) and a ``device`` description;
    - any other result has a one-line ``reason``;
    - no process it started outlives `run` -- except warm workers (`LocalBackend` given `probes.warm.WarmWorkers`,
      `probes.slurm.SlurmBackend` with ``warm=True``), which serve the next probe and end at the backend's
      ``close``, at a failed probe, or with the tuner.
    """

    name = "base"
    reports_steps = False
    """True: `run` also takes ``on_step`` (`probes.steps.OnStep`), calls it with each timed step as it comes,
    and stops the probe with status ``pruned`` when it returns a reason"""

    @abc.abstractmethod
    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        """One probe of ``spec`` in ``workdir`` (the backend's to write), stopped after ``timeout_s`` seconds."""


class LocalBackend(ProbeBackend):
    """torchrun with ``nproc`` processes on this machine (default: the candidate's TP*CP*PP*DP).

    ``warm``: run the probes in these warm workers (`probes.warm.WarmWorkers`: consecutive probes of one world size
    share processes; ``env`` is then set per probe in the workers' environment) instead of a torchrun each."""

    name = "local"
    reports_steps = True

    def __init__(self, nproc: int | None = None, *, env: dict | None = None, warm: WarmWorkers | None = None) -> None:
        self.nproc = nproc
        self.env = dict(env or {})
        self.warm = warm

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float, on_step: OnStep | None = None) -> ProbeResult:
        nproc = self.nproc if self.nproc is not None else probe_world(spec)
        if self.warm is not None:
            return self.warm.run(spec, nproc=nproc, workdir=Path(workdir), timeout_s=timeout_s, env=self.env,
                                 on_step=on_step)
        return run_local(spec, nproc=nproc, workdir=Path(workdir), timeout_s=timeout_s, env=self.env, on_step=on_step)

    def close(self) -> None:
        """Stop the warm workers, if any."""
        if self.warm is not None:
            self.warm.close()


__all__ = ["LocalBackend", "ProbeBackend"]
