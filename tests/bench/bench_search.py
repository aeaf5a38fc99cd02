"""Probes-to-best of search strategies, replayed on published measurement tables (offline, about a minute).

    python tests/bench/bench_search.py                       # every table, 20 seeds for the random strategies
    python tests/bench/bench_search.py --seeds 5 --format json
    python tests/bench/bench_search.py --data ../shared/data  # where published_dev.yaml / hagemann_13b_dev.yaml are
    python tests/bench/bench_search.py --overhead              # seconds the search spends per probe

Tables: seed 003's three V100 tables (tests/data/bigscience_1b3_v100.csv), the BigScience tr11 tables
of published_dev.yaml and the Hagemann et al. Llama 13B sheets (hagemann_13b_dev.yaml), read by
`search.published_tables` with the setup each was measured on. The space of a table is the plan's
survivors that a row matches (`ReplayTable.restrict`: every dimension matched); the target is the
fastest measured row in that space (``best in space``; ``table best pruned`` says when the table's
own best is a row the planner rules out, which no strategy can reach). Tables whose space holds
fewer than 3 configurations are listed as skipped. The other groups of published_dev.yaml are no sweeps to
replay: DeepSpeed's autotuning GPT-2 rows change the global batch with the micro batch (GAS 1) under HF
DDP / ZeRO-1, Narayanan et al.'s Table 2 pairs ZeRO-3 with PTD-P at each GPU count (two rows, two
frameworks), and the torchtitan and fms-fsdp rows are one run per model.
``oom/slower probed ahead``: the probes the plan's order makes before the best, those that ran out of
memory (a configuration the planner predicted to fit) and those measured slower.

A strategy probes until it first measures the target; probes-to-best counts every probe up to and
including it (OOMs count; configurations an OOM rules out without a probe do not). Strategies:

- ``ei``: the default of `tune`: the analytic top-1, then expected improvement under the refitted
  CostParams and the measured residual spread (`SurvivorSampler.ei_pick`); ``ei-k2``/``ei-k3``: the
  same after the analytic top-2 / top-3;
- ``planner``: the plain analytic order (the plan's ranking, never refitted);
- ``analytic``: top-3, then the refitted CostParams order (greedy, no uncertainty);
- ``tpe``: top-3, then Optuna's TPE mapped to survivors (the default before);
- ``random`` (mean over seeds) and ``grid`` ((tp, pp, dp, mbs, ...) order).

The deterministic strategies are run once (their result does not depend on the seed).

    python tests/bench/bench_search.py --robustness          # held-out style: the planner made wrong on purpose
    python tests/bench/bench_search.py --loto                # leave-one-table-out choice of the top-k
    python tests/bench/bench_search.py --implications        # how far OOM inference holds on the sheets
    python tests/bench/bench_search.py --pruning --seeds 3   # whole studies, measured step noise, pruning off/on

``--robustness`` (a robustness benchmark, NOT the dev-table result): every table replayed again under a
planner with one time term mis-scaled (`PERTURBATIONS`: TP, PP or DP time x1/3 or x3, or its FITTED
per-micro-batch framework overhead dropped), so that the plan's rank of the measured best moves (to 5-10
on some), as on a held-out sheet where the planner is off; the measured rows and so the target are
unchanged. ``analytic`` is left out there: its refit (`Objective`) calls the real planner, not the
perturbed one. ``--loto``: for each table, the top-k (1, 2 or 3) that is best on the other tables (their
dev and perturbed cases together) is chosen, then scored on the held-out table. ``--implications``: for each
OOM inference rule (`IMPLICATION_RULES`: `tune`'s same-layout rule, then dominance in the planner's memory terms,
finest to coarsest), the (OOM, so OOM) pairs it draws among each sheet's measured rows, how many the sheet
contradicts (the second ran), and what it would save or lose in the plan's order.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SEED003 = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
SEED003_TABLES = {"v100-32gb-recompute": ("V100-32GB", "full"), "v100-32gb-no-recompute": ("V100-32GB", "none"),
                  "v100-16gb-recompute": ("V100-16GB", "full")}
STRATEGIES = {"ei": ("ei", 1), "ei-k2": ("ei", 2), "ei-k3": ("ei", 3), "planner": ("planner", 0),
              "analytic": ("analytic", 3), "tpe": ("tpe", 3),
              "random": ("random", 0), "grid": ("grid", 0)}
SEEDED = ("tpe", "random")
MIN_SPACE = 3


@dataclass(frozen=True)
class Case:
    name: str
    space: object          # search.space.SearchSpace
    table: object          # search.replay.ReplayTable
    target: set            # config keys of the fastest measured configuration(s) in the space
    table_best_pruned: bool
    planner_rank: int      # 1-based rank of the target in the plan's order (within the space)
    resid_sd: float        # spread of log(measured / planned step time) over the ok rows, after a global scale


def default_data() -> str:
    """../shared/data next to the checkout (or next to its parent, for a worktree one level down)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        if (base / "shared" / "data").is_dir():
            return str(base / "shared" / "data")
    return str(ROOT.parent / "shared" / "data")


