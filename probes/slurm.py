"""SLURM backend: each probe is an ``srun`` step on a disjoint slice of one allocation.

    >>> from probes.slurm import SlurmBackend
    >>> with SlurmBackend(reservation="bigscience", gpus_per_node=8, nodes=48) as backend:
    ...     results = backend.run_many(specs, workdir=Path("runs"), timeout_s=900)

Inside an allocation (``SLURM_JOB_ID`` set, e.g. from an sbatch script) its nodes are used;
otherwise ``salloc --no-shell`` asks for ``nodes`` nodes (with ``--reservation``/``--partition``/
``--account`` when given) and ``scancel`` gives them back when the backend is closed.

A probe of W ranks takes a slice: W / gpus_per_node whole nodes (the step gets all of each node),
or, when W is smaller than a node, W slots of one node (``--exact --gres=gpu:W`` and W/gpus_per_node
of the node's CPUs; with ``gres=None`` slots are CPUs: ``--exact --cpus-per-task=W``). Each probe
is ``srun --ntasks-per-node=1 --kill-on-bad-exit=1 --time=M`` of ``python -m probes.slurm_task task``
on every node of its slice; for the built-in probe that task execs `probes.forkserver`, which imports torch and
the probe once and forks the node's N ranks (as a warm step does, below: a fresh step and fresh processes per
probe, without a Python and torch start per rank: ~7 s of CPU for a 2-rank probe against ~15 s under torchrun,
tests/bench/NOTES.md, "Suite time", round 13); for a framework's command (`run_command`: Megatron, torchtitan)
it execs ``python -u -m torch.distributed.run --nproc_per_node N --nnodes K --rdzv_endpoint FIRST_HOST:PORT
--rdzv_backend c10d --max_restarts 0 --node_rank $SLURM_PROCID ...`` (BigScience's tr11-176B-ml.slurm
launcher, without a shell). A probe past
its wall-clock limit has its step cancelled (``scancel JOB.STEP``) and srun's process group
killed; the slice goes back to the pool. A node that fails two probes is set aside and listed
in ``backend.set_aside``.

Warm workers (``SlurmBackend(warm=True)``; `tune`'s default for its built-in probe, ``--no-warm`` turns it off):
consecutive probes of one world size run in one long-lived step (`SlurmWarmPool`: the same task line with
``--forkserver``: each node's ranks forked by `probes.forkserver` from one process that imported torch, the
workers of `probes.warm_worker`, ``probes.train --serve FOLDER``), which holds its slice until it is retired;
the pool logic is `probes.warm`'s (jobs handed over whole, new process groups and a fresh model per probe, memory
checked; retired after an OOM, a crash, a timeout -- its step scancel'ed, the slice given back -- or a change of
world size, device or environment). `run_many` runs its concurrent probes one step each.
Commands are argument lists only; nothing goes through a shell.
As with any srun, this Python and the repository must be at the same paths on every node
(a shared filesystem); probe folders must be shared too (each node writes its rank logs there).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from probes import lifeline
from probes.backend import ProbeBackend
from probes.launch import KILL_GRACE_S, REPO_ROOT, ProcessTracker, probe_env
from probes.extent import resolve_probe
from probes.layout import LayoutError
from probes.outcome import classify
from probes.phases import MARKS_FILE, phases_of, read_marks
from probes.result import ProbeResult, ProbeSpec
from probes.slurm_guard import SlurmGuard
from probes.slurm_task import forkserver_task_argv, main, torchrun_task_argv  # noqa: F401 -- re-exported
from probes.steps import OnStep
from probes.warm import WarmPool, WarmWorkers

SLURM_COMMAND_TIMEOUT_S = 60.0
"""limit for one scontrol/squeue/scancel call"""
FAILURES_TO_SET_ASIDE = 2
NODE_FAILURE_STATUSES = ("crash", "timeout")
"""outcomes that may be a node's fault (an OOM or an invalid layout is the configuration's)"""
DEFAULT_PORT_BASE = 29600


class SlurmError(RuntimeError):
    """A SLURM command failed or an allocation could not be had; the message says which and why."""


def _run(argv: list[str], *, timeout_s: float = SLURM_COMMAND_TIMEOUT_S, env: Mapping[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired as err:
        raise SlurmError(f"{argv[0]} did not answer within {timeout_s:g} s ({' '.join(argv)})") from err
    except FileNotFoundError as err:
        raise SlurmError(f"{argv[0]} is not installed (SLURM client commands are needed)") from err


def expand_nodelist(nodelist: str, *, env: Mapping[str, str] | None = None) -> list[str]:
    """``node[01-03],gpu7`` -> ``["node01", "node02", "node03", "gpu7"]`` via ``scontrol show hostnames``."""
    if not nodelist.strip():
        return []
    out = _run(["scontrol", "show", "hostnames", nodelist], env=env)
    if out.returncode != 0:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {out.stderr.strip()}")
    return out.stdout.split()


# -- slices: pure functions of a node list ----------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    """Where one probe runs: ``procs_per_node`` ranks on each of ``hosts`` (rendezvous on hosts[0])."""

    hosts: tuple[str, ...]
    procs_per_node: int
    port: int = DEFAULT_PORT_BASE

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def world(self) -> int:
        return self.nnodes * self.procs_per_node

    @property
    def master(self) -> str:
        return self.hosts[0]

    def host_of_rank(self, rank: int) -> str:
        return self.hosts[min(rank // self.procs_per_node, self.nnodes - 1)]


def slice_shape(procs: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, procs per node) for a probe of ``procs`` ranks; ValueError when it cannot be laid out.

    ``procs`` < a node: one node, ``procs`` slots of it. Otherwise whole nodes: ``procs`` must be a
    multiple of ``gpus_per_node`` (torchrun starts the same count on every node).
    """
    if procs < 1 or gpus_per_node < 1:
        raise ValueError(f"procs {procs} and gpus per node {gpus_per_node} must be >= 1")
    if procs <= gpus_per_node:
        return 1, procs
    if procs % gpus_per_node:
        raise ValueError(f"a probe of {procs} ranks is not a whole number of {gpus_per_node}-GPU nodes; "
                         f"probe {procs // gpus_per_node * gpus_per_node} or "
                         f"{(procs // gpus_per_node + 1) * gpus_per_node} ranks")
    return procs // gpus_per_node, gpus_per_node


