"""The per-node task of a SLURM probe step: ``srun ... python -m probes.slurm_task task ...`` runs it once per node
of a slice; it fills in the node's rank and execs torchrun or `probes.forkserver` (no shell, no expansion).

Its own module, importing only the standard library and `probes.lifeline`, so that each step's task starts in a bare
Python's time: `probes.slurm` imports the planner (~0.45 s of CPU more per step on the 2-core test machine,
tests/bench/NOTES.md, "Suite time", round 13). `probes.slurm` builds the task's command line (`SlurmBackend.task_argv`)
and re-exports these names.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from probes import lifeline


def torchrun_task_argv(*, nproc_per_node: int, nnodes: int, master: str, port: int, node_rank: int | str,
                       rdzv_id: str, worker: Sequence[str], log_dir: Path | None = None, tee: bool = False,
                       python: str = sys.executable) -> list[str]:
    """BigScience's per-node launcher line as an argument list; ``worker`` is ``-m module ...`` or ``script ...``
    (started behind a `probes.lifeline`: it dies with torchrun)."""
    argv = [python, "-u", "-m", "torch.distributed.run", "--nproc_per_node", str(nproc_per_node),
            "--nnodes", str(nnodes), "--rdzv_endpoint", f"{master}:{port}", "--rdzv_backend", "c10d",
            "--rdzv_id", rdzv_id, "--max_restarts", "0", "--node_rank", str(node_rank)]
    if log_dir is not None:
        argv += ["--log_dir", str(log_dir)]
    if tee:
        argv += ["--tee", "3"]
    elif log_dir is not None:
        argv += ["--redirects", "3"]
    return argv + lifeline.worker_module_args(list(worker), python=python)


def forkserver_task_argv(*, nproc_per_node: int, nnodes: int, master: str, port: int, node_rank: int,
                         log_dir: Path, train_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """A warm pool's per-node launcher line: `probes.forkserver` forks this node's ranks of ``probes.train
    TRAIN_ARGS`` (rank 0's store at ``master:port``), in place of torchrun's worker processes."""
    return [python, "-u", "-m", "probes.forkserver", "--nproc", str(nproc_per_node), "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--master", f"{master}:{port}", "--log-dir", str(log_dir), "--",
            *train_args]


def _task_main(args: argparse.Namespace) -> int:
    """Inside an srun task: fill in this node's rank and exec torchrun, or the fork server (no shell, no
    expansion); it keeps this pid, which its workers' lifelines check as their parent's."""
    node_rank = int(os.environ.get("SLURM_PROCID", "0"))
    log_dir = Path(args.log_dir) / f"node{node_rank}" if args.log_dir else None
    worker = list(args.worker)
    if worker and worker[0] == "--":
        worker = worker[1:]
    if args.forkserver:
        if log_dir is None or worker[:2] != ["-m", "probes.train"]:
            print("probes.slurm_task task --forkserver needs --log-dir and the worker -m probes.train ...",
                  file=sys.stderr)
            return 2
        argv = forkserver_task_argv(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, master=args.master,
                                    port=args.port, node_rank=node_rank, log_dir=log_dir, train_args=worker[2:])
    else:
        argv = torchrun_task_argv(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, master=args.master,
                                  port=args.port, node_rank=node_rank, rdzv_id=args.rdzv_id, worker=worker,
                                  log_dir=log_dir, tee=args.tee)
    os.environ.update(lifeline.parent_env())
    os.execv(argv[0], argv)
    return 127  # not reached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes.slurm_task",
                                     description="internal: the per-node task srun starts for a probe")
    sub = parser.add_subparsers(dest="command", required=True)
    task = sub.add_parser("task", help="exec torchrun for this node of a slice (run by srun)")
    task.add_argument("--nproc-per-node", type=int, required=True)
    task.add_argument("--nnodes", type=int, required=True)
    task.add_argument("--master", required=True)
    task.add_argument("--port", type=int, required=True)
    task.add_argument("--rdzv-id", required=True)
    task.add_argument("--log-dir", default=None)
    task.add_argument("--tee", action="store_true")
    task.add_argument("--forkserver", action="store_true", help="fork the ranks from one process (probes.forkserver)")
    task.add_argument("worker", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return _task_main(args)


__all__ = ["forkserver_task_argv", "main", "torchrun_task_argv"]


if __name__ == "__main__":
    sys.exit(main())
