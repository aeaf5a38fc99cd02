"""`tune`: measure the planner's best configurations on the real machine, learn from every probe.

    tune --model 176B --gpus 384 --study bloom --budget 2h     # work folder tune-bloom/ (tune.db, trial-NNNN/)
    tune --model 1B3 --gpu V100-32GB --gpus 8 --gpus-per-node 4 --global-batch 512 --precision fp16 \\
         --recompute full --zero 1 --no-rampup --backend replay \\
         --results tests/data/bigscience_1b3_v100.csv --results-table v100-32gb-recompute
    tune report --study bloom                                   # the table again, plots, dashboard hint
    tune calibrate --nproc-per-node 8 --out calibration.yaml    # probes.calibrate, arguments passed through

Re-running the same command continues the study: finished configurations are never probed again,
a trial left RUNNING by a killed tuner is retried (at once when that tuner ran on this host, else
after ``--grace-s``), a Ctrl-C'd one is probed again first. Ctrl-C records the running trial FAIL
with outcome ``interrupted`` and exits 130; SIGTERM (a SLURM time limit) does the same and exits 143.
Bad input prints one line and exits 2 (``--debug`` shows tracebacks).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
import warnings
from contextlib import ExitStack
from pathlib import Path

from planner.cli import OneLineParser, add_setup_arguments, number, setup_from_args
from planner.emit.write import TORCHTITAN_VERSIONS
from planner.errors import PlantuneError
from planner.files import check_out, write_files

from search._base import BackendError, TuneError
from search.interrupts import Terminated, deferred_interrupts

DB_NAME = "tune.db"
"""the SQLite file inside a study's work folder (the default storage)"""
BACKENDS = ("local", "replay", "slurm")
PROBES = ("auto", "train", "megatron", "torchtitan")
EMIT_KINDS = ("megatron-deepspeed", "megatron-lm", "fsdp")
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""128 + SIGTERM, as a shell reports a process SIGTERM ended"""
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""a study name is also a folder name: letters, digits, '.', '_', '-'; no path separators"""
INSTALL_TUNE = "pip install 'plantune[tune]'"
INSTALL_PROBES = "pip install 'plantune[probes]'"
COMMANDS = """commands:
  tune [run] --model M --gpus N ...   probe the planner's best configurations (this help)
  tune report --study NAME            a study's ranked table again, plots, optuna-dashboard hint
                                      (tune report --help)
  tune calibrate --out FILE.yaml      measure this machine's GEMM rate and bus bandwidth for
                                      plan --calibration (tune calibrate --help)

limits: --budget is the wall-clock time of this run, every probe included (confirmation re-probes
too; a probe still running at the end is stopped and probed again by the next run), or with a gpuh
suffix (--budget 40gpuh) the GPU-hours its probes may hold (phase seconds x GPUs); --max-probes
counts the probes that ran in the study over all runs (ok, oom, timeout, crash; confirmation
re-probes included; configurations answered from storage, implied out of memory or refused
without starting a process are not counted).
"""


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


GPUH = re.compile(r"(\d+(?:\.\d+)?)\s*gpu-?h(?:ours?)?", re.IGNORECASE)


def parse_budget(text: str) -> tuple[str, float]:
    """``40gpuh`` (GPU-hours) -> ("gpuh", 40.0); a duration (`parse_duration`) -> ("wall", seconds)."""
    m = GPUH.fullmatch(text.strip())
    if m:
        value = float(m.group(1))
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0 GPU-hours")
        return "gpuh", value
    try:
        return "wall", parse_duration(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (2h, 90m, 1h30m, 600) or GPU-hours "
                                         "(40gpuh)") from None


class _BudgetAction(argparse.Action):
    """--budget 2h sets ``budget`` (seconds), --budget 40gpuh sets ``budget_gpuh``; both may be given."""

    def __call__(self, parser, namespace, values, option_string=None):
        kind, value = values
        setattr(namespace, "budget" if kind == "wall" else "budget_gpuh", value)


_nonneg_float = number(float, allow_zero=True)
_nonneg_int = number(int, allow_zero=True)

_pos_int = number(int)
_pos_float = number(float)


def _study_name(text: str) -> str:
    if not STUDY_NAME.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a study name: use letters, digits, '.', '_' and '-' "
                                         "(it names the work folder, so no '/' or '..')")
    return text


def _fill_help(p: argparse.ArgumentParser) -> None:
    """Help for every flag: a --no-X without one is "the opposite of --X", any other without one lists its choices
    (the shared planner flags keep the one help text planner.cli.add_setup_arguments gives them)."""
    for action in p._actions:
        if action.help is None:
            action.help = ("the opposite of " + action.option_strings[0].replace("--no-", "--") if
                           action.option_strings and action.option_strings[0].startswith("--no-") else None)
        if action.help is None and action.choices:
            action.help = "one of " + ", ".join(map(str, action.choices))


