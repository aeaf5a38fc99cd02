"""Planner speed: `plan` as a new process, and whole-space scoring rates.

    python tests/bench/bench_plan.py            # prints medians over 5 runs

Targets (issues 2 and 9): `plan --model 176B --gpus 384` under 0.3 s wall as a new process on 2 cores
(Python start-up included); the whole space of Megatron-1T on 3072 GPUs and of Llama-3-405B on
16384 GPUs under 2 s each; a plan's cost must not grow with the GPU count (98,304 and 10^9 GPUs take
what 384 take). Reported as medians and candidates scored per second, not asserted.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REPEATS = 5


def median_wall(argv: list[str], check: bool = True) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=check, capture_output=True, timeout=120)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def whole_space(model: str, gpus: int, gpu: str, framework: str) -> tuple[float, int]:
    import planner

    m = planner.load_model(model)
    cluster = planner.make_cluster(gpu=gpu, gpus=gpus)
    training = planner.TrainingSpec(global_batch=m.global_batch, seq_len=m.seq_len, framework=framework)
    times, total = [], 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        p = planner.plan(m, cluster, training)
        times.append(time.perf_counter() - t0)
        total = p.total
    return statistics.median(times), total


def main() -> int:
    startup = median_wall([sys.executable, "-c", "pass"])
    wall = median_wall([sys.executable, "-m", "planner.cli", "--model", "176B", "--gpus", "384"])
    print(f"python start-up alone:                    {startup:.3f} s (median of {REPEATS})")
    print(f"plan --model 176B --gpus 384 (new process): {wall:.3f} s (median of {REPEATS}; target < 0.3 s)")
    for gpus in (98_304, 10**9):
        t = median_wall([sys.executable, "-m", "planner.cli", "--model", "176B", "--gpus", str(gpus), "--no-rampup"],
                        check=False)
        print(f"plan --model 176B --gpus {gpus:,} --no-rampup (new process): {t:.3f} s (median of {REPEATS})")
    for model, gpus, gpu, fw in (("1T", 3072, "A100-80GB", "megatron-lm"), ("405B", 16384, "H100-SXM", "megatron-lm")):
        t, n = whole_space(model, gpus, gpu, fw)
        print(f"whole space {model} on {gpus} {gpu} ({fw}): {t:.3f} s for {n} candidates = "
              f"{n / t:,.0f} candidates/s (median of {REPEATS}; target < 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
