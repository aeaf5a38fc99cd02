"""`tune`: measure the planner's best configurations on the real machine, learn from every probe.

    tune --model 176B --gpus 384 --study bloom --storage sqlite:///tune.db --budget 2h
    tune --model 1B3 --gpu V100-32GB --gpus 8 --gpus-per-node 4 --global-batch 512 --precision fp16 \\
         --recompute full --zero 1 --no-rampup --backend replay \\
         --results ../shared/data/bigscience_1b3_v100.csv --results-table v100-32gb-recompute
    tune report --study bloom --storage sqlite:///tune.db      # the table again, plots, dashboard hint
    tune calibrate --nproc-per-node 8 --out calibration.yaml    # probes.calibrate, arguments passed through

Re-running the same command continues the study: finished configurations are never probed again,
a trial left RUNNING by a killed tuner is retried (after ``--grace-s``), a Ctrl-C'd one is probed
again first. Ctrl-C records the running trial FAIL with outcome ``interrupted`` and exits 130.
Bad input prints one line and exits 2 (``--debug`` shows tracebacks).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import warnings
from contextlib import ExitStack
from pathlib import Path

from planner.cli import OneLineParser, add_setup_arguments, number, setup_from_args
from planner.errors import PlantuneError

from search._base import BackendError, TuneError

DEFAULT_STORAGE = "sqlite:///tune.db"
BACKENDS = ("local", "replay", "slurm")
PROBES = ("train", "megatron")
EMIT_KINDS = ("megatron-deepspeed", "megatron-lm", "fsdp")
EXIT_INTERRUPTED = 130


def parse_duration(text: str) -> float:
    """``2h``, ``90m``, ``1h30m``, ``45s`` or plain seconds -> seconds."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        value = float(t)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", t)
        if not parts or re.sub(r"\d+(?:\.\d+)?\s*[hms]", "", t).strip():
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration; e.g. 2h, 90m, 1h30m, 600")
        value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


_nonneg_float = number(float, allow_zero=True)
_nonneg_int = number(int, allow_zero=True)
_pos_int = number(int)
_pos_float = number(float)