def seed003_setups():
    """Seed 003's tables with the setup tests/published.py gives them (the example cluster files, whose
    intra-node rate is calibrated on these rows; Megatron-DeepSpeed, fp16, GBS 512, no FlashAttention)."""
    from dataclasses import replace

    from planner import load_model
    from planner.hardware import load_cluster
    from search.replay import ReplayTable

    sys.path.insert(0, str(ROOT / "tests"))
    from published import SEED003_TRAINING

    for table, (gpu, recompute) in SEED003_TABLES.items():
        training = replace(SEED003_TRAINING, recompute_options=(recompute,), zero_options=(1,))
        mem = gpu.removeprefix("V100-").removesuffix("GB").lower()
        cluster = load_cluster(str(ROOT / "examples" / f"cluster-2x4-v100-{mem}gb.yaml"))
        yield f"seed003-{table}", load_model("1B3"), cluster, training, ReplayTable.read(str(SEED003), table)


def published_setups(data: Path):
    from search.published_tables import read_tables

    for name in ("published_dev.yaml", "hagemann_13b_dev.yaml"):
        path = data / name
        if not path.is_file():
            print(f"bench_search: {path} not found; skipped (give --data)", file=sys.stderr)
            continue
        for t in read_tables(str(path)):
            yield t.name, t.model, t.cluster, t.training, t.table


def make_case(name, model, cluster, training, table, full=None) -> tuple[Case | None, str]:
    """The case, or None and why it is skipped. ``full``: the setup's `plan(..., allow_empty=True)`, if already made."""
    from planner import plan
    from search.space import SearchSpace, config_key

    full = plan(model, cluster, training, allow_empty=True) if full is None else full
    keep, _ = table.restrict(full)
    space = SearchSpace.from_plan(full, keep=keep)
    steps = {}
    for e in space.survivors:
        row = table.find(e.candidate)
        if row is not None and row.status == "ok":
            steps[config_key(e.candidate)] = row.step_time_s / e.candidate.global_batch
    if len(space) < MIN_SPACE or not steps:
        return None, f"{len(space)} configurations in the space, {len(steps)} measured ok"
    best = min(steps.values())
    target = {k for k, s in steps.items() if s <= best * (1 + 1e-9)}
    table_best = table.best_row()
    pruned = table_best is not None and not any(table_best.matches(space.by_key(k).candidate) for k in space.keys)
    rank = min(i + 1 for i, k in enumerate(space.keys) if k in target)
    logs = [math.log(steps[config_key(e.candidate)] * e.candidate.global_batch / e.step_time_s)
            for e in space.survivors if config_key(e.candidate) in steps]
    mean = statistics.mean(logs)
    resid = math.sqrt(statistics.mean([(x - mean) ** 2 for x in logs]))
    return Case(name=name, space=space, table=table, target=target, table_best_pruned=pruned,
                planner_rank=rank, resid_sd=resid), ""


PERTURBATIONS = (("tp", 1 / 3), ("tp", 3.0), ("pp", 1 / 3), ("pp", 3.0), ("dp", 1 / 3), ("dp", 3.0),
                 ("no-overhead", 0.0))
"""robustness benchmark: the planner's time term scaled by a factor (TP all-reduces, PP bubble + p2p, exposed DP),
or its FITTED per-micro-batch framework overhead dropped; stated before any run, the same for every table"""