def build_run_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tune", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=COMMANDS,
                      description="Probe the planner's surviving configurations, best predicted first, then as a\n"
                                  "sampler learning from every measurement directs. Also: tune report, tune\n"
                                  "calibrate (see the end). Needs the tune extra (" + INSTALL_TUNE + ");\n"
                                  "probes on this machine also the probes extra (pip install 'plantune[probes]').")
    add_setup_arguments(p)
    s = p.add_argument_group("study")
    s.add_argument("--study", "--study-name", dest="study", type=_study_name, default="plantune",
                   help="study name: the resume key and the work folder tune-STUDY (default plantune)")
    s.add_argument("--storage", default=None,
                   help=f"Optuna database URL (default sqlite:///WORKDIR/{DB_NAME}; postgresql://user@host/db to "
                        "share a study between several tuners)")
    s.add_argument("--budget", type=parse_budget, action=_BudgetAction, dest="budget",
                   help="wall-clock limit of this run, every probe included: 2h, 90m, 1h30m, seconds "
                        "(a probe running at the end is stopped and probed again next run); and/or GPU-hours the "
                        "probes of this run may hold, e.g. 40gpuh (give --budget twice for both); the study ends "
                        "with its best so far")
    s.add_argument("--max-probes", "--n-trials", dest="max_probes", type=_pos_int,
                   help="probes run in the study, all runs and confirmation re-probes included (ok, oom, timeout, "
                        "crash; default: until every survivor is done)")
    s.add_argument("--top-k", type=_nonneg_int, default=None,
                   help="the planner's best K are probed first (default 1 with --sampler ei, whose refitted order "
                        "continues from the first measurement; 3 with the others)")
    s.add_argument("--sampler", choices=("ei", "tpe", "random", "grid", "analytic", "planner"), default="ei",
                   help="after the top-k: ei (expected improvement under the refitted model, default), tpe, random, "
                        "grid, analytic (refitted order), planner (the plan's order)")
    s.add_argument("--seed", type=int, default=None, help="random seed of the sampler (and of --replay-noise)")
    s.add_argument("--startup-trials", type=_pos_int, default=4, help="measurements before TPE models (default 4)")
    s.add_argument("--confirm-top", type=_nonneg_int, default=3,
                   help="re-probe the best K measured configurations (default 3; 0: off)")
    s.add_argument("--repeats", type=_nonneg_int, default=2,
                   help="re-probes of each of them (default 2); 'confirmed' when all agree within "
                        "the report's spread")
    s.add_argument("--heartbeat-s", type=_pos_int, default=60, help="trial heartbeat interval, seconds (default 60)")
    s.add_argument("--grace-s", type=_pos_int, default=120,
                   help="a RUNNING trial of another host without a heartbeat this long is failed and retried "
                        "(default 120)")
    s.add_argument("--max-retry", type=_nonneg_int, default=3,
                   help="how often a trial whose tuner died is retried (default 3)")
    b = p.add_argument_group("probes")
    b.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: torchrun on this machine (default); slurm: srun in an allocation; replay: "
                        "answer probes from a CSV of earlier measurements")
    b.add_argument("--results", help="--backend replay: CSV of earlier measurements")
    b.add_argument("--results-table", help="--backend replay: the table column's value to replay")
    b.add_argument("--replay-noise", type=_nonneg_float, default=0.0,
                   help="--backend replay: log-normal sigma on step times")
    b.add_argument("--replay-delay", type=_nonneg_float, default=0.0,
                   help="--backend replay: seconds each probe takes (tests of concurrency and interruption)")
    b.add_argument("--local-procs", type=_pos_int, default=None,
                   help="--backend local: processes this node can run (default --gpus-per-node); a candidate "
                        "needing more runs one DP replica (TP*CP*PP processes), projected to the full DP")
    b.add_argument("--reservation", help="SLURM reservation (--backend slurm; also written into launch.sbatch)")
    b.add_argument("--partition", help="SLURM partition (--backend slurm)")
    b.add_argument("--account", help="SLURM account (--backend slurm)")
    b.add_argument("--probe", choices=PROBES, default="auto",
                   help="auto (default): the program --framework emits for when it can run here (Megatron-LM's "
                        "pretrain_gpt.py on mock data from --megatron-path or an importable megatron, your --command, "
                        "torchtitan's trainer when torchtitan is importable and probes run on CUDA), else plantune's "
                        "stand-in, saying why; train: always plantune's stand-in (a torch GPT); megatron: your "
                        "--command with the arguments of --framework megatron-lm, else of the Megatron-DeepSpeed fork "
                        "--emit-flavor names; torchtitan: torchtitan's trainer on the --framework fsdp config (mock "
                        "data), whatever the device")
    b.add_argument("--command", help="Megatron probes: your training command with {args}, e.g. "
                                     "\"python pretrain_gpt.py {args} --data-path D\" (split into words, no shell)")
    b.add_argument("--megatron-path", metavar="DIR",
                   help="--probe auto with --framework megatron-lm: the Megatron-LM checkout holding pretrain_gpt.py; "
                        "probes run it with the emitted arguments on mock data (default: the one beside an importable "
                        "megatron package)")
    b.add_argument("--probe-layers", type=_pos_int, help="run a reduced model of N layers (step time scaled up)")
    b.add_argument("--probe-steps", type=_pos_int, default=5, help="timed steps per probe (default 5)")
    b.add_argument("--probe-warmup", type=_nonneg_int, default=2, help="untimed steps first (default 2)")
    b.add_argument("--no-warm", action="store_true",
                   help="--probe train: start each probe's own torchrun (--backend local) or srun step (--backend "
                        "slurm) (default: consecutive probes of one world size reuse warm workers, fresh ones after a "
                        "failure)")
    b.add_argument("--no-prune", action="store_true",
                   help="run every probe to its end (default: a probe whose timed steps are clearly behind the best "
                        "so far, by more than the step-time noise measured here, stops early and is recorded pruned)")
    b.add_argument("--probe-timeout", type=parse_duration, default=600.0,
                   help="wall-clock limit of one probe (default 600 s)")
    b.add_argument("--probe-device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where probes run (default auto: CUDA when present); cpu needs a plan with --gpu CPU")
    b.add_argument("--workdir", default=None,
                   help="the study's work folder: probe folders trial-NNNN and the default storage "
                        "(default ./tune-STUDY)")
    o = p.add_argument_group("output")
    o.add_argument("--emit", choices=EMIT_KINDS, help="write the best measured configuration like plan --emit")
    o.add_argument("--emit-flavor", "--emit_flavor", choices=("bigscience", "microsoft"), default="bigscience",
                   help="--emit megatron-deepspeed: which fork's arguments (default bigscience)")
    o.add_argument("--torchtitan-version", "--torchtitan_version", choices=TORCHTITAN_VERSIONS,
                   default=TORCHTITAN_VERSIONS[0], help="--emit fsdp: the torchtitan release to write for (default "
                   f"{TORCHTITAN_VERSIONS[0]}, a Python config module; {TORCHTITAN_VERSIONS[1]}: torchtitan.toml)")
    o.add_argument("--out", help="folder for --emit (default WORKDIR/run); an existing non-empty folder needs --force")
    o.add_argument("--force", action="store_true",
                   help="let --out replace files in an existing folder (a symbolic link is replaced, never followed)")
    o.add_argument("--format", choices=("table", "json"), default="table", help="result on stdout (default table)")
    o.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    o.add_argument("--debug", action="store_true", help="show tracebacks")
    _fill_help(p)
    return p


