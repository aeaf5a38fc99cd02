"""Run a command and print the CPU time of its whole process tree, orphans included.

    flock /tmp/plantune-slow.lock env CI=true PYTHONPATH=$PWD python3 tests/bench/tree_cpu.py python3 -m pytest -q FILES

`/usr/bin/time` and RUSAGE_CHILDREN count only the descendants some ancestor waited for: a probe rank whose
launcher was killed first is reaped by init and its CPU is lost (a stopped warm pool's ranks, a killed tuner's).
This process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every orphan of the tree is
reparented to it and reaped here; after the command ends it reaps what is still ending for up to `DRAIN_S`, then
prints one line to stderr: exit status, wall time and the tree's user + sys CPU. Its exit status is the
command's. Linux only.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) option number, linux/prctl.h"""
DRAIN_S = 20.0
"""how long orphans still ending after the command are waited for (a measurement tool, not a test)"""


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python3 tests/bench/tree_cpu.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("tree_cpu: prctl(PR_SET_CHILD_SUBREAPER) failed: orphans would not be counted", file=sys.stderr)
        return 2
    started = time.monotonic()
    proc = subprocess.Popen(argv)
    code = 1
    while True:                                   # reap as they end, so no orphan lingers as a zombie
        pid, status = os.wait()
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            break
    drain = time.monotonic() + DRAIN_S
    while time.monotonic() < drain:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.2)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"[tree_cpu] exit {code}, wall {time.monotonic() - started:.1f} s, CPU {used.ru_utime:.1f} s user + "
          f"{used.ru_stime:.1f} s sys = {used.ru_utime + used.ru_stime:.1f} s", file=sys.stderr)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