def perturbed_time(time, term: str, factor: float):
    """A `planner.cost.TimeBreakdown` with one term mis-scaled: the step moves by that line's seconds x (factor - 1),
    added as one more communication term (so `tune`'s refit scales it with the others); the framework's
    per-micro-batch overhead is dropped from its term (p2p and bubble both)."""
    from dataclasses import replace

    from planner.cost import breakdown
    from planner.terms import COMMUNICATION, TermTime

    step = time.terms
    if term == "no-overhead":
        step = step.scaled(("pp_microbatch_overhead",), 0.0)
    else:
        seconds = {"tp": time.tp_comm_s, "dp": time.dp_comm_s,
                   "pp": time.pp_p2p_s - time.pp_overhead_s + time.pp_bubble_s - time.bubble_overhead_s}[term]
        group = {"tp": "tp_comm_s", "dp": "dp_comm_s", "pp": "pp_p2p_s"}[term]
        extra = TermTime(name=f"perturbed {term}", kind=COMMUNICATION, group=group, per_microbatch=False,
                         seconds=seconds * (factor - 1))
        step = replace(step, terms=(*step.terms, extra))
    return breakdown(step, time.params, model_flops=time.model_flops, hardware_flops=time.hardware_flops)


def perturb(case: Case, term: str, factor: float) -> Case:
    """The same table planned by a wrong planner: every survivor's time perturbed, the plan's order re-ranked by
    it (the measured rows, and so the target, are unchanged)."""
    from dataclasses import replace

    from search.space import SearchSpace, config_key

    survivors = [replace(e, time=perturbed_time(e.time, term, factor)) for e in case.space.survivors]
    survivors.sort(key=lambda e: e.time.step_time_s / e.candidate.global_batch)
    space = SearchSpace(plan=case.space.plan, survivors=tuple(survivors), restricted_out=case.space.restricted_out)
    rank = min(i + 1 for i, e in enumerate(space.survivors) if config_key(e.candidate) in case.target)
    label = f"{term} x{factor:.3g}" if term != "no-overhead" else term
    return replace(case, name=f"{case.name} [{label}]", space=space, planner_rank=rank)


def ahead_of_best(case: Case) -> tuple[int, int, int]:
    """(OOM probes, slower measured probes, slower probes made after a measurement) the plan's order makes before
    the best; configurations an earlier OOM implies out of memory are not probed (`SearchSpace.implied_oom`), as in
    `tune`. Only the last kind can a strategy that learns step times from measurements save: before the first
    measurement it knows nothing the plan does not, and an OOM is a memory prediction."""
    from search.space import config_key

    ooms, oom, slower, informed = [], 0, 0, 0
    for e in case.space.survivors:
        if config_key(e.candidate) in case.target:
            break
        if case.space.implied_oom(e.candidate, ooms):
            continue
        row = case.table.find(e.candidate)
        if row is not None and row.status == "oom":
            ooms.append(e.candidate)
            oom += 1
        else:
            informed += slower > 0
            slower += 1
    return oom, slower, informed


def probes_to_best(case: Case, strategy: str, seed: int) -> int:
    import optuna

    from search.objective import Objective, ProbeFailed, ProbeSettings
    from search.replay import ReplayBackend
    from search.sampler import SurvivorSampler
    from search.storage import recover

    kind, top_k = STRATEGIES[strategy]
    study = optuna.create_study(direction="maximize", sampler=SurvivorSampler(case.space, strategy=kind, seed=seed))
    objective = Objective(space=case.space, backend=ReplayBackend(case.table), settings=ProbeSettings())
    recover(study, case.space, top_k)
    count = {"probes": 0, "found": None}

    def stop_at_best(study, trial) -> None:
        if trial.user_attrs.get("outcome") in ("ok", "oom", "timeout", "crash", "invalid", "not_measured"):
            count["probes"] += 1
            if trial.user_attrs["outcome"] == "ok" and trial.user_attrs.get("config") in case.target:
                count["found"] = count["probes"]
                study.stop()

    study.optimize(objective, n_trials=len(case.space), catch=(ProbeFailed,), callbacks=[stop_at_best])
    if count["found"] is None:
        raise AssertionError(f"{case.name}: {strategy} (seed {seed}) never measured the best")
    return count["found"]


def run(cases: list[Case], seeds: int, strategies=tuple(STRATEGIES)) -> list[dict]:
    rows = []
    for case in cases:
        oom, slower, informed = ahead_of_best(case)
        row = {"table": case.name, "configs": len(case.space), "planner_rank": case.planner_rank,
               "oom_ahead": oom, "slower_ahead": slower, "slower_after_a_measurement": informed,
               "table_best_pruned": case.table_best_pruned, "resid_sd": round(case.resid_sd, 3)}
        for strategy in strategies:
            counts = [probes_to_best(case, strategy, s) for s in (range(seeds) if strategy in SEEDED else [0])]
            row[strategy] = statistics.mean(counts)
        rows.append(row)
    return rows


