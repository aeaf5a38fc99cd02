"""Answer probes from a table of earlier measurements (offline evaluation of search strategies, tests).

    tune --model 1B3 --gpu V100-32GB --gpus 8 --gpus-per-node 4 --global-batch 512 --seq-len 2048 \\
         --precision fp16 --recompute full --zero 1 --backend replay \\
         --results tests/data/bigscience_1b3_v100.csv --results-table v100-32gb-recompute

The CSV has one row per measured configuration and a header naming its columns. Every column is
one of (anything else is refused, naming the column: a column that changes the configuration must
be matched, never ignored):

- configuration, matched against the candidate: ``tp, pp, dp, micro_batch`` (required),
  ``activation_recompute`` (none | selective | full), ``zero_stage`` (0-3), ``sequence_parallel``,
  ``virtual_pipeline``, ``hybrid_shard``, ``context_parallel``, ``expert_parallel``,
  ``expert_tensor_parallel`` (also spelled ``mbs``, ``recompute``, ``zero``, ``sp``, ``vpp``, ``hybrid``,
  ``cp``, ``ep``, ``etp`` as the candidate names them). An absent ``sequence_parallel``/``virtual_pipeline``/
  ``hybrid_shard``/``context_parallel``/``expert_parallel``/``expert_tensor_parallel`` column means off
  (0, 1, 0, 1, 1, 1); ``dp`` is the data-parallel degree (world = TP·CP·PP·DP). An absent recompute or ZeRO column matches any value,
  and a row that then matches several configurations of the plan is refused (add the column or
  plan with one ``--recompute``/``--zero``).
- measurement: ``status`` (ok | oom | timeout | crash | invalid; required), ``seconds_per_iteration``,
  ``memory_gb`` (as the table gives it);
- context, checked against the plan: ``table`` (pick with ``--results-table``), ``global_batch``,
  ``seq_len``, ``nodes`` and ``gpus_per_node`` (their product must be the plan's GPU count);
- description, kept but never matched: ``gpu``, ``gpu_mem_gb``, ``tflops_per_gpu``, ``grad_accum``, ``notes``,
  ``source``, ``id``.

The search space is the plan's survivors that a row matches (`ReplayTable.restrict`); every row
no survivor matches is listed once with the reason (not enumerated by the plan's space, or
ruled out by which rule). Duplicate rows (same configuration) are replayed from the first.
`search.published_tables` reads the YAML files of tests/data (copies of the published tables) (BLOOM tr11, Hagemann et al.) as
tables of the same kind; ``--results FILE.yaml`` replays them directly.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
import time
from dataclasses import dataclass, fields
from pathlib import Path

from planner import Candidate, Estimate, Plan, estimate
from planner.enumeration import enumerate_candidates
from planner.schema import did_you_mean
from planner.space import RECOMPUTE
from probes.backend import ProbeBackend
from probes.result import ProbeResult, ProbeSpec

from search._base import TuneError

NOT_MEASURED = "not measured"
STATUSES = ("ok", "oom", "timeout", "crash", "invalid")
DIMENSION_COLUMNS = {"tp": "tp", "pp": "pp", "dp": "dp", "micro_batch": "mbs", "activation_recompute": "recompute",
                     "zero_stage": "zero", "sequence_parallel": "sp", "virtual_pipeline": "vpp",
                     "hybrid_shard": "hybrid", "context_parallel": "cp", "expert_parallel": "ep",
                     "expert_tensor_parallel": "etp"}
"""CSV column -> Candidate field it must match"""
OFF_WHEN_ABSENT = {"sp": False, "vpp": 1, "hybrid": False, "cp": 1, "ep": 1, "etp": 1}
"""a table without the column measured these off"""
MEASURE_COLUMNS = ("status", "seconds_per_iteration", "memory_gb")
CONTEXT_COLUMNS = ("table", "global_batch", "seq_len", "nodes", "gpus_per_node")
DESCRIPTION_COLUMNS = ("gpu", "gpu_mem_gb", "tflops_per_gpu", "grad_accum", "notes", "source", "id")
ALIASES = {"zero": "zero_stage", "sp": "sequence_parallel", "vpp": "virtual_pipeline", "hybrid": "hybrid_shard",
           "mbs": "micro_batch", "recompute": "activation_recompute", "step_time_s": "seconds_per_iteration",
           "cp": "context_parallel", "ep": "expert_parallel", "etp": "expert_tensor_parallel"}
"""other spellings of a column (the candidate's own field names)"""
KNOWN_COLUMNS = (*DIMENSION_COLUMNS, *MEASURE_COLUMNS, *CONTEXT_COLUMNS, *DESCRIPTION_COLUMNS)
_REQUIRED = ("tp", "pp", "dp", "micro_batch", "status")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRow:
    """One measured configuration. A dimension is None where the table has no column for it."""

    tp: int
    pp: int
    dp: int
    mbs: int
    recompute: str | None = None
    zero: int | None = None
    sp: bool | None = None
    vpp: int | None = None
    hybrid: bool | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    status: str = "ok"
    step_time_s: float | None = None
    memory_gb: float | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    world: int | None = None
    """nodes x gpus_per_node when the table says"""
    line: int = 0
    """where the row is in its file (CSV line, or YAML entry number)"""

    def matches(self, c: Candidate) -> bool:
        if (self.tp, self.pp, self.dp, self.mbs) != (c.tp, c.pp, c.dp, c.mbs):
            return False
        if self.recompute is not None and self.recompute != c.recompute:
            return False
        if self.zero is not None and self.zero != c.zero:
            return False
        for name, off in OFF_WHEN_ABSENT.items():
            mine = getattr(self, name)
            if (off if mine is None else mine) != getattr(c, name):
                return False
        return True

    @property
    def key(self) -> tuple:
        """The configuration (duplicates share it)."""
        return (self.tp, self.pp, self.dp, self.mbs, self.recompute, self.zero,
                *((OFF_WHEN_ABSENT[n] if getattr(self, n) is None else getattr(self, n)) for n in OFF_WHEN_ABSENT))

    def label(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"mbs={self.mbs}"]
        if self.recompute is not None:
            parts.append(f"recompute={self.recompute}")
        if self.zero is not None:
            parts.append(f"zero={self.zero}")
        if self.sp:
            parts.append("sp=1")
        if self.vpp and self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        if self.hybrid:
            parts.append("hybrid=1")
        parts += [f"{n}={getattr(self, n)}" for n in ("cp", "ep", "etp") if (getattr(self, n) or 1) > 1]
        return ",".join(parts)


def _num(text: str | None, kind: type, *, what: str, where: str) -> float | int | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise TuneError(f"{where}: {what} {text!r} is not a number") from None
    if kind is int and not math.isfinite(value):
        raise TuneError(f"{where}: {what} {text!r} is not a finite integer")
    if kind is int:
        if value != int(value):
            raise TuneError(f"{where}: {what} {text!r} is not an integer")
        return int(value)
    return value


def _flag(text: str | None, *, what: str, where: str) -> bool | None:
    if text is None:
        return None
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise TuneError(f"{where}: {what} {text!r} is not 0/1 (or true/false)")


def row_from_record(r: dict, *, where: str, line: int) -> ReplayRow:
    """A CSV record (column -> text) as a ReplayRow; every value checked."""
    tp, pp, dp, mbs = (_num(r.get(k), int, what=k, where=where) for k in ("tp", "pp", "dp", "micro_batch"))
    if None in (tp, pp, dp, mbs) or min(tp, pp, dp, mbs) < 1:
        raise TuneError(f"{where}: tp, pp, dp and micro_batch must be positive integers")
    recompute = (r.get("activation_recompute") or "").strip().lower() or None
    if recompute is not None and recompute not in RECOMPUTE:
        raise TuneError(f"{where}: activation_recompute {recompute!r}: use one of {', '.join(RECOMPUTE)}")
    zero = _num(r.get("zero_stage"), int, what="zero_stage", where=where)
    if zero is not None and zero not in (0, 1, 2, 3):
        raise TuneError(f"{where}: zero_stage {zero}: use 0, 1, 2 or 3")
    vpp = _num(r.get("virtual_pipeline"), int, what="virtual_pipeline", where=where)
    degrees = {n: _num(r.get(col), int, what=col, where=where)
               for col, n in (("context_parallel", "cp"), ("expert_parallel", "ep"), ("expert_tensor_parallel", "etp"))}
    for n, v in degrees.items():
        if v is not None and v < 1:
            raise TuneError(f"{where}: {n} {v} must be a positive integer (1: off)")
    if vpp is not None and vpp < 1:
        raise TuneError(f"{where}: virtual_pipeline {vpp} must be a positive integer (1: off)")
    status = (r.get("status") or "").strip().lower()
    if status not in STATUSES:
        raise TuneError(f"{where}: status {status!r}: use one of {', '.join(STATUSES)}")
    step = _num(r.get("seconds_per_iteration"), float, what="seconds_per_iteration", where=where)
    if status == "ok" and (step is None or not math.isfinite(step) or step <= 0):
        raise TuneError(f"{where}: status ok needs seconds_per_iteration, a finite number > 0; fix the cell or give "
                        "the row another status (oom, timeout, crash)")
    nodes = _num(r.get("nodes"), int, what="nodes", where=where)
    gpn = _num(r.get("gpus_per_node"), int, what="gpus_per_node", where=where)
    return ReplayRow(tp=tp, pp=pp, dp=dp, mbs=mbs, recompute=recompute, zero=zero,
                     sp=_flag(r.get("sequence_parallel"), what="sequence_parallel", where=where),
                     vpp=vpp, hybrid=_flag(r.get("hybrid_shard"), what="hybrid_shard", where=where), **degrees,
                     status=status, step_time_s=step,
                     memory_gb=_num(r.get("memory_gb"), float, what="memory_gb", where=where),
                     global_batch=_num(r.get("global_batch"), int, what="global_batch", where=where),
                     seq_len=_num(r.get("seq_len"), int, what="seq_len", where=where),
                     world=nodes * gpn if nodes and gpn else None, line=line)


def _read_csv(p: Path, path: str) -> list[dict]:
    """The rows of a replay CSV, columns under their canonical names; the header checked."""
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = [ALIASES.get(h.strip(), h.strip()) for h in (reader.fieldnames or [])]
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise TuneError(f"--results {path}: column {twice[0]!r} is given twice (or under two spellings: "
                            f"{', '.join(a for a, c in ALIASES.items() if c == twice[0]) or twice[0]})")
        unknown = [c for c in header if c not in KNOWN_COLUMNS]
        if unknown:
            raise TuneError(f"--results {path}: column {unknown[0]!r} is not understood"
                            f"{did_you_mean(unknown[0], [*KNOWN_COLUMNS, *ALIASES])}; a column that "
                            f"changes the configuration must be matched, not ignored: rename it to one of "
                            f"{', '.join(DIMENSION_COLUMNS)} or drop it (descriptions: "
                            f"{', '.join(DESCRIPTION_COLUMNS)})")
        missing = [c for c in _REQUIRED if c not in header]
        if missing:
            raise TuneError(f"--results {path}: missing columns {missing}; needs {', '.join(_REQUIRED)}, "
                            "seconds_per_iteration, memory_gb")
        raw = [{ALIASES.get((k or "").strip(), (k or "").strip()): v for k, v in r.items()} for r in reader]
    return raw


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
        if p.suffix.lower() in (".yaml", ".yml"):
            from search.published_tables import read_table

            return read_table(str(path), table).table
        try:
            raw = _read_csv(p, path)
        except UnicodeDecodeError as err:
            raise TuneError(f"--results {path} is not a text CSV (byte {err.start} is not UTF-8); give the CSV of "
                            "earlier measurements") from None
        except csv.Error as err:
            raise TuneError(f"--results {path}: not a readable CSV ({err}); give the CSV of earlier measurements"
                            ) from None
        tables = sorted({r.get("table", "") for r in raw if r.get("table")})
        if table is None and len(tables) > 1:
            raise TuneError(f"--results {path} holds several tables ({', '.join(tables)}); pick one with "
                            "--results-table")
        if table is not None and table not in tables:
            raise TuneError(f"--results-table {table!r} is not in {path}; tables: {', '.join(tables) or 'none'}")
        rows = [row_from_record(r, where=f"--results {path} line {i + 2}", line=i + 2) for i, r in enumerate(raw)
                if table is None or r.get("table") == table]
        if not rows:
            raise TuneError(f"--results {path}: no rows")
        return cls(path=str(path), table=table or (tables[0] if tables else None), rows=tuple(rows))

    def check(self, *, global_batch: int, seq_len: int, world_size: int | None = None) -> None:
        """The table must be measured at the batch, sequence (and GPU count) the study plans with."""
        checks = [("global_batch", global_batch, "--global-batch"), ("seq_len", seq_len, "--seq-len")]
        if world_size is not None:
            checks.append(("world", world_size, "--gpus"))
        for attr, want, flag in checks:
            seen = {getattr(r, attr) for r in self.rows} - {None}
            if seen and seen != {want}:
                raise TuneError(f"--results {self.path} was measured at {attr.replace('world', 'GPUs')} "
                                f"{sorted(seen)}; plan with {flag} {sorted(seen)[0]} to replay it")

    def unique_rows(self) -> list[ReplayRow]:
        """The rows, each configuration once (the first row of duplicates)."""
        seen, out = set(), []
        for r in self.rows:
            if r.key not in seen:
                seen.add(r.key)
                out.append(r)
        return out

    def find(self, c: Candidate) -> ReplayRow | None:
        return next((r for r in self.rows if r.matches(c)), None)

    def best_row(self) -> ReplayRow | None:
        """The fastest ok row per sample (GBS / step time)."""
        ok = [r for r in self.rows if r.status == "ok" and r.step_time_s]
        return min(ok, key=lambda r: r.step_time_s / (r.global_batch or 1), default=None)

    def restrict(self, plan: Plan | list[Estimate]) -> tuple[set[str], list[tuple[str, str]]]:
        """(keys of survivors with a row, [(row, why never probed)] for each configuration no survivor matches).

        Refuses a row that matches several survivors (a dimension the table does not record varies in the
        plan). With a `Plan`, each unmatched row says why: not enumerated by the plan's space (which
        flag or rule), or ruled out by the planner (the first rule it breaks).
        """
        survivors = plan.candidates if isinstance(plan, Plan) else list(plan)
        if isinstance(plan, Plan):
            self.check(global_batch=plan.training.global_batch, seq_len=plan.training.seq_len,
                       world_size=plan.cluster.world_size)
        by_layout: dict[tuple, list[Estimate]] = {}
        for e in survivors:
            c = e.candidate
            by_layout.setdefault((c.tp, c.pp, c.dp, c.mbs), []).append(e)
        best = self.best_row()
        keep, orphans = set(), []
        enumerated: set[str] | None = None
        for row in self.unique_rows():
            hits = [e for e in by_layout.get((row.tp, row.pp, row.dp, row.mbs), []) if row.matches(e.candidate)]
            if len(hits) > 1:
                differ = [f.name for f in fields(Candidate)
                          if len({getattr(e.candidate, f.name) for e in hits}) > 1]
                cols = [c for c, f in DIMENSION_COLUMNS.items() if f in differ]
                raise TuneError(f"--results {self.path} line {row.line} ({row.label()}) matches {len(hits)} "
                                f"configurations of the plan that differ in {', '.join(differ)}: add the "
                                f"{', '.join(cols)} column, or plan with one value (--recompute/--zero)")
            if hits:
                keep.add(hits[0].candidate.label())
                continue
            if isinstance(plan, Plan):
                if enumerated is None:
                    enumerated = enumerated_labels(plan)
                why = why_not_probed(row, plan, enumerated)
            else:
                why = "ruled out by the planner"
            if best is not None and row.key == best.key:
                why += "; this is the table's best measured row"
            orphans.append((row.label(), f"in the table ({row.status}) but {why}; never probed"))
        return keep, orphans


def candidate_of(row: ReplayRow, plan: Plan) -> Candidate:
    """The candidate a row describes, under the plan's training (unrecorded recompute/ZeRO: the plan's only value)."""
    t = plan.training
    recompute = row.recompute or (t.recompute_options[0] if len(t.recompute_options) == 1 else "none")
    zero = row.zero if row.zero is not None else (0 if row.dp == 1 else
                                                  (t.zero_options[0] if len(t.zero_options) == 1 else 0))
    gas = max(t.global_batch // (row.mbs * row.dp), 1)
    return Candidate(tp=row.tp, pp=row.pp, dp=row.dp, mbs=row.mbs, gas=gas, recompute=recompute, zero=zero,
                     sp=bool(row.sp), vpp=row.vpp or 1, hybrid=bool(row.hybrid), cp=row.cp or 1, ep=row.ep or 1,
                     etp=row.etp or 1)


def enumerated_labels(plan: Plan) -> set[str]:
    """Every configuration the plan's space enumerates (survivors and ruled out), by label."""
    cluster = plan.cluster
    return {x.label() for x in enumerate_candidates(plan.model, cluster.world_size, cluster.domain_gpus,
                                                    plan.training)}


def why_not_probed(row: ReplayRow, plan: Plan, enumerated: set[str] | None = None) -> str:
    """Why no survivor of ``plan`` is this row: outside the space the plan enumerates, or a rule."""
    t, cluster, model = plan.training, plan.cluster, plan.model
    c = candidate_of(row, plan)
    if c.world != cluster.world_size:
        return f"TP*CP*PP*DP = {c.world} is not the plan's {cluster.world_size} GPUs (not enumerated)"
    if row.recompute is not None and row.recompute not in t.recompute_options:
        return f"recompute={row.recompute} is not enumerated (--recompute {','.join(t.recompute_options)})"
    if row.zero is not None and c.dp > 1 and row.zero not in t.zero_options:
        return f"ZeRO-{row.zero} is not enumerated (--zero {','.join(map(str, t.zero_options))})"
    if c.label() not in (enumerated if enumerated is not None else enumerated_labels(plan)):
        per_replica = t.global_batch // c.dp
        if c.mbs > t.max_mbs or per_replica % c.mbs:
            return (f"MBS {c.mbs} is not enumerated (every MBS up to --max-mbs {t.max_mbs} that divides "
                    f"GBS/DP = {per_replica})")
        if c.tp > 2 * cluster.gpus_per_node:
            return f"TP {c.tp} is not enumerated (up to twice the {cluster.gpus_per_node} GPUs per node)"
        if c.sp:
            return f"sequence parallelism is not enumerated for --framework {t.framework} with TP {c.tp}"
        if c.vpp > 1:
            return f"VPP {c.vpp} is not enumerated for --framework {t.framework} with PP {c.pp}"
        if c.cp > 1 or c.ep > 1 or c.etp > 1:
            return (f"CP {c.cp}, EP {c.ep}, ETP {c.etp} is not enumerated for --framework {t.framework} "
                    "(context and expert parallelism: megatron-lm, fsdp; sizes: --cp, --ep)")
        if c.zero and c.dp == 1:
            return f"ZeRO-{c.zero} with DP=1 is not enumerated (the same as ZeRO-0)"
        return f"{c.label()} is not enumerated by the plan's space"
    est = estimate(model, cluster, t, c)
    if est.reasons:
        v = est.reasons[0]
        return f"ruled out by the planner ({v.reason.value}: {v.detail})"
    return "a survivor of the plan that the space does not hold"


class ReplayBackend(ProbeBackend):
    """A `probes.backend.ProbeBackend` whose probes read the table instead of running.

    ``noise`` > 0 multiplies each answered step time by exp(N(0, noise)) (seeded by ``seed`` and
    the configuration), to exercise confirmation; 0 answers the table's numbers exactly.
    ``delay_s`` makes each probe take that long (wall clock), like a real one.

    Steps: a probe answers ``spec.warmup_steps`` untimed and ``spec.steps`` timed steps of the (noisy) step time,
    each multiplied by exp(N(0, sigma)) with sigma drawn per probe from ``step_noise`` (measured coefficients of
    variation of timed steps; empty: every step the same). Each timed step goes to ``on_step`` as it comes, and a
    reason returned stops the probe (``pruned``). Nothing is slept: ``phases`` holds the simulated seconds
    (``launch_s`` per probe for launch and set-up, then warm-up and timed steps), ``extra["simulated"]`` is True.
    A replay simulates (and reports) steps only when given ``step_noise`` or ``launch_s``
    (tests/bench/bench_search.py --pruning); otherwise it answers the table's row as one step, as it always has.
    """

    name = "replay"

    def __init__(self, table: ReplayTable, *, noise: float = 0.0, seed: int = 0, delay_s: float = 0.0,
                 step_noise: tuple[float, ...] = (), launch_s: float = 0.0) -> None:
        self.table = table
        self.noise = noise
        self.seed = seed
        self.delay_s = delay_s
        self.step_noise = tuple(step_noise)
        self.launch_s = launch_s
        self.reports_steps = bool(self.step_noise) or launch_s > 0
        self.calls = 0

    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float, on_step=None) -> ProbeResult:
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
            return ProbeResult(status=row.status if row.status != "ok" else "crash",
                               reason=f"{row.status} in {where}", device=device, wall_s=0.0)
        step = row.step_time_s
        if self.noise > 0:
            rng = random.Random(f"{self.seed}:{c.label()}:{self.calls}")
            step *= math.exp(rng.gauss(0.0, self.noise))
        gbs = c.mbs * c.dp * c.gas
        if not self.reports_steps:
            return ProbeResult(status="ok", step_times_s=[step], step_time_median_s=step, step_time_cv=0.0,
                               stable=True, samples_per_s=gbs / step, peak_memory_bytes_per_rank=memory,
                               memory_kind="table (GB as measured)", device=device, world_size=c.world, wall_s=0.0)
        rng = random.Random(f"steps:{self.seed}:{c.label()}:{self.calls}")
        sigma = rng.choice(self.step_noise) if self.step_noise else 0.0

        def one() -> float:
            return step * math.exp(rng.gauss(0.0, sigma)) if sigma else step

        warmup = [one() for _ in range(spec.warmup_steps)]
        phases = {"launch": self.launch_s, "warmup": sum(warmup), "steps": 0.0}
        times: list[float] = []
        for i in range(max(spec.steps, 1)):
            times.append(one())
            phases["steps"] += times[-1]
            reason = on_step(i, times[-1]) if on_step is not None else None
            if reason:
                return ProbeResult(status="pruned", reason=reason, step_times_s=times, device=device,
                                   world_size=c.world, wall_s=0.0, phases=phases,
                                   extra={"simulated": True, "pruned_after_steps": len(times)})
        median = statistics.median(times)
        cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
        return ProbeResult(status="ok", step_times_s=times, step_time_median_s=median, step_time_cv=cv,
                           stable=cv <= spec.max_cv, samples_per_s=gbs / median, peak_memory_bytes_per_rank=memory,
                           memory_kind="table (GB as measured)", device=device, world_size=c.world, wall_s=0.0,
                           phases=phases, extra={"simulated": True})


__all__ = ["KNOWN_COLUMNS", "NOT_MEASURED", "ReplayBackend", "ReplayRow", "ReplayTable", "candidate_of",
           "row_from_record", "why_not_probed"]
