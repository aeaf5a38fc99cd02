"""The planner against every development table of published runs (tests/data, = ../shared/data).

    python tests/bench/validate.py            # per-table metrics, then the summary (README)
    python tests/bench/validate.py --rows     # also every run: predicted vs measured

After the classic dev tables, the modern dev runs (published_modern_dev.yaml: MT-NLG, MegaScale, torchtitan Dec-2024,
NeMo 24.07; search.published_runs.modern_runs states what it assumes, torchtitan's rows read as torchtitan ran them:
FSDP2 x TP x PP x CP, float8, torch.compile, async TP, its schedules), scored apart from the summary so that the
classic figures stay comparable across versions; each source beside its floor: one constant MFU per source
(publication), fitted to that source's own runs (the geometric mean of their measured MFU), the error a model that
knows each framework's level but nothing of layouts scores.

For every table (runs of one model on one cluster in one search: tests/published.py `dev_cases`):
- throughput error, like for like: predicted / measured tokens/s per GPU (the step time where the
  run gives it, at the run's global batch), mean absolute error and the geometric-mean ratio (bias);
- beside it the floor: one constant fraction of peak for every run (the geometric mean of the
  measured MFU over all runs), the error a model that knows nothing of layouts scores;
- Spearman's rank correlation of predicted vs measured throughput inside the table (>= 3 runs);
- regret of the top pick: the measured best over the measured throughput of the run the planner
  ranks first (among the runs that ran; "rules": among the runs plan keeps, OOM when it OOMed);
- memory error: predicted / measured peak per GPU (first stage where the source measured the first node), the
  prediction read as the source's figure counts it (planner.memory.reported_bytes: nvidia-smi's);
- OOM confusion: predicted total over HBM vs the run's OOM, and runs that ran but plan rules out.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from published import DevCase, dev_cases, modern_dev_cases, seed003_dev_cases  # noqa: E402

from planner import flops, fp8  # noqa: E402
from planner.memory import MEASUREMENTS, reported_bytes, stage_memory, verdict  # noqa: E402
from planner.rank import Estimate, estimate  # noqa: E402
from planner.topology import Topology  # noqa: E402


@dataclass
class Row:
    case: DevCase
    est: Estimate
    pred_tps: float
    floor_tps: float = 0.0
    pred_mem_gib: float = 0.0
    pred_oom: bool = False

    @property
    def ratio(self) -> float | None:
        m = self.case.tokens_per_s_per_gpu
        return self.pred_tps / m if m else None


@dataclass
class TableResult:
    name: str
    rows: list[Row]
    mape: float | None = None
    floor_mape: float | None = None
    bias: float | None = None
    spearman: float | None = None
    regret: float | None = None
    regret_rules: float | str | None = None
    mem_mape: float | None = None


@dataclass
class Summary:
    tables: list[TableResult]
    rows: list[Row]
    floor_mfu: float
    floor_by: dict = field(default_factory=dict)
    """source -> its constant MFU, where the floor is one constant per source"""
    mape: float = 0.0
    floor_mape: float = 0.0
    table_mape: float = 0.0
    table_floor_mape: float = 0.0
    within_table_sd: float = 0.0
    optimistic: float = 0.0
    median_spearman: float = 0.0
    mean_regret: float = 0.0
    max_regret: float = 0.0
    picks_oom: int = 0
    mem_mape: float = 0.0
    oom: dict = field(default_factory=dict)
    false_prunes: int = 0
    by_framework: dict = field(default_factory=dict)
    by_gpu: dict = field(default_factory=dict)


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else 0.0


def _gmean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def model_flops_per_token(c: DevCase) -> float:
    return flops.model_flops_per_iteration(c.model, 1) / c.model.seq_len


def _peak(c: DevCase) -> float:
    """The MFU denominator: the dense peak of the training's precision, bf16's under FP8 (planner.fp8)."""
    return c.cluster.gpu.peak_flops(fp8.compute_precision(c.training.precision))


def _pred_rate(r: Row) -> float:
    """predicted model FLOP/s per GPU: ranks like tokens/s for one model, fairly across model sizes"""
    return r.pred_tps * model_flops_per_token(r.case)


def _meas_rate(r: Row) -> float:
    return r.case.tokens_per_s_per_gpu * model_flops_per_token(r.case)


def regret(ran: list[Row]) -> float:
    """measured best / measured rate of the layout predicted best, minus 1; runs of one layout (repeats,
    e.g. tr11's two 1-node rows) count once, at their mean"""
    layouts: dict[tuple, list[Row]] = {}
    for r in ran:
        layouts.setdefault((r.case.model, r.case.cand, r.case.training.global_batch, r.case.cluster), []).append(r)
    pred = {k: _pred_rate(v[0]) for k, v in layouts.items()}
    meas = {k: statistics.fmean(_meas_rate(r) for r in v) for k, v in layouts.items()}
    pick = max(layouts, key=pred.__getitem__)
    return max(meas.values()) / meas[pick] - 1


def shape_regrets(s: "Summary", prefix: str = "bloom tr11") -> dict[str, float]:
    """Regret of the pick per model shape (hidden, layers, heads) over a search's tables."""
    shapes: dict[str, list[Row]] = {}
    for r in s.rows:
        if r.case.table.startswith(prefix) and r.case.tokens_per_s_per_gpu:
            m = r.case.model
            shapes.setdefault(f"h{m.hidden} L{m.layers} a{m.heads}", []).append(r)
    return {k: regret(v) for k, v in shapes.items() if len({(r.case.cand, r.case.cluster) for r in v}) >= 2}


def evaluate(cases: list[DevCase] | None = None, *, floor_per_source: bool = False) -> Summary:
    """``floor_per_source``: the floor is one constant MFU per source (`DevCase.framework`), else one for all runs."""
    cases = cases if cases is not None else seed003_dev_cases() + dev_cases()
    topologies: dict = {}
    rows: list[Row] = []
    for c in cases:
        topo = topologies.setdefault(c.cluster, Topology(c.cluster))
        est = estimate(c.model, c.cluster, c.training, c.time_candidate(), topology=topo)
        tps = c.training.global_batch * c.model.seq_len / est.step_time_s / c.cand.world if est.time else 0.0
        stages = stage_memory(c.model.with_overrides(seq_len=c.training.seq_len), c.cand, c.cluster, c.training)
        first = stages[0] if c.memory_stage == "first" else max(stages, key=lambda m: m.total_bytes)
        busiest = max(stages, key=lambda m: m.total_bytes)
        # like for like: what the source's figure counts (nvidia-smi: the allocator's reserve, context, NCCL)
        shown = reported_bytes(first, c.cand, c.cluster, c.memory_definition) \
            if c.memory_definition in MEASUREMENTS else first.total_bytes
        # predicted OOM: the planner's one memory verdict (tests/bench/memory_fit.py uses the same)
        rows.append(Row(case=c, est=est, pred_tps=tps, pred_mem_gib=shown / 2**30,
                        pred_oom=not verdict(busiest, c.cluster, c.training).fits))

    measured = [r for r in rows if r.case.tokens_per_s_per_gpu]
    mfus = [r.case.tokens_per_s_per_gpu * model_flops_per_token(r.case) / _peak(r.case) for r in measured]
    floor_mfu = _gmean(mfus)   # one constant fraction of peak for every run
    floor_by: dict[str, float] = {}
    if floor_per_source:
        by_source: dict[str, list[float]] = {}
        for r, mfu in zip(measured, mfus):
            by_source.setdefault(r.case.framework, []).append(mfu)
        floor_by = {k: _gmean(v) for k, v in by_source.items()}
    for r in rows:
        mfu = floor_by.get(r.case.framework, floor_mfu)
        r.floor_tps = mfu * _peak(r.case) / model_flops_per_token(r.case)

    tables: dict[str, list[Row]] = {}
    for r in rows:
        tables.setdefault(r.case.table, []).append(r)
    results = []
    for name, trs in tables.items():
        t = TableResult(name=name, rows=trs)
        ran = [r for r in trs if r.case.tokens_per_s_per_gpu]
        if ran:
            t.mape = statistics.fmean(abs(r.ratio - 1) for r in ran)
            t.floor_mape = statistics.fmean(abs(r.floor_tps / r.case.tokens_per_s_per_gpu - 1) for r in ran)
            t.bias = _gmean([r.ratio for r in ran])
        if len(ran) >= 3:
            t.spearman = spearman([_pred_rate(r) for r in ran], [_meas_rate(r) for r in ran])
            t.regret = regret(ran)
            kept = [r for r in trs if r.est.fits and r.pred_tps > 0]
            if kept:
                pick = max(kept, key=_pred_rate)
                t.regret_rules = "OOM" if not pick.case.tokens_per_s_per_gpu else \
                    max(_meas_rate(r) for r in ran) / _meas_rate(pick) - 1
            else:
                t.regret_rules = "none kept"
        mem = [r for r in trs if r.case.memory_gib and not r.case.oom]
        if mem:
            t.mem_mape = statistics.fmean(abs(r.pred_mem_gib / r.case.memory_gib - 1) for r in mem)
        results.append(t)

    s = Summary(tables=results, rows=rows, floor_mfu=floor_mfu, floor_by=floor_by)
    s.mape = statistics.fmean(abs(r.ratio - 1) for r in measured)
    s.floor_mape = statistics.fmean(abs(r.floor_tps / r.case.tokens_per_s_per_gpu - 1) for r in measured)
    spread = []
    for t in results:
        logs = [math.log(r.ratio) for r in t.rows if r.case.tokens_per_s_per_gpu]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            spread += [(x - mean) ** 2 for x in logs]
    s.within_table_sd = math.sqrt(statistics.fmean(spread)) if spread else 0.0
    timed = [t for t in results if t.mape is not None]
    s.table_mape = statistics.fmean(t.mape for t in timed)
    s.table_floor_mape = statistics.fmean(t.floor_mape for t in timed)
    s.optimistic = sum(r.ratio > 1 for r in measured) / len(measured)
    ranked = [t for t in results if t.spearman is not None]
    if ranked:
        s.median_spearman = statistics.median(t.spearman for t in ranked)
        s.mean_regret = statistics.fmean(t.regret for t in ranked)
        s.max_regret = max(t.regret for t in ranked)
    s.picks_oom = sum(t.regret_rules == "OOM" for t in ranked)
    mem = [r for r in rows if r.case.memory_gib and not r.case.oom]
    s.mem_mape = statistics.fmean(abs(r.pred_mem_gib / r.case.memory_gib - 1) for r in mem) if mem else 0.0
    known = [r for r in rows if r.case.oom is not None]
    s.oom = {"oom_predicted_oom": sum(r.case.oom and r.pred_oom for r in known),
             "oom_predicted_fits": sum(r.case.oom and not r.pred_oom for r in known),
             "ran_predicted_oom": sum(not r.case.oom and r.pred_oom for r in known),
             "ran_predicted_fits": sum(not r.case.oom and not r.pred_oom for r in known)}
    s.false_prunes = sum(1 for r in known if not r.case.oom and not r.est.fits)
    for key, attr in (("by_framework", lambda r: r.case.framework),
                      ("by_gpu", lambda r: r.case.cluster.gpu.id.split("-")[0])):
        groups: dict[str, list[float]] = {}
        for r in measured:
            groups.setdefault(attr(r), []).append(r.ratio)
        setattr(s, key, {k: (_gmean(v), len(v)) for k, v in sorted(groups.items())})
    return s


def _f(x: float | str | None, fmt: str = ".0%") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return format(x, fmt)


TABLE_HEADER = f"{'table':62} {'runs':>4} {'err':>5} {'floor':>5} {'pred/meas':>9} {'Spearman':>8} {'regret':>6}"


def _table_line(t: TableResult) -> str:
    return (f"{t.name[:62]:62} {len(t.rows):4} {_f(t.mape):>5} {_f(t.floor_mape):>5} {_f(t.bias, '.2f'):>9} "
            f"{_f(t.spearman, '.2f'):>8} {_f(t.regret):>6}")


def render(s: Summary, rows: bool = False) -> str:
    out = [f"{TABLE_HEADER} {'w/ rules':>8} {'mem err':>7}"]
    for t in s.tables:
        out.append(f"{_table_line(t)} {_f(t.regret_rules):>8} {_f(t.mem_mape):>7}")
        if rows:
            for r in t.rows:
                c = r.case.cand
                out.append(f"    {r.case.id[:56]:56} tp{c.tp} pp{c.pp} dp{c.dp} mbs{c.mbs} {c.recompute:9} "
                           f"meas {r.case.tokens_per_s_per_gpu or 0:8.1f} pred {r.pred_tps:8.1f} tok/s/GPU  "
                           f"mem {r.case.memory_gib or '-'} vs {r.pred_mem_gib:.1f} GiB"
                           f"{'  OOM' if r.case.oom else ''}{'  ruled out' if not r.est.fits else ''}")
    n = sum(1 for r in s.rows if r.case.tokens_per_s_per_gpu)
    shapes = shape_regrets(s)
    if shapes:
        out += ["", "BLOOM tr11 per model shape (runs of one shape across its tables): regret of the pick",
                "  " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(shapes.items()))]
    o = s.oom
    known = sum(o.values())
    out += ["", "Summary (python tests/bench/validate.py)", "",
            "| metric | value |", "|---|---|",
            f"| runs with a measured throughput / tables | {n} / {len(s.tables)} |",
            f"| throughput error, mean absolute (tokens/s per GPU) | {s.mape:.1%} |",
            f"| floor: one constant fraction of peak ({s.floor_mfu:.1%} MFU) for every run | {s.floor_mape:.1%} |",
            f"| throughput error, mean of the tables' errors (floor) | {s.table_mape:.1%} ({s.table_floor_mape:.1%}) |",
            f"| spread of predicted/measured inside a table (sd of the log ratio; plan's ties) | "
            f"{s.within_table_sd:.3f} |",
            f"| runs predicted faster than measured | {s.optimistic:.0%} |",
            f"| Spearman inside a table, median | {s.median_spearman:.2f} |",
            f"| regret of the top pick, mean / worst | {s.mean_regret:.1%} / {s.max_regret:.1%} |",
            f"| BLOOM tr11 model shapes whose pick is within 5% of the measured best | "
            f"{sum(v <= 0.05 for v in shapes.values())} of {len(shapes)} (worst {max(shapes.values(), default=0):.1%}) |",
            f"| tables whose plan pick (rules applied) ran out of memory | {s.picks_oom} |",
            f"| memory error, mean absolute | {s.mem_mape:.1%} |",
            f"| OOM vs fits right ({known} runs) | {(o['oom_predicted_oom'] + o['ran_predicted_fits']) / known:.0%} "
            f"(OOM missed {o['oom_predicted_fits']}, false OOM {o['ran_predicted_oom']}) |",
            f"| runs that ran but plan rules out | {s.false_prunes} |",
            "", "predicted / measured throughput (geometric mean, runs):",
            "  by framework: " + ", ".join(f"{k} {v:.2f} ({n})" for k, (v, n) in s.by_framework.items()),
            "  by GPU: " + ", ".join(f"{k} {v:.2f} ({n})" for k, (v, n) in s.by_gpu.items())]
    return "\n".join(out)


