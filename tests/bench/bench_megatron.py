"""Real Megatron-LM beside the torch-native probe and `plan`, on the same one-GPU layouts (`--probe megatron`).

    # a CUDA machine, the repository root (tests/bench/megatron_gpu.sh runs this, then tune --probe megatron):
    python tests/bench/bench_megatron.py --megatron-src build/megatron-lm-v0.17.1
    # the CPU: render every command and pass it through Megatron-LM's own parse_args + validate_args
    python tests/bench/bench_megatron.py --megatron-src build/megatron-lm-v0.17.1 --check-args

``--megatron-src``: a Megatron-LM tree holding pretrain_gpt.py, gpt_builders.py, model_provider.py and megatron/
(``git archive core_v0.17.1 megatron pretrain_gpt.py gpt_builders.py model_provider.py`` of NVIDIA/Megatron-LM).
Megatron runs as a user would run it without Transformer Engine or Apex: ``--transformer-impl local`` (Megatron's
own DotProductAttention, so the plan is made without FlashAttention, ``--attention-backend unfused``), mock data,
the NullTokenizer, and the fusions that need Apex/TE off (`MEGATRON_EXTRA`). Per layout: the Megatron step time
(probes.megatron.MegatronProbe, flavor megatron-lm, its log), the torch-native probe's (probes.launch.run_local,
SDPA attention), and the planner's Megatron-LM estimate without FlashAttention; model TFLOP/s of each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from planner.flops import model_flops_per_iteration, tflops_per_gpu  # noqa: E402
from planner.constants import ALLOCATOR_OVERHEAD  # noqa: E402
from planner.hardware import ClusterSpec, make_cluster  # noqa: E402
from planner.memory import MemoryBreakdown, reported_bytes  # noqa: E402
from planner.model import ModelSpec  # noqa: E402
from planner.rank import estimate  # noqa: E402
from planner.space import Candidate, TrainingSpec  # noqa: E402
from probes.backend import LocalBackend  # noqa: E402
from probes.megatron import MegatronProbe, worker_argv  # noqa: E402

MODEL = ModelSpec(name="llama-1.1b", layers=22, hidden=2048, heads=32, kv_heads=4, ffn_hidden=5632, vocab=32000,
                  seq_len=2048, glu=True, norm="rmsnorm", position="rope", bias=False, tied_embeddings=False)
"""TinyLlama-1.1B's shape (bench_gpu.MODEL_1B, whose torch-probe timings are in tests/bench/gpu_runs)"""
GLOBAL_BATCH = 16
LAYOUTS = ("mbs=1", "mbs=2", "mbs=4,recompute=full", "mbs=2,recompute=selective")
MEGATRON_EXTRA = ("--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(MODEL.vocab),
                  "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
                  "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
                  "--seed", "1234")
"""what a run without Transformer Engine, Apex or a dataset needs (flags of megatron/training/arguments.py)"""
DRIVER = ROOT / "tests" / "test_megatron_parser_driver.py"
TRAINING = TrainingSpec(global_batch=GLOBAL_BATCH, seq_len=MODEL.seq_len, precision="bf16", framework="megatron-lm",
                        flash_attention=False, eager_ops=True)
"""the plan of those runs: Megatron's own unfused DotProductAttention, and its fusions off (MEGATRON_EXTRA: the
element-wise ops, SwiGLU included, as PyTorch ops)"""
FOREACH_ADAM_TEMP_BYTES = 4.0
"""bytes per parameter torch's foreach AdamW allocates during its step, one fp32 tensor per state
(torch/optim/adamw.py _multi_tensor_adamw: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)); Megatron falls back to
torch's AdamW without Apex or Transformer Engine (megatron/core/optimizer/__init__.py)"""


def first_report_bytes(mem: MemoryBreakdown, cand: Candidate, cluster: ClusterSpec) -> float:
    """What Megatron-LM's first memory report ("[Rank 0] (after 1 iterations) memory (MB) | ... | max allocated",
    megatron/training/training.py report_memory, printed once) reads for a one-GPU plan ``mem``: torch's
    max_memory_allocated over the first iteration (`planner.memory.reported_bytes`: the live tensors, without the
    allocator's overhead, the CUDA context and NCCL's buffers), which is the larger of two phases, neither the plan's
    total:
    - forward and backward before any optimizer step: torch's AdamW creates its two moments lazily on the first
      step (torch/optim/adamw.py _init_group: state initialisation when len(state) == 0), so the bf16 weights, the
      fp32 main grads and the fp32 master weights (2 + 4 + 4 bytes a parameter), and the activations and logits;
    - the step: every model state (18 bytes a parameter) and foreach AdamW's temporary (FOREACH_ADAM_TEMP_BYTES).
    From the second iteration on the forward runs beside the moments: the plan's total is that steady state."""
    params = mem.params_on_gpu
    moments = mem.optimizer_bytes - 4.0 * params   # optimizer_bytes holds the fp32 master weights and the moments
    allocated = reported_bytes(mem, cand, cluster, "max_memory_allocated")
    forward_backward = allocated - moments
    step = allocated - (mem.activations_bytes + mem.logits_bytes) / ALLOCATOR_OVERHEAD + FOREACH_ADAM_TEMP_BYTES * params
    return max(forward_backward, step)


