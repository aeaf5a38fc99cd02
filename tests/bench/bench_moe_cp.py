"""Planner speed on the issue-14 targets: CP/EP/FP8 layouts ranked in under a second each.

    python tests/bench/bench_moe_cp.py          # medians over 5 runs

Cases (issue 14): Llama-3.1-405B at 128K tokens on 16,384 H100s (Llama 3's CP=16 run), Mixtral-8x22B on
1,024 H100s (8K tokens, NeMo's GBS 512) and DeepSeek-V3 on 2,048 H100s (its own 15,360 x 4K batch), with
Megatron-LM, bf16 and fp8. Reported: candidates, median process CPU seconds of `plan()` (what the machine's
load does not inflate) and median wall seconds; nothing is asserted.
"""

from __future__ import annotations

import statistics
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


def main() -> int:
    print(f"{'model':16} {'GPUs':>6} {'prec':5} {'candidates':>10} {'cpu s':>7} {'wall s':>7}  best")
    for model, gpus, gbs, seq in CASES:
        for precision in ("bf16", "fp8"):
            total, cpu, wall, best = measure(model, gpus, gbs, seq, precision)
            print(f"{model:16} {gpus:6d} {precision:5} {total:10d} {cpu:7.2f} {wall:7.2f}  {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
