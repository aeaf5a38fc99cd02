"""One node's probe workers forked from one process that has imported torch and the probe code once.

    python -m probes.lifeline forkserver python -u -m probes.forkserver --nproc 2 --log-dir POOL/logs \\
        -- --serve POOL

What torchrun does for a local warm pool (`probes.warm.WarmPool`), without paying for a Python and torch start
per rank: this process imports torch, `probes.train`, `probes.warm_worker` and what every probe imports later
(`PRELOAD`: torch._dynamo is pulled in by the meta-device init and the optimizer step), then forks ``nproc``
ranks, each running ``probes.train`` with the arguments after ``--``. Measured on the 2-core test machine: a
worker's start is ~5.5 s of CPU (import torch 2-2.5 s, probes.train 1.3 s, torch._dynamo 1.5 s), torchrun's ~3 s;
a pool of 2 started here pays one import, not three (tests/bench/NOTES.md, "Suite time", round 12).

GPU: nothing here touches CUDA before the fork (importing torch does not initialise it; `NVML_CHECK_ENV`; `main`
refuses to fork if torch has initialised it); each rank picks its device, and NCCL starts, in the rank
(`probes.train._device_of`).
On one node the ranks rendezvous through a file store in the log folder's parent (`RDZV_FILE_ENV`), not a TCP
port; on several (a SLURM warm pool: `probes.slurm` runs one fork server per node, ``--nnodes --node-rank
--master``) through rank 0's TCP store at ``--master`` (env://).

What torchrun provides and the pool relies on, kept:
- each rank's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK (`rank_env`);
- each rank's stdout and stderr in ``LOG_DIR/forkserver/attempt_0/{rank}/std{out,err}.log`` (torchrun's
  ``--log-dir`` layout; a warm job moves them to its own folder while it runs);
- lifelines: this process is started behind one (it dies with the tuner); each rank holds at ``worker`` before it
  arms (PR_SET_PDEATHSIG: it dies with this process), then at ``import`` (armed; torch is already imported here),
  as `probes.lifeline` describes for torchrun's workers, so the kill tests reach the same moments;
- failures: when a rank fails (a warm worker only ends so), the others get SIGTERM (SIGKILL after
  `KILL_GRACE_S`), a summary in torchrun's ChildFailedError format (rank, exit code, the first observed failure)
  goes to stderr for `probes.outcome`, and this process exits 1. On SIGTERM (a pool stopped; its process group
  gets it) it stops and reaps its ranks, as torchrun does, then exits 143.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time
from pathlib import Path

from probes import lifeline

PRELOAD = ("torch", "torch.distributed", "probes.train", "probes.warm_worker", "torch._dynamo",
           "torch.distributed.pipelining")
"""imported once here before forking (what a probe imports anyway, whatever its layout)"""
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""set while importing `PRELOAD`: should an import ask torch.cuda.is_available(), torch counts the devices through
NVML instead of initialising the CUDA driver, which a forked rank could then not use (the ranks' environment is
restored before the fork; on the CPU build no import here queries CUDA at all, checked 2026-11-29)"""
RDZV_FILE_ENV = "PLANTUNE_RDZV_FILE"
"""the ranks' rendezvous file (torch.distributed's file:// store), set by this process for its ranks"""
LOG_RUN = "forkserver"
"""the run folder of the ranks' logs, as torchrun's run id in LOG_DIR/{run}/attempt_0/{rank}/"""
KILL_GRACE_S = 5.0
"""seconds between SIGTERM and SIGKILL for the ranks left after one ended (as probes.launch.KILL_GRACE_S)"""


def rank_env(local_rank: int, nproc: int, *, nnodes: int = 1, node_rank: int = 0, master: str | None = None,
             rdzv_file: Path | None = None) -> dict[str, str]:
    """torchrun's environment for one rank: RANK = node_rank * nproc + local_rank; the rendezvous at ``master``
    (``host:port``: env://, rank 0 serves the store there) or through ``rdzv_file`` (one node)."""
    rank, world = node_rank * nproc + local_rank, nnodes * nproc
    env = {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node_rank), "ROLE_RANK": str(rank),
           "ROLE_WORLD_SIZE": str(world)}
    if master is not None:
        host, _, port = master.rpartition(":")
        env.update(MASTER_ADDR=host, MASTER_PORT=port)
    elif rdzv_file is not None:
        env[RDZV_FILE_ENV] = str(rdzv_file)
    return env