def build_report_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tune report", description="A study's ranked table again, plots, and how to open it "
                                                      "in optuna-dashboard.")
    p.add_argument("--study", "--study-name", dest="study", type=_study_name, required=True,
                   help="the study's name, as given to tune")
    p.add_argument("--storage", default=None, help=f"its database URL (default sqlite:///WORKDIR/{DB_NAME})")
    p.add_argument("--workdir", default=None, help="the study's work folder (default ./tune-STUDY)")
    p.add_argument("--plots", default=None, help="folder for the PNG plots (default WORKDIR/report)")
    p.add_argument("--no-plots", action="store_true", help="no plots")
    p.add_argument("--trials", action="store_true", help="also one row per trial (predicted before/after, measured)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def workdir_of(args: argparse.Namespace) -> Path:
    """The study's work folder: --workdir, else ./tune-STUDY."""
    return Path(args.workdir) if args.workdir else Path(f"tune-{args.study}")


def storage_of(args: argparse.Namespace, *, create: bool) -> str:
    """--storage, else sqlite:///WORKDIR/tune.db (the folder made when ``create``)."""
    if args.storage:
        return args.storage
    folder = workdir_of(args)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / DB_NAME}"


# -- run ----------------------------------------------------------------------------------------------

def _inputs(model, cluster, training, restriction: str | None) -> dict:
    from dataclasses import asdict

    t = asdict(training)
    t["rampup"] = training.rampup.as_list() if training.rampup else None
    return json.loads(json.dumps({"model": model.to_dict(), "cluster": cluster.to_dict(), "training": t,
                                  "restriction": restriction}))


