"""Planner speed on the issue-14 targets: CP/EP/FP8 layouts ranked in under a second each.

    python tests/bench/bench_moe_cp.py          # medians over 5 runs

Cases (issue 14): Llama-3.1-405B at 128K tokens on 16,384 H100s (Llama 3's CP=16 run), Mixtral-8x22B on
1,024 H100s (8K tokens, NeMo's GBS 512) and DeepSeek-V3 on 2,048 H100s (its own 15,360 x 4K batch), with
Megatron-LM, bf16 and fp8. Reported: candidates, median process CPU seconds of `plan()` (what the machine's
load does not inflate) and median wall seconds; then the `plan` command itself as a new process (Python start-up,
imports and the table included; issue 14's target: under a second each), for these cases and for the presets' own
sequence and batch (Mixtral-8x22B at 64K tokens, DeepSeek-V3). Nothing is asserted.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REPEATS = 5
CASES = [  # (model, GPUs, global batch, sequence)
    ("llama3.1-405b", 16384, 128, 131072),
    ("mixtral-8x22b", 1024, 512, 8192),
    ("deepseek-v3", 2048, 15360, 4096),
]


def measure(model: str, gpus: int, gbs: int, seq: int, precision: str) -> tuple[int, float, float, str]:
    import planner

    m = planner.load_model(model)
    cluster = planner.make_cluster(gpu="H100", gpus=gpus)
    training = planner.TrainingSpec(global_batch=gbs, seq_len=seq, framework="megatron-lm", precision=precision)
    cpu, wall, total, best = [], [], 0, ""
    for _ in range(REPEATS):
        c0, w0 = time.process_time(), time.perf_counter()
        p = planner.plan(m, cluster, training)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        total, best = p.total, f"{p.best.candidate.label()} {p.best.throughput.model_tflops_per_gpu:.0f} TFLOPs"
    return total, statistics.median(cpu), statistics.median(wall), best


COMMANDS = [  # `plan` argv: the CASES as flags, and the presets' own sequence and batch
    [*f"--model {m} --gpus {g} --gpu H100 --global-batch {b} --seq-len {s} --framework megatron-lm".split(), *prec]
    for m, g, b, s in CASES for prec in ([], ["--precision", "fp8"])
] + [f"--model {m} --gpus {g} --gpu H100-SXM".split() + prec
       for m, g in (("mixtral-8x22b", 1024), ("deepseek-v3", 2048)) for prec in ([], ["--precision", "fp8"])]


def new_process(argv: list[str]) -> tuple[float, float]:
    """Median wall and CPU (user + system) seconds of `plan ARGV` as a new process."""
    wall, cpu = [], []
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "planner.cli", *argv], cwd=ROOT, check=True, capture_output=True,
                       timeout=600)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    print(f"{'model':16} {'GPUs':>6} {'prec':5} {'candidates':>10} {'cpu s':>7} {'wall s':>7}  best")
    for model, gpus, gbs, seq in CASES:
        for precision in ("bf16", "fp8"):
            total, cpu, wall, best = measure(model, gpus, gbs, seq, precision)
            print(f"{model:16} {gpus:6d} {precision:5} {total:10d} {cpu:7.2f} {wall:7.2f}  {best}")
    print(f"\n`plan` as a new process (median of {REPEATS}; target < 1 s each)")
    print(f"{'wall s':>7} {'cpu s':>7}  command")
    for argv in COMMANDS:
        wall, cpu = new_process(argv)
        print(f"{wall:7.2f} {cpu:7.2f}  plan {' '.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