def overhead(repeats: int = 5) -> list[dict]:
    """Seconds the search itself spends per probe (medians): `refit` of 10 measurements (what `tune` records
    after every probe) and one expected-improvement choice over the whole space, for two spaces."""
    import optuna

    from planner import TrainingSpec, load_model, make_cluster, plan
    from search.calibration import Measurement, refit
    from search.space import SearchSpace, params_of
    from search.sampler import SurvivorSampler

    out = []
    for label, model, cluster, training in (
            ("BLOOM-176B on 384 A100", load_model("176B"), make_cluster(gpu="A100-80GB", gpus=384),
             TrainingSpec(global_batch=2048, seq_len=2048, flash_attention=False)),
            ("Llama-2-13B on 64 A100 (Megatron-LM)", load_model("llama2-13b"), make_cluster(gpu="A100-80GB", gpus=64),
             TrainingSpec(global_batch=2048, seq_len=2048, framework="megatron-lm")),
            ("Llama-3-405B on 16384 H100", load_model("llama3-405b"), make_cluster(gpu="H100-80GB", gpus=16384),
             TrainingSpec(global_batch=2048, seq_len=8192, framework="megatron-lm"))):
        full = plan(model, cluster, training)
        space = SearchSpace.from_plan(full)
        ms = [Measurement(candidate=e.candidate, step_time_s=e.step_time_s * 1.3) for e in full.candidates[:10]]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            refit(model, cluster, training, ms)
            times.append(time.perf_counter() - t0)
        sampler = SurvivorSampler(space, strategy="ei")
        study = optuna.create_study(direction="maximize", sampler=sampler)
        dists = space.distributions()
        for e, m in zip(full.candidates[:10], ms):
            key = e.candidate.label()
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=1.0, distributions=dists,
                params={n: v for n, v in params_of(e.candidate).items() if n in dists},
                user_attrs={"config": key, "slot": key, "outcome": "ok", "measured_step_s": m.step_time_s}))
        picks = []
        for i in range(repeats):
            t0 = time.perf_counter()
            sampler._refit_key = None          # refit every time, as after a new measurement
            sampler.ei_pick(study, space.keys[10:])
            picks.append(time.perf_counter() - t0)
        out.append({"space": label, "survivors": len(space), "refit_10_s": statistics.median(times),
                    "ei_choice_s": statistics.median(picks)})
    return out


ROBUST_STRATEGIES = ("ei", "ei-k2", "ei-k3", "planner", "tpe", "random", "grid")
HARD_RANKS = (5, 10)
"""the held-out style cases of the robustness benchmark: the plan's rank of the measured best in 5-10"""


def _verdict(rows: list[dict], strategies) -> dict:
    out = {}
    for s in strategies:
        out[s] = {"mean": round(statistics.mean(r[s] for r in rows), 3) if rows else None,
                  "worse_than_planner": sum(1 for r in rows if r[s] > r["planner"]),
                  "better_than_planner": sum(1 for r in rows if r[s] < r["planner"]),
                  "worst_excess_over_planner": max((r[s] - r["planner"] for r in rows), default=0)}
    return out