def _backend(args: argparse.Namespace, cluster, training, stack: ExitStack, choice=None):
    """The ProbeBackend the flags ask for (``choice``: the program that measures, search.probe_choice), and the replay
    table when replaying."""
    from search.probe_choice import STAND_IN, TORCHTITAN

    program = choice.program if choice is not None else STAND_IN
    if args.backend == "replay":
        from search.replay import ReplayBackend, ReplayTable

        if not args.results:
            raise TuneError("--backend replay needs --results FILE.csv (a table of earlier measurements)")
        table = ReplayTable.read(args.results, args.results_table)
        _check_numbers(table)
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
                                   gres=None if args.probe_device == "cpu" else "gpu",
                                   warm=not args.no_warm)   # the built-in probe's; framework probes: a step each
        except ValueError as err:
            raise TuneError(str(err)) from None
        stack.callback(backend.close)
        if program == STAND_IN:
            return backend, None
    elif program == STAND_IN:
        backend = _local_backend(args.local_procs or cluster.gpus_per_node, warm=not args.no_warm)
        stack.callback(backend.close)
        return backend, None
    else:
        from probes.backend import LocalBackend

        backend = LocalBackend()
    local = None if args.backend == "slurm" else (args.local_procs or cluster.gpus_per_node)
    if program == TORCHTITAN:
        from probes.torchtitan import TorchtitanProbe

        return TorchtitanProbe(backend, version=choice.version, cluster=cluster, training=training,
                               max_local_procs=local), None
    try:
        from probes.megatron import MegatronProbe
    except ImportError as err:
        raise TuneError(f"Megatron probes are not available here ({err})") from None
    try:
        return MegatronProbe(choice.command or args.command, backend, flavor=choice.flavor, cluster=cluster,
                             optimizer=training.optimizer, flash_attention=training.flash_attention,
                             attention_kernel=training.attention_kernel,
                             max_local_procs=local, cwd=Path(choice.cwd) if choice.cwd else None), None
    except ValueError as err:
        raise TuneError(f"--command: {err}") from None


def _probe_choice(args: argparse.Namespace, model, training):
    """Which program measures this run's probes (search.probe_choice), or None for a replay (it probes nothing)."""
    from search.probe_choice import choose

    if args.backend == "replay":
        return None
    return choose(probe=args.probe, framework=training.framework, flavor=args.emit_flavor,
                  device=_resolved_device(args), command=args.command, megatron_path=args.megatron_path,
                  vocab=model.vocab)


def _resolved_device(args: argparse.Namespace) -> str:
    """cuda or cpu: --probe-device, or for auto whether this machine has CUDA (a SLURM allocation: cuda)."""
    if args.probe_device != "auto":
        return args.probe_device
    if args.backend == "slurm":
        return "cuda"
    return _this_machine_device() or "cpu"