def find_slice(free: Mapping[str, int], order: Sequence[str], *, procs: int, gpus_per_node: int,
               port: int = DEFAULT_PORT_BASE) -> Slice | None:
    """First fit of a ``procs``-rank probe in ``free`` (host -> free slots), hosts tried in ``order``.

    Multi-node probes take wholly free nodes; a sub-node probe prefers a node already in use
    (packs probes so whole nodes stay free for big ones). None when nothing fits now.
    """
    nnodes, per_node = slice_shape(procs, gpus_per_node)
    if nnodes > 1 or per_node == gpus_per_node:
        whole = [h for h in order if free.get(h, 0) >= gpus_per_node]
        if len(whole) < nnodes:
            return None
        return Slice(hosts=tuple(whole[:nnodes]), procs_per_node=per_node, port=port)
    fits = [h for h in order if free.get(h, 0) >= per_node]
    if not fits:
        return None
    partial = [h for h in fits if free[h] < gpus_per_node]
    return Slice(hosts=((partial or fits)[0],), procs_per_node=per_node, port=port)


def plan_slices(nodes: Sequence[str], *, procs: int, gpus_per_node: int, port_base: int = DEFAULT_PORT_BASE
                ) -> list[Slice]:
    """Every disjoint slice a ``procs``-rank probe can have at once on ``nodes`` (48 nodes, 64 ranks of
    8 GPUs: 6 slices of 8 nodes). Ports differ per slice so that slices sharing a host do not clash."""
    free = {h: gpus_per_node for h in nodes}
    out: list[Slice] = []
    while (s := find_slice(free, list(nodes), procs=procs, gpus_per_node=gpus_per_node,
                           port=port_base + len(out))) is not None:
        out.append(s)
        for h in s.hosts:
            free[h] -= s.procs_per_node
    return out


