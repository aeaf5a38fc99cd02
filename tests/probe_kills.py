"""SIGKILL a tuner at a chosen moment of its probe's life, by event, and find what outlived it.

    from probe_kills import KILL_MOMENTS, kill_tuner_at
    survivors = kill_tuner_at(moment, argv, workdir=tmp_path, env=env)     # [] when nothing outlived it

The probe processes are held at the moment (`probes.lifeline.hold`: PLANTUNE_PROBE_HOLD) and each
writes a marker file there; the tuner is killed once the marker is seen -- or, for ``steps``, once rank
0 has logged a timed step. A process held before its lifeline arms (``torchrun``, ``srun``, ``salloc``,
``worker``: a parent killed between the fork and the prctl) is released only when its parent has died,
and must then die by itself. Held processes past that point are never released: had the kill missed
them they would wait forever, never end on their own and pass. A probe process is any process with the
test's folder in its arguments (torchrun's --log-dir, the workers' --spec, srun's task line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 1800
"""a probe that has not reached its moment after this long hangs (it takes seconds); no speed limit"""
CASCADE_S = 300
"""a hang guard: SIGKILLs (and a guard's scancel) take well under a second; long below PG_TIMEOUT_S (600 s),
after which an orphan waiting in the process-group set-up would end by itself"""
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class KillMoment:
    """Where the probe is when the tuner is killed: ``hold`` is PLANTUNE_PROBE_HOLD (None: ``steps``);
    ``unarmed``: the held process has no lifeline yet and is released once its parent is gone."""

    name: str
    hold: str | None
    markers: int = 1
    unarmed: bool = False


KILL_MOMENTS = {m.name: m for m in (
    KillMoment("torchrun", "torchrun", unarmed=True),   # launcher forked torchrun, prctl not yet done
    KillMoment("forkserver", "forkserver", unarmed=True),  # a warm pool's fork server forked, prctl not yet done
    KillMoment("srun", "srun", unarmed=True),
    KillMoment("salloc", "salloc", unarmed=True),
    KillMoment("worker", "worker:1", unarmed=True),     # torchrun or the fork server forked rank 1, prctl not done
    KillMoment("import", "import", markers=2),          # both ranks armed, before Python imports torch (forked:
                                                        # before the rank's own code; the fork server imported it)
    KillMoment("setup", "setup:1"),                     # torch imported; rank 1 before, rank 0 in, init_process_group
    KillMoment("steps", None),                          # rank 0 has timed a training step
    KillMoment("teardown", "teardown:0"),               # rank 0 wrote result.json and has not exited
)}


def probe_processes(folder: Path) -> list[psutil.Process]:
    """Running processes (zombies aside) with ``folder`` in their arguments."""
    mark = str(folder)
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(mark in arg for arg in proc.info["cmdline"] or ()):
            out.append(proc)
    return out


def _wait(what: str, ready, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        time.sleep(POLL_S)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s")


def _step_logged(workdir: Path) -> bool:
    return any("[probe] step" in p.read_text(errors="replace") for p in workdir.rglob("0/std*.log"))


def _held(hold_dir: Path, phase: str) -> list[int]:
    return [int(p.read_text()) for p in hold_dir.glob(f"held-{phase}-*") if p.read_text().strip()]


def kill_tuner_at(moment: KillMoment, argv: list[str], *, folder: Path, env: dict[str, str] | None = None,
                  reached=None) -> list[str]:
    """Start the tuner ``argv``, SIGKILL it at ``moment``, return the probe processes (``folder`` in their
    arguments) still running once every kill has had its effect: [] when none outlived it.

    ``reached``: an extra condition for the moment (e.g. the SLURM step is running), checked with the marker."""
    hold_dir = folder / "hold"
    hold_dir.mkdir()
    env = dict(os.environ if env is None else env)
    env.pop("PLANTUNE_PROBE_HOLD", None)
    if moment.hold is not None:
        env.update(PLANTUNE_PROBE_HOLD=moment.hold, PLANTUNE_PROBE_HOLD_DIR=str(hold_dir))
    phase = (moment.hold or "").partition(":")[0]
    with open(folder / "tune.stdout", "wb") as out, open(folder / "tune.stderr", "wb") as err:
        tuner = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    held: list[int] = []
    try:
        def at_moment():
            if tuner.poll() is not None:
                raise AssertionError(f"the tuner ended (exit {tuner.returncode}) before the probe reached "
                                     f"'{moment.name}': {(folder / 'tune.stderr').read_text()[-2000:]}")
            if moment.hold is None:
                done = _step_logged(folder)
            else:
                done = len(_held(hold_dir, phase)) >= moment.markers
            return done and (reached is None or reached())
        _wait(f"the probe reaching '{moment.name}'", at_moment, HANG_S)
        held = _held(hold_dir, phase)
        parents = {pid: psutil.Process(pid).ppid() for pid in held}
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
        if moment.unarmed:       # its parent (killed, or killed with the tuner) must be gone before it arms
            _wait("the held process's parent dying", lambda: all(_parent_changed(p, pp) for p, pp in parents.items()),
                  CASCADE_S)
            (hold_dir / "release").touch()
        try:
            _wait("every probe process ending", lambda: not probe_processes(folder), CASCADE_S)
        except AssertionError:
            pass
        return [f"{p.pid} {' '.join(p.info['cmdline'] or [])}" for p in probe_processes(folder)]
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
        for proc in probe_processes(folder):   # never leave them behind, even when the test fails
            try:
                proc.kill()
            except psutil.Error:
                pass


def _parent_changed(pid: int, parent: int) -> bool:
    try:
        return psutil.Process(pid).ppid() != parent
    except psutil.NoSuchProcess:
        return True