def _this_machine_device() -> str | None:
    """cuda when torch sees a CUDA device here, else cpu; None when torch is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _megatron_probe_flavor(args: argparse.Namespace, training) -> str:
    """--probe megatron runs Megatron-LM's arguments when the layouts are planned for it (--framework megatron-lm),
    else the Megatron-DeepSpeed fork --emit-flavor names."""
    return "megatron-lm" if training.framework == "megatron-lm" else args.emit_flavor


def _check_numbers(table) -> None:
    """Every replayed number finite and positive, before any trial is stored: a bad cell would otherwise be
    recorded as a final crash of that configuration, and fixing the CSV would not bring it back."""
    import math

    for row in table.rows:
        where = f"--results {table.path}: row tp={row.tp},pp={row.pp},dp={row.dp},mbs={row.mbs}"
        if row.status == "ok" and not (row.step_time_s is not None and math.isfinite(row.step_time_s)
                                       and row.step_time_s > 0):
            raise TuneError(f"{where} has status ok but seconds_per_iteration is not a finite number > 0; fix the "
                            "cell, or give the row another status (oom, timeout, crash)")
        if row.memory_gb is not None and not (math.isfinite(row.memory_gb) and row.memory_gb >= 0):
            raise TuneError(f"{where}: memory_gb {row.memory_gb} is not a finite number >= 0; fix the cell or leave "
                            "it empty")


def _local_backend(capacity: int, *, warm: bool = True):
    """LocalBackend with as many processes as the candidate needs (TP*CP*PP*DP) when this node has them, one DP
    replica (TP*CP*PP processes, reported as reduced and projected by the probe) when only that fits; ``warm``:
    consecutive probes of one world size in the same workers (probes.warm; ``close`` stops them)."""
    from probes.backend import LocalBackend, ProbeBackend
    from probes.extent import probe_world
    from probes.result import ProbeResult
    from probes.warm import WarmWorkers

    workers = WarmWorkers() if warm else None

    class OneNode(ProbeBackend):
        name = "local"
        reports_steps = True

        def close(self) -> None:
            if workers is not None:
                workers.close()

        def run(self, spec, *, workdir, timeout_s, on_step=None):
            c = spec.candidate
            world, model_parallel = probe_world(spec), c["tp"] * c["pp"] * spec.cp
            if world <= capacity:
                return LocalBackend(nproc=world, warm=workers).run(spec, workdir=workdir, timeout_s=timeout_s,
                                                                   on_step=on_step)
            if model_parallel <= capacity:
                return LocalBackend(nproc=model_parallel, warm=workers).run(spec, workdir=workdir,
                                                                            timeout_s=timeout_s, on_step=on_step)
            return ProbeResult(status="invalid", wall_s=0.0, reason=(
                f"needs TP*CP*PP = {model_parallel} processes, this node runs {capacity} (--local-procs); "
                "probe it with --backend slurm"))

    return OneNode()


def _command_line(argv: list[str]) -> str:
    return shlex.join(["tune", *argv])


def _targets(args: argparse.Namespace, training, choice=None) -> tuple:
    """What every configuration of the space must run on (planner.rules): the planned framework, the
    --emit target, the torch-native probe when it probes (its TP/PP, CP and MoE/EP rules: never a layout it
    refuses) and, for --probe megatron, the fork it runs, so that the study only measures what it can
    emit and launch. A replay probes nothing: its table says what ran."""
    from planner.rules import PROBE, Target
    from search.probe_choice import MEGATRON_DEEPSPEED, MEGATRON_LM, STAND_IN, TORCHTITAN

    targets = [Target(training.framework, training.flavor)]
    program = choice.program if choice is not None else (
        None if getattr(args, "backend", "local") == "replay" else
        {"train": STAND_IN, "megatron": MEGATRON_LM if training.framework == MEGATRON_LM else MEGATRON_DEEPSPEED}.get(
            args.probe, STAND_IN))
    if program == STAND_IN:
        targets.append(Target(PROBE))
    if program in (MEGATRON_LM, MEGATRON_DEEPSPEED):
        flavor = _megatron_probe_flavor(args, training)
        targets.append(Target("megatron-lm") if flavor == "megatron-lm" else Target("megatron-deepspeed", flavor))
    if program == TORCHTITAN:
        targets.append(Target("fsdp"))
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


def out_dir_of(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out else workdir_of(args) / "run"


def _emit_best(args: argparse.Namespace, model, cluster, training, best_summary, calibration,
               storage: str) -> list[Path]:
    from planner import Candidate, estimate
    from planner.emit import Prediction, RunSetup
    from planner.emit.write import render
    from search.calibration import params_dict

    cand = Candidate(**best_summary.candidate)
    est = estimate(model, cluster, training, cand, params=calibration)
    t = est.throughput
    prediction = None
    if t is not None and est.memory and est.time:
        prediction = Prediction(memory_gb_per_gpu=round(est.memory.total_gb, 3),
                                step_time_s=round(est.time.step_time_s, 3),
                                model_tflops_per_gpu=round(t.model_tflops_per_gpu, 3),
                                hardware_tflops_per_gpu=round(t.hardware_tflops_per_gpu, 3), mfu=round(t.mfu, 4))
    files = render(RunSetup(model=model, cluster=cluster, training=training, candidate=cand, prediction=prediction),
                   args.emit, flavor=args.emit_flavor, reservation=args.reservation,
                   torchtitan_version=args.torchtitan_version)
    files["tune_measured.json"] = json.dumps({"study": args.study, "storage": storage, **best_summary.to_dict(),
                                              "calibration": params_dict(calibration)}, indent=1) + "\n"
    return write_files(out_dir_of(args), files, force=args.force)


def _probe_device_problem(args: argparse.Namespace, cluster) -> str | None:
    """Probing on this machine's CPU under a GPU plan (or on a GPU under a CPU plan) measures another machine:
    the refit would scale the GPU's model by a CPU's speed (and hit its clamp). The reason, or None."""
    if args.backend == "replay":
        return None
    gpu_plan = cluster.gpu.id.upper() != "CPU"
    device = args.probe_device
    if device == "auto" and args.backend == "local" and gpu_plan:
        device = _this_machine_device()
        if device is None:
            return None                     # the probe itself says torch is missing
    if device == "cpu" and gpu_plan:
        return (f"the plan is for {cluster.gpu.id} GPUs but the probes would run on this machine's CPU"
                f"{' (no CUDA device found)' if args.probe_device == 'auto' else ''}: their times say nothing about "
                f"{cluster.gpu.id}; tune on the GPU machine, or plan for the CPU with --gpu CPU --gpus-per-node "
                "<cores to use>")
    if device == "cuda" and not gpu_plan:
        return "the plan is for --gpu CPU but --probe-device cuda runs on a GPU; plan with the GPU's --gpu id"
    return None


def _calibration_problem(args: argparse.Namespace, cluster) -> str | None:
    """A calibration file measured on a CPU applied to a GPU plan (or the other way): the reason, or None."""
    if not getattr(args, "calibration", None):
        return None
    import yaml

    try:
        doc = yaml.safe_load(Path(args.calibration).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None                          # the planner's reader has already refused it, or will
    device = str(doc.get("device", "")) if isinstance(doc, dict) else ""
    gpu_plan = cluster.gpu.id.upper() != "CPU"
    if device.lower().startswith("cpu") and gpu_plan:
        return (f"--calibration {args.calibration} was measured on a CPU ({device}) and the plan is for "
                f"{cluster.gpu.id}; calibrate on the GPU machine (tune calibrate --gpu {cluster.gpu.id} ...) "
                "or plan with --gpu CPU")
    if device and not device.lower().startswith("cpu") and not gpu_plan:
        return f"--calibration {args.calibration} was measured on {device}, and the plan is for --gpu CPU"
    return None


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import optuna
    from planner import plan

    from search.calibration import class_scales, params_dict, refit
    from search.objective import Ledger, Objective, ProbeSettings
    from search.report import (best, best_line, dashboard_command, format_table, measured_by_line, report_dict,
                               summarize)
    from search.space import SearchSpace
    from search.progress import Progress, fold
    from search.settings import TuneSettings
    from search.storage import open_study, storage_url
    from search.study import pick_line, run as run_study

    from planner.rules import PROBE

    model, cluster, training = setup_from_args(args)
    choice = _probe_choice(args, model, training)
    targets = _targets(args, training, choice)
    if args.storage:
        storage_url(args.storage)
    if args.emit:
        check_out(out_dir_of(args), force=args.force)
    workdir = workdir_of(args)
    with ExitStack() as stack:
        backend, table = _backend(args, cluster, training, stack, choice)
        for problem in (_calibration_problem(args, cluster), _probe_device_problem(args, cluster)):
            if problem:
                raise TuneError(problem)
        if any(t.framework == PROBE for t in targets):
            from planner.rules import probe_model_violations

            for v in probe_model_violations(model):
                raise TuneError(v.detail)
        full = plan(model, cluster, training, targets=targets)
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
        storage = storage_of(args, create=True)
        settings = TuneSettings(study_name=args.study, storage_url=storage, budget_s=args.budget,
                                budget_gpuh=getattr(args, "budget_gpuh", None),
                                max_probes=args.max_probes,
                                top_k=args.top_k,
                                sampler=args.sampler, seed=args.seed,
                                startup_trials=args.startup_trials, confirm_top=args.confirm_top,
                                repeats=args.repeats, heartbeat_s=args.heartbeat_s, grace_s=args.grace_s,
                                max_retry=args.max_retry)
        probe = ProbeSettings(steps=args.probe_steps, warmup_steps=args.probe_warmup, layers=args.probe_layers,
                              timeout_s=args.probe_timeout, device=args.probe_device, prune=not args.no_prune,
                              workdir=None if args.backend == "replay" else workdir,
                              resources=_resources(args, cluster, choice.program if choice else ""),
                              program=choice.program if choice else "", program_reason=choice.reason if choice else "")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        study = open_study(settings, space, _inputs(model, cluster, training, restriction))
        if choice is not None:
            study.set_user_attr("probe_program", {"program": choice.program, "reason": choice.reason})
        progress = Progress(total=len(space), budget_s=args.budget, enabled=not args.no_progress,
                            max_probes=args.max_probes, planned=len(space) + args.confirm_top * args.repeats,
                            probe_timeout_s=args.probe_timeout, program=choice.program if choice else "")
        _say(f"tune: study {args.study!r} in {storage}: {len(space)} configurations "
              f"({full.total} enumerated, {len(full.candidates)} survive the planner"
              + (f", {restriction}" if restriction else "") + f"); backend {backend.name}"
              + (f"; probe folders in {workdir}" if probe.workdir else ""))
        if choice is not None:
            _say(f"tune: probes measured by {choice.line()}")
        objective = Objective(space=space, backend=backend, settings=probe, on_probe=progress.probing,
                              on_probe_end=progress.probe_ended)
        run_started = time.time()
        try:
            with deferred_interrupts():
                records = run_study(study, objective, space, settings, progress)
        except BackendError as err:
            progress.close()
            print(f"tune: error: {err}; the study stops (finished trials are kept in {storage}); fix it and "
                  f"resume with: {_command_line(argv)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as stop:
            progress.close()
            what = "stopped by SIGTERM" if isinstance(stop, Terminated) else "interrupted"
            print(f"tune: {what}; finished trials are stored in {storage} (study {args.study!r}) and the running "
                  f"one is recorded FAIL 'interrupted' (probed again first). Resume with:\n  {_command_line(argv)}",
                  file=sys.stderr)
            return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED

    summaries = summarize(records)
    winner = best(summaries)
    ledger = Ledger(records)
    calibration = refit(model, cluster, training, ledger.measurements(), class_scales=class_scales(ledger.class_pairs()))
    if args.format == "json":
        d = report_dict(records, study=args.study, storage=storage)
        d["calibration"] = params_dict(calibration)
        d["ruled_out_rows"] = [{"config": c, "why": w} for c, w in space.restricted_out]
        print(json.dumps(d, indent=1))
    else:
        width = stdout_width()
        print(format_table(summaries, title=f"tune: study {args.study!r}, {probes_of(records)} trials, "
                                            f"calibration compute x{calibration.compute_scale:.3g}, "
                                            f"comm x{calibration.comm_scale:.3g}" + "".join(
                                                f", {c} x{v:.3g}" for c, v in calibration.class_scales), width=width))
        measured_by = measured_by_line(records)
        for line in [f"  not probed: {config}: {why}" for config, why in space.restricted_out] + (
                [f"  {measured_by}"] if measured_by else []) + [
                calibration_note(calibration.compute_scale, calibration.comm_scale)]:
            print(line if width is None else fold(line, width))
    _say_invalid(summaries, args)
    _say_clamped(calibration)
    if winner is None:
        _say("tune: no configuration measured successfully; see the reasons above")
        _say_steps_share(records, run_started, cluster.world_size)
        return 1
    _say(f"tune: {best_line(summaries)}")
    recorded = pick_line(study)
    if recorded:
        _say(f"tune: {recorded}")
    if args.emit:
        written = _emit_best(args, model, cluster, training, winner, calibration, storage)
        _say(f"tune: wrote {len(written)} files to {out_dir_of(args)}: {', '.join(p.name for p in written)}")
    _say(f"tune: open the study with: {dashboard_command(storage)}")
    _say_steps_share(records, run_started, cluster.world_size)          # the final line
    return 0


def _say(text: str) -> None:
    """An informational line on stderr: as is in a log, folded to the width on a terminal (error lines stay one line
    whatever the width: they are printed as they are)."""
    if sys.stderr.isatty():
        from search.progress import fold, terminal_width

        text = fold(text, terminal_width(sys.stderr) - 1)
    print(text, file=sys.stderr)


def _say_steps_share(records, run_started: float, gpus: int) -> None:
    """The share of this run's reservation (its GPUs x its wall time) that measured steps (search.accounting)."""
    from search.accounting import gpu_seconds, steps_line

    elapsed = max(time.time() - run_started, 1e-9)
    this_run = [r for r in records if r.started is not None and r.started >= run_started - 1.0]
    if not sum(gpu_seconds(this_run).values()):
        return                               # nothing ran here (a replay, or every answer from storage)
    _say(f"tune: {steps_line(this_run, reservation_gpu_s=elapsed * gpus, gpus=gpus, elapsed_s=elapsed)}")


