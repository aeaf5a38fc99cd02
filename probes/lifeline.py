"""Every probe process dies with the tuner that started it, at any moment of its life.

    python -m probes.lifeline torchrun python -m torch.distributed.run ... -m probes.lifeline worker \\
        python -u -m probes.train --spec spec.json --out probe-dir

A lifeline is a wrapper that execs its command (same pid) after asking Linux to SIGKILL the process when
its parent dies (prctl PR_SET_PDEATHSIG; kept across exec). The launcher starts torchrun (or srun, salloc)
through one, and torchrun starts each worker through one, so the chain tuner -> torchrun -> workers dies
together whenever a link is killed -- also while a worker is still importing torch (0.9 s on an idle
CPU machine, seconds on a busy node), before which nothing of the worker's own runs. Linux counts the
parent *thread*: whoever starts a lifeline must do it from a thread that lives as long as the command
(the launchers start and wait in the same thread).

Linux sends the signal only for a parent that dies after the prctl. A parent that died between the fork
and the prctl is caught by comparing ``getppid()`` with the pid the parent wrote into `PARENT_ENV` before
starting the lifeline (each lifeline writes its own pid there for the processes its command starts): a
lifeline whose parent is already gone kills itself before exec'ing anything. Pure Python, stdlib only:
it runs before torch is imported.

Debug (tests): ``PLANTUNE_PROBE_HOLD=PHASE[:RANK]`` makes a process at that phase write
``$PLANTUNE_PROBE_HOLD_DIR/held-PHASE-PID`` and wait there until ``$PLANTUNE_PROBE_HOLD_DIR/release``
exists, so a test can kill the tuner at a known moment. Phases: a lifeline's role (``torchrun``,
``forkserver``, ``srun``, ``salloc``, ``worker``; held before it arms), ``import`` (a worker armed, before it
execs Python and imports torch; a rank forked by `probes.forkserver` holds at ``worker`` and ``import`` in the
same places, torch being imported already), ``setup`` (before the process group is initialised) and
``teardown`` (after the result is written, before the process exits) in probes.train. ``RANK`` holds only that
rank (torchrun's RANK).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

PARENT_ENV = "PLANTUNE_LIFELINE_PARENT"
"""the pid a lifeline expects as its parent (written by whoever starts it)"""
HOLD_ENV = "PLANTUNE_PROBE_HOLD"
HOLD_DIR_ENV = "PLANTUNE_PROBE_HOLD_DIR"
HOLD_POLL_S = 0.05
PR_SET_PDEATHSIG = 1
"""prctl(2) option number, linux/prctl.h"""
ROLES = ("torchrun", "forkserver", "srun", "salloc", "worker")


def wrap(role: str, argv: list[str], *, python: str = sys.executable) -> list[str]:
    """``argv`` run through a lifeline of ``role``: ``python -m probes.lifeline ROLE ARGV``."""
    if role not in ROLES:
        raise ValueError(f"lifeline role {role!r} is not one of {', '.join(ROLES)}")
    return [python, "-m", "probes.lifeline", role, *argv]


def worker_module_args(worker: list[str], *, python: str = sys.executable) -> list[str]:
    """torchrun's entry for ``worker`` (``-m module ARGS`` or ``script.py ARGS``) through a worker lifeline:
    ``-m probes.lifeline worker python -u WORKER`` (torchrun adds its interpreter in front)."""
    return ["-m", "probes.lifeline", "worker", python, "-u", *worker]


def parent_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` with this process named as the parent of the lifeline about to be started."""
    return {**(env or {}), PARENT_ENV: str(os.getpid())}


def hold(phase: str) -> None:
    """Debug: wait at ``phase`` when PLANTUNE_PROBE_HOLD names it (see the module docstring)."""
    wanted = os.environ.get(HOLD_ENV, "")
    if not wanted:
        return
    name, _, rank = wanted.partition(":")
    if name != phase or (rank and rank != os.environ.get("RANK")):
        return
    folder = Path(os.environ[HOLD_DIR_ENV])
    (folder / f"held-{phase}-{os.getpid()}").write_text(f"{os.getpid()}\n")
    while not (folder / "release").exists():
        time.sleep(HOLD_POLL_S)


def arm() -> None:
    """SIGKILL this process when its parent dies; die now if the parent named in PARENT_ENV already has."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    expected = os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):     # the parent died before the prctl: do what it would do
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ROLES:
        print(f"usage: python -m probes.lifeline {{{','.join(ROLES)}}} PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    role, command = args[0], args[1:]
    hold(role)
    arm()
    os.environ[PARENT_ENV] = str(os.getpid())          # the pid the command's own lifelines will check
    if role == "worker":
        hold("import")
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"probes.lifeline: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
