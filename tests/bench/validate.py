"""Predicted vs measured for every published run in tests/data (the README's validation table).

    python tests/bench/validate.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from published import published_case, published_runs, seed003_case, seed003_rows  # noqa: E402

from planner import flops  # noqa: E402
from planner.memory import stage_memory  # noqa: E402
from planner.rank import estimate  # noqa: E402


def seed003() -> None:
    print("seed 003, BigScience 1.3B on 2x4 V100 (examples/cluster-2x4-v100-*.yaml)")
    print(f"{'table':24} {'TP':>2} {'PP':>2} {'MBS':>3}  {'s/it meas':>9} {'pred':>6}  {'GB meas':>7} {'pred':>5}  fits")
    for row in seed003_rows():
        model, cluster, training, cand = seed003_case(row)
        est = estimate(model, cluster, training, cand)
        first = stage_memory(model, cand, cluster, training)[0].total_bytes / 2**30
        print(f"{row['table']:24} {cand.tp:2} {cand.pp:2} {cand.mbs:3}  "
              f"{row['seconds_per_iteration'] or row['status']:>9} {est.step_time_s:6.1f}  "
              f"{row['memory_gb'] or '-':>7} {first:5.1f}  {est.fits}")


def published() -> None:
    print("\npublished A100 runs (Megatron-LM 2021 Table 1: TFLOPs by Eq. 3; Korthikanti 2022: s/iteration, MFU)")
    print(f"{'run':48} {'measured':>10} {'predicted':>10}")
    for r in published_runs():
        model, cluster, training, cand = published_case(r)
        est = estimate(model, cluster, training, cand)
        meas = r["measured"]
        if "tflops_per_gpu" in meas:
            eq3 = flops.megatron_eq3_flops(global_batch=training.global_batch, seq_len=model.seq_len,
                                           layers=model.layers, hidden=model.hidden, vocab=model.vocab)
            pred = flops.tflops_per_gpu(eq3, est.step_time_s, cluster.world_size)
            print(f"{r['id']:48} {meas['tflops_per_gpu']:>7} TF {pred:>7.1f} TF")
        else:
            print(f"{r['id']:48} {meas['seconds_per_iteration']:>8} s {est.step_time_s:>8.2f} s   "
                  f"MFU {meas['mfu']:.3f} vs {est.throughput.mfu:.3f}")


if __name__ == "__main__":
    seed003()
    published()