def _child(local_rank: int, env: dict[str, str], log_dir: Path, args: list[str]) -> None:
    """The forked rank: its environment and logs, its lifeline, then probes.train; never returns."""
    code = 1
    try:
        os.environ.update(env)
        folder = log_dir / LOG_RUN / "attempt_0" / str(local_rank)
        folder.mkdir(parents=True, exist_ok=True)
        for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
            f = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(f, fd)
            os.close(f)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        lifeline.hold("worker")
        lifeline.arm()                                  # PARENT_ENV names this server (its lifeline set it)
        os.environ[lifeline.PARENT_ENV] = str(os.getpid())
        lifeline.hold("import")
        from probes.train import main

        code = main(args) or 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:                               # noqa: BLE001 -- the rank's stderr log has it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Terminated(Exception):
    """This process got SIGTERM (a pool being stopped: `probes.launch.stop_processes`, scancel)."""


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)       # once: the ranks are stopped and reaped next
    raise Terminated


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _stop(ranks: dict[int, int], codes: dict[int, int]) -> None:
    """SIGTERM the ranks still running, SIGKILL what is left after the grace; their exit codes into ``codes``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ranks:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + KILL_GRACE_S
        while ranks and time.monotonic() < deadline:
            for pid in list(ranks):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[ranks.pop(pid)] = _exit_code(status)
            if ranks:
                time.sleep(0.05)
        if not ranks:
            return


def _summary(codes: dict[int, int], first: int, pids: dict[int, int], offset: int = 0) -> str:
    """The ranks' failures in torchrun's ChildFailedError layout (probes.outcome parses it; local ranks here,
    global ones once ``offset``, this node's first rank, is added)."""
    def block(i: int, local: int) -> str:
        return (f"[{i}]:\n  rank      : {offset + local} (local_rank: {local})\n  exitcode  : {codes[local]} "
                f"(pid: {pids[local]})\n")
    failed = [r for r in sorted(codes) if codes[r] != 0]
    return ("probes.forkserver: a rank ended\nFailures:\n" + "".join(block(i, r) for i, r in enumerate(failed))
            + "Root Cause (first observed failure):\n" + block(0, first))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes.forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, required=True, help="ranks to fork")
    parser.add_argument("--log-dir", type=Path, required=True, help="the ranks' stdout/stderr go under it")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes, each with a fork server (SLURM: one per task)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index")
    parser.add_argument("--master", default=None, help="host:port of rank 0's store (default: a file store beside "
                                                       "--log-dir, one node only)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then probes.train's arguments")
    args = parser.parse_args(argv)
    train_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    if args.nproc < 1:
        parser.error("--nproc must be at least 1")
    if args.nnodes > 1 and args.master is None:
        parser.error("--nnodes above 1 needs --master host:port")
    import importlib

    saved = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"                    # a CUDA query while importing asks NVML, not the driver
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        if saved is None:
            os.environ.pop(NVML_CHECK_ENV, None)
        else:
            os.environ[NVML_CHECK_ENV] = saved
    import torch

    if torch.cuda.is_initialized():                     # a forked rank could not use it
        print("probes.forkserver: CUDA was initialised before the fork", file=sys.stderr)
        return 1
    gc.freeze()   # what the imports made is never collected: a rank's gc.collect scans only its probes' objects
    rdzv = args.log_dir.resolve().parent / "rdzv-store"
    args.log_dir.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for local in range(args.nproc):
        env = rank_env(local, args.nproc, nnodes=args.nnodes, node_rank=args.node_rank, master=args.master,
                       rdzv_file=rdzv)
        pid = os.fork()
        if pid == 0:
            _child(local, env, args.log_dir, train_args)
        pids[local] = pid
    ranks = {pid: rank for rank, pid in pids.items()}
    codes: dict[int, int] = {}
    signal.signal(signal.SIGTERM, _terminated)
    try:
        while ranks:                                    # until every rank has ended, or one has failed
            pid, status = os.wait()
            rank = ranks.pop(pid)
            codes[rank] = _exit_code(status)
            if codes[rank] != 0:
                _stop(ranks, codes)
                print(_summary(codes, rank, pids, args.node_rank * args.nproc), file=sys.stderr, flush=True)
                return 1
    except Terminated:                                  # the pool is stopped: its ranks end and are reaped here
        _stop(ranks, codes)
        return 128 + signal.SIGTERM
    return 0


__all__ = ["KILL_GRACE_S", "LOG_RUN", "PRELOAD", "RDZV_FILE_ENV", "Terminated", "main", "rank_env"]


if __name__ == "__main__":
    sys.exit(main())