def build_run_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tune", description="Probe the planner's surviving configurations, best predicted "
                                               "first, then as a sampler learning from every measurement directs.")
    add_setup_arguments(p)
    s = p.add_argument_group("study")
    s.add_argument("--study", "--study-name", dest="study", default="plantune", help="study name (resume key)")
    s.add_argument("--storage", default=DEFAULT_STORAGE,
                   help=f"Optuna RDB URL (default {DEFAULT_STORAGE}; postgresql://... for many workers)")
    s.add_argument("--budget", type=parse_duration, help="wall-clock budget: 2h, 90m, 1h30m, seconds")
    s.add_argument("--max-probes", "--n-trials", dest="max_probes", type=_pos_int,
                   help="search probes in the study, all runs together (default: until every survivor is done)")
    s.add_argument("--top-k", type=_nonneg_int, default=3, help="analytic best probed first (default 3)")
    s.add_argument("--sampler", choices=("ei", "tpe", "random", "grid", "analytic", "planner"), default="ei",
                   help="after the top-k: ei (expected improvement under the refitted model, default), tpe, random, "
                        "grid, analytic (refitted order), planner (the plan's order)")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--startup-trials", type=_pos_int, default=4, help="measurements before TPE models (default 4)")
    s.add_argument("--confirm-top", type=_nonneg_int, default=3, help="re-probe the best K (default 3; 0: off)")
    s.add_argument("--repeats", type=_nonneg_int, default=2, help="re-probes of each confirmed one (default 2)")
    s.add_argument("--heartbeat-s", type=_pos_int, default=60, help="trial heartbeat interval (default 60)")
    s.add_argument("--grace-s", type=_pos_int, default=120,
                   help="a RUNNING trial without heartbeat this long is failed and retried (default 120)")
    s.add_argument("--max-retry", type=_nonneg_int, default=3)
    b = p.add_argument_group("probes")
    b.add_argument("--backend", choices=BACKENDS, default="local")
    b.add_argument("--results", help="--backend replay: CSV of earlier measurements")
    b.add_argument("--results-table", help="--backend replay: the table column's value to replay")
    b.add_argument("--replay-noise", type=_nonneg_float, default=0.0,
                   help="--backend replay: log-normal sigma on step times")
    b.add_argument("--replay-delay", type=_nonneg_float, default=0.0,
                   help="--backend replay: seconds each probe takes (tests of concurrency and interruption)")
    b.add_argument("--local-procs", type=_pos_int, default=None,
                   help="--backend local: processes this node can run (default --gpus-per-node); a candidate "
                        "needing more runs one DP replica (TP*PP processes), projected to the full DP")
    b.add_argument("--reservation", help="SLURM reservation (--backend slurm; also written into launch.sbatch)")
    b.add_argument("--partition", help="SLURM partition (--backend slurm)")
    b.add_argument("--account", help="SLURM account (--backend slurm)")
    b.add_argument("--probe", choices=PROBES, default="train",
                   help="train: plantune's GPT probe; megatron: your command (--command)")
    b.add_argument("--command", help="--probe megatron: your training command with {args}, e.g. "
                                     "\"python pretrain_gpt.py {args} --data-path D\"")
    b.add_argument("--probe-layers", type=_pos_int, help="run a reduced model of N layers (step time scaled up)")
    b.add_argument("--probe-steps", type=_pos_int, default=5, help="timed steps per probe (default 5)")
    b.add_argument("--probe-warmup", type=_nonneg_int, default=2, help="untimed steps first (default 2)")
    b.add_argument("--probe-timeout", type=parse_duration, default=600.0, help="per probe (default 600 s)")
    b.add_argument("--probe-device", choices=("auto", "cuda", "cpu"), default="auto")
    b.add_argument("--workdir", default="tune-runs", help="probe folders: WORKDIR/STUDY/trial-NNNN")
    o = p.add_argument_group("output")
    o.add_argument("--emit", choices=EMIT_KINDS, help="write the best measured configuration like plan --emit")
    o.add_argument("--emit-flavor", "--emit_flavor", choices=("bigscience", "microsoft"), default="bigscience")
    o.add_argument("--out", help="folder for --emit (default run/)")
    o.add_argument("--format", choices=("table", "json"), default="table")
    o.add_argument("--no-progress", action="store_true", help="no live progress line on stderr")
    o.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def build_report_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tune report", description="A study's ranked table again, plots, and how to open it "
                                                      "in optuna-dashboard.")
    p.add_argument("--study", "--study-name", dest="study", required=True)
    p.add_argument("--storage", default=DEFAULT_STORAGE)
    p.add_argument("--plots", default=None, help="folder for the PNG plots (default tune-report-STUDY)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--trials", action="store_true", help="also one row per trial (predicted before/after, measured)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--debug", action="store_true")
    return p


# -- run ----------------------------------------------------------------------------------------------

def _inputs(model, cluster, training, restriction: str | None) -> dict:
    from dataclasses import asdict

    t = asdict(training)
    t["rampup"] = training.rampup.as_list() if training.rampup else None
    return json.loads(json.dumps({"model": model.to_dict(), "cluster": cluster.to_dict(), "training": t,
                                  "restriction": restriction}))