def render_modern(s: Summary, rows: bool = False) -> str:
    """The modern dev runs: per table, then per source the planner's error beside its one-constant-MFU floor."""
    out = ["", "Modern dev runs (published_modern_dev.yaml), floor = one constant MFU per source", "", TABLE_HEADER]
    for t in s.tables:
        out.append(_table_line(t))
        if rows:
            for r in t.rows:
                c = r.case.cand
                out.append(f"    {r.case.id[:60]:60} {c.label()[:60]:60} meas {r.case.tokens_per_s_per_gpu:8.1f} "
                           f"pred {r.pred_tps:8.1f} floor {r.floor_tps:8.1f} tok/s/GPU")
    out += ["", "| source | runs | throughput error | floor: one constant MFU per source | pred/meas (geo. mean) |",
            "|---|---|---|---|---|"]
    measured = [r for r in s.rows if r.case.tokens_per_s_per_gpu]
    for source in dict.fromkeys(r.case.framework for r in measured):
        rs = [r for r in measured if r.case.framework == source]
        err = statistics.fmean(abs(r.ratio - 1) for r in rs)
        floor = statistics.fmean(abs(r.floor_tps / r.case.tokens_per_s_per_gpu - 1) for r in rs)
        out.append(f"| {source} | {len(rs)} | {err:.1%} | {floor:.1%} ({s.floor_by[source]:.1%} MFU) | "
                   f"{_gmean([r.ratio for r in rs]):.2f} |")
    out.append(f"| all | {len(measured)} | {s.mape:.1%} | {s.floor_mape:.1%} | "
               f"{_gmean([r.ratio for r in measured]):.2f} |")
    out.append(f"\nSpearman inside a table, median {s.median_spearman:.2f}; throughput error, mean of the tables' "
               f"errors {s.table_mape:.1%} (floor {s.table_floor_mape:.1%})")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every run")
    ap.add_argument("--classic", action="store_true", help="the classic dev tables only")
    args = ap.parse_args()
    print(render(evaluate(), rows=args.rows))
    if not args.classic:   # torchtitan's Dec-2024 tables are among them, one table each
        print(render_modern(evaluate(modern_dev_cases(), floor_per_source=True), rows=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