def robustness(cases: list[Case], seeds: int, fmt: str) -> int:
    started = time.perf_counter()
    perturbed = [perturb(c, term, f) for c in cases for term, f in PERTURBATIONS]
    rows = run(perturbed, seeds, ROBUST_STRATEGIES)
    hard = [r for r in rows if HARD_RANKS[0] <= r["planner_rank"] <= HARD_RANKS[1]]
    report = {"all": _verdict(rows, ROBUST_STRATEGIES), "hard": _verdict(hard, ROBUST_STRATEGIES),
              "cases": len(rows), "hard_cases": len(hard),
              "differs": [r for r in rows if any(r[s] != r["planner"] for s in ("ei", "ei-k2", "ei-k3"))]}
    if fmt == "json":
        print(json.dumps(report, indent=1))
        return 0
    print("ROBUSTNESS BENCHMARK (planner perturbed on purpose; not the dev-table result)")
    for label, key, n in (("all perturbed cases", "all", len(rows)),
                          (f"plan's rank of the best {HARD_RANKS[0]}-{HARD_RANKS[1]}", "hard", len(hard))):
        print(f"{label} ({n}):")
        for s in ROBUST_STRATEGIES:
            v = report[key][s]
            print(f"  {s:8s} mean {v['mean']:.3g}  worse than planner on {v['worse_than_planner']}, better on "
                  f"{v['better_than_planner']}, worst excess {v['worst_excess_over_planner']:+.3g}")
    print("cases where an ei variant differs from the plan's order:")
    for r in report["differs"]:
        print(f"  {r['table']}: plan rank {r['planner_rank']}, " + ", ".join(
            f"{s} {r[s]:.3g}" for s in ("ei", "ei-k2", "ei-k3", "planner")))
    print(f"({time.perf_counter() - started:.1f} s; {seeds} seeds for {', '.join(SEEDED)})")
    return 0


def loto(cases: list[Case], fmt: str) -> int:
    """Leave one table out: choose ei's top-k on the other tables (dev + perturbed), score it on the held-out one."""
    ks = ("ei", "ei-k2", "ei-k3")
    per_table = []
    for c in cases:
        group = [c] + [perturb(c, term, f) for term, f in PERTURBATIONS]
        per_table.append({s: [probes_to_best(g, s, 0) for g in group] for s in (*ks, "planner")})
    rows = []
    for i, c in enumerate(cases):
        others = [t for j, t in enumerate(per_table) if j != i]
        chosen = min(ks, key=lambda s: (statistics.mean(x for t in others for x in t[s]), ks.index(s)))
        held = per_table[i]
        rows.append({"table": c.name, "chosen": chosen, "dev": held[chosen][0], "dev_planner": held["planner"][0],
                     "perturbed": statistics.mean(held[chosen][1:]),
                     "perturbed_planner": statistics.mean(held["planner"][1:])})
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['table'][:70]:70s} chosen {r['chosen']:6s} dev {r['dev']} (planner {r['dev_planner']}), "
              f"perturbed mean {r['perturbed']:.3g} (planner {r['perturbed_planner']:.3g})")
    print(f"held-out dev mean {statistics.mean(r['dev'] for r in rows):.3g} vs planner "
          f"{statistics.mean(r['dev_planner'] for r in rows):.3g}; worse on "
          f"{sum(r['dev'] > r['dev_planner'] for r in rows)} tables; held-out perturbed mean "
          f"{statistics.mean(r['perturbed'] for r in rows):.3g} vs planner "
          f"{statistics.mean(r['perturbed_planner'] for r in rows):.3g}")
    return 0


IMPLICATION_RULES = {
    "same layout (tune's)": None,
    "every memory term": lambda m: (m.weights_bytes, m.grads_bytes, m.optimizer_bytes, m.activations_bytes,
                                    m.logits_bytes, m.buffers_bytes),
    "states, activations, rest": lambda m: (m.static_bytes, m.activations_bytes, m.logits_bytes + m.buffers_bytes),
    "states, rest": lambda m: (m.static_bytes, m.activations_bytes + m.logits_bytes + m.buffers_bytes),
    "total": lambda m: (m.total_bytes,),
}
"""OOM inference rules ("b needs at least a's memory, so a's OOM implies b's"): `tune`'s structural one
(`search.space.needs_more_memory`), and dominance in the planner's own memory terms, finest to coarsest"""


def _implied(rule, b, a) -> bool:
    """Under ``rule``, estimate ``b`` needs at least the memory of estimate ``a`` (and is not it)."""
    from search.space import needs_more_memory

    if b is a:
        return False
    if rule is None:
        return needs_more_memory(b.candidate, a.candidate)
    return all(x >= y * (1 - 1e-9) for x, y in zip(rule(b.memory), rule(a.memory)))


def sheet_implications(setups: list, rule, plans: list | None = None) -> tuple[int, int]:
    """(pairs, contradicted): the (a ran out of memory, so b must) pairs ``rule`` draws among each sheet's measured
    rows that the plan keeps, and how many of them the sheet contradicts (b ran). ``plans``: each setup's
    `plan(..., allow_empty=True)`, if already made."""
    from planner import plan

    pairs = contradicted = 0
    for i, setup in enumerate(setups):
        full = plan(*setup[1:4], allow_empty=True) if plans is None else plans[i]
        rows = [(e, r.status) for e in full.candidates
                if (r := setup[4].find(e.candidate)) is not None and r.status in ("ok", "oom")]
        for a, status in rows:
            if status == "oom":
                implied = [s for b, s in rows if _implied(rule, b, a)]
                pairs, contradicted = pairs + len(implied), contradicted + implied.count("ok")
    return pairs, contradicted