class SlicePool:
    """The allocation's nodes as free slots; hands out disjoint slices to concurrent probes.

    Thread-safe. `acquire` blocks until a slice fits; it returns None at once when the probe can
    never fit on the nodes still in service. Failures are counted per node; a node reaching
    `FAILURES_TO_SET_ASIDE` is set aside (no new probe lands on it).
    """

    def __init__(self, nodes: Sequence[str], *, gpus_per_node: int, port_base: int = DEFAULT_PORT_BASE,
                 failures_to_set_aside: int = FAILURES_TO_SET_ASIDE) -> None:
        if not nodes:
            raise ValueError("a slice pool needs at least one node")
        self.order = list(dict.fromkeys(nodes))
        self.gpus_per_node = gpus_per_node
        self.free = {h: gpus_per_node for h in self.order}
        self.failures: dict[str, int] = {h: 0 for h in self.order}
        self.set_aside: dict[str, str] = {}
        """host -> why it was set aside"""
        self.failures_to_set_aside = failures_to_set_aside
        self._ports: set[int] = set()
        self._port_base = port_base
        self._cond = threading.Condition()

    def in_service(self) -> list[str]:
        return [h for h in self.order if h not in self.set_aside]

    def can_ever_fit(self, procs: int) -> bool:
        return find_slice({h: self.gpus_per_node for h in self.in_service()}, self.in_service(), procs=procs,
                          gpus_per_node=self.gpus_per_node) is not None

    def acquire(self, procs: int, *, timeout_s: float | None = None) -> Slice | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if not self.can_ever_fit(procs):
                    return None
                port = next(p for p in range(self._port_base, self._port_base + 10_000) if p not in self._ports)
                free = {h: n for h, n in self.free.items() if h not in self.set_aside}
                found = find_slice(free, self.order, procs=procs, gpus_per_node=self.gpus_per_node, port=port)
                if found is not None:
                    for h in found.hosts:
                        self.free[h] -= found.procs_per_node
                    self._ports.add(port)
                    return found
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(timeout=remaining)

    def release(self, s: Slice) -> None:
        with self._cond:
            for h in s.hosts:
                self.free[h] += s.procs_per_node
            self._ports.discard(s.port)
            self._cond.notify_all()

    def record(self, s: Slice, result: ProbeResult) -> list[str]:
        """Count a failed probe against its node(s); the hosts newly set aside."""
        if result.status not in NODE_FAILURE_STATUSES:
            return []
        blamed = [s.host_of_rank(result.root_cause_rank)] if result.root_cause_rank is not None else list(s.hosts)
        newly = []
        with self._cond:
            for h in blamed:
                self.failures[h] += 1
                if self.failures[h] >= self.failures_to_set_aside and h not in self.set_aside:
                    self.set_aside[h] = f"failed {self.failures[h]} probes (last: {result.status}: {result.reason})"
                    newly.append(h)
            self._cond.notify_all()
        return newly


# -- running one step -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """How one srun step ended and what it printed."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float
    hosts: tuple[str, ...]
    world: int
    job_id: str
    step_name: str
    rank_logs: dict[int, str] = field(default_factory=dict)
    cancelled_step: str | None = None
    """``JOB.STEP`` that was scancel'ed after the timeout"""
    pids: tuple[int, ...] = ()
    """local processes the launch started (torchrun and its workers on this machine)"""


def collect_rank_logs(workdir: Path, log_dir: Path, procs_per_node: int) -> dict[int, str]:
    """torchrun's per-rank files of every node -> ``rank{r}.stdout|stderr`` in workdir; texts by rank.

    Rank = node index * procs_per_node + local rank (the c10d rendezvous may number nodes in
    join order; the error records the probe writes carry the true global rank).
    """
    texts: dict[int, str] = {}
    for path in sorted(log_dir.glob("node*/*/attempt_*/*/std*.log")):
        node = int(path.parents[3].name.removeprefix("node"))  # node{i}/<run>/attempt_0/<local rank>/
        rank = node * procs_per_node + int(path.parent.name)
        target = workdir / f"rank{rank}.{path.stem}"
        target.write_bytes(path.read_bytes())
        texts[rank] = texts.get(rank, "") + path.read_text(errors="replace")
    return texts


