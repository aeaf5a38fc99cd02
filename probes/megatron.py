"""External probe: the user's Megatron-DeepSpeed or Megatron-LM command, run for a candidate, timed from its log.

    tune ... --probe megatron --command "python pretrain_gpt.py {args} --data-path /data/oscar_text_document"
    tune ... --framework megatron-lm --probe megatron \
        --command "python Megatron-LM/pretrain_gpt.py {args} --mock-data --tokenizer-type NullTokenizer ..."

    >>> probe = MegatronProbe("python pretrain_gpt.py {args} --data-path D", LocalBackend(nproc=8))
    >>> result = probe.run(spec, workdir=Path("runs/probe-0001"), timeout_s=1200)

For each candidate the arguments (and, for a Megatron-DeepSpeed fork, ds_config.json) are rendered by
`planner.emit` exactly as ``plan --emit`` writes them (flavor ``megatron-lm``: ``plan --emit megatron-lm``'s
arguments, no ds_config; ``{ds_config}`` is then refused), in the probe variant of MEGATRON_DEEPSPEED.md:
``--train-iters N --log-interval 1``, an eval interval above N, no rampup, no ``--train-samples``, no ``--save``.
The template is split with `shlex` into an argument list; ``{args}`` must stand alone and expands
to every plantune argument, the other placeholders (``{ds_config}``, ``{nproc}``, ``{nnodes}``,
``{world}``, ``{train_iters}``, ``{workdir}``) are substituted inside single arguments. Nothing
goes through a shell. The command must start with a Python interpreter: the script runs under
``torch.distributed.run`` (``--tee 3``) on this machine or on a SLURM slice (probes.slurm).

The log is parsed in the three formats MEGATRON_DEEPSPEED.md lists (bigscience: seconds;
microsoft: ``(ms)`` and ``tgs``; Megatron-LM: ``(ms)`` and ``throughput per GPU``), with or
without torchrun's ``[defaultN]:`` prefix. The first ``warmup_iters`` logged iterations are skipped;
TFLOPs are model FLOPs from `planner.flops` (the forks' own figure counts recompute and is kept
only in ``extra["reported_tflops"]``). Peak memory is the ``max allocated`` of the ``[Rank R]
(after N iterations) memory (MB)`` report; "CUDA out of memory" / ``OutOfMemoryError`` -> oom.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from planner.emit.megatron_deepspeed import DS_CONFIG_NAME, args_txt, ds_config_text, megatron_args
from planner.emit.megatron_lm import megatron_lm_args
from planner.emit.setup import RunSetup, setup_problems
from planner.flops import hardware_flops_per_iteration, model_flops_per_iteration, tflops_per_gpu
from planner.hardware import ClusterSpec, make_cluster
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec
from probes import lifeline
from probes.backend import ProbeBackend
from probes.launch import probe_env, run_with_timeout
from probes.layout import model_spec
from probes.outcome import OOM_MARKERS
from probes.result import ProbeResult, ProbeSpec
from probes.slurm import StepOutcome, slice_shape

FORMATS = ("bigscience", "microsoft", "megatron-lm")
MEGATRON_LM = "megatron-lm"
"""the flavor that runs NVIDIA Megatron-LM's pretrain_gpt.py (planner.emit.megatron_lm), not a DeepSpeed fork"""
PLACEHOLDERS = ("args", "ds_config", "nproc", "nnodes", "world", "train_iters", "workdir")
MB_BYTES = 1024 * 1024
"""Megatron's report_memory divides bytes by 1024*1024 and calls it MB"""
DROPPED_FOR_PROBES = ("--rampup-batch-size", "--train-samples")
"""emitted arguments a probe run must not carry (rampup is refused with --train-iters)"""


