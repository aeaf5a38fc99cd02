"""Probes-to-best of search strategies, replayed on seed 003's V100 tables (offline, seconds).

    python tests/bench/bench_search.py                 # 20 seeds, every table, every strategy
    python tests/bench/bench_search.py --seeds 50 --format json

For each table of tests/data/bigscience_1b3_v100.csv the space is the planner's survivors that
the table measured (1B3, 8 V100s as 2x4, GBS 512, seq 2048, fp16, ZeRO-1, recompute as the table).
A strategy probes until it first measures a configuration with the table's best step time;
probes-to-best counts every probe up to and including that one (OOMs count; configurations an
OOM rules out without a probe do not). Mean, median and worst over seeds; on the tables grid order
and the analytic order do not depend on the seed (one run each).

A synthetic case adds a larger space: BLOOM-176B on 384 A100-80GB (the planner's survivors), each
seed drawing a machine whose step times are the planner's under hidden CostParams (compute x1.35,
comm x2.5) times a per-configuration log-normal factor (sigma 0.08) the cost model cannot know;
the best is that machine's fastest configuration (grid order still varies with the machine).

Strategies: ``tune`` (analytic top-3 enqueued, then TPE mapped to survivors: the default),
``tpe`` (no top-k), ``random`` (uniform over unprobed survivors), ``grid`` ((tp, pp, dp, mbs)
order), ``analytic`` (the calibrated planner's ranking, re-ranked after every probe).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
TABLES = {"v100-32gb-recompute": ("V100-32GB", "full"), "v100-32gb-no-recompute": ("V100-32GB", "none"),
          "v100-16gb-recompute": ("V100-16GB", "full")}
STRATEGIES = {"tune": ("tpe", 3), "tpe": ("tpe", 0), "random": ("random", 0), "grid": ("grid", 0),
              "analytic": ("analytic", 0)}


def best_keys(table: str) -> set[tuple[int, int, int]]:
    rows = [r for r in csv.DictReader(DATA.open()) if r["table"] == table and r["status"] == "ok"]
    best = min(float(r["seconds_per_iteration"]) for r in rows)
    return {(int(r["tp"]), int(r["pp"]), int(r["micro_batch"])) for r in rows
            if float(r["seconds_per_iteration"]) == best}


def _run_until_best(space, backend, strategy: str, seed: int, is_best) -> int:
    """Probes (ok, oom, ...) up to and including the first one ``is_best`` accepts."""
    import optuna

    from search.objective import Objective, ProbeFailed, ProbeSettings
    from search.study import SurvivorSampler, recover

    kind, top_k = STRATEGIES[strategy]
    study = optuna.create_study(direction="maximize", sampler=SurvivorSampler(space, strategy=kind, seed=seed))
    objective = Objective(space=space, backend=backend, settings=ProbeSettings())
    recover(study, space, top_k)
    count = {"probes": 0, "found": None}

    def stop_at_best(study, trial) -> None:
        if trial.user_attrs.get("outcome") in ("ok", "oom", "timeout", "crash", "invalid", "not_measured"):
            count["probes"] += 1
            if trial.user_attrs["outcome"] == "ok" and is_best(trial.user_attrs["candidate"]):
                count["found"] = count["probes"]
                study.stop()

    study.optimize(objective, n_trials=len(space), catch=(ProbeFailed,), callbacks=[stop_at_best])
    if count["found"] is None:
        raise AssertionError(f"{strategy} (seed {seed}) never measured the best")
    return count["found"]


def probes_to_best(table: str, strategy: str, seed: int) -> tuple[int, int]:
    """(probes until the first measured-best one, size of the space) on a seed 003 table."""
    from planner import TrainingSpec, load_model, make_cluster, plan
    from search.replay import ReplayBackend, ReplayTable
    from search.space import SearchSpace

    gpu, recompute = TABLES[table]
    full = plan(load_model("1B3"), make_cluster(gpu=gpu, gpus=8, gpus_per_node=4),
                TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", recompute_options=(recompute,),
                             zero_options=(1,), flash_attention=False))
    replay = ReplayTable.read(str(DATA), table)
    keep, _ = replay.restrict(full.candidates)
    space = SearchSpace.from_plan(full, keep=keep)
    wanted = best_keys(table)
    found = _run_until_best(space, ReplayBackend(replay), strategy, seed,
                            lambda c: (c["tp"], c["pp"], c["mbs"]) in wanted)
    return found, len(space)


class Synthetic:
    """A made-up machine: the planner's step time under hidden CostParams, times a fixed per-configuration
    log-normal factor (what the cost model cannot know: kernels, placement)."""

    name = "synthetic"

    def __init__(self, space, *, compute_scale: float, comm_scale: float, sigma: float, world_seed: int) -> None:
        import math
        import random

        from planner import CostParams, estimate
        from search.space import config_key

        p = space.plan
        hidden = CostParams(compute_scale=compute_scale, comm_scale=comm_scale)
        self.step = {}
        for e in space.survivors:
            rng = random.Random(f"{world_seed}:{config_key(e.candidate)}")
            t = estimate(p.model, p.cluster, p.training, e.candidate, params=hidden).step_time_s
            self.step[config_key(e.candidate)] = t * math.exp(rng.gauss(0.0, sigma))
        self.best = min(self.step, key=self.step.get)

    def run(self, spec, *, workdir, timeout_s):
        from planner import Candidate
        from probes.result import ProbeResult
        from search.space import config_key

        step = self.step[config_key(Candidate(**spec.candidate))]
        return ProbeResult(status="ok", step_time_median_s=step, step_times_s=[step], device="synthetic")


def synthetic_probes_to_best(strategy: str, seed: int) -> tuple[int, int]:
    """BLOOM-176B on 384 A100s: the planner's survivors, a synthetic machine drawn per seed."""
    from planner import Candidate, TrainingSpec, load_model, make_cluster, plan
    from search.space import SearchSpace, config_key

    full = plan(load_model("176B"), make_cluster(gpu="A100-80GB", gpus=384),
                TrainingSpec(global_batch=2048, seq_len=2048, flash_attention=False))
    space = SearchSpace.from_plan(full)
    machine = Synthetic(space, compute_scale=1.35, comm_scale=2.5, sigma=0.08, world_seed=seed)
    found = _run_until_best(space, machine, strategy, seed,
                            lambda c: config_key(Candidate(**c)) == machine.best)
    return found, len(space)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--no-synthetic", action="store_true", help="only the seed 003 tables")
    args = p.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    started = time.perf_counter()
    rows = []
    cases = [(table, lambda st, sd, t=table: probes_to_best(t, st, sd)) for table in TABLES]
    if not args.no_synthetic:
        cases.append(("synthetic-176b-384xA100", synthetic_probes_to_best))
    for table, fn in cases:
        for strategy in STRATEGIES:
            fixed = table in TABLES and strategy in ("grid", "analytic")       # no randomness at all
            counts, size = [], 0
            for seed in range(1) if fixed else range(args.seeds):
                n, size = fn(strategy, seed)
                counts.append(n)
            rows.append({"table": table, "strategy": strategy, "space": size, "seeds": len(counts),
                         "mean": statistics.mean(counts), "median": statistics.median(counts), "worst": max(counts)})
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        from tabulate import tabulate

        print(tabulate([[r["table"], r["strategy"], r["space"], r["seeds"], f"{r['mean']:.2f}", r["median"], r["worst"]]
                        for r in rows], headers=["table", "strategy", "configs", "seeds", "mean probes-to-best",
                                                  "median", "worst"]))
        print(f"({time.perf_counter() - started:.1f} s; probes counted up to and including the first measured-best)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