def implications(cases: list[Case], setups: list, fmt: str) -> int:
    """How far OOM inference can go on the sheets: for each rule, the pairs (a ran out of memory, so b must) it
    draws among a sheet's measured rows, how many the sheet contradicts (b ran), and what the rule would change
    in the plan's order (OOM probes it saves before the best; tables where it rules out the best)."""
    from search.space import config_key

    out = {}
    for name, rule in IMPLICATION_RULES.items():
        pairs, contradicted = sheet_implications(setups, rule)
        saved = best_lost = 0
        for case in cases:
            ooms = []
            for e in case.space.survivors:
                if any(_implied(rule, e, o) for o in ooms):
                    if config_key(e.candidate) in case.target:
                        best_lost += 1
                        break
                    row = case.table.find(e.candidate)
                    saved += row is not None and row.status == "oom"
                    continue
                if config_key(e.candidate) in case.target:
                    break
                row = case.table.find(e.candidate)
                if row is not None and row.status == "oom":
                    ooms.append(e)
        out[name] = {"implied_pairs": pairs, "contradicted": contradicted, "oom_probes_saved": saved,
                     "tables_best_ruled_out": best_lost}
    if fmt == "json":
        print(json.dumps(out, indent=1))
        return 0
    print("OOM inference on the sheets (pairs among each sheet's measured rows; probes in the plan's order)")
    for name, v in out.items():
        print(f"  {name:28s} implied {v['implied_pairs']:4d}, contradicted by the sheet {v['contradicted']:3d}; "
              f"in the plan's order: OOM probes saved {v['oom_probes_saved']}, tables whose best it rules out "
              f"{v['tables_best_ruled_out']}")
    return 0


MEASURED_STEP_CVS = (0.0011, 0.009, 0.014, 0.041, 0.081)
"""coefficients of variation of the timed steps of single probes measured on GPUs, the replay's per-step noise is
drawn from: H200 Megatron-LM probe (tests/bench/gpu_runs/h200-2026-11-26-megatron/trial-0000-result.json,
step_time_cv), H100 torch probes (tests/bench/gpu_runs/h100-2026-11-22*/bench_gpu*.log and
matmul_rope_roll_uncached.log: "cv 0.009 / 0.014 / 0.041 / 0.081")"""
LAUNCH_S = 12.5
"""seconds of a probe outside its steps (launch, rendezvous, model build, teardown) in the with-overhead count: the
H200 stand-in probe of issue 30 took 15-20 s of wall time for about 5 s of timed steps (the middle of 10-15 s)"""


def pruning_study(case: Case, seed: int, prune: bool, launch_s: float) -> dict:
    """One whole `tune` study of ``case`` (search, confirmation) replayed with per-step noise, pruning on or off."""
    import optuna

    from search.objective import Objective, ProbeSettings
    from search.progress import Progress
    from search.replay import ReplayBackend
    from search.report import best, summarize
    from search.sampler import SurvivorSampler
    from search.settings import TuneSettings
    from search.study import run as run_study

    settings = TuneSettings(study_name=case.name, sampler="ei", seed=seed, top_k=1)
    study = optuna.create_study(direction="maximize", sampler=SurvivorSampler(case.space, strategy="ei", seed=seed))
    backend = ReplayBackend(case.table, seed=seed, step_noise=MEASURED_STEP_CVS, launch_s=launch_s)
    objective = Objective(space=case.space, backend=backend, settings=ProbeSettings(prune=prune))
    records = run_study(study, objective, case.space, settings,
                        Progress(total=len(case.space), budget_s=None, enabled=False))
    probes = [r for r in sorted(records, key=lambda r: r.number) if r.counted or r.outcome == "invalid"]
    found = next((i + 1 for i, r in enumerate(probes) if r.outcome == "ok" and r.config in case.target), None)
    seconds = [sum((r.attrs.get("phases") or {}).values()) for r in probes]
    steps = [(r.attrs.get("phases") or {}).get("steps", 0.0) + (r.attrs.get("phases") or {}).get("warmup", 0.0)
             for r in probes]
    top = best(summarize(records))
    return {"probes_to_best": found, "probe_s": sum(seconds), "step_s": sum(steps),
            "probe_s_to_best": sum(seconds[:found]) if found else None, "probes": len(probes),
            "pruned": sum(r.outcome == "pruned" for r in probes), "best": top.config if top else None,
            "best_is_target": bool(top and top.config in case.target)}