def _backend(args: argparse.Namespace, cluster, training, stack: ExitStack):
    """The ProbeBackend the flags ask for, and the replay table when replaying."""
    if args.backend == "replay":
        from search.replay import ReplayBackend, ReplayTable

        if not args.results:
            raise TuneError("--backend replay needs --results FILE.csv (a table of earlier measurements)")
        table = ReplayTable.read(args.results, args.results_table)
        table.check(global_batch=training.global_batch, seq_len=training.seq_len)
        return ReplayBackend(table, noise=args.replay_noise, seed=args.seed or 0, delay_s=args.replay_delay), table
    if args.backend == "slurm":
        try:
            from probes.slurm import SlurmBackend
        except ImportError as err:
            raise TuneError(f"--backend slurm is not available here ({err})") from None
        try:
            backend = SlurmBackend(args.reservation, args.partition, args.account, gpus_per_node=cluster.gpus_per_node,
                                   nodes=cluster.nodes,   # salloc'ed when not already inside an allocation
                                   time_limit_s=max(args.probe_timeout * 1.5, 300.0),
                                   gres=None if args.probe_device == "cpu" else "gpu")
        except ValueError as err:
            raise TuneError(str(err)) from None
        stack.callback(backend.close)
        if args.probe != "megatron":
            return backend, None
    elif args.probe != "megatron":
        return _local_backend(args.local_procs or cluster.gpus_per_node), None
    else:
        from probes.backend import LocalBackend

        backend = LocalBackend()
    if not args.command:
        raise TuneError("--probe megatron needs --command \"python pretrain_gpt.py {args} ...\"")
    try:
        from probes.megatron import MegatronProbe
    except ImportError as err:
        raise TuneError(f"--probe megatron is not available here ({err})") from None
    local = None if args.backend == "slurm" else (args.local_procs or cluster.gpus_per_node)
    try:
        return MegatronProbe(args.command, backend, flavor=args.emit_flavor, cluster=cluster,
                             optimizer=training.optimizer, flash_attention=training.flash_attention,
                             max_local_procs=local), None
    except ValueError as err:
        raise TuneError(f"--command: {err}") from None


def _local_backend(capacity: int):
    """LocalBackend with as many processes as the candidate needs when this node has them, one DP
    replica (TP*PP processes, reported as reduced and projected by the probe) when only that fits."""
    from probes.backend import LocalBackend, ProbeBackend
    from probes.result import ProbeResult

    class OneNode(ProbeBackend):
        name = "local"

        def run(self, spec, *, workdir, timeout_s):
            c = spec.candidate
            world, model_parallel = c["tp"] * c["pp"] * c["dp"], c["tp"] * c["pp"]
            if world <= capacity:
                return LocalBackend(nproc=world).run(spec, workdir=workdir, timeout_s=timeout_s)
            if model_parallel <= capacity:
                return LocalBackend(nproc=model_parallel).run(spec, workdir=workdir, timeout_s=timeout_s)
            return ProbeResult(status="invalid", wall_s=0.0, reason=(
                f"needs TP*PP = {model_parallel} processes, this node runs {capacity} (--local-procs); "
                "probe it with --backend slurm"))

    return OneNode()


def _command_line(argv: list[str]) -> str:
    return shlex.join(["tune", *argv])


def _targets(args: argparse.Namespace, training) -> tuple:
    """What every configuration of the space must run on (planner.rules): the planned framework, the
    --emit target and, for --probe megatron, the fork it runs, so that the study only measures what it can
    emit and launch."""
    from planner.rules import Target

    targets = [Target(training.framework, training.flavor)]
    if args.probe == "megatron":
        targets.append(Target("megatron-deepspeed", args.emit_flavor))
    if args.emit:
        targets.append(Target(args.emit, args.emit_flavor))
    return tuple(dict.fromkeys(targets))


def _check_emittable(args: argparse.Namespace, model, cluster, training, space) -> None:
    """Refuse before probing when no configuration of the space could be emitted as --emit asks."""
    from planner.emit import RunSetup, setup_problems

    problems = []
    for est in space.survivors:
        problems = setup_problems(RunSetup(model=model, cluster=cluster, training=training, candidate=est.candidate),
                                  args.emit, args.emit_flavor)
        if not problems:
            return
    raise TuneError(f"--emit {args.emit} ({args.emit_flavor}) cannot write any configuration of this space: "
                    + "; ".join(problems))