def probes_of(records) -> int:
    """The trials of a study but the ones recording tune's pick (search.study.record_pick)."""
    from search._base import PICK_PHASE

    return sum(1 for r in records if r.phase != PICK_PHASE)


def stdout_width() -> int | None:
    """The usable columns of the terminal stdout is (its width less one), or None when stdout is not a terminal (a
    file or a pipe gets the wide table, one row per line)."""
    if not sys.stdout.isatty():
        return None
    from search.progress import terminal_width

    return terminal_width(sys.stdout) - 1


def calibration_note(compute: float, comm: float) -> str:
    """What the title's "calibration compute xA, comm xB" means, said under the table."""
    return (f"calibration compute x{compute:.3g}, comm x{comm:.3g}: the planner's compute terms (GEMMs, attention, "
            f"element-wise) times {compute:.3g} and its communication terms (TP/PP/DP/CP/EP collectives) times "
            f"{comm:.3g} best fit these measured step times (search.calibration.refit; x1: as predicted, below 1: "
            "faster than predicted); pred after uses them, and tune --emit writes them")


def _resources(args: argparse.Namespace, cluster, program: str = "") -> str:
    """What a probe's `invalid` verdict depends on: where and on how many processes probes run, and the program
    when it is not the stand-in (search.probe_choice)."""
    which = f":{program}" if program and program != "stand-in" else ""
    if args.backend == "local":
        return f"local:{args.local_procs or cluster.gpus_per_node}:{args.probe_device}{which}"
    if args.backend == "slurm":
        return f"slurm:{cluster.nodes}x{cluster.gpus_per_node}:{args.probe_device}{which}"
    return args.backend


