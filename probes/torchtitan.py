"""torchtitan probe: the config ``plan --emit fsdp`` writes for torchtitan 0.3.0, run by torchtitan's own trainer
for a few steps on mock data, timed from its log.

    probe = TorchtitanProbe(LocalBackend(), version="0.3.0", cluster=cluster, training=training)
    result = probe.run(spec, workdir=Path("tune-x/trial-0003"), timeout_s=600)

For each candidate the trial folder gets the emitted module (``plantune_torchtitan.py``, planner.emit.torchtitan_py,
exactly what ``plan --emit fsdp`` writes) and a probe module, ``plantune_probe.py``, whose config function
``probe`` takes the emitted ``Trainer.Config`` and changes only what a probe needs: mock data
(probes.torchtitan_mock: random tokens through torchtitan's dataloader, a tokenizer that is a vocabulary size),
``training.steps`` = warm-up + timed steps, one metrics line per step, no checkpoint, no TensorBoard, outputs in the
trial folder. It runs as ``python -m torch.distributed.run ... -m torchtitan.train --module plantune_probe --config
probe`` (no shell) in the trial folder, like Megatron probes (probes.megatron: same launch, lifelines, SLURM slices,
one DP replica when the node is too small, result assembly).

torchtitan logs ``step: N  loss: ...  memory: X.XXGiB(P%)  tps: T  tflops: ...`` (components/metrics.py
MetricsProcessor.log): tps is tokens per second per device, ``tokens this rank saw since the last line /
(seconds x TP*PP*CP)``; each rank sees global_batch x seq_len / DP tokens a step, so the step time is
``global_batch x seq_len / (world x tps)``. ``memory`` is the peak reserved memory of the device.
torchtitan's trainer needs a CUDA device: it picks ``cuda`` when torch finds no accelerator and calls
``torch.cuda.set_device`` first thing (tools/utils.py get_device_info, trainer.py Trainer.__init__), so on a
CPU-only machine it stops there, before the process group (search.probe_choice falls back to the stand-in).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from planner.emit import torchtitan_py
from planner.emit.setup import RunSetup, setup_problems
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec
from probes.backend import ProbeBackend
from probes.result import ProbeResult
from probes.megatron import IterationLine, MegatronLog, MegatronProbe, MemoryLine, parse_log, strip_prefix

KIND = "fsdp"
"""the emitter kind (planner.emit) whose config the probe runs"""
PROBE_MODULE = "plantune_probe"
PROBE_FN = "probe"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)\s+.*?\bmemory:\s*([\d.]+)GiB.*?\btps:\s*([\d,]+)"
                   r"(?:.*?\btflops:\s*([\d,.]+))?")
NO_CUDA_MARKERS = ("_cuda_setDevice", "Torch not compiled with CUDA enabled")
"""what torchtitan's trainer fails with on a torch without CUDA (Trainer.__init__'s torch.cuda.set_device)"""


def probe_module_text(*, steps: int, vocab_size: int, dump_folder: str) -> str:
    """The probe's config module: the emitted job with mock data, ``steps`` steps, a metrics line each."""
    return f'''"""plantune probe of the emitted torchtitan job (plantune_torchtitan.py, as plan --emit fsdp writes it):
mock data, {steps} steps, one metrics line per step, no checkpoint. Written by probes.torchtitan."""

import plantune_torchtitan as job
from probes.torchtitan_mock import MockDataLoader, MockTokenizer


def {PROBE_FN}():
    cfg = job.{torchtitan_py.CONFIG_FN}()
    cfg.tokenizer = MockTokenizer.Config(vocab_size={vocab_size})
    cfg.dataloader = MockDataLoader.Config(vocab_size={vocab_size})
    cfg.hf_assets_path = {dump_folder!r}
    cfg.dump_folder = {dump_folder!r}
    cfg.training.steps = {steps}
    cfg.checkpoint.enable = False
    cfg.metrics.log_freq = 1
    cfg.metrics.enable_tensorboard = False
    cfg.metrics.disable_color_printing = True
    return cfg
'''


def parse_torchtitan_log(text: str, *, global_batch: int, seq_len: int, world: int) -> MegatronLog:
    """torchtitan's metrics lines as iteration lines (step time from tps, see the module doc) and the peak reserved
    memory; OOM and the first error line as probes.megatron reads them."""
    base = parse_log("")
    iterations: dict[int, IterationLine] = {}
    peak_gib = 0.0
    for raw in text.splitlines():
        line = _ANSI.sub("", strip_prefix(raw))
        m = _STEP.search(line)
        if m is None:
            continue
        step, tps = int(m.group(1)), float(m.group(4).replace(",", ""))
        peak_gib = max(peak_gib, float(m.group(3)))
        if tps <= 0 or step in iterations:
            continue
        try:
            loss = float(m.group(2))
        except ValueError:
            loss = None
        tflops = float(m.group(5).replace(",", "")) if m.group(5) else None
        iterations[step] = IterationLine(iteration=step, total=0, step_time_s=global_batch * seq_len /
                                         (world * tps), format="torchtitan", global_batch=global_batch,
                                         tokens_per_gpu_per_s=tps, reported_tflops=tflops, lm_loss=loss)
    other = parse_log(text)            # OOM and error lines (the Megatron reader's markers)
    memory = [MemoryLine(rank=0, after_iterations=max(iterations, default=0), allocated_mb=peak_gib * 1024,
                         max_allocated_mb=peak_gib * 1024, reserved_mb=peak_gib * 1024,
                         max_reserved_mb=peak_gib * 1024)] if iterations else []
    return replace(base, iterations=[iterations[k] for k in sorted(iterations)], memory=memory,
                   oom_line=other.oom_line, error_line=other.error_line)


