"""Predicted vs measured for every published run in tests/data (the README's validation table).

    python tests/bench/validate.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from planner import flops  # noqa: E402
from planner.hardware import load_cluster, make_cluster  # noqa: E402
from planner.memory import stage_memory  # noqa: E402
from planner.model import ModelSpec, get_preset  # noqa: E402
from planner.rank import estimate  # noqa: E402
from planner.space import Candidate, TrainingSpec  # noqa: E402

DATA = ROOT / "tests" / "data"


def seed003() -> None:
    model = get_preset("1B3")
    training = TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", flash_attention=False)
    print("seed 003, BigScience 1.3B on 2x4 V100 (examples/cluster-2x4-v100-*.yaml)")
    print(f"{'table':24} {'TP':>2} {'PP':>2} {'MBS':>3}  {'s/it meas':>9} {'pred':>6}  {'GB meas':>7} {'pred':>5}  fits")
    for row in csv.DictReader((DATA / "bigscience_1b3_v100.csv").open()):
        cluster = load_cluster(str(ROOT / "examples" / f"cluster-2x4-v100-{row['gpu_mem_gb']}gb.yaml"))
        tp, pp, dp, mbs = (int(row[k]) for k in ("tp", "pp", "dp", "micro_batch"))
        cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=512 // (mbs * dp), recompute=row["activation_recompute"],
                         zero=1 if dp > 1 else 0)
        est = estimate(model, cluster, training, cand)
        first = stage_memory(model, cand, cluster, training)[0].total_bytes / 2**30
        print(f"{row['table']:24} {tp:2} {pp:2} {mbs:3}  {row['seconds_per_iteration'] or row['status']:>9} "
              f"{est.step_time_s:6.1f}  {row['memory_gb'] or '-':>7} {first:5.1f}  {est.fits}")


def published() -> None:
    print("\npublished A100 runs (Megatron-LM 2021 Table 1: TFLOPs by Eq. 3; Korthikanti 2022: s/iteration, MFU)")
    print(f"{'run':48} {'measured':>10} {'predicted':>10}")
    for r in yaml.safe_load((DATA / "published_public.yaml").read_text()):
        md, p, meas = r["model"], r["parallel"], r["measured"]
        m = ModelSpec(name=r["id"], layers=md["layers"], hidden=md["hidden"], heads=md["heads"], kv_heads=md["heads"],
                      ffn_hidden=md["ffn_hidden"], vocab=md["vocab"], seq_len=md["seq_len"])
        cluster = make_cluster(gpu="A100-80GB", gpus=r["hardware"]["total_gpus"])
        ac = p["activation_recompute"]
        rec = "selective" if "selective" in ac else ("full" if "full" in ac else "none")
        cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],
                         gas=p["global_batch"] // (p["micro_batch"] * p["dp"]), recompute=rec,
                         sp=bool(p.get("sequence_parallel")), vpp=p.get("virtual_pipeline") or 1)
        training = TrainingSpec(global_batch=p["global_batch"], seq_len=md["seq_len"], precision="fp16",
                                framework="megatron-lm", flash_attention=False)
        est = estimate(m, cluster, training, cand)
        if "tflops_per_gpu" in meas:
            eq3 = flops.megatron_eq3_flops(global_batch=p["global_batch"], seq_len=md["seq_len"], layers=md["layers"],
                                           hidden=md["hidden"], vocab=md["vocab"])
            pred = flops.tflops_per_gpu(eq3, est.step_time_s, cluster.world_size)
            print(f"{r['id']:48} {meas['tflops_per_gpu']:>7} TF {pred:>7.1f} TF")
        else:
            print(f"{r['id']:48} {meas['seconds_per_iteration']:>8} s {est.step_time_s:>8.2f} s   "
                  f"MFU {meas['mfu']:.3f} vs {est.throughput.mfu:.3f}")


if __name__ == "__main__":
    seed003()
    published()
