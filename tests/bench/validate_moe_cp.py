"""Predicted vs published throughput for context-parallel, MoE and FP8 runs (issue 14).

    python tests/bench/validate_moe_cp.py

Each row is a published layout; the planner scores that exact layout (TP, PP, CP, DP, EP, VP, MBS, GBS) and
reports the best of recompute none/selective/full and ZeRO 0/1 that fits, against the published model
TFLOP/s per GPU. Sources:
- Llama 3: Dubey et al. 2024 (arXiv 2407.21783) Table 4 (BF16, H100, 16M-token batches).
- Megatron-Bridge: NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11 container, DGX-H100 and
  DGX-B200 pre-training tables (FP8 current scaling on H100, MXFP8 on B200; MoE runs force-balanced, dropless).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ROWS = [  # source, model, gpu, GPUs, precision, GBS, MBS, seq, TP, PP, CP, VP, EP, published TFLOP/s/GPU
    ("Llama 3 Table 4", "llama3-405b", "H100", 8192, "bf16", 2048, 1, 8192, 8, 16, 1, None, 1, 430),
    ("Llama 3 Table 4", "llama3-405b", "H100", 16384, "bf16", 2048, 1, 8192, 8, 16, 1, None, 1, 400),
    ("Llama 3 Table 4", "llama3.1-405b", "H100", 16384, "bf16", 128, 1, 131072, 8, 16, 16, None, 1, 380),
    ("Megatron-Bridge 25.11 H100", "llama3-70b", "H100", 64, "fp8", 128, 1, 8192, 4, 8, 1, 5, 1, 719),
    ("Megatron-Bridge 25.11 H100", "llama3.1-405b", "H100", 1024, "fp8", 512, 1, 8192, 8, 8, 2, 8, 1, 737),
    ("Megatron-Bridge 25.11 H100", "qwen3-30b-a3b", "H100", 16, "fp8", 512, 2, 4096, 1, 2, 1, 24, 8, 121),
    ("Megatron-Bridge 25.11 B200", "deepseek-v3", "B200", 256, "fp8", 2048, 1, 4096, 1, 16, 1, 1, 8, 557),
    ("Megatron-Bridge 25.11 B200", "qwen3-30b-a3b", "B200", 8, "fp8", 512, 1, 4096, 1, 1, 1, 1, 8, 214),
]


def predict(model: str, gpu: str, gpus: int, precision: str, gbs: int, mbs: int, seq: int, tp: int, pp: int,
            cp: int, vp: int | None, ep: int) -> tuple[float, str] | None:
    from planner import load_model, make_cluster
    from planner.rank import estimate
    from planner.space import Candidate, TrainingSpec

    m, cluster = load_model(model), make_cluster(gpu=gpu, gpus=gpus)
    t = TrainingSpec(global_batch=gbs, seq_len=seq, precision=precision, framework="megatron-lm")
    dp = gpus // (tp * pp * cp)
    best = None
    for recompute in ("none", "selective", "full"):
        for zero in (0, 1):
            for vpp in ([vp] if vp else [1, 2, 4, 8]):
                c = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, gas=gbs // (mbs * dp), recompute=recompute,
                              zero=zero, sp=tp > 1, vpp=vpp)
                e = estimate(m, cluster, t, c)
                if e.throughput and not any(v.reason.value.startswith("memory") for v in e.reasons):
                    tf = e.throughput.model_tflops_per_gpu
                    if best is None or tf > best[0]:
                        best = (tf, f"recompute={recompute} zero={zero} vpp={vpp} {e.memory.total_gb:.0f} GB"
                                    + (f" [{', '.join(v.reason.value for v in e.reasons)}]" if e.reasons else ""))
    return best


def main() -> int:
    print(f"{'source':28} {'model':15} {'GPUs':>6} {'prec':5} {'TP/PP/CP/EP':12} {'published':>9} {'predicted':>9} "
          f"{'ratio':>6}  chosen")
    for src, model, gpu, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep, pub in ROWS:
        best = predict(model, gpu, gpus, prec, gbs, mbs, seq, tp, pp, cp, vp, ep)
        pred, note = best if best else (float("nan"), "does not fit")
        print(f"{src:28} {model:15} {gpu + 'x' + str(gpus):>6} {prec:5} {f'{tp}/{pp}/{cp}/{ep}':12} {pub:9.0f} "
              f"{pred:9.0f} {pred / pub:6.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