def pruning_bench(cases: list[Case], seeds: int, fmt: str, launch_s: float = LAUNCH_S) -> int:
    """Pruning on the dev tables: whole studies replayed with per-step noise drawn from measured step spreads
    (`MEASURED_STEP_CVS`), each with pruning off and on, ``seeds`` noise seeds each. Pruning passes when its study ends
    with the same best, reaches the table's best in no more probes, and spends at least 30% fewer probe-seconds."""
    rows = []
    for case in cases:
        for seed in range(seeds):
            off = pruning_study(case, seed, False, launch_s)
            on = pruning_study(case, seed, True, launch_s)
            rows.append({"table": case.name, "seed": seed, "configs": len(case.space), "off": off, "on": on})
    total = {k: {m: sum(r[k][m] for r in rows) for m in ("probe_s", "step_s", "probes", "pruned")}
             for k in ("off", "on")}
    saved = 1 - total["on"]["probe_s"] / total["off"]["probe_s"]
    saved_steps = 1 - total["on"]["step_s"] / total["off"]["step_s"]
    later = [r for r in rows if (r["on"]["probes_to_best"] or 10 ** 9) > (r["off"]["probes_to_best"] or 10 ** 9)]
    differs = [r for r in rows if r["on"]["best"] != r["off"]["best"]]
    lost = [r for r in rows if r["off"]["best_is_target"] and not r["on"]["best_is_target"]]
    summary = {"studies": len(rows), "probe_s_saved": saved, "step_s_saved": saved_steps, "launch_s": launch_s,
               "found_later": len(later), "best_differs": len(differs), "target_lost": len(lost),
               "pruned": total["on"]["pruned"], "probes_off": total["off"]["probes"], "probes_on": total["on"]["probes"],
               "mean_probes_to_best_off": statistics.mean(r["off"]["probes_to_best"] or 0 for r in rows),
               "mean_probes_to_best_on": statistics.mean(r["on"]["probes_to_best"] or 0 for r in rows),
               "passed": not later and not differs and saved >= 0.30}
    if fmt == "json":
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
        return 0 if summary["passed"] else 1
    from tabulate import tabulate

    by_table: dict[str, list[dict]] = {}
    for r in rows:
        by_table.setdefault(r["table"], []).append(r)
    table = []
    for name, rs in by_table.items():
        off_s, on_s = sum(r["off"]["probe_s"] for r in rs), sum(r["on"]["probe_s"] for r in rs)
        table.append([name[:60], rs[0]["configs"], f"{statistics.mean(r['off']['probes_to_best'] or 0 for r in rs):.3g}",
                      f"{statistics.mean(r['on']['probes_to_best'] or 0 for r in rs):.3g}",
                      f"{statistics.mean(r['on']['pruned'] for r in rs):.3g}", f"{off_s / len(rs):.0f}",
                      f"{on_s / len(rs):.0f}", f"{100 * (1 - on_s / off_s):.0f}%",
                      sum(r["on"]["best"] == r["off"]["best"] for r in rs)])
    print(tabulate(table, headers=["table", "configs", "probes to best (off)", "(on)", "pruned", "probe s (off)",
                                   "probe s (on)", "saved", f"same best (of {seeds})"]))
    print(f"\n{len(rows)} studies ({seeds} noise seeds; per-step noise drawn from the measured CVs "
          f"{MEASURED_STEP_CVS}; {launch_s:g} s a probe outside its steps): pruning saved "
          f"{100 * saved:.1f}% of probe-seconds ({100 * saved_steps:.1f}% of step-seconds), pruned "
          f"{total['on']['pruned']} of {total['on']['probes']} probes; the table's best reached later in "
          f"{len(later)} studies, a different final best in {len(differs)}, the table's best lost in {len(lost)}; "
          f"mean probes to the best {summary['mean_probes_to_best_off']:.3g} off, "
          f"{summary['mean_probes_to_best_on']:.3g} on: {'PASS' if summary['passed'] else 'FAIL'}")
    for r in later + differs:
        print(f"  {r['table']} seed {r['seed']}: off {r['off']}, on {r['on']}")
    return 0 if summary["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="seeds for the random strategies (tpe, random)")
    p.add_argument("--data", default=default_data(),
                   help="folder of published_dev.yaml and hagemann_13b_dev.yaml (default ../shared/data)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--overhead", action="store_true", help="only time the search's own work per probe")
    p.add_argument("--robustness", action="store_true",
                   help="replay every table under planners with one term mis-scaled (a robustness benchmark)")
    p.add_argument("--loto", action="store_true", help="leave-one-table-out choice of the top-k of ei")
    p.add_argument("--pruning", action="store_true",
                   help="whole studies replayed with measured per-step noise, pruning off vs on (probe-seconds saved)")
    p.add_argument("--launch-s", type=float, default=LAUNCH_S,
                   help=f"--pruning: seconds of each probe outside its steps (default {LAUNCH_S:g})")
    p.add_argument("--implications", action="store_true",
                   help="how far OOM inference rules hold on the sheets (implied, contradicted, probes saved)")
    args = p.parse_args(argv)
    import optuna

    if args.overhead:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        rows = overhead()
        if args.format == "json":
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                print(f"{r['space']} ({r['survivors']} survivors): refit of 10 measurements {r['refit_10_s']:.3f} s, "
                      f"one EI choice {r['ei_choice_s']:.3f} s (medians of 5)")
        return 0

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    started = time.perf_counter()
    cases, skipped = [], []
    setups = [*seed003_setups(), *published_setups(Path(args.data))]
    for setup in setups:
        case, why = make_case(*setup)
        (cases.append(case) if case else skipped.append((setup[0], why)))
    if args.implications:
        return implications(cases, setups, args.format)
    if args.pruning:
        return pruning_bench(cases, args.seeds, args.format, args.launch_s)
    if args.robustness:
        return robustness(cases, args.seeds, args.format)
    if args.loto:
        return loto(cases, args.format)
    rows = run(cases, args.seeds)
    strategies = list(STRATEGIES)
    summary = {s: statistics.mean(r[s] for r in rows) for s in strategies}
    verdict = {"ei_worse_than_planner": [r["table"] for r in rows if r["ei"] > r["planner"]],
               "ei_better_than_planner": [r["table"] for r in rows if r["ei"] < r["planner"]]}
    if args.format == "json":
        print(json.dumps({"rows": rows, "mean": summary, "skipped": skipped, **verdict}, indent=1))
        return 0
    from tabulate import tabulate

    resid = statistics.median(r["resid_sd"] for r in rows)
    print(tabulate([[r["table"], r["configs"], r["planner_rank"], f"{r['oom_ahead']}/{r['slower_ahead']}",
                     "yes" if r["table_best_pruned"] else "",
                     f"{r['resid_sd']:.3f}", *(f"{r[s]:.3g}" for s in strategies)] for r in rows]
                   + [["mean over tables", "", "", f"{sum(r['oom_ahead'] for r in rows)}/"
                       f"{sum(r['slower_ahead'] for r in rows)}", "", f"median {resid:.3f}",
                       *(f"{summary[s]:.3g}" for s in strategies)]],
                   headers=["table", "configs", "planner rank of best", "oom/slower probed ahead", "table best pruned",
                            "resid sd",
                            *(f"{s}{' (mean)' if s in SEEDED else ''}" for s in strategies)]))
    print(f"\nprobes the plan's order makes before the best: {sum(r['oom_ahead'] for r in rows)} out of memory, "
          f"{sum(r['slower_ahead'] for r in rows)} slower, of which "
          f"{sum(r['slower_after_a_measurement'] for r in rows)} after a measurement (what learning step times "
          "can save)")
    print(f"ei worse than the planner's order on {len(verdict['ei_worse_than_planner'])} tables "
          f"{verdict['ei_worse_than_planner']}, better on {len(verdict['ei_better_than_planner'])}")
    for name, why in skipped:
        print(f"skipped {name}: {why}")
    print(f"({time.perf_counter() - started:.1f} s; {args.seeds} seeds for {', '.join(SEEDED)}; probes counted up "
          "to and including the first measured-best)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
