"""Run a probe on this machine under torchrun, in its own process group, with a wall-clock limit.

    >>> from probes.launch import run_local
    >>> result = run_local(spec, nproc=2, workdir=Path("probes/0001"), timeout_s=120)

Each probe leaves a folder: ``spec.json``, ``command.json`` (argv, cwd, environment overrides,
pids), ``torchrun.stdout`` / ``torchrun.stderr``, ``rank{r}.stdout`` / ``rank{r}.stderr``,
``result.json``. The configuration is checked before anything starts (``status="invalid"``);
on timeout the torchrun process group and every worker (torchrun starts each in its own
session) get SIGTERM, then SIGKILL after `KILL_GRACE_S`; no process is left behind, also when
the launcher itself is SIGKILLed (`probes.lifeline`: torchrun and every worker die with it). The
outcome is classified by `probes.outcome.classify`.

`torchrun_argv` is the one command builder; the SLURM backend wraps the same argv in srun.
No torch import here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from probes import lifeline
from probes.extent import resolve_probe
from probes.layout import LayoutError
from probes.outcome import classify
from probes.phases import phases_of, read_marks
from probes.result import ProbeResult, ProbeSpec
from probes.steps import OnStep, StepTail, StepWatch

REPO_ROOT = Path(__file__).resolve().parent.parent
KILL_GRACE_S = 5.0
"""seconds between SIGTERM and SIGKILL"""
POLL_S = 0.2
"""how often the launcher records worker pids while waiting"""


def torchrun_argv(*, spec_path: Path | None = None, out_dir: Path | None = None, nproc: int, nnodes: int = 1, node_rank: int | None = None,
                  rdzv_endpoint: str | None = None, rdzv_id: str = "plantune", log_dir: Path | None = None,
                  python: str = sys.executable, module: str = "probes.train",
                  module_args: list[str] | None = None) -> list[str]:
    """``python -m torch.distributed.run ... -m probes.lifeline worker python -u -m probes.train --spec SPEC
    --out DIR`` as an argument list (each worker behind a lifeline: it dies with torchrun).

    One node without ``rdzv_endpoint``: ``--standalone`` (a c10d rendezvous on localhost port 0,
    i.e. a free port the OS picks). Several nodes: c10d rendezvous at ``rdzv_endpoint``
    (``host:port``), as srun runs one torchrun per node. ``log_dir`` makes torchrun write each
    rank's stdout/stderr to ``log_dir/<run>/attempt_0/<local_rank>/{stdout,stderr}.log``.
    """
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", str(nnodes),
            "--max-restarts", "0"]
    if rdzv_endpoint is None:
        if nnodes != 1:
            raise ValueError(f"nnodes {nnodes} > 1 needs a rendezvous endpoint host:port")
        argv.append("--standalone")
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
        if node_rank is not None:
            argv += ["--node-rank", str(node_rank)]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir), "--redirects", "3"]
    if module_args is None:
        if spec_path is None or out_dir is None:
            raise ValueError("torchrun_argv: give spec_path and out_dir, or module_args")
        module_args = ["--spec", str(spec_path), "--out", str(out_dir)]
    return argv + lifeline.worker_module_args(["-m", module, *module_args], python=python)


def probe_env(env: dict | None = None) -> dict[str, str]:
    """Environment overrides for probe workers: the repo importable, one thread per rank, unbuffered output."""
    path = os.environ.get("PYTHONPATH", "")
    overrides = {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT),
                 "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    overrides.update({k: str(v) for k, v in (env or {}).items()})
    return overrides


# -- processes -------------------------------------------------------------------------------------

def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _pid_files(workdir: Path) -> list[int]:
    pids = []
    for path in workdir.glob("pid-rank*"):
        try:
            pids.append(int(path.read_text().strip()))
        except ValueError:
            continue
    return pids


class ProcessTracker:
    """Every pid the probe started (torchrun and its workers), with start times to avoid pid reuse."""

    def __init__(self, root_pid: int, workdir: Path | None) -> None:
        """``workdir``: where the workers write ``pid-rank*`` files (None: the workers are not this machine's
        processes, as an srun step's on other nodes; only ``root_pid``'s own descendants are tracked)."""
        self.root_pid = root_pid
        self.workdir = workdir
        self.seen: dict[int, float | None] = {}
        self.stopped_at: float | None = None
        """epoch seconds when the launcher saw the command end or decided to stop it (run_with_timeout)"""
        self._ps = _psutil()
        self.snapshot()

    def _add(self, pid: int) -> None:
        if pid in self.seen:
            return
        created = None
        if self._ps is not None:
            try:
                created = self._ps.Process(pid).create_time()
            except self._ps.Error:
                return
        self.seen[pid] = created

    def snapshot(self) -> None:
        self._add(self.root_pid)
        if self._ps is not None:
            try:
                for child in self._ps.Process(self.root_pid).children(recursive=True):
                    self._add(child.pid)
            except self._ps.Error:
                pass
        for pid in _pid_files(self.workdir) if self.workdir is not None else ():
            self._add(pid)

    def alive(self) -> list[int]:
        out = []
        for pid, created in self.seen.items():
            if self._ps is not None:
                try:
                    proc = self._ps.Process(pid)
                    if (created is None or proc.create_time() == created) and proc.status() != self._ps.STATUS_ZOMBIE:
                        out.append(pid)
                except self._ps.Error:
                    continue
            else:
                try:
                    os.kill(pid, 0)
                    out.append(pid)
                except OSError:
                    continue
        return out

    def signal_all(self, sig: int) -> None:
        for pid in self.alive():
            try:
                if os.getpgid(pid) == pid:      # torchrun and its workers lead their own groups
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except OSError:
                continue


def stop_processes(proc: subprocess.Popen, tracker: ProcessTracker) -> None:
    """SIGTERM every tracked process group, SIGKILL what is left after KILL_GRACE_S, reap torchrun."""
    tracker.snapshot()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        tracker.signal_all(sig)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()
            if not tracker.alive():
                break
            time.sleep(0.05)
        if not tracker.alive():
            break
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def run_with_timeout(argv: list[str], *, env: dict[str, str], timeout_s: float, workdir: Path,
                     stdout: object = None, stderr: object = None,
                     cwd: Path = REPO_ROOT,
                     watch: Callable[[], str | None] | None = None) -> tuple[int | None, bool, ProcessTracker]:
    """Run ``argv`` (torchrun) in a new session behind a lifeline (it dies with this process, and its workers
    with it); kill everything it started on timeout or when it ends.

    ``watch`` is polled every `POLL_S` while it runs (`probes.steps.StepWatch`); when it returns a reason,
    everything is stopped as on a timeout (the caller's watch keeps the reason; ``timed_out`` stays False).
    Returns (returncode, timed_out, tracker); ``tracker.seen`` holds every pid observed.
    """
    proc = subprocess.Popen(lifeline.wrap("torchrun", argv), cwd=cwd, env=lifeline.parent_env(env), stdout=stdout,
                            stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True)
    tracker = ProcessTracker(proc.pid, workdir)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            try:
                proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                tracker.snapshot()
                if watch is not None and watch():
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
    finally:
        tracker.stopped_at = time.time()
        stop_processes(proc, tracker)
    return proc.returncode, timed_out, tracker


def collect_rank_logs(workdir: Path, log_dir: Path) -> dict[int, str]:
    """Copy torchrun's per-rank logs to ``rank{r}.stdout`` / ``rank{r}.stderr``; the texts by rank."""
    texts: dict[int, str] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/std*.log")):
        rank = int(path.parent.name)
        stream = path.stem
        target = workdir / f"rank{rank}.{stream}"
        shutil.copyfile(path, target)
        texts[rank] = texts.get(rank, "") + path.read_text(errors="replace")
    return texts


def prepare_workdir(spec: ProbeSpec, workdir: Path) -> Path:
    """``workdir`` made, cleared of an earlier probe's files (a retried trial), with ``spec.json``; its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in [*workdir.glob("error-rank*.json"), *workdir.glob("pid-rank*"), *workdir.glob("rank*.std*"),
                  workdir / "result.json", workdir / "phase-marks.json"]:
        stale.unlink(missing_ok=True)
    shutil.rmtree(workdir / "logs", ignore_errors=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True) + "\n")
    return spec_path


def refuse_invalid(spec: ProbeSpec, *, nproc: int, workdir: Path) -> ProbeResult | None:
    """The ``invalid`` result (also written to result.json) of a layout ``nproc`` processes cannot run, else None."""
    try:
        resolve_probe(spec, world=nproc, local_world=nproc)
    except LayoutError as err:
        result = ProbeResult(status="invalid", reason=str(err), world_size=nproc, workdir=str(workdir), wall_s=0.0)
        result.write(workdir / "result.json")
        return result
    return None


def run_local(spec: ProbeSpec, *, nproc: int, workdir: Path, timeout_s: float, env: dict | None = None,
              on_step: OnStep | None = None) -> ProbeResult:
    """Run ``spec`` on ``nproc`` local processes; the classified `ProbeResult` (also in workdir/result.json).

    ``on_step(index, seconds)`` gets each timed step as rank 0 reports it; when it returns a reason the probe is
    stopped and the result is ``pruned`` (that reason, the steps seen) -- unless rank 0 had already written its
    measurement, which is then kept."""
    workdir = Path(workdir).resolve()
    spec_path = prepare_workdir(spec, workdir)
    started = time.monotonic()
    refused = refuse_invalid(spec, nproc=nproc, workdir=workdir)
    if refused is not None:
        return refused

    log_dir = workdir / "logs"
    argv = torchrun_argv(spec_path=spec_path, out_dir=workdir, nproc=nproc, log_dir=log_dir)
    overrides = probe_env(env)
    command = {"argv": argv, "cwd": str(REPO_ROOT), "env": overrides, "timeout_s": timeout_s, "nproc": nproc,
               "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")

    watch = StepWatch(on_step, StepTail(workdir)) if on_step is not None else None
    spawned = time.time()
    with open(workdir / "torchrun.stdout", "wb") as out, open(workdir / "torchrun.stderr", "wb") as err:
        returncode, timed_out, tracker = run_with_timeout(argv, env={**os.environ, **overrides}, timeout_s=timeout_s,
                                                          workdir=workdir, stdout=out, stderr=err, watch=watch)
    wall_s = time.monotonic() - started
    ended = time.time()
    phases = phases_of(read_marks(workdir), spawned=spawned, stopped=tracker.stopped_at or ended, ended=ended)
    rank_logs = collect_rank_logs(workdir, log_dir)
    left = tracker.alive()
    command.update({"pids": sorted(tracker.seen), "returncode": returncode, "timed_out": timed_out,
                    "wall_s": wall_s})
    (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")
    extra = {"pids": sorted(tracker.seen), "returncode": returncode}
    if left:
        extra["pids_left"] = left
    if watch is not None and watch.stop_reason and not (workdir / "result.json").is_file():
        extra["pruned_after_steps"] = len(watch.steps)
        result = ProbeResult(status="pruned", reason=watch.stop_reason, step_times_s=list(watch.steps),
                             wall_s=wall_s, workdir=str(workdir), world_size=nproc, extra=extra, phases=phases)
    else:
        result = classify(workdir, returncode=returncode, timed_out=timed_out, timeout_s=timeout_s,
                          torchrun_stderr=(workdir / "torchrun.stderr").read_text(errors="replace"),
                          rank_logs=rank_logs, wall_s=wall_s, world_size=nproc, extra=extra)
        result = ProbeResult.from_dict({**result.to_dict(), "phases": phases})
    result.write(workdir / "result.json")
    return result


__all__ = ["KILL_GRACE_S", "REPO_ROOT", "ProcessTracker", "collect_rank_logs", "prepare_workdir", "probe_env",
           "refuse_invalid", "run_local", "run_with_timeout", "stop_processes", "torchrun_argv"]
