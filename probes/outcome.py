"""Classify how a probe ended: ok | oom | timeout | crash, with the root-cause rank (no torch).

    >>> from probes.outcome import classify
    >>> result = classify(workdir, returncode=1, timed_out=False, timeout_s=300)

Evidence, in order of trust:
1. ``result.json`` written by rank 0 of `probes.train` (ok, or invalid);
2. ``error-rank{r}.json`` records written by a failing rank (status, message, time);
3. torchrun's failure summary (rank, exitcode per failed worker) in its stderr;
4. the per-rank stdout/stderr logs scanned for OOM and communication-error markers.

Root cause (torchrun's "first observed failure" is often a rank that only saw its peer vanish):
the earliest record that is not a peer-failure error; else a rank that died without a record
(killed by a signal other than the agent's SIGTERM -- SIGKILL from the OOM killer or a preemption --
or ``os._exit``), torchrun's first observed one among them; else the earliest record. A rank killed
by a signal from outside is marked ``extra["killed_by"]`` (the tuner retries it once).
Shared by the local and SLURM launchers.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from probes.result import ProbeResult

OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "DefaultCPUAllocator: can't allocate memory",
               "MemoryError", "std::bad_alloc")
"""text that means a rank ran out of (device or host) memory"""
PEER_FAILURE_MARKERS = ("Connection reset by peer", "Connection closed by peer", "remote worker", "Broken pipe",
                        "NCCL communicator was aborted", "DistNetworkError", "Socket Timeout",
                        "failed to recv", "Connection refused")
"""text of an error a rank raises because another rank died (not itself a root cause)"""
COMM_MARKERS = ("NCCL", "gloo", "ProcessGroup", "c10d")
AGENT_SIGNALS = (-signal.SIGTERM,)
"""exit codes of workers that torchrun stopped after another failure (it sends SIGTERM; a SIGKILL comes from
outside: the kernel OOM killer, a preemption, an operator)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFailure:
    rank: int
    status: str
    """oom | crash"""
    message: str
    time_s: float | None = None
    exitcode: int | None = None
    has_record: bool = False

    @property
    def peer_failure(self) -> bool:
        return any(m in self.message for m in PEER_FAILURE_MARKERS)


_FAILURE_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def parse_torchrun_failures(stderr_text: str) -> dict[int, int]:
    """{rank: exitcode} from torchrun's ChildFailedError summary (Failures and Root Cause blocks)."""
    return {int(r): int(code) for r, code in _FAILURE_RE.findall(stderr_text)}


_ROOT_RE = re.compile(r"Root Cause[^\n]*\n(?:[^\n]*\n)*?\s*rank\s*:\s*(\d+)")


def parse_first_observed(stderr_text: str) -> int | None:
    """The rank torchrun's "Root Cause (first observed failure)" block names, or None."""
    m = _ROOT_RE.search(stderr_text)
    return int(m.group(1)) if m else None


def read_error_records(workdir: Path) -> dict[int, dict]:
    out = {}
    for path in sorted(workdir.glob("error-rank*.json")):
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        out[int(rec["rank"])] = rec
    return out


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel OOM killer sends SIGKILL)" if code == -signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def _scan(text: str, markers: tuple[str, ...]) -> str | None:
    for line in text.splitlines():
        if any(m in line for m in markers):
            return line.strip()[:500]
    return None


def failures(workdir: Path, torchrun_stderr: str, rank_logs: dict[int, str]) -> list[RankFailure]:
    """Every failed rank, from error records, torchrun's summary and the rank logs."""
    records = read_error_records(workdir)
    exits = parse_torchrun_failures(torchrun_stderr)
    out = []
    for rank in sorted(set(records) | set(exits)):
        rec = records.get(rank)
        code = exits.get(rank)
        log = rank_logs.get(rank, "")
        if rec is not None:
            out.append(RankFailure(rank=rank, status=rec.get("status", "crash"), message=rec.get("message", ""),
                                   time_s=rec.get("time"), exitcode=code, has_record=True))
            continue
        oom_line = _scan(log, OOM_MARKERS)
        message = oom_line or _exit_text(code if code is not None else 1)
        out.append(RankFailure(rank=rank, status="oom" if oom_line else "crash", message=message, exitcode=code))
    return out