def _emit_best(args: argparse.Namespace, model, cluster, training, best_summary, calibration) -> list[Path]:
    from planner import Candidate, estimate
    from planner.emit import Prediction, RunSetup, emit

    cand = Candidate(**best_summary.candidate)
    est = estimate(model, cluster, training, cand, params=calibration)
    t = est.throughput
    prediction = None
    if t is not None and est.memory and est.time:
        prediction = Prediction(memory_gb_per_gpu=round(est.memory.total_gb, 3),
                                step_time_s=round(est.time.step_time_s, 3),
                                model_tflops_per_gpu=round(t.model_tflops_per_gpu, 3),
                                hardware_tflops_per_gpu=round(t.hardware_tflops_per_gpu, 3), mfu=round(t.mfu, 4))
    out = Path(args.out or "run")
    written = emit(RunSetup(model=model, cluster=cluster, training=training, candidate=cand, prediction=prediction),
                   args.emit, out, flavor=args.emit_flavor, reservation=args.reservation)
    measured = out / "tune_measured.json"
    measured.write_text(json.dumps({"study": args.study, "storage": args.storage, **best_summary.to_dict(),
                                    "calibration": {"compute_scale": calibration.compute_scale,
                                                    "comm_scale": calibration.comm_scale}}, indent=1) + "\n")
    return [*written, measured]


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import optuna
    from planner import plan

    from search.calibration import refit
    from search.objective import Ledger, Objective, ProbeSettings
    from search.report import best, format_table, report_dict, summarize
    from search.space import SearchSpace
    from search.study import Progress, TuneSettings, open_study
    from search.study import run as run_study

    model, cluster, training = setup_from_args(args)
    targets = _targets(args, training)
    full = plan(model, cluster, training, targets=targets)
    with ExitStack() as stack:
        backend, table = _backend(args, cluster, training, stack)
        if table is not None:
            keep, orphans = table.restrict(full)
            space = SearchSpace.from_plan(full, keep=keep, restricted_out=tuple(orphans))
            restriction = f"replay table {table.table or Path(table.path).name} ({len(table.rows)} rows)"
        else:
            space, restriction = SearchSpace.from_plan(full), None
        if not len(space):
            raise TuneError(f"no survivor of the plan is in the space ({restriction or 'empty'}); "
                            "check --results-table and the model/cluster flags")
        if args.emit:
            _check_emittable(args, model, cluster, training, space)
        settings = TuneSettings(study_name=args.study, storage_url=args.storage, budget_s=args.budget,
                                max_probes=args.max_probes, top_k=args.top_k, sampler=args.sampler, seed=args.seed,
                                startup_trials=args.startup_trials, confirm_top=args.confirm_top,
                                repeats=args.repeats, heartbeat_s=args.heartbeat_s, grace_s=args.grace_s,
                                max_retry=args.max_retry)
        probe = ProbeSettings(steps=args.probe_steps, warmup_steps=args.probe_warmup, layers=args.probe_layers,
                              timeout_s=args.probe_timeout, device=args.probe_device,
                              workdir=None if args.backend == "replay" else Path(args.workdir) / args.study)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        study = open_study(settings, space, _inputs(model, cluster, training, restriction))
        progress = Progress(total=len(space), budget_s=args.budget, enabled=not args.no_progress)
        print(f"tune: study {args.study!r} in {args.storage}: {len(space)} configurations "
              f"({full.total} enumerated, {len(full.candidates)} survive the planner"
              + (f", {restriction}" if restriction else "") + f"); backend {backend.name}", file=sys.stderr)
        objective = Objective(space=space, backend=backend, settings=probe, on_probe=progress.probing)
        try:
            records = run_study(study, objective, space, settings, progress)
        except BackendError as err:
            progress.close()
            print(f"tune: error: {err}; the study stops (finished trials are kept in {args.storage}); fix it and "
                  f"resume with: {_command_line(argv)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            progress.close()
            print(f"tune: interrupted; finished trials are stored in {args.storage} (study {args.study!r}) and the "
                  f"running one is recorded FAIL 'interrupted'. Resume with:\n  {_command_line(argv)}",
                  file=sys.stderr)
            return EXIT_INTERRUPTED

    summaries = summarize(records)
    winner = best(summaries)
    calibration = refit(model, cluster, training, Ledger(records).measurements())
    if args.format == "json":
        d = report_dict(records, study=args.study, storage=args.storage)
        d["calibration"] = {"compute_scale": calibration.compute_scale, "comm_scale": calibration.comm_scale}
        d["ruled_out_rows"] = [{"config": c, "why": w} for c, w in space.restricted_out]
        print(json.dumps(d, indent=1))
    else:
        print(format_table(summaries, title=f"tune: study {args.study!r}, {len(records)} trials, "
                                            f"calibration compute x{calibration.compute_scale:.3g}, "
                                            f"comm x{calibration.comm_scale:.3g}"))
        for config, why in space.restricted_out:
            print(f"  not probed: {config}: {why}")
    if winner is None:
        print("tune: no configuration measured successfully; see the reasons above", file=sys.stderr)
        return 1
    print(f"tune: best {winner.config}: {winner.median_tflops:.3g} model TFLOPs/GPU measured"
          + (f" (median of {len(winner.tflops)})" if len(winner.tflops) > 1 else ""), file=sys.stderr)
    if args.emit:
        written = _emit_best(args, model, cluster, training, winner, calibration)
        print(f"tune: wrote {len(written)} files to {args.out or 'run'}: {', '.join(p.name for p in written)}",
              file=sys.stderr)
    print(f"tune: open the study with: optuna-dashboard {args.storage}", file=sys.stderr)
    return 0


# -- report -------------------------------------------------------------------------------------------

def report(args: argparse.Namespace) -> int:
    import optuna

    from search.objective import TrialRecord
    from search.report import format_table, format_trials, report_dict, summarize, write_plots
    from search.study import open_storage, TuneSettings

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(TuneSettings(study_name=args.study, storage_url=args.storage))
    names = optuna.get_all_study_names(storage)
    if args.study not in names:
        raise TuneError(f"no study {args.study!r} in {args.storage}; studies there: {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=args.study, storage=storage)
    records = [TrialRecord.from_trial(t) for t in study.get_trials(deepcopy=False)]
    if args.format == "json":
        print(json.dumps(report_dict(records, study=args.study, storage=args.storage), indent=1))
    else:
        print(format_table(summarize(records), title=f"tune: study {args.study!r}, {len(records)} trials"))
        if args.trials:
            print()
            print(format_trials(records))
    if not args.no_plots:
        paths = write_plots(records, Path(args.plots or f"tune-report-{args.study}"), study=args.study)
        print(f"tune: wrote plots {', '.join(str(p) for p in paths)}", file=sys.stderr)
    print(f"tune: open the study with: optuna-dashboard {args.storage}", file=sys.stderr)
    return 0


# -- entry ----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        from probes.calibrate import main as calibrate_main

        try:
            return int(calibrate_main(argv[1:]) or 0)
        except SystemExit as exit_:          # its argparse: --help (0) or a usage error (2)
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    try:                                     # argparse exits (one line, 2) on bad flags, 0 after --help
        if argv and argv[0] == "report":
            args = build_report_parser().parse_args(argv[1:])
            command = report
        else:
            rest = argv[1:] if argv and argv[0] == "run" else argv
            args = build_run_parser().parse_args(rest)
            command = lambda a: run(a, argv)  # noqa: E731
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 0
    try:
        return command(args)
    except PlantuneError as err:
        if args.debug:
            raise
        print(f"tune: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