# -- log lines ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class IterationLine:
    """One ``iteration N/ M | ...`` training-log line."""

    iteration: int
    total: int
    step_time_s: float
    format: str
    """bigscience (seconds) | microsoft (ms + tgs) | megatron-lm (ms)"""
    global_batch: int | None = None
    samples_per_s: float | None = None
    tokens_per_gpu_per_s: float | None = None
    reported_tflops: float | None = None
    """the fork's own TFLOPs figure (recompute-inflated in BS/MS): recorded, never ranked on"""
    lm_loss: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLine:
    """``[Rank R] (after N iterations) memory (MB) | allocated: ... | max reserved: ...``."""

    rank: int
    after_iterations: int
    allocated_mb: float
    max_allocated_mb: float
    reserved_mb: float
    max_reserved_mb: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronLog:
    iterations: list[IterationLine] = field(default_factory=list)
    """first occurrence of each iteration number, in order"""
    memory: list[MemoryLine] = field(default_factory=list)
    oom_line: str | None = None
    error_line: str | None = None
    """the first ``...Error: ...`` line of a worker, for a crash's reason"""


_LAUNCHER_PREFIX = re.compile(r"^\s*(?:\[default\d+\]:|\d+:)\s?")
"""torchrun --tee's ``[default7]:`` and srun --label's ``7:``"""
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)\s*\|(.*)")
_ERROR = re.compile(r"^\s*(?:\w+\.)*\w*(?:Error|Exception)\b.*:")


def _fields(text: str) -> dict[str, str]:
    out = {}
    for part in text.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value.split()[0].split("/")[0])
    except (ValueError, IndexError):
        return None


def strip_prefix(line: str) -> str:
    return _LAUNCHER_PREFIX.sub("", line, count=1)


def parse_iteration_line(line: str) -> IterationLine | None:
    """The iteration line's fields, or None when ``line`` is not one (any of the three formats)."""
    line = strip_prefix(line)
    m = _ITERATION.search(line)
    if m is None:
        return None
    f = _fields(line[m.end():])
    if "elapsed time per iteration (s)" in f:
        step_s, fmt = _number(f["elapsed time per iteration (s)"]), "bigscience"
    elif "elapsed time per iteration (ms)" in f:
        ms = _number(f["elapsed time per iteration (ms)"])
        step_s = None if ms is None else ms / 1000.0
        fmt = "microsoft" if "tokens per gpu per second (tgs)" in f or "TFLOPs" in f else "megatron-lm"
    else:
        return None
    if step_s is None:
        return None
    gbs = _number(f.get("global batch size"))
    reported = _number(f.get("TFLOPs", f.get("throughput per GPU (TFLOP/s/GPU)")))
    return IterationLine(iteration=int(m.group(1)), total=int(m.group(2)), step_time_s=step_s, format=fmt,
                         global_batch=None if gbs is None else int(gbs),
                         samples_per_s=_number(f.get("samples per second")),
                         tokens_per_gpu_per_s=_number(f.get("tokens per gpu per second (tgs)")),
                         reported_tflops=reported, lm_loss=_number(f.get("lm loss")))


def parse_memory_line(line: str) -> MemoryLine | None:
    m = _MEMORY.search(strip_prefix(line))
    if m is None:
        return None
    f = _fields(m.group(3))
    values = [_number(f.get(k)) for k in ("allocated", "max allocated", "reserved", "max reserved")]
    if any(v is None for v in values):
        return None
    a, ma, r, mr = values
    return MemoryLine(rank=int(m.group(1)), after_iterations=int(m.group(2)), allocated_mb=a, max_allocated_mb=ma,
                      reserved_mb=r, max_reserved_mb=mr)


def parse_log(text: str) -> MegatronLog:
    """Every iteration and memory line of a run's output (all ranks' streams together)."""
    iterations: dict[int, IterationLine] = {}
    memory: dict[int, MemoryLine] = {}
    oom = error = None
    for raw in text.splitlines():
        it = parse_iteration_line(raw)
        if it is not None:
            iterations.setdefault(it.iteration, it)
            continue
        mem = parse_memory_line(raw)
        if mem is not None:
            memory.setdefault(mem.rank, mem)
            continue
        line = strip_prefix(raw).strip()
        if oom is None and any(marker in line for marker in OOM_MARKERS):
            oom = line[:500]
        if error is None and _ERROR.match(line) and "torch.distributed.elastic" not in line:
            error = line[:500]  # the first worker error; torchrun's ChildFailedError only follows it
    return MegatronLog(iterations=[iterations[k] for k in sorted(iterations)],
                       memory=[memory[k] for k in sorted(memory)], oom_line=oom, error_line=error)


