"""Warm workers: consecutive probes of the same world size run in the same worker processes (no torch here).

    >>> workers = WarmWorkers()
    >>> workers.run(spec, nproc=2, workdir=Path("runs/trial-0000"), timeout_s=120)   # starts a pool of 2
    >>> workers.run(spec2, nproc=2, workdir=Path("runs/trial-0001"), timeout_s=120)  # same processes
    >>> workers.close()

A `WarmPool` is ``nproc`` workers (``probes.train --serve FOLDER``: `probes.warm_worker`) forked by one
`probes.forkserver` process, which imports torch once for them all (torchrun would start a Python and torch per
rank: ~5.5 s of CPU each on the test machine), started behind a lifeline like a one-shot probe's torchrun
(`probes.launch.run_with_timeout`), so the chain tuner -> fork server -> workers still dies whenever a link is
killed, between probes too. A probe is handed over as
``FOLDER/job-N.json`` (renamed into place whole); the pool answers in the probe's own folder with the files a
one-shot probe leaves there (pid files, phase marks, result.json or error records, the ranks' logs under
``logs/``) and, once each rank has released the probe's memory, ``FOLDER/done-N-rank{r}.json``. The tuner
waits for events: those files, the launcher (fork server, or srun) ending, the probe's deadline (polled every
`POLL_S`, as the one-shot launcher does). The result is classified by `probes.outcome.classify` as a one-shot probe's.

A pool is retired -- its processes stopped, the next probe starts fresh workers -- after a probe that did not end
cleanly (an OOM or a crash ends the failing worker and the fork server the rest; a timeout kills them), when a rank
reports memory not released (`RELEASE_SLACK_BYTES`), when the world size or the device kind
changes, when it is used from another thread than the one that started it (the lifeline follows the thread),
and at `close`. A probe stopped early (pruned) is stopped cooperatively: ``FOLDER/stop-N``, every rank leaves
after the same step, and the pool serves the next probe; one that does not leave by the probe's deadline is
killed like a hung one.

The launcher is a hook of `WarmPool` (`_argv`, `_tracker`, `_stop`, `launch_extra`): on the SLURM backend,
`probes.slurm.SlurmWarmPool` starts the workers as one srun step on a node slice, stops them by scancel'ing it
and gives the slice back; everything above is the same there (`WarmWorkers` takes its ``start``).

Phases (`probes.phases`): the pool's first probe counts from the pool's start (launch and rendezvous are its);
a later one from the moment its job was written, so its launch and rendezvous are the hand-over and a barrier,
and its teardown ends when every rank has released its memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from probes import lifeline
from probes.launch import (POLL_S, REPO_ROOT, ProcessTracker, collect_rank_logs, prepare_workdir, probe_env,
                           refuse_invalid, stop_processes)
from probes.outcome import classify
from probes.phases import phases_of, read_marks
from probes.result import ProbeResult, ProbeSpec
from probes.steps import OnStep, StepTail, StepWatch


RELEASE_SLACK_BYTES = 256 << 20
"""a rank whose memory after a probe's release is more than this above the pool's baseline (the level before its
first probe) keeps something alive: the pool is retired (on CPU the resident set grew 20-27 MiB over the first
probes of tests/test_warm.py, lazily loaded code and allocator pools; CUDA allocations go back to the baseline)"""


def job_path(pool: Path, n: int) -> Path:
    return pool / f"job-{n}.json"


def stop_path(pool: Path, n: int) -> Path:
    return pool / f"stop-{n}"


def done_path(pool: Path, n: int, rank: int) -> Path:
    return pool / f"done-{n}-rank{rank}.json"


def write_atomic(path: Path, text: str) -> None:
    """``text`` in ``path``, appearing whole (written aside, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def not_released(done: list[dict]) -> str | None:
    """Why the pool must be retired after a probe whose ranks reported ``done`` (their release records), or None
    when every rank came back near the pool's baseline."""
    held = [r for r in done if not r.get("released", True)]
    if not held:
        return None
    worst = max(held, key=lambda r: r.get("held_bytes") or 0)
    return (f"memory not released: rank {worst['rank']} holds {(worst.get('held_bytes') or 0) / 2**20:.0f} MiB more "
            f"than before the pool's first probe ({worst.get('kind')})")


def forkserver_argv(*, nproc: int, log_dir: Path, args: list[str], python: str = sys.executable) -> list[str]:
    """``python -u -m probes.forkserver --nproc N --log-dir DIR -- ARGS``: ``nproc`` ranks of ``probes.train ARGS``
    forked from one process (`probes.forkserver`; run it behind a lifeline of role ``forkserver``)."""
    return [python, "-u", "-m", "probes.forkserver", "--nproc", str(nproc), "--log-dir", str(log_dir), "--", *args]


class WarmPool:
    """One fork server of ``nproc`` warm workers serving probes from ``folder`` (see the module docstring)."""

    launcher = "forkserver"
    """what runs the workers (its output: ``FOLDER/{launcher}.stdout|stderr``): locally `probes.forkserver`, which
    forks the ranks from one process that has imported torch (torchrun would start a Python per rank)"""

    def __init__(self, nproc: int, folder: Path, *, device: str = "auto", env: dict | None = None) -> None:
        self.nproc = nproc
        self.folder = Path(folder).resolve()
        self.key = (nproc, device)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.overrides = probe_env(env)
        self.argv = self._argv()
        self.jobs = 0
        self.retired: str | None = None
        """why the pool was retired (None while it serves)"""
        self._thread = threading.get_ident()
        self._out = open(self.folder / f"{self.launcher}.stdout", "wb")
        self._err = open(self.folder / f"{self.launcher}.stderr", "wb")
        self.started_at = time.time()
        self.proc = subprocess.Popen(lifeline.wrap(self.launcher, self.argv), cwd=REPO_ROOT,
                                     env=lifeline.parent_env({**os.environ, **self.overrides}), stdout=self._out,
                                     stderr=self._err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.tracker = self._tracker()

    # -- what a launcher other than the local fork server changes (probes.slurm.SlurmWarmPool: an srun step) ----
    def _argv(self) -> list[str]:
        """The launcher's command (run behind a lifeline of role `launcher`)."""
        return forkserver_argv(nproc=self.nproc, log_dir=self.folder / "logs", args=["--serve", str(self.folder)])

    def _tracker(self) -> ProcessTracker:
        """The local processes to stop (the fork server, and its workers by their pid files)."""
        return ProcessTracker(self.proc.pid, self.folder)

    def _stop(self) -> None:
        """End the launcher and every worker."""
        stop_processes(self.proc, self.tracker)

    def launch_extra(self) -> dict:
        """What a probe's result records about where it ran, beside the pids (probes.slurm: hosts, step)."""
        return {}

    @property
    def usable(self) -> bool:
        """Serving: not retired, its launcher running, asked from the thread that started it."""
        return self.retired is None and self.proc.poll() is None and threading.get_ident() == self._thread

    def close(self, reason: str = "closed") -> None:
        """Retire the pool: stop the launcher and every worker (SIGTERM, then SIGKILL), keep ``reason``."""
        if self.retired is None:
            self.retired = reason
        self._stop()
        for f in (self._out, self._err):
            f.close()

    def _done(self, n: int) -> list[dict] | None:
        """Every rank's record of job ``n`` once all are there, else None."""
        records = []
        for rank in range(self.nproc):
            try:
                records.append(json.loads(done_path(self.folder, n, rank).read_text()))
            except (OSError, ValueError):
                return None
        return records

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float, env: dict | None = None,
            on_step: OnStep | None = None) -> ProbeResult:
        """Hand ``spec`` to the pool (its folder ``workdir`` prepared, its layout valid for ``nproc``: `WarmWorkers`
        checks both) and wait for its end; the classified `ProbeResult` (also in workdir/result.json)."""
        if not self.usable:
            raise RuntimeError(f"warm pool {self.folder} is not serving ({self.retired or 'its launcher ended'})")
        workdir = Path(workdir).resolve()
        n = self.jobs
        self.jobs += 1
        started = time.monotonic()
        spawned = self.started_at if n == 0 else time.time()
        command = {"warm_pool": str(self.folder), "job": n, "argv": self.argv, "cwd": str(REPO_ROOT),
                   "env": self.overrides, "job_env": dict(env or {}), "timeout_s": timeout_s, "nproc": self.nproc,
                   "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")
        write_atomic(job_path(self.folder, n), json.dumps({"spec": spec.to_dict(), "out": str(workdir),
                                                           "env": {k: str(v) for k, v in (env or {}).items()}}))
        watch = StepWatch(on_step, StepTail(workdir)) if on_step is not None else None
        deadline = time.monotonic() + timeout_s
        done: list[dict] | None = None
        timed_out = False
        stop_at: float | None = None
        try:
            while True:
                try:
                    self.proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                    break                                   # the launcher ended: a worker failed (or was killed)
                except subprocess.TimeoutExpired:
                    pass
                self.tracker.snapshot()
                done = self._done(n)
                if done is not None:
                    break
                if watch is not None and stop_at is None and watch():
                    stop_path(self.folder, n).touch()         # every rank leaves after the same step
                    stop_at = time.time()
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
        except BaseException:                               # Ctrl-C, SIGTERM: no worker outlives the tuner's exit
            self.close("interrupted")
            raise
        done = done or self._done(n)
        seen_end = time.time()
        warm = {"pool": str(self.folder), "job": n, "reused": n > 0}
        if done is None:
            self.close("timeout" if timed_out else "a worker ended")
        else:
            warm["release"] = [{k: r.get(k) for k in ("rank", "status", "kind", "baseline_bytes", "before_bytes",
                                                     "after_bytes", "held_bytes", "released")} for r in done]
            held = not_released(done)
            if held:
                self.close(held)
        if self.retired is not None:
            warm["retired"] = self.retired
        ended = time.time()
        wall_s = time.monotonic() - started
        phases = phases_of(read_marks(workdir), spawned=spawned, stopped=stop_at or seen_end, ended=ended)
        rank_logs = collect_rank_logs(workdir, workdir / "logs")
        extra: dict = {"pids": sorted(self.tracker.seen), "returncode": self.proc.returncode, "warm": warm,
                       **self.launch_extra()}
        if done is None:
            left = self.tracker.alive()
            if left:
                extra["pids_left"] = left
        command.update({"pids": sorted(self.tracker.seen), "returncode": self.proc.returncode,
                        "timed_out": timed_out, "wall_s": wall_s, "warm": warm})
        (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")
        if watch is not None and watch.stop_reason and not (workdir / "result.json").is_file():
            extra["pruned_after_steps"] = len(watch.steps)
            result = ProbeResult(status="pruned", reason=watch.stop_reason, step_times_s=list(watch.steps),
                                 wall_s=wall_s, workdir=str(workdir), world_size=self.nproc, extra=extra,
                                 phases=phases)
        else:
            stderr = "" if done is not None else (self.folder / f"{self.launcher}.stderr").read_text(errors="replace")
            result = classify(workdir, returncode=0 if done is not None else self.proc.returncode,
                              timed_out=timed_out, timeout_s=timeout_s, torchrun_stderr=stderr, rank_logs=rank_logs,
                              wall_s=wall_s, world_size=self.nproc, extra=extra)
            result = ProbeResult.from_dict({**result.to_dict(), "phases": phases})
        result.write(workdir / "result.json")
        return result


class WarmWorkers:
    """At most one `WarmPool` at a time, kept while consecutive probes need its world size and device kind.

    ``root``: where pool folders go (default: ``warm/`` beside the first probe's folder, i.e. in the study's
    work folder). ``env``: the workers' environment overrides (`probes.launch.probe_env`). ``start``: makes a
    pool of ``nproc`` workers for ``spec`` in a new ``folder`` (default: a local fork server, `WarmPool`; the SLURM
    backend's starts an srun step on a slice, `probes.slurm.SlurmWarmPool`)."""

    def __init__(self, root: Path | None = None, *, env: dict | None = None,
                 start: Callable[[ProbeSpec, int, Path], WarmPool] | None = None) -> None:
        self.root = None if root is None else Path(root)
        self.env = dict(env or {})
        self.pool: WarmPool | None = None
        self.pools_started = 0
        self._start = start or (lambda spec, nproc, folder: WarmPool(nproc, folder, device=spec.device, env=self.env))

    def run(self, spec: ProbeSpec, *, nproc: int, workdir: Path, timeout_s: float, env: dict | None = None,
            on_step: OnStep | None = None) -> ProbeResult:
        """One probe of ``spec`` on ``nproc`` warm workers (a new pool when none serves that world); ``env`` is
        set in the workers' os.environ for this probe only (probes.train's debug variables)."""
        workdir = Path(workdir).resolve()
        prepare_workdir(spec, workdir)
        refused = refuse_invalid(spec, nproc=nproc, workdir=workdir)
        if refused is not None:
            return refused
        if self.pool is not None and (not self.pool.usable or self.pool.key != (nproc, spec.device)):
            self.pool.close("world size or device changed" if self.pool.usable else "not serving")
            self.pool = None
        if self.pool is None:
            root = self.root if self.root is not None else workdir.parent / "warm"
            root.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix="pool-", dir=root))
            self.pool = self._start(spec, nproc, folder)
            self.pools_started += 1
        result = self.pool.run(spec, workdir=workdir, timeout_s=timeout_s, env=env, on_step=on_step)
        if self.pool.retired is not None:
            self.pool = None
        return result

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


__all__ = ["RELEASE_SLACK_BYTES", "WarmPool", "WarmWorkers", "done_path", "job_path", "not_released", "stop_path",
           "forkserver_argv", "write_atomic"]