def candidate(layout: str) -> Candidate:
    kw: dict = {"tp": 1, "pp": 1, "dp": 1, "recompute": "none"}
    for part in filter(None, layout.split(",")):
        key, value = part.split("=")
        kw[key] = value if key == "recompute" else int(value)
    return Candidate(gas=GLOBAL_BATCH // kw["mbs"], **kw)


def megatron_probe(src: Path, gpu: str) -> MegatronProbe:
    command = " ".join(["python", "-u", str(src / "pretrain_gpt.py"), "{args}", *MEGATRON_EXTRA])
    return MegatronProbe(command, LocalBackend(nproc=1), "megatron-lm", cluster=make_cluster(gpu=gpu, gpus=1,
                                                                                            gpus_per_node=1),
                         flash_attention=False, cwd=src, env={"PYTHONPATH": f"{src}{os.pathsep}{ROOT}"})


def check_args(src: Path, gpu: str, layouts: tuple[str, ...] = LAYOUTS) -> int:
    """Every layout's rendered command through Megatron-LM's parse_args + validate_args (no GPU needed)."""
    probe = megatron_probe(src, gpu)
    cases = []
    with tempfile.TemporaryDirectory(prefix="bench-megatron-") as tmp:
        for layout in layouts:
            setup = probe.probe_setup(MODEL, candidate(layout), precision="bf16", procs=1)
            argv = worker_argv(probe.command_for(setup, workdir=Path(tmp), train_iters=8))
            cases.append({"id": layout, "argv": argv[1:], "world": 1, "env": {}, "capability": [9, 0],
                          "vocab": MODEL.vocab, "attrs": ["micro_batch_size", "global_batch_size", "recompute_granularity",
                                    "transformer_impl", "mock_data"]})
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, cwd=src)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    bad = 0
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            print(f"{r['id']:<28} {r['stage']:<14} {r.get('error') or r.get('attrs')}")
            bad += r["stage"] != "ok"
    return 1 if bad else 0


def run(src: Path, gpu: str, steps: int, warmup: int, layouts: tuple[str, ...] = LAYOUTS) -> int:
    from probes.launch import run_local
    from probes.result import ProbeSpec

    cluster = make_cluster(gpu=gpu, gpus=1, gpus_per_node=1)
    probe = megatron_probe(src, gpu)
    training = TRAINING
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-megatron-") as tmp:
        for layout in layouts:
            cand = candidate(layout)
            est = estimate(MODEL, cluster, training, cand)
            spec = ProbeSpec(model=MODEL.to_dict(), candidate=cand.to_dict(), precision="bf16",
                             warmup_steps=warmup, steps=steps, device="cuda")
            meg = probe.run(spec, workdir=Path(tmp) / f"megatron-{len(rows)}", timeout_s=900)
            torch_probe = run_local(spec, nproc=1, workdir=Path(tmp) / f"torch-{len(rows)}", timeout_s=900)
            rows.append((layout, est, meg, torch_probe))
            print(f"{layout}: megatron {meg.status} {meg.step_time_median_s or meg.reason}, torch {torch_probe.status} "
                  f"{torch_probe.step_time_median_s or torch_probe.reason}", flush=True)
    flops = model_flops_per_iteration(MODEL, GLOBAL_BATCH)
    print(f"\n{MODEL.name}, seq {MODEL.seq_len}, GBS {GLOBAL_BATCH}, bf16, one {gpu}; step s (model TFLOP/s)")
    print(f"{'layout':<28} {'Megatron-LM':>16} {'torch probe':>16} {'plan (unfused)':>16} {'plan mem GB':>11} "
          f"{'plan 1st report GB':>18} {'Meg peak GB':>11}")
    for layout, est, meg, tp in rows:
        def cell(step):
            return f"{step:.3f} ({tflops_per_gpu(flops, step, 1):.0f})" if step else "-"
        plan_s = est.time.step_time_s if est.time else None
        peak = max(meg.peak_memory_bytes_per_rank) / 1e9 if meg.peak_memory_bytes_per_rank else None
        print(f"{layout:<28} {cell(meg.step_time_median_s) if meg.ok else meg.status:>16} "
              f"{cell(tp.step_time_median_s) if tp.ok else tp.status:>16} {cell(plan_s):>16} "
              f"{est.memory.total_bytes / 1e9 if est.memory else float('nan'):>11.1f} "
              f"{first_report_bytes(est.memory, est.candidate, cluster) / 1e9 if est.memory else float('nan'):>18.1f} "
              f"{peak if peak is not None else float('nan'):>11.1f}")
    return 0 if all(meg.ok for _, _, meg, _ in rows) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-src", type=Path, default=ROOT / "build" / "megatron-lm-v0.17.1")
    p.add_argument("--gpu", default=None, help="catalog id (default: the CUDA device's; H100-SXM with --check-args)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layouts", default=";".join(LAYOUTS), help="';'-separated, e.g. 'mbs=1;mbs=4,recompute=full'")
    p.add_argument("--check-args", action="store_true", help="CPU: validate the commands with Megatron-LM's parser")
    args = p.parse_args(argv)
    src = args.megatron_src.resolve()
    layouts = tuple(x for x in args.layouts.split(";") if x)
    if not (src / "pretrain_gpt.py").is_file():
        p.error(f"--megatron-src {src} has no pretrain_gpt.py; see this script's docstring")
    if args.check_args:
        return check_args(src, args.gpu or "H100-SXM", layouts)
    gpu = args.gpu
    if gpu is None:
        import torch

        from planner.hardware import catalog_id_for_device

        gpu = catalog_id_for_device(torch.cuda.get_device_name(0))
    return run(src, gpu, args.steps, args.warmup, layouts)


if __name__ == "__main__":
    sys.exit(main())