def root_cause(fails: list[RankFailure], first_observed: int | None = None) -> RankFailure | None:
    """The failure that caused the others (see the module docstring); ``first_observed``: torchrun's root rank."""
    if not fails:
        return None
    own = [f for f in fails if f.has_record and not f.peer_failure]
    if own:
        return min(own, key=lambda f: f.time_s or 0.0)
    abrupt = [f for f in fails if not f.has_record and f.exitcode not in AGENT_SIGNALS]
    if abrupt:
        return next((f for f in abrupt if f.rank == first_observed), abrupt[0])
    recorded = [f for f in fails if f.has_record]
    if recorded:
        return min(recorded, key=lambda f: f.time_s or 0.0)
    return fails[0]


def classify(workdir: Path, *, returncode: int | None, timed_out: bool, timeout_s: float,
             torchrun_stderr: str = "", rank_logs: dict[int, str] | None = None, wall_s: float | None = None,
             world_size: int = 0, extra: dict | None = None) -> ProbeResult:
    """The probe's `ProbeResult` from what its folder and processes left behind."""
    extra = dict(extra or {})
    rank_logs = rank_logs or {}
    common = {"wall_s": wall_s, "workdir": str(workdir), "world_size": world_size}
    result_path = workdir / "result.json"
    if result_path.is_file():                   # rank 0 finished measuring, even if teardown then hung
        try:
            found = ProbeResult.read(result_path)
        except (json.JSONDecodeError, TypeError, ValueError):
            found = None
        if found is not None:
            d = found.to_dict()
            extra = {**d.get("extra", {}), **extra, "train_wall_s": d.get("wall_s")}
            if timed_out:
                extra["timed_out_after_result"] = True
            return ProbeResult.from_dict({**d, **common, "world_size": found.world_size or world_size,
                                          "extra": extra})
    fails = failures(workdir, torchrun_stderr, rank_logs)
    extra["failures"] = [f"rank {f.rank}: {f.status}: {f.message}" for f in fails]
    if timed_out:
        root = root_cause([f for f in fails if f.status == "oom" or not f.peer_failure])
        if root is not None and root.status == "oom":
            return ProbeResult(status="oom", reason=f"rank {root.rank}: {root.message}", root_cause_rank=root.rank,
                               extra=extra, **common)
        return ProbeResult(status="timeout", reason=f"no result within {timeout_s:g} s; process group killed",
                           extra=extra, **common)
    root = root_cause(fails, parse_first_observed(torchrun_stderr))
    if root is None:
        oom_rank = next((r for r, text in sorted(rank_logs.items()) if _scan(text, OOM_MARKERS)), None)
        if oom_rank is not None:
            line = _scan(rank_logs[oom_rank], OOM_MARKERS)
            return ProbeResult(status="oom", reason=f"rank {oom_rank}: {line}", root_cause_rank=oom_rank,
                               extra=extra, **common)
        tail = (torchrun_stderr.strip().splitlines() or ["no output"])[-1][:300]
        code = returncode if returncode is not None else -1
        return ProbeResult(status="crash", reason=f"launcher {_exit_text(code)} without a result: {tail}",
                           extra=extra, **common)
    reason = f"rank {root.rank}: {root.message}"
    if root.status == "crash" and not root.has_record and root.exitcode is not None and root.exitcode < 0:
        try:
            extra["killed_by"] = signal.Signals(-root.exitcode).name
        except ValueError:
            extra["killed_by"] = f"signal {-root.exitcode}"
    if root.status != "oom" and any(m in root.message for m in COMM_MARKERS):
        reason = f"rank {root.rank}: communication error: {root.message}"
    return ProbeResult(status=root.status, reason=reason, root_cause_rank=root.rank, extra=extra, **common)


__all__ = ["OOM_MARKERS", "PEER_FAILURE_MARKERS", "RankFailure", "classify", "failures", "parse_first_observed",
           "parse_torchrun_failures",
           "read_error_records", "root_cause"]
