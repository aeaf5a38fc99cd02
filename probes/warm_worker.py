"""A warm probe worker: one torchrun rank that runs probe after probe, handed to it through a folder.

    python -m torch.distributed.run ... -m probes.lifeline worker python -u -m probes.train --serve POOL

The tuner's side is `probes.warm` (it writes the jobs and reads what comes back). Each rank waits for
``POOL/job-N.json`` (N = 0, 1, ...; written whole by an atomic rename: the probe's `ProbeSpec`, its folder
``out`` and environment overrides), then runs it as `probes.train` runs one probe: ``pid-rank{r}`` and phase
marks in ``out``, ``result.json`` from rank 0, ``error-rank{r}.json`` and the end of the process on a failure
(an OOM or a crash leaves no worker: torchrun stops the others and the next probe gets fresh ones). For the
job's duration the rank's stdout and stderr go to ``out/logs/warm/attempt_0/{rank}/std{out,err}.log``,
where a one-shot probe's torchrun logs are (the global rank: on one node it is the local rank torchrun names
them by; on a multi-node SLURM slice it keeps the nodes' ranks apart), so progress, pruning and the failure
classification read them alike.

Between probes: the default process group stays (one rendezvous per pool); each probe builds its device mesh
-- new process groups -- and a fresh model, and these groups are destroyed with the model afterwards. The
memory is released (garbage collected, the CUDA cache emptied, freed heap given back to the system on CPU)
and measured: each rank writes ``POOL/done-N-rank{r}.json`` with the bytes it holds (CUDA: allocated by
torch; CPU: resident set) before the pool's first probe, before this one, and after the release, and
whether the release came back within `probes.warm.RELEASE_SLACK_BYTES` of the pool's baseline (the tuner retires the
pool otherwise).

Pruning: the tuner writes ``POOL/stop-N``; rank 0 looks after each step, the flag rides in the step's loss
all-reduce, and every rank leaves the probe after the same step (no result.json; ``done`` says
``stopped``), releases its memory and waits for the next job.

Debug environment variables of `probes.train` (faults, the address-space cap, holds) work per job: a job's
``env`` is set in os.environ for its duration (the address-space limit is restored after it).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from probes.extent import resolve_probe
from probes.layout import LayoutError
from probes.lifeline import hold
from probes.memstat import current_bytes
from probes.phases import PhaseMarks
from probes.result import ProbeResult, ProbeSpec
from probes.train import PG_TIMEOUT_S, Stopped, _device_of, _emit, _fail, rendezvous, run_probe
from probes.warm import RELEASE_SLACK_BYTES, done_path, job_path, stop_path, write_atomic

JOB_POLL_S = 0.01
"""how soon a waiting rank first looks again for its next job file; the wait doubles up to `JOB_POLL_MAX_S`"""
JOB_POLL_MAX_S = 0.1
"""the longest a waiting rank sleeps between looks: a job handed over while it idles starts at most this late (the
queue phase, not the timed steps), and an idle rank costs ~0.1% of a core, not ~1% (at 10 ms: measured 10 ms CPU a
second, 2026-11-29)"""
LOG_RUN = "warm"
"""the run folder of a job's logs: out/logs/warm/attempt_0/{rank}/stdout.log (as torchrun's --log-dir)"""


def _wait_job(pool: Path, n: int) -> dict:
    path = job_path(pool, n)
    wait = JOB_POLL_S
    while not path.exists():
        time.sleep(wait)
        wait = min(2 * wait, JOB_POLL_MAX_S)
    return json.loads(path.read_text())


@contextlib.contextmanager
def _job_logs(out: Path, rank: int):
    """stdout and stderr (the file descriptors: torch's C++ output too) into the job's log files."""
    folder = out / "logs" / LOG_RUN / "attempt_0" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(folder / "stdout.log", "ab") as o, open(folder / "stderr.log", "ab") as e:
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def _job_env(overrides: dict):
    """os.environ with the job's overrides, and the address-space limit, as they were afterwards."""
    before = {k: os.environ.get(k) for k in overrides}
    limit = resource.getrlimit(resource.RLIMIT_AS)
    os.environ.update({k: str(v) for k, v in overrides.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        resource.setrlimit(resource.RLIMIT_AS, limit)


def _groups() -> set:
    """The process groups that exist now (torch's registry; empty when this torch has none to read)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    return set(getattr(world, "pg_map", None) or ())


def _trim_heap() -> None:
    """Give freed heap memory back to the system (glibc malloc_trim; nothing elsewhere)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _level(device: torch.device) -> float | None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return current_bytes(device)


def _forget_meshes() -> None:
    """Empty DTensor's caches of sharding plans. They are keyed by specs holding a DeviceMesh, and meshes compare
    equal by shape, names and device, not by process group: the next probe's mesh of the same shape would find the
    last probe's plans and run collectives on its destroyed groups ("Could not resolve the process group registered
    under the name 15": tests/test_probes_parallel.py's third 4-process layout on warm workers)."""
    try:
        from torch.distributed.tensor import _redistribute
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:
        return
    _clear_sharding_prop_cache()
    for clear in (getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
                  getattr(_redistribute, "clear_redistribute_planner_cache", None)):
        if clear is not None:
            clear()


def release(device: torch.device, groups_before: set) -> float | None:
    """Destroy the probe's process groups, forget the plans made on them, collect its objects, empty the caches;
    the bytes held afterwards."""
    if dist.is_initialized():
        for pg in _groups() - groups_before:
            if pg is not dist.group.WORLD:
                dist.destroy_process_group(pg)
        _forget_meshes()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    else:
        _trim_heap()
    return _level(device)


def serve(pool: Path, started: float) -> None:
    """Run the jobs of ``pool`` in order until the process is stopped (see the module docstring)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    write_atomic(pool / f"pid-rank{rank}", f"{os.getpid()}\n")
    device: torch.device | None = None
    rendezvous_at = started
    baseline: float | None = None
    n = 0
    while True:
        job = _wait_job(pool, n)
        picked = time.time()
        spec = ProbeSpec.from_dict(job["spec"])
        out = Path(job["out"])
        out.mkdir(parents=True, exist_ok=True)
        status = "ok"
        with _job_env(job.get("env") or {}), _job_logs(out, rank):
            (out / f"pid-rank{rank}").write_text(f"{os.getpid()}\n")
            marks = PhaseMarks(out if rank == 0 else None)
            marks.mark("start", started if n == 0 else picked)
            before = None
            groups_before: set = set()
            try:
                layout, extent = resolve_probe(spec, world=world, local_world=local_world)
                if device is None:
                    device = _device_of(spec, local_rank)
                    hold("setup")
                    if world > 1:
                        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                                timeout=timedelta(seconds=PG_TIMEOUT_S), **rendezvous(rank, world))
                    rendezvous_at = time.time()
                elif world > 1:
                    dist.barrier()                      # every rank has taken the job
                marks.mark("rendezvous", rendezvous_at if n == 0 else None)
                groups_before = _groups()
                before = _level(device)
                baseline = before if baseline is None else baseline
                result = run_probe(spec, layout, rank, world, device, picked, extent, marks,
                                   stop=stop_path(pool, n).exists)
                if rank == 0:
                    _emit(ProbeResult(**{**result.to_dict(), "workdir": str(out)}), out)
                del result
            except LayoutError as err:                  # the tuner checks first: only a changed world gets here
                status = "invalid"
                if rank == 0:
                    _emit(ProbeResult(status="invalid", reason=str(err), world_size=world, workdir=str(out)), out)
            except Stopped:
                status = "stopped"
            except Exception as err:  # noqa: BLE001 -- recorded for the launcher, then the process ends
                _fail(err, rank, out)
            hold("teardown")
            after = release(device, groups_before) if device is not None else None
        held = None if after is None or baseline is None else after - baseline
        write_atomic(done_path(pool, n, rank), json.dumps({
            "rank": rank, "status": status, "kind": "cuda_allocated" if device and device.type == "cuda" else "rss",
            "baseline_bytes": baseline, "before_bytes": before, "after_bytes": after, "held_bytes": held,
            "released": held is None or held <= RELEASE_SLACK_BYTES, "time": time.time()}) + "\n")
        n += 1


__all__ = ["JOB_POLL_S", "release", "serve"]
