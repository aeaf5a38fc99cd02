"""SLURM jobs and steps that end with the tuner: a guard process scancels them when the tuner dies.

    guard = SlurmGuard(env)             # started by SlurmBackend; reads what to cancel on its stdin
    guard.watch_job("plantune-probes-1a2b3c4d")        # before salloc --job-name=...
    guard.watch_step("4242", "plantune-0123456789")     # before srun --jobid=4242 --job-name=...
    guard.forget("plantune-0123456789")                 # the step ended
    guard.close()                                       # the backend was closed: nothing to cancel

The guard is a child of the tuner in its own session, without a lifeline: it outlives the tuner. Only
the tuner holds the write end of the guard's stdin, so when the tuner ends in any way (SIGKILL too) the
guard reads end-of-file. It then waits until no process on this host runs with any watched name in its
arguments (the srun and salloc clients, which die with the tuner through their lifelines, and so can
no longer start a step or be granted a job), and scancels what is still watched: each job by its name
(``scancel --name``: pending or granted), each step by its id (``squeue -s``). SLURM then kills the
steps' processes on every node, and the probe workers die with their torchrun (`probes.lifeline`).

Lines on stdin: ``job NAME``, ``step JOBID NAME``, ``forget NAME``, ``close``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

CLIENT_GONE_POLL_S = 0.1
CLIENT_GONE_LIMIT_S = 120.0
"""the longest the guard waits for a dead tuner's srun/salloc to go before it scancels anyway"""
COMMAND_TIMEOUT_S = 60.0


class SlurmGuard:
    """The tuner's handle on its guard process (see the module docstring). Thread-safe."""

    def __init__(self, env: dict[str, str] | None = None, *, python: str = sys.executable) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([python, "-m", "probes.slurm_guard"], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, env=env, text=True, start_new_session=True,
                                      cwd=str(Path(__file__).resolve().parent.parent))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, *words: str) -> None:
        with self._lock:
            if self._proc.stdin is None or self._proc.stdin.closed:
                return
            self._proc.stdin.write(" ".join(words) + "\n")
            self._proc.stdin.flush()

    def watch_job(self, name: str) -> None:
        self._send("job", name)

    def watch_step(self, job_id: str, name: str) -> None:
        self._send("step", str(job_id), name)

    def forget(self, name: str) -> None:
        self._send("forget", name)

    def close(self) -> None:
        """The tuner cleaned up itself: the guard ends without cancelling anything."""
        self._send("close")
        with self._lock:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _clients(names: set[str]) -> list[int]:
    """Pids of processes on this host whose arguments carry ``--job-name=NAME`` for a watched name."""
    wanted = {f"--job-name={n}".encode() for n in names}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = set((entry / "cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue
        if args & wanted:
            found.append(int(entry.name))
    return found


def _run(argv: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"probes.slurm_guard: {' '.join(argv)}: {err}", file=sys.stderr)
        return None


def cancel(jobs: set[str], steps: dict[str, str]) -> None:
    """scancel the jobs named ``jobs`` and the steps ``steps`` (name -> job id), once their clients are gone."""
    names = jobs | set(steps)
    deadline = time.monotonic() + CLIENT_GONE_LIMIT_S
    while _clients(names) and time.monotonic() < deadline:
        time.sleep(CLIENT_GONE_POLL_S)
    for name in sorted(jobs):
        _run(["scancel", f"--name={name}"])
    for job_id in sorted(set(steps.values())):
        listed = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
        for line in (listed.stdout if listed else "").splitlines():
            parts = line.split()
            if len(parts) == 2 and steps.get(parts[1]) == job_id:
                _run(["scancel", parts[0]])


def main() -> int:
    jobs: set[str] = set()
    steps: dict[str, str] = {}
    for line in sys.stdin:
        words = line.split()
        if words == ["close"]:
            return 0
        if len(words) == 2 and words[0] == "job":
            jobs.add(words[1])
        elif len(words) == 3 and words[0] == "step":
            steps[words[2]] = words[1]
        elif len(words) == 2 and words[0] == "forget":
            jobs.discard(words[1])
            steps.pop(words[1], None)
    cancel(jobs, steps)        # end of file without "close": the tuner is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