class SlurmBackend(ProbeBackend):
    """Probes as srun steps on slices of a SLURM allocation (see the module docstring)."""

    name = "slurm"

    def __init__(self, reservation: str | None = None, partition: str | None = None, account: str | None = None, *,
                 gpus_per_node: int = 8, nodes_per_probe: int | None = None, nodes: int | None = None,
                 time_limit_s: float = 1800.0, gres: str | None = "gpu", nproc: int | None = None,
                 env: Mapping[str, str] | None = None, port_base: int = DEFAULT_PORT_BASE,
                 alloc_timeout_s: float = 600.0, overcommit: bool = False,
                 inside_allocation: bool | None = None, warm: bool = False) -> None:
        """``gres="gpu"`` asks steps for ``--gres=gpu:N``; ``gres=None`` counts CPUs (CPU probes).
        ``nodes``: how many nodes to salloc when not already inside an allocation (default
        ``nodes_per_probe`` or 1). A probe gets the candidate's TP*PP*DP ranks, or one DP replica
        (TP*PP, reported reduced) when that exceeds ``nodes_per_probe`` nodes, or exactly ``nproc``.
        ``inside_allocation``: None detects SLURM_JOB_ID; False always sallocs. ``env`` holds extra
        environment for SLURM commands and probe processes (SLURM_CONF for a test cluster). ``warm``: `run`
        keeps its workers in one step for the next probe of the same world size (`SlurmWarmPool`)."""
        for name, value in (("reservation", reservation), ("partition", partition), ("account", account)):
            if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
                raise ValueError(f"{name} {value!r} is not a SLURM name (letters, digits, '.', '_', '-')")
        self.reservation, self.partition, self.account = reservation, partition, account
        self.gpus_per_node = gpus_per_node
        self.nodes_per_probe = nodes_per_probe
        self.nodes_wanted = nodes or nodes_per_probe or 1
        self.time_limit_s = time_limit_s
        self.gres = gres
        self.nproc = nproc
        self.env = dict(env or {})
        self.port_base = port_base
        self.alloc_timeout_s = alloc_timeout_s
        self.overcommit = overcommit
        self.inside_allocation = inside_allocation
        self.job_id: str | None = None
        self.cpus_per_node: int | None = None
        """CPUs the allocation holds on each node (from squeue %C), to share among sub-node slices"""
        self.owns_allocation = False
        self._pool: SlicePool | None = None
        self._guard: SlurmGuard | None = None
        self._lock = threading.Lock()
        self.warm = warm
        self.reports_steps = warm
        """warm workers report each timed step (on_step) and stop a pruned probe; a one-shot step does not"""
        self._workers: WarmWorkers | None = None
        self._workers_env: dict[str, str] = {}

    # -- allocation ---------------------------------------------------------------------------
    def _client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _allocation_args(self) -> list[str]:
        out = []
        if self.reservation:
            out.append(f"--reservation={self.reservation}")
        if self.partition:
            out.append(f"--partition={self.partition}")
        if self.account:
            out.append(f"--account={self.account}")
        return out

    def allocate(self) -> list[str]:
        """The allocation's hosts: this job's (SLURM_JOB_ID) or a new ``salloc --no-shell`` one."""
        with self._lock:
            if self._pool is not None:
                return self._pool.order
            env = self._client_env()
            self._guard = SlurmGuard(env)   # scancels this backend's steps and allocation if the tuner dies
            inside = self.inside_allocation
            if inside is None:
                inside = bool(env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST"))
            try:
                if inside:
                    self.job_id = env["SLURM_JOB_ID"]
                    hosts = expand_nodelist(env["SLURM_JOB_NODELIST"], env=env)
                else:
                    self.job_id, hosts = self._salloc(env, self._guard)
                    self.owns_allocation = True
            except BaseException:
                self._guard.close()
                self._guard = None
                raise
            self.cpus_per_node = self._allocated_cpus_per_node(len(hosts), env)
            self._pool = SlicePool(hosts, gpus_per_node=self.gpus_per_node, port_base=self.port_base)
            return hosts

    def _allocated_cpus_per_node(self, nnodes: int, env: dict[str, str]) -> int | None:
        try:
            out = _run(["squeue", "-h", "-j", str(self.job_id), "-o", "%C"], env=env)
        except SlurmError:
            return None
        text = out.stdout.strip()
        return int(text) // max(1, nnodes) if out.returncode == 0 and text.isdigit() else None

    def _salloc(self, env: dict[str, str], guard: SlurmGuard) -> tuple[str, list[str]]:
        name = f"plantune-probes-{uuid.uuid4().hex[:8]}"
        minutes = max(1, math.ceil(self.time_limit_s / 60))
        argv = ["salloc", "--no-shell", f"--job-name={name}", f"--nodes={self.nodes_wanted}", "--exclusive",
                f"--time={minutes}", *self._allocation_args()]
        if self.gres:
            argv.append(f"--gres={self.gres}:{self.gpus_per_node}")
        guard.watch_job(name)
        try:   # salloc dies with the tuner (its lifeline); the guard then cancels the request by name
            out = _run(lifeline.wrap("salloc", argv), timeout_s=self.alloc_timeout_s, env=lifeline.parent_env(env))
        except SlurmError:
            _run(["scancel", f"--name={name}"], env=env)
            raise SlurmError(f"no allocation within {self.alloc_timeout_s:g} s ({' '.join(argv)}); request cancelled")
        granted = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
        if out.returncode != 0 or not granted:
            raise SlurmError(f"{' '.join(argv)} failed: {(out.stderr or out.stdout).strip()}")
        job_id = granted.group(1)
        listed = _run(["squeue", "-h", "-j", job_id, "-o", "%N"], env=env)
        return job_id, expand_nodelist(listed.stdout.strip(), env=env)

    def close(self) -> None:
        """Stop the warm workers' step; give back an allocation this backend asked for (``scancel JOB``); end the
        guard."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self.owns_allocation and self.job_id:
            _run(["scancel", self.job_id], env=self._client_env())
            self.owns_allocation = False
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        self._pool = None

    def __enter__(self) -> "SlurmBackend":
        self.allocate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pool(self) -> SlicePool:
        self.allocate()
        if self._pool is None:
            raise SlurmError("the allocation was closed; use the backend inside its `with` block")
        return self._pool

    @property
    def set_aside(self) -> dict[str, str]:
        """Nodes no longer used, host -> why."""
        return dict(self._pool.set_aside) if self._pool else {}

    # -- one step -----------------------------------------------------------------------------
    def srun_argv(self, s: Slice, *, step_name: str, time_limit_s: float, task_argv: Sequence[str]) -> list[str]:
        """``srun`` for one probe on slice ``s``: one task per node, killed whole if one fails."""
        minutes = max(1, math.ceil(time_limit_s / 60))
        argv = ["srun", f"--jobid={self.job_id}", f"--job-name={step_name}", f"--nodes={s.nnodes}",
                f"--ntasks={s.nnodes}", "--ntasks-per-node=1", f"--nodelist={','.join(s.hosts)}",
                "--kill-on-bad-exit=1", "--wait=60", f"--time={minutes}"]
        if self.gres:
            argv.append(f"--gres={self.gres}:{s.procs_per_node}")
        if s.procs_per_node < self.gpus_per_node:  # a share of the node: only its slots, so others fit beside
            cpus = s.procs_per_node
            if self.gres and self.cpus_per_node:
                cpus = max(1, self.cpus_per_node // self.gpus_per_node) * s.procs_per_node
            argv += ["--exact", f"--cpus-per-task={cpus}"]
        if self.overcommit:
            argv.append("--overcommit")
        return argv + list(task_argv)

    def task_argv(self, s: Slice, *, worker: Sequence[str], rdzv_id: str, log_dir: Path | None, tee: bool,
                  forkserver: bool = False) -> list[str]:
        """``python -m probes.slurm_task task ...`` for slice ``s``; ``forkserver``: the node's ranks are forked by
        `probes.forkserver` (a warm pool's ``-m probes.train --serve``), not started by torchrun."""
        argv = [sys.executable, "-m", "probes.slurm_task", "task", "--nproc-per-node", str(s.procs_per_node),
                "--nnodes", str(s.nnodes), "--master", s.master, "--port", str(s.port), "--rdzv-id", rdzv_id]
        if log_dir is not None:
            argv += ["--log-dir", str(log_dir)]
        if tee:
            argv.append("--tee")
        if forkserver:
            argv.append("--forkserver")
        return argv + ["--", *worker]

    def _step_id(self, step_name: str, env: dict[str, str]) -> str | None:
        try:
            out = _run(["squeue", "-h", "-s", "-j", str(self.job_id), "-o", "%i %j"], env=env)
        except SlurmError:
            return None
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == step_name:
                return parts[0]
        return None

    def _stop_step(self, proc: subprocess.Popen, step_name: str, env: dict[str, str]) -> str | None:
        """scancel the step (its tasks on every node), then srun's process group by pid."""
        step = self._step_id(step_name, env)
        if step is not None:
            try:
                _run(["scancel", step], env=env)
            except SlurmError:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=KILL_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        return step

    def run_step(self, s: Slice, worker: Sequence[str], *, workdir: Path, timeout_s: float,
                 env: Mapping[str, str] | None = None, tee: bool = False, log_dir: Path | None = None,
                 cwd: Path | None = None, forkserver: bool = False) -> StepOutcome:
        """Run ``worker`` under torchrun on every node of ``s`` (``forkserver``: ``-m probes.train ...`` forked by
        `probes.forkserver`, which needs ``log_dir``); kill it after ``timeout_s``."""
        workdir.mkdir(parents=True, exist_ok=True)
        step_name = f"plantune-{uuid.uuid4().hex[:10]}"
        overrides = probe_env({**self.env, **(env or {})})
        full_env = {**os.environ, **overrides}
        argv = self.srun_argv(s, step_name=step_name, time_limit_s=min(timeout_s, self.time_limit_s) + 60,
                              task_argv=self.task_argv(s, worker=worker, rdzv_id=step_name, log_dir=log_dir, tee=tee,
                                                       forkserver=forkserver))
        cwd = Path(cwd or REPO_ROOT)
        command = {"argv": argv, "cwd": str(cwd), "env": overrides, "timeout_s": timeout_s,
                   "hosts": list(s.hosts), "procs_per_node": s.procs_per_node, "job_id": self.job_id,
                   "step_name": step_name, "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")
        started = time.monotonic()
        timed_out, step = False, None
        guard = self._guard
        if guard is not None:
            guard.watch_step(str(self.job_id), step_name)
        with open(workdir / "srun.stdout", "wb") as out, open(workdir / "srun.stderr", "wb") as err:
            # srun dies with the tuner (its lifeline), which ends the step; the guard scancels it in any case
            proc = subprocess.Popen(lifeline.wrap("srun", argv), cwd=cwd, env=lifeline.parent_env(full_env),
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                step = self._stop_step(proc, step_name, full_env)
            finally:
                if proc.poll() is None:
                    step = self._stop_step(proc, step_name, full_env)
                if guard is not None:
                    guard.forget(step_name)
        wall_s = time.monotonic() - started
        command.update({"returncode": proc.returncode, "timed_out": timed_out, "wall_s": wall_s,
                        "cancelled_step": step})
        (workdir / "command.json").write_text(json.dumps(command, indent=1) + "\n")
        rank_logs = collect_rank_logs(workdir, log_dir, s.procs_per_node) if log_dir is not None else {}
        return StepOutcome(returncode=proc.returncode, timed_out=timed_out,
                           stdout=(workdir / "srun.stdout").read_text(errors="replace"),
                           stderr=(workdir / "srun.stderr").read_text(errors="replace"), wall_s=wall_s,
                           hosts=s.hosts, world=s.world, job_id=str(self.job_id), step_name=step_name,
                           rank_logs=rank_logs, cancelled_step=step)

    def run_command(self, worker: Sequence[str], *, procs: int, workdir: Path, timeout_s: float,
                    env: Mapping[str, str] | None = None, tee: bool = True, cwd: Path | None = None
                    ) -> StepOutcome | None:
        """Acquire a slice for ``procs`` ranks, run ``worker`` on it, release it. None when no slice
        can ever fit (the nodes in service are too few)."""
        s = self.pool.acquire(procs)
        if s is None:
            return None
        try:
            return self.run_step(s, worker, workdir=Path(workdir).resolve(), timeout_s=timeout_s, env=env, tee=tee,
                                 log_dir=Path(workdir).resolve() / "logs", cwd=cwd)
        finally:
            self.pool.release(s)

    def record(self, s: Slice | tuple[str, ...], result: ProbeResult) -> list[str]:
        if not isinstance(s, Slice):
            s = Slice(hosts=tuple(s), procs_per_node=max(1, result.world_size // max(1, len(s))))
        return self.pool.record(s, result)

    # -- ProbeBackend ---------------------------------------------------------------------------
    def procs_for_candidate(self, candidate: Mapping[str, object]) -> int:
        """Ranks a probe of ``candidate`` (a Candidate dict) runs: ``nproc``, else TP*PP*DP, or one DP
        replica (TP*PP, a reduced probe) when the full layout exceeds ``nodes_per_probe`` nodes."""
        if self.nproc is not None:
            return self.nproc
        tp_pp = int(candidate["tp"]) * int(candidate["pp"])
        procs = tp_pp * int(candidate["dp"])
        if self.nodes_per_probe:
            cap = self.nodes_per_probe * self.gpus_per_node
            procs = procs if procs <= cap else tp_pp
        return procs

    def procs_for(self, spec: ProbeSpec) -> int:
        """`procs_for_candidate` times the spec's context-parallel ranks (TP·CP·PP·DP)."""
        return self.procs_for_candidate(spec.candidate) * (1 if self.nproc is not None else spec.cp)

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float, on_step: OnStep | None = None
            ) -> ProbeResult:
        """Run the torch probe (``probes.train``) for ``spec`` on a free slice -- in the warm workers' step when
        the backend is ``warm`` (``on_step`` then gets each timed step: `probes.warm.WarmPool.run`); always a
        ProbeResult."""
        return self._run(spec, workdir=workdir, timeout_s=timeout_s, on_step=on_step, warm=self.warm)

    def _run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float, on_step: OnStep | None = None,
             warm: bool = False) -> ProbeResult:
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        for stale in [*workdir.glob("error-rank*.json"), *workdir.glob("pid-rank*"), *workdir.glob("rank*.std*"),
                      workdir / "result.json", workdir / MARKS_FILE]:
            stale.unlink(missing_ok=True)
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True) + "\n")
        procs = self.procs_for(spec)

        def invalid(reason: str) -> ProbeResult:
            r = ProbeResult(status="invalid", reason=reason, world_size=procs, workdir=str(workdir), wall_s=0.0)
            r.write(workdir / "result.json")
            return r

        try:
            nnodes, per_node = slice_shape(procs, self.gpus_per_node)
            resolve_probe(spec, world=procs, local_world=per_node)
        except (LayoutError, ValueError) as err:
            return invalid(str(err))
        if warm:
            if not self.pool.can_ever_fit(procs):
                return invalid(self._no_fit(procs))
            return self._run_warm(spec, procs=procs, workdir=workdir, timeout_s=timeout_s, on_step=on_step)
        s = self.pool.acquire(procs)
        if s is None:
            return invalid(self._no_fit(procs))
        spawned = time.time()
        try:
            worker = ["-m", "probes.train", "--spec", str(spec_path), "--out", str(workdir)]
            step = self.run_step(s, worker, workdir=workdir, timeout_s=timeout_s, log_dir=workdir / "logs",
                                 forkserver=True)
        finally:
            self.pool.release(s)
        ended = time.time()
        # srun's wait for the step's resources is inside "launch" (it is not told apart from the start)
        phases = phases_of(read_marks(workdir), spawned=spawned, stopped=ended, ended=ended)
        extra = {"hosts": list(step.hosts), "job_id": step.job_id, "step_name": step.step_name,
                 "returncode": step.returncode}
        if step.cancelled_step:
            extra["cancelled_step"] = step.cancelled_step
        result = classify(workdir, returncode=step.returncode, timed_out=step.timed_out, timeout_s=timeout_s,
                          torchrun_stderr=step.stderr, rank_logs=step.rank_logs, wall_s=step.wall_s,
                          world_size=step.world, extra=extra)
        launcher_error = not step.rank_logs and "srun: error" in step.stderr
        if launcher_error:  # the step never started: SLURM refused it, no node is to blame
            result = ProbeResult.from_dict({**result.to_dict(), "extra": {**result.extra, "launcher_error": True}})
        result = ProbeResult.from_dict({**result.to_dict(), "phases": phases})
        newly = [] if launcher_error else self.pool.record(s, result)
        if newly:
            result = ProbeResult.from_dict({**result.to_dict(), "extra": {**result.extra, "set_aside": newly}})
        result.write(workdir / "result.json")
        return result

    def _no_fit(self, procs: int) -> str:
        return (f"{procs} ranks do not fit on the {len(self.pool.in_service())} node(s) in service "
                f"x {self.gpus_per_node} (set aside: {sorted(self.pool.set_aside) or 'none'})")

    def _run_warm(self, spec: ProbeSpec, *, procs: int, workdir: Path, timeout_s: float,
                  on_step: OnStep | None) -> ProbeResult:
        """``spec`` in the warm workers (a new step on a new slice when none serves ``procs`` ranks); the failure
        is counted against the slice's nodes as a one-shot step's."""
        if self._workers is not None and self._workers_env != self.env:
            self._workers.close()                       # the workers were started with another environment
            self._workers = None
        if self._workers is None:
            self._workers = WarmWorkers(start=self._start_pool)
            self._workers_env = dict(self.env)
        result = self._workers.run(spec, nproc=procs, workdir=workdir, timeout_s=timeout_s, on_step=on_step)
        hosts = result.extra.get("hosts")
        if not hosts:
            return result
        pool_err = Path(result.extra["warm"]["pool"]) / f"{SlurmWarmPool.launcher}.stderr"
        launcher_error = (result.status != "ok" and not list(workdir.glob("rank*.std*")) and pool_err.is_file()
                          and "srun: error" in pool_err.read_text(errors="replace"))
        extra = dict(result.extra)
        if launcher_error:   # the step never started: SLURM refused it, no node is to blame
            extra["launcher_error"] = True
        newly = [] if launcher_error else self.pool.record(
            Slice(hosts=tuple(hosts), procs_per_node=max(1, procs // len(hosts))), result)
        if newly:
            extra["set_aside"] = newly
        if extra != result.extra:
            result = ProbeResult.from_dict({**result.to_dict(), "extra": extra})
            result.write(workdir / "result.json")
        return result

    def _start_pool(self, spec: ProbeSpec, nproc: int, folder: Path) -> "SlurmWarmPool":
        """`WarmWorkers`' ``start``: a slice for ``nproc`` ranks (waiting for one), a step of workers on it."""
        s = self.pool.acquire(nproc)
        if s is None:
            raise SlurmError(self._no_fit(nproc))
        try:
            return SlurmWarmPool(self, s, folder, device=spec.device)
        except BaseException:
            self.pool.release(s)
            raise

    def run_many(self, specs: Sequence[ProbeSpec], *, workdir: Path, timeout_s: float) -> list[ProbeResult]:
        """Run ``specs`` concurrently on disjoint slices (``workdir/probe-0000`` ...), a step each (no warm
        workers: each thread would need its own); results in order."""
        workdir = Path(workdir)
        if not specs:
            return []
        capacity = max(1, min(len(specs), sum(self.gpus_per_node for _ in self.pool.in_service())))
        with ThreadPoolExecutor(max_workers=capacity, thread_name_prefix="slurm-probe") as pool:
            futures = [pool.submit(self._run, spec, workdir=workdir / f"probe-{i:04d}", timeout_s=timeout_s)
                       for i, spec in enumerate(specs)]
            return [f.result() for f in futures]


class SlurmWarmPool(WarmPool):
    """Warm workers in one srun step on slice ``s`` of ``backend``'s allocation: `probes.warm.WarmPool` with
    srun in place of a local fork server. The step runs the backend's per-node task (a `probes.forkserver` on
    every node of the slice, forking ``probes.train --serve FOLDER`` as its workers), is watched by the backend's
    guard (scancel'ed if the tuner dies) and holds the slice until the pool is retired: then it is scancel'ed,
    srun's process group killed and the slice given back. Only srun's own process tree is signalled from here:
    the workers' pid files name processes of other nodes."""

    launcher = "srun"

    def __init__(self, backend: SlurmBackend, s: Slice, folder: Path, *, device: str = "auto") -> None:
        self.backend = backend
        self.slice = s
        self.step_name = f"plantune-warm-{uuid.uuid4().hex[:10]}"
        self.cancelled_step: str | None = None
        self._released = False
        self._guard = backend._guard
        if self._guard is not None:
            self._guard.watch_step(str(backend.job_id), self.step_name)
        try:
            super().__init__(s.world, folder, device=device, env=backend.env)
        except BaseException:
            if self._guard is not None:
                self._guard.forget(self.step_name)
            raise

    def _argv(self) -> list[str]:
        task = self.backend.task_argv(self.slice, worker=["-m", "probes.train", "--serve", str(self.folder)],
                                      rdzv_id=self.step_name, log_dir=self.folder / "logs", tee=False,
                                      forkserver=True)
        return self.backend.srun_argv(self.slice, step_name=self.step_name, time_limit_s=self.backend.time_limit_s,
                                      task_argv=task)

    def _tracker(self) -> ProcessTracker:
        return ProcessTracker(self.proc.pid, None)

    def _stop(self) -> None:
        if self._released:
            return
        self.cancelled_step = self.backend._stop_step(self.proc, self.step_name, {**os.environ, **self.overrides})
        if self._guard is not None:
            self._guard.forget(self.step_name)
        self._released = True
        if self.backend._pool is not None:
            self.backend._pool.release(self.slice)

    def launch_extra(self) -> dict:
        extra = {"hosts": list(self.slice.hosts), "job_id": str(self.backend.job_id), "step_name": self.step_name}
        if self.cancelled_step:
            extra["cancelled_step"] = self.cancelled_step
        return extra


if __name__ == "__main__":
    sys.exit(main())