class TorchtitanProbe(MegatronProbe):
    """Runs torchtitan's trainer on the emitted config for a candidate through a backend (local or SLURM)."""

    name = "torchtitan"

    def __init__(self, backend: ProbeBackend, *, version: str = torchtitan_py.VERSION,
                 cluster: ClusterSpec | None = None, training: TrainingSpec | None = None,
                 max_local_procs: int | None = None, env: dict[str, str] | None = None) -> None:
        """``training``: the plan's TrainingSpec (precision, optimizer, FP8, compile: what the emitted job says);
        its batch is the candidate's. ``env``: environment overrides for the workers (e.g. a PYTHONPATH)."""
        if version != torchtitan_py.VERSION:
            raise ValueError(f"the torchtitan probe runs torchtitan {torchtitan_py.VERSION}'s Python config, not "
                             f"{version}'s")
        self.tokens = ["python", "-u", "-m", "torchtitan.train", "--module", PROBE_MODULE, "--config", PROBE_FN]
        self.backend = backend
        self.flavor = f"torchtitan-{version}"
        self.kind = KIND
        self.cluster = cluster
        self.training = training
        self.optimizer = training.optimizer if training else "adamw"
        self.flash_attention = training.flash_attention if training else None
        self.attention_kernel = training.attention_kernel if training else ""
        self.cwd = Path.cwd().resolve()
        self.env = dict(env or {})
        self.max_local_procs = max_local_procs

    def procs_for(self, candidate: Candidate) -> int:
        """The candidate's world, or one DP replica (TP*PP*CP ranks) when the node has fewer."""
        decide = getattr(self.backend, "procs_for_candidate", None)
        if decide is not None:
            return int(decide(candidate.to_dict()))
        if self.max_local_procs is not None and candidate.world > self.max_local_procs:
            return candidate.tp * candidate.pp * candidate.cp
        return candidate.world

    def probe_setup(self, model: ModelSpec, candidate: Candidate, *, precision: str, procs: int) -> RunSetup:
        setup = super().probe_setup(model, candidate, precision=precision, procs=procs)
        if self.training is None:
            return setup
        training = replace(self.training, global_batch=setup.candidate.global_batch, seq_len=model.seq_len,
                           precision=precision, framework=KIND, rampup=None)
        return replace(setup, training=training)

    def run_cwd(self, workdir: Path) -> Path:
        return workdir                 # the emitted and the probe module are importable there (-m puts it on sys.path)

    def command_for(self, setup: RunSetup, *, workdir: Path, train_iters: int) -> list[str]:
        """Write the emitted module and the probe module into ``workdir``; the command's argument list."""
        (workdir / torchtitan_py.FILE_NAME).write_text(torchtitan_py.config_text(setup))
        (workdir / f"{PROBE_MODULE}.py").write_text(probe_module_text(steps=train_iters,
                                                                      vocab_size=setup.model.vocab,
                                                                      dump_folder=str(workdir / "outputs")))
        return list(self.tokens)

    def problems(self, setup: RunSetup) -> list[str]:
        return setup_problems(setup, KIND, "bigscience") + torchtitan_py.problems(setup)

    def parse(self, text: str, setup: RunSetup) -> MegatronLog:
        return parse_torchtitan_log(text, global_batch=setup.candidate.global_batch, seq_len=setup.model.seq_len,
                                    world=setup.candidate.world)

    def _result(self, step, setup: RunSetup, **kw) -> ProbeResult:
        result = super()._result(step, setup, **kw)
        if result.memory_kind:
            result = replace(result, memory_kind="cuda_max_reserved")    # torchtitan logs the reserved peak
        if result.status == "crash" and any(m in (result.reason or "") for m in NO_CUDA_MARKERS):
            result = replace(result, reason=f"{result.reason}; torchtitan's trainer needs a CUDA device (it calls "
                                            "torch.cuda.set_device): probe on the GPU machine, or --probe auto")
        return result


__all__ = ["PROBE_FN", "PROBE_MODULE", "TorchtitanProbe", "parse_torchtitan_log", "probe_module_text"]
