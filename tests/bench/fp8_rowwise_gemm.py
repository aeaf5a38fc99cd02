"""Rowwise vs tensorwise float8 GEMMs (torch._scaled_mm) and bf16 on this GPU, for Llama 3 8B's four layer GEMMs at
8192 tokens: the measurement behind planner.constants.ROWWISE_GEMM_EFFICIENCY.

    python tests/bench/fp8_rowwise_gemm.py      # needs FP8 tensor cores (H100/H200/B200); prints JSON

H200, torch 2.11.0+cu130 (2026-11-26, tests/bench/gpu_runs/h200-2026-11-26-fp8/fp8_rowwise_gemm.json): the layer's
GEMMs at 1,314 (tensorwise), 1,235 (rowwise), 700 (bf16) TFLOP/s; rowwise / tensorwise 0.941.
"""

from __future__ import annotations

import json
import sys

SHAPES = {"qkv": (8192, 4096, 6144), "out": (8192, 4096, 4096), "fc1": (8192, 4096, 28672), "fc2": (8192, 14336, 4096)}
"""GEMM: (M tokens, K in, N out), Llama 3 8B forward"""
WARMUP, REPS = 10, 50


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("fp8_rowwise_gemm: no CUDA device", file=sys.stderr)
        return 2
    d, f8 = torch.device("cuda"), torch.float8_e4m3fn
    rows, seconds, flops = [], {"tensorwise": 0.0, "rowwise": 0.0, "bf16": 0.0}, 0
    for name, (m, k, n) in SHAPES.items():
        a, b = torch.randn(m, k, device=d).to(f8), torch.randn(n, k, device=d).to(f8).t()   # b column-major
        one = torch.ones((), device=d)
        row_a, row_b = torch.ones(m, 1, device=d), torch.ones(1, n, device=d)
        x, y = (torch.randn(m, k, device=d, dtype=torch.bfloat16), torch.randn(k, n, device=d, dtype=torch.bfloat16))
        gemms = {"tensorwise": lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                 "rowwise": lambda: torch._scaled_mm(a, b, scale_a=row_a, scale_b=row_b, out_dtype=torch.bfloat16),
                 "bf16": lambda: x @ y}
        row = {"gemm": name}
        for key, gemm in gemms.items():
            for _ in range(WARMUP):
                gemm()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPS):
                gemm()
            end.record()
            torch.cuda.synchronize()
            s = start.elapsed_time(end) / 1e3 / REPS
            row[f"{key}_tflops"] = round(2 * m * n * k / s / 1e12, 1)
            seconds[key] += s
        flops += 2 * m * n * k
        row["rowwise/tensorwise"] = round(row["rowwise_tflops"] / row["tensorwise_tflops"], 3)
        rows.append(row)
    print(json.dumps({"dev": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                      "layer_tflops": {k: round(flops / v / 1e12, 1) for k, v in seconds.items()},
                      "layer_rowwise/tensorwise": round(seconds["tensorwise"] / seconds["rowwise"], 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