def _say_invalid(summaries, args: argparse.Namespace) -> None:
    """Configurations the probes refused here: what to change (they are re-checked when the resources change)."""
    invalid = [s for s in summaries if s.outcome == "invalid"]
    if invalid:
        _say(f"tune: {len(invalid)} configuration(s) could not run with these resources (e.g. {invalid[0].reason}); "
             "rerun the same command with more --local-procs or --backend slurm and they are probed again")


def _say_clamped(calibration) -> None:
    from search.calibration import SCALE_RANGE

    for name in ("compute_scale", "comm_scale"):
        value = getattr(calibration, name)
        if value <= SCALE_RANGE[0] * 1.0001 or value >= SCALE_RANGE[1] * 0.9999:
            _say(f"tune: warning: the refit {name} hit its limit ({value:g}, range {SCALE_RANGE[0]:g}..."
                 f"{SCALE_RANGE[1]:g}): the probes measure a machine unlike the plan's --gpu; the predictions are "
                 "not calibrated")


# -- report -------------------------------------------------------------------------------------------

def report(args: argparse.Namespace) -> int:
    import optuna

    from search.objective import TrialRecord
    from search.accounting import PLOT as PHASES_PLOT, format_phases, gpu_seconds, plot_phases
    from search.report import (best_line, dashboard_command, format_table, format_trials, measured_by_line,
                               report_dict, summarize, write_plots)
    from search.settings import TuneSettings
    from search.storage import open_storage
    from search.study import pick_line

    plots = Path(args.plots) if args.plots else workdir_of(args) / "report"
    if not args.no_plots and (plots.is_symlink() or (plots.exists() and not plots.is_dir())):
        raise TuneError(f"--plots {plots} is {'a link' if plots.is_symlink() else 'a file'}; give a folder")
    storage = storage_of(args, create=False)
    if not args.storage and not (workdir_of(args) / DB_NAME).is_file():
        raise TuneError(f"no study {args.study!r} here: {workdir_of(args) / DB_NAME} does not exist; give --workdir "
                        "or --storage as tune was run with")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna_storage = open_storage(TuneSettings(study_name=args.study, storage_url=storage))
    names = optuna.get_all_study_names(optuna_storage)
    if args.study not in names:
        raise TuneError(f"no study {args.study!r} in {storage}; studies there: {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=args.study, storage=optuna_storage)
    records = [TrialRecord.from_trial(t) for t in study.get_trials(deepcopy=False)]
    if args.format == "json":
        d = report_dict(records, study=args.study, storage=storage)
        d["gpu_hours_by_phase"] = {k: v / 3600 for k, v in gpu_seconds(records).items()}
        print(json.dumps(d, indent=1))
    else:
        summaries = summarize(records)
        print(format_table(summaries, title=f"tune: study {args.study!r}, {probes_of(records)} trials",
                           width=stdout_width()))
        measured_by = measured_by_line(records)
        if measured_by:
            print(f"tune: {measured_by}")
        print(f"tune: {best_line(summaries) or 'no configuration measured successfully'}")
        recorded = pick_line(study)
        if recorded:
            print(f"tune: {recorded}")
        if args.trials:
            print()
            print(format_trials(records))
        print()
        print(format_phases(records))
    if not args.no_plots:
        try:
            paths = write_plots(records, plots, study=args.study)
            paths.append(plots / PHASES_PLOT)
            plot_phases(records, paths[-1], study=args.study)
        except OSError as err:
            raise TuneError(f"--plots {plots}: cannot write there ({err.strerror or err}); give a folder you can "
                            "write, or --no-plots") from None
        _say(f"tune: wrote plots {', '.join(str(p) for p in paths)}")
    _say(f"tune: open the study with: {dashboard_command(storage)}")
    return 0


# -- entry ----------------------------------------------------------------------------------------------

def _missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one line for a missing optional dependency, or None for any other missing module."""
    name = (err.name or "").split(".")[0]
    if name in ("optuna", "matplotlib", "sqlalchemy", "psycopg2", "psycopg"):
        return f"tune needs {name}, which is not installed: {INSTALL_TUNE}"
    if name in ("torch", "psutil"):
        return f"probes on this machine need {name}, which is not installed: {INSTALL_PROBES}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        from probes.calibrate import main as calibrate_main

        try:
            return int(calibrate_main(argv[1:], prog="tune calibrate") or 0)
        except SystemExit as exit_:          # its argparse: --help (0) or a usage error (2)
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
        except ModuleNotFoundError as err:
            line = _missing_extra(err)
            if line is None:
                raise
            print(f"tune calibrate: error: {line}", file=sys.stderr)
            return 2
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
    except ModuleNotFoundError as err:
        line = _missing_extra(err)
        if line is None or args.debug:
            raise
        print(f"tune: error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