# -- the command ------------------------------------------------------------------------------------

def split_template(template: str | Sequence[str]) -> list[str]:
    """``shlex.split`` of the user's command (an argument list is taken as it is); ValueError unless ``{args}``
    stands alone in it."""
    if isinstance(template, str):
        try:
            tokens = shlex.split(template)
        except ValueError as err:
            raise ValueError(f"--command: {err} in {template!r}") from None
    else:
        tokens = [str(t) for t in template]
    if "{args}" not in tokens:
        raise ValueError("--command must contain {args} as a separate word, where plantune's Megatron arguments "
                         "go, e.g. \"python pretrain_gpt.py {args} --data-path ...\"")
    return tokens


_PLACEHOLDER = re.compile(r"\{(\w*)\}")


def render_command(tokens: Sequence[str], values: Mapping[str, str | Sequence[str]]) -> list[str]:
    """Substitute placeholders per argument: a list value only as a whole word (``{args}``)."""
    out: list[str] = []
    for tok in tokens:
        whole = _PLACEHOLDER.fullmatch(tok)
        if whole and not isinstance(values.get(whole.group(1)), (str, type(None))):
            out.extend(str(v) for v in values[whole.group(1)])
            continue

        def one(m: re.Match) -> str:
            name = m.group(1)
            value = values.get(name)
            if value is None:
                raise ValueError(f"--command: unknown placeholder {{{name}}}; known: "
                                 f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
            if not isinstance(value, str):
                raise ValueError(f"--command: {{{name}}} expands to several arguments and must stand alone")
            return value
        out.append(_PLACEHOLDER.sub(one, tok))
    return out


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")


def worker_argv(argv: Sequence[str]) -> list[str]:
    """``python [-u] script.py ARGS`` -> ``script.py ARGS`` (or ``-m module ARGS``) for torch.distributed.run."""
    if not argv or not _PYTHON.match(Path(argv[0]).name):
        raise ValueError(f"--command must start with a Python interpreter (python pretrain_gpt.py ...), got "
                         f"{argv[0] if argv else 'nothing'!r}: plantune starts it under torch.distributed.run")
    rest = list(argv[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest.pop(0)  # interpreter flags (-u, -O): torchrun runs workers with its own interpreter
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ValueError("--command names no script after the interpreter")
    return rest


def probe_args(setup: RunSetup, flavor: str, *, train_iters: int,
               ds_config_path: Path | None = None) -> list[tuple[str, ...]]:
    """The emitter's arguments, probe variant: fixed iterations, log every one, no eval, no rampup."""
    emitted = megatron_lm_args(setup) if flavor == MEGATRON_LM else megatron_args(setup, flavor)
    args = [a for a in emitted if a[0] not in DROPPED_FOR_PROBES]
    args = [("--deepspeed_config", str(ds_config_path)) if a[0] == "--deepspeed_config" else a for a in args]
    return args + [("--train-iters", str(train_iters)), ("--log-interval", "1"),
                   ("--eval-interval", str(train_iters + 1)), ("--eval-iters", "1")]


# -- running it -------------------------------------------------------------------------------------

def run_local_command(worker: Sequence[str], *, procs: int, workdir: Path, timeout_s: float, cwd: Path,
                      env: Mapping[str, str] | None = None) -> StepOutcome:
    """``python -u -m torch.distributed.run --standalone --nproc_per_node N --tee 3 WORKER`` on this machine,
    each worker behind a `probes.lifeline` (it dies with torchrun, torchrun with this process)."""
    argv = [sys.executable, "-u", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs),
            "--nnodes", "1", "--max_restarts", "0", "--tee", "3", *lifeline.worker_module_args(list(worker))]
    overrides = probe_env(env)
    (workdir / "command.json").write_text(json.dumps({"argv": argv, "cwd": str(cwd), "env": overrides,
                                                      "timeout_s": timeout_s}, indent=1) + "\n")
    started = time.monotonic()
    with open(workdir / "torchrun.stdout", "wb") as out, open(workdir / "torchrun.stderr", "wb") as err:
        returncode, timed_out, tracker = run_with_timeout(argv, env={**os.environ, **overrides}, timeout_s=timeout_s,
                                                          workdir=workdir, stdout=out, stderr=err, cwd=cwd)
    return StepOutcome(returncode=returncode, timed_out=timed_out,
                       stdout=(workdir / "torchrun.stdout").read_text(errors="replace"),
                       stderr=(workdir / "torchrun.stderr").read_text(errors="replace"),
                       wall_s=time.monotonic() - started, hosts=("localhost",), world=procs, job_id="",
                       step_name="", pids=tuple(sorted(tracker.seen)))


def summarize(log: MegatronLog, *, model: ModelSpec, candidate: Candidate, global_batch: int, world: int,
              warmup_iters: int, max_cv: float = 0.15) -> dict:
    """ProbeResult fields from the parsed log (empty when no iteration after warm-up was logged)."""
    steady = log.iterations[warmup_iters:]  # the first logged ones are warm-up (a resumed run starts past 1)
    if not steady:
        return {}
    times = [it.step_time_s for it in steady]
    median_s = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
    gbs = steady[-1].global_batch or global_batch
    samples_per_s = gbs / median_s
    reported = [it.reported_tflops for it in steady if it.reported_tflops is not None]
    out = {
        "step_times_s": times, "step_time_median_s": median_s, "step_time_cv": cv, "stable": cv <= max_cv,
        "samples_per_s": samples_per_s, "tokens_per_s": samples_per_s * model.seq_len,
        "model_tflops_per_device": tflops_per_gpu(model_flops_per_iteration(model, gbs), median_s, world),
        "hardware_tflops_per_device": tflops_per_gpu(
            hardware_flops_per_iteration(model, gbs, candidate.recompute), median_s, world),
        "losses": [it.lm_loss for it in steady if it.lm_loss is not None],
        "extra": {"log_format": steady[-1].format, "iterations_logged": len(log.iterations),
                  "warmup_iterations_skipped": len(log.iterations) - len(steady), "global_batch": gbs,
                  "reported_tflops": statistics.median(reported) if reported else None},
    }
    if log.memory:
        out["peak_memory_bytes_per_rank"] = [m.max_allocated_mb * MB_BYTES for m in log.memory]
        out["memory_kind"] = "cuda_max_allocated"
        out["extra"]["memory_report"] = [{"rank": m.rank, "max_allocated_mb": m.max_allocated_mb,
                                          "max_reserved_mb": m.max_reserved_mb} for m in log.memory]
    return out


def log_phases(log: MegatronLog, *, warmup_iters: int, wall_s: float) -> dict[str, float]:
    """Seconds of a framework probe by phase, as far as its log tells: the warm-up and the timed iterations (the
    framework's own step times) and the rest of the wall time as ``other`` (launch, imports, process groups, model
    build and exit, which the log does not separate; search.accounting's column for unsplit time)."""
    warmup = sum(it.step_time_s for it in log.iterations[:warmup_iters])
    steps = sum(it.step_time_s for it in log.iterations[warmup_iters:])
    out = {"warmup": warmup, "steps": steps, "other": max(wall_s - warmup - steps, 0.0)}
    return {k: v for k, v in out.items() if v > 0}


def project_replica(model: ModelSpec, full: Candidate, step_s: float) -> dict:
    """The full candidate from a run of fewer DP replicas with the same MBS and GAS: each replica does the
    same work per step, so the step time carries over under perfect data-parallel scaling (the torch probe's
    projection, probes/train.py, makes the same assumption; the extra gradient all-reduce time is not added)."""
    gbs = full.mbs * full.dp * full.gas
    return {
        "step_time_s": step_s,
        "samples_per_s": gbs / step_s,
        "tokens_per_s": gbs * model.seq_len / step_s,
        "model_tflops_per_device": tflops_per_gpu(model_flops_per_iteration(model, gbs), step_s, full.world),
        "hardware_tflops_per_device": tflops_per_gpu(hardware_flops_per_iteration(model, gbs, full.recompute),
                                                     step_s, full.world),
        "world_size": full.world,
        "global_batch": gbs,
        "note": f"{full.dp} DP replicas from a run of fewer (same MBS and GAS) assume perfect data-parallel "
                "scaling (no extra gradient all-reduce time)",
    }


class MegatronProbe(ProbeBackend):
    """Runs the user's Megatron-DeepSpeed (``flavor`` bigscience | microsoft) or Megatron-LM (``flavor``
    megatron-lm) command for a candidate through a backend (local or SLURM)."""

    name = "megatron"

    def __init__(self, command_template: str | Sequence[str], backend: ProbeBackend, flavor: str = "bigscience", *,
                 cluster: ClusterSpec | None = None, optimizer: str = "adamw", flash_attention: bool | None = None,
                 attention_kernel: str = "", cwd: Path | None = None, env: Mapping[str, str] | None = None,
                 max_local_procs: int | None = None) -> None:
        """``command_template``: the user's command line (split with `shlex`, no shell) or an argument list
        (search.probe_choice's Megatron-LM command). ``cluster`` names the GPU (bf16 support, the plan's cluster);
        its size is replaced by the probe's. ``cwd``: where the command's relative paths resolve (default: the current folder).
        ``backend``: SlurmBackend (or anything with ``run_command``) runs on its slices; any other
        backend means this machine, with ``max_local_procs`` processes at most (one DP replica
        when the candidate needs more)."""
        self.tokens = split_template(command_template)
        # refuse an unknown placeholder or a non-Python command now, not at the first probe
        worker_argv(render_command(self.tokens, {p: [] if p == "args" else p for p in PLACEHOLDERS}))
        if flavor == MEGATRON_LM and any("{ds_config}" in t for t in self.tokens):
            raise ValueError("{ds_config} is a Megatron-DeepSpeed file; Megatron-LM takes no DeepSpeed config")
        self.backend = backend
        self.flavor = flavor
        self.kind = MEGATRON_LM if flavor == MEGATRON_LM else "megatron-deepspeed"
        """the emitter kind (planner.emit) and the framework the probed layouts are timed for"""
        self.cluster = cluster
        self.optimizer = optimizer
        # The bigscience fork has no FlashAttention: its probes run without, whatever the plan assumed.
        self.flash_attention = flavor != "bigscience" and (flash_attention is None or flash_attention)
        # the plan's --attention-kernel, launched as the emitters write it (--attention-backend, --use-flash-attn-v1/v2)
        self.attention_kernel = attention_kernel if self.flash_attention or attention_kernel not in (
            "fa1", "fa2", "fa3", "cudnn") else ""
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.env = dict(env or {})
        self.max_local_procs = max_local_procs

    # -- what runs --------------------------------------------------------------------------------
    def procs_for(self, candidate: Candidate) -> int:
        """Ranks the probe gets: as the backend decides (SlurmBackend: ``nodes_per_probe``), else its
        fixed ``nproc``, else the candidate's TP*PP*DP, or one DP replica (TP*PP) when that exceeds
        ``max_local_procs``."""
        decide = getattr(self.backend, "procs_for_candidate", None)
        if decide is not None:
            return int(decide(candidate.to_dict()))
        nproc = getattr(self.backend, "nproc", None)
        if nproc:
            return int(nproc)
        if self.max_local_procs is not None and candidate.world > self.max_local_procs:
            return candidate.tp * candidate.pp
        return candidate.world

    def _gpus_per_node(self, procs: int) -> int:
        return int(getattr(self.backend, "gpus_per_node", procs) or procs)

    def probe_setup(self, model: ModelSpec, candidate: Candidate, *, precision: str, procs: int) -> RunSetup:
        """The RunSetup of what actually runs: DP cut to fit ``procs`` (GAS kept), cluster = the slice."""
        tp_pp = candidate.tp * candidate.pp
        if procs % tp_pp:
            raise ValueError(f"{procs} ranks are not a multiple of TP({candidate.tp})*PP({candidate.pp})")
        dp = min(candidate.dp, procs // tp_pp)
        cand = replace(candidate, dp=dp)
        nnodes, per_node = slice_shape(cand.world, self._gpus_per_node(cand.world))
        gpu = self.cluster.gpu.id if self.cluster else "CPU"
        cluster = make_cluster(gpu=gpu, gpus_per_node=per_node, nodes=nnodes, name="probe-slice")
        training = TrainingSpec(global_batch=cand.global_batch, seq_len=model.seq_len, precision=precision,
                                optimizer=self.optimizer, framework=self.kind,
                                flash_attention=self.flash_attention, attention_kernel=self.attention_kernel)
        return RunSetup(model=model, cluster=cluster, training=training, candidate=cand)

    def command_for(self, setup: RunSetup, *, workdir: Path, train_iters: int) -> list[str]:
        """Write args.txt (and, for a DeepSpeed fork, ds_config.json) into ``workdir``; the rendered command's
        argument list."""
        ds_path = None
        if self.kind != MEGATRON_LM:
            ds_path = workdir / DS_CONFIG_NAME
            ds_path.write_text(ds_config_text(setup, self.flavor))
        args = probe_args(setup, self.flavor, train_iters=train_iters, ds_config_path=ds_path)
        (workdir / "args.txt").write_text(args_txt(args))
        values = {"args": [v for a in args for v in a], "ds_config": str(ds_path or ""),
                  "nproc": str(setup.cluster.gpus_per_node), "nnodes": str(setup.cluster.nodes),
                  "world": str(setup.candidate.world), "train_iters": str(train_iters), "workdir": str(workdir)}
        return render_command(self.tokens, values)

    def run_cwd(self, workdir: Path) -> Path:  # noqa: ARG002
        """Where the command runs: ``cwd`` (a probe of another framework may run in its trial folder)."""
        return self.cwd

    def parse(self, text: str, setup: RunSetup) -> MegatronLog:  # noqa: ARG002
        """The run's output read as iteration and memory lines (Megatron's three formats)."""
        return parse_log(text)

    def problems(self, setup: RunSetup) -> list[str]:
        """What keeps the framework from running ``setup`` (the rulebook's reasons, each with its fix)."""
        return setup_problems(setup, self.kind, self.flavor)

    # -- ProbeBackend ---------------------------------------------------------------------------------
    def run(self, spec: ProbeSpec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        """``spec.warmup_steps`` + ``spec.steps`` iterations of the user's command for ``spec.candidate``."""
        model = model_spec(spec)
        candidate = Candidate(**spec.candidate)
        return self.run_candidate(model, candidate, precision=spec.precision, workdir=workdir, timeout_s=timeout_s,
                                  warmup_iters=spec.warmup_steps, measure_iters=spec.steps, max_cv=spec.max_cv)

    def run_candidate(self, model: ModelSpec, candidate: Candidate, *, precision: str, workdir: Path,
                      timeout_s: float, warmup_iters: int = 2, measure_iters: int = 5,
                      max_cv: float = 0.15) -> ProbeResult:
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "result.json").unlink(missing_ok=True)
        procs = self.procs_for(candidate)

        def finish(result: ProbeResult) -> ProbeResult:
            result.write(workdir / "result.json")
            return result

        try:
            setup = self.probe_setup(model, candidate, precision=precision, procs=procs)
        except ValueError as err:
            return finish(ProbeResult(status="invalid", reason=str(err), world_size=procs, workdir=str(workdir)))
        problems = self.problems(setup)
        if problems:
            return finish(ProbeResult(status="invalid", reason="; ".join(problems), world_size=setup.candidate.world,
                                      workdir=str(workdir)))
        train_iters = warmup_iters + measure_iters
        argv = self.command_for(setup, workdir=workdir, train_iters=train_iters)
        worker = worker_argv(argv)
        world = setup.candidate.world
        run_command = getattr(self.backend, "run_command", None)
        if run_command is not None:
            step = run_command(worker, procs=world, workdir=workdir, timeout_s=timeout_s, env=self.env,
                               cwd=self.run_cwd(workdir))
            if step is None:
                return finish(ProbeResult(status="invalid", reason=f"{world} ranks do not fit on the backend's nodes",
                                          world_size=world, workdir=str(workdir)))
        else:  # any other backend (LocalBackend, a wrapper of it) means this machine
            local_env = {**getattr(self.backend, "env", {}), **self.env}
            step = run_local_command(worker, procs=world, workdir=workdir, timeout_s=timeout_s,
                                     cwd=self.run_cwd(workdir), env=local_env)
        result = self._result(step, setup, workdir=workdir, timeout_s=timeout_s, warmup_iters=warmup_iters,
                              reduced=setup.candidate.dp != candidate.dp, max_cv=max_cv, full=candidate)
        record = getattr(self.backend, "record", None)
        if record is not None and step.hosts:
            record(step.hosts, result)
        return finish(result)

    def _result(self, step: StepOutcome, setup: RunSetup, *, workdir: Path, timeout_s: float, warmup_iters: int,
                reduced: bool, max_cv: float, full: Candidate | None = None) -> ProbeResult:
        text = step.stdout + "\n" + step.stderr + "\n" + "\n".join(step.rank_logs.values())
        log = self.parse(text, setup)
        c = setup.candidate
        fields = summarize(log, model=setup.model, candidate=c, global_batch=setup.training.global_batch,
                           world=step.world, warmup_iters=warmup_iters, max_cv=max_cv)
        common = {"world_size": step.world, "wall_s": step.wall_s, "workdir": str(workdir), "reduced": reduced,
                  "device": f"{setup.cluster.gpu.id} x {step.world}",
                  "phases": log_phases(log, warmup_iters=warmup_iters, wall_s=step.wall_s)}
        extra = {**fields.pop("extra", {}), "hosts": list(step.hosts), "returncode": step.returncode,
                 "flavor": self.flavor, "layout": c.label(), "flash_attention": setup.training.flash_attention}
        if step.job_id:
            extra |= {"job_id": step.job_id, "step_name": step.step_name}
        if step.pids:
            extra["pids"] = list(step.pids)
        if step.cancelled_step:
            extra["cancelled_step"] = step.cancelled_step
        if log.oom_line is not None:
            return ProbeResult(status="oom", reason=log.oom_line, extra=extra, **common, **fields)
        if fields and (step.returncode == 0 or step.timed_out):
            if step.timed_out:
                extra["timed_out_after_measuring"] = True
            projected = project_replica(setup.model, full, fields["step_time_median_s"]) if reduced and full else {}
            return ProbeResult(status="ok", extra=extra, projected=projected, **common, **fields)
        if step.timed_out:
            return ProbeResult(status="timeout", reason=f"no measured iteration within {timeout_s:g} s; killed",
                               extra=extra, **common, **fields)
        if step.returncode == 0:
            return ProbeResult(status="crash", reason="exited 0 without iteration lines after warm-up "
                               f"({len(log.iterations)} logged); does the command honour --log-interval 1?",
                               extra=extra, **common)
        tail = log.error_line or next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "no output")
        return ProbeResult(status="crash", reason=f"exit code {step.returncode}: {strip_prefix(tail).strip()[:300]}",
                           extra=extra, **common, **fields)


__all__ = ["FORMATS", "MEGATRON_LM", "IterationLine", "MegatronLog", "MegatronProbe", "MemoryLine", "PLACEHOLDERS",
           "parse_iteration_line", "parse_log", "parse_memory_line", "probe_args", "project_replica", "render_command",
           "run_local_command", "split_template", "summarize", "worker_argv"]
