"""Answer probes from a table of earlier measurements (offline evaluation of search strategies, tests).

    tune --model 1B3 --gpu V100-32GB --gpus 8 --gpus-per-node 4 --global-batch 512 --seq-len 2048 \\
         --precision fp16 --recompute full --zero 1 --backend replay \\
         --results ../shared/data/bigscience_1b3_v100.csv --results-table v100-32gb-recompute

The CSV has one row per measured configuration: ``tp, pp, dp, micro_batch`` (and optionally
``activation_recompute``, ``global_batch``, ``seq_len``, ``table``), ``status`` (ok | oom | ...),
``seconds_per_iteration`` and ``memory_gb`` (as the table gives it). A row matches a candidate on
(tp, pp, dp, mbs, recompute); ZeRO and the rest are what the user planned with.

The search space is restricted to the table's rows (`ReplayTable.keys`) that the planner lets
through; a row the planner rules out is reported, never probed. A configuration that is not in
the table (possible only without the restriction) is answered ``invalid`` with ``not measured``.
"""

from __future__ import annotations

import csv
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from planner import Candidate, Estimate
from probes.backend import ProbeBackend
from probes.result import ProbeResult, ProbeSpec

from search._base import TuneError

NOT_MEASURED = "not measured"
_REQUIRED = ("tp", "pp", "dp", "micro_batch", "status")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRow:
    tp: int
    pp: int
    dp: int
    mbs: int
    recompute: str | None
    status: str
    step_time_s: float | None
    memory_gb: float | None
    global_batch: int | None
    seq_len: int | None

    def matches(self, c: Candidate) -> bool:
        return ((self.tp, self.pp, self.dp, self.mbs) == (c.tp, c.pp, c.dp, c.mbs)
                and (self.recompute is None or self.recompute == c.recompute))


def _num(text: str | None, kind: type) -> float | int | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayTable:
    path: str
    table: str | None
    rows: tuple[ReplayRow, ...]

    @classmethod
    def read(cls, path: str, table: str | None = None) -> "ReplayTable":
        p = Path(path)
        if not p.is_file():
            raise TuneError(f"--results {path} does not exist; give a CSV of earlier measurements")
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in _REQUIRED if c not in header]
            if missing:
                raise TuneError(f"--results {path}: missing columns {missing}; needs {', '.join(_REQUIRED)}, "
                                "seconds_per_iteration, memory_gb")
            raw = list(reader)
        tables = sorted({r.get("table", "") for r in raw if r.get("table")})
        if table is None and len(tables) > 1:
            raise TuneError(f"--results {path} holds several tables ({', '.join(tables)}); pick one with "
                            "--results-table")
        if table is not None and table not in tables:
            raise TuneError(f"--results-table {table!r} is not in {path}; tables: {', '.join(tables) or 'none'}")
        rows = []
        for r in raw:
            if table is not None and r.get("table") != table:
                continue
            tp, pp, dp, mbs = (_num(r.get(k), int) for k in ("tp", "pp", "dp", "micro_batch"))
            if None in (tp, pp, dp, mbs):
                raise TuneError(f"--results {path}: a row has a non-integer tp/pp/dp/micro_batch: {dict(r)}")
            rows.append(ReplayRow(tp=tp, pp=pp, dp=dp, mbs=mbs, recompute=(r.get("activation_recompute") or None),
                                  status=(r.get("status") or "ok").strip().lower(),
                                  step_time_s=_num(r.get("seconds_per_iteration"), float),
                                  memory_gb=_num(r.get("memory_gb"), float),
                                  global_batch=_num(r.get("global_batch"), int), seq_len=_num(r.get("seq_len"), int)))
        if not rows:
            raise TuneError(f"--results {path}: no rows")
        return cls(path=str(path), table=table or (tables[0] if tables else None), rows=tuple(rows))

    def check(self, *, global_batch: int, seq_len: int) -> None:
        """The table must be measured at the batch and sequence the study plans with."""
        for attr, want, flag in (("global_batch", global_batch, "--global-batch"), ("seq_len", seq_len, "--seq-len")):
            seen = {getattr(r, attr) for r in self.rows} - {None}
            if seen and seen != {want}:
                raise TuneError(f"--results {self.path} was measured at {attr} {sorted(seen)}; plan with "
                                f"{flag} {sorted(seen)[0]} to replay it")

    def find(self, c: Candidate) -> ReplayRow | None:
        return next((r for r in self.rows if r.matches(c)), None)

    def restrict(self, survivors: list[Estimate]) -> tuple[set[str], list[tuple[str, str]]]:
        """(keys of survivors with a row, [(row, why)] for rows no survivor matches)."""
        keep, orphans = set(), []
        for row in self.rows:
            hits = [e for e in survivors if row.matches(e.candidate)]
            keep.update(e.candidate.label() for e in hits)
            if not hits:
                label = f"tp={row.tp},pp={row.pp},dp={row.dp},mbs={row.mbs}" + (
                    f",recompute={row.recompute}" if row.recompute else "")
                orphans.append((label, f"in the table ({row.status}) but ruled out by the planner; never probed"))
        return keep, orphans


class ReplayBackend(ProbeBackend):
    """A `probes.backend.ProbeBackend` whose probes read the table instead of running.

    ``noise`` > 0 multiplies each answered step time by exp(N(0, noise)) (seeded by ``seed`` and
    the configuration), to exercise confirmation; 0 answers the table's numbers exactly.
    ``delay_s`` makes each probe take that long (wall clock), like a real one.
    """

    name = "replay"

    def __init__(self, table: ReplayTable, *, noise: float = 0.0, seed: int = 0, delay_s: float = 0.0) -> None:
        self.table = table
        self.noise = noise
        self.seed = seed
        self.delay_s = delay_s
        self.calls = 0

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        self.calls += 1
        if self.delay_s > 0:        # a probe that takes time (tests of concurrency, kills and Ctrl-C)
            time.sleep(min(self.delay_s, timeout_s))
        c = Candidate(**spec.candidate)
        row = self.table.find(c)
        where = f"{self.table.path}" + (f" table {self.table.table}" if self.table.table else "")
        device = f"replay of {where}"
        if row is None:
            return ProbeResult(status="invalid", reason=f"{NOT_MEASURED} in {where}", device=device,
                               extra={"not_measured": True}, wall_s=0.0)
        memory = [row.memory_gb * 1e9] if row.memory_gb is not None else []
        if row.status == "oom":
            return ProbeResult(status="oom", reason=f"out of memory in {where}", device=device,
                               peak_memory_bytes_per_rank=memory, wall_s=0.0)
        if row.status != "ok" or row.step_time_s is None:
            status = row.status if row.status in ("timeout", "crash", "invalid") else "crash"
            return ProbeResult(status=status, reason=f"{row.status} in {where}", device=device, wall_s=0.0)
        step = row.step_time_s
        if self.noise > 0:
            rng = random.Random(f"{self.seed}:{c.label()}:{self.calls}")
            step *= math.exp(rng.gauss(0.0, self.noise))
        gbs = c.mbs * c.dp * c.gas
        return ProbeResult(status="ok", step_times_s=[step], step_time_median_s=step, step_time_cv=0.0, stable=True,
                           samples_per_s=gbs / step, peak_memory_bytes_per_rank=memory,
                           memory_kind="table (GB as measured)", device=device, world_size=c.world, wall_s=0.0)


__all__ = ["NOT_MEASURED", "ReplayBackend", "ReplayRow", "ReplayTable"]
