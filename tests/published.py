"""Turn the rows of tests/data (seed 003's V100 tables, published_public.yaml) into planner inputs; the dev
split (published_dev.yaml, hagemann_13b_dev.yaml) comes from search.published_runs.

Shared by the validation tests and tests/bench/validate.py.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import yaml

from planner.hardware import ClusterSpec, load_cluster, make_cluster
from planner.model import ModelSpec, get_preset
from planner.space import Candidate, TrainingSpec
from search.published_runs import PublishedRun, modern_runs, read_rows, read_runs
from search.published_tables import PublishedTable, read_tables

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

# BigScience tr3m-1B3 as benchmarked in seed 003: fp16, Megatron-DeepSpeed (ZeRO-1 where DP > 1),
# GBS 512, seq 2048, no FlashAttention, on examples/cluster-2x4-v100-{16,32}gb.yaml.
SEED003_TRAINING = TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", framework="megatron-deepspeed",
                                flash_attention=False)


def seed003_rows() -> list[dict]:
    return list(csv.DictReader((DATA / "bigscience_1b3_v100.csv").open()))


def seed003_case(row: dict) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Candidate]:
    cluster = load_cluster(str(ROOT / "examples" / f"cluster-2x4-v100-{row['gpu_mem_gb']}gb.yaml"))
    tp, pp, dp, mbs = (int(row[k]) for k in ("tp", "pp", "dp", "micro_batch"))
    cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=512 // (mbs * dp), recompute=row["activation_recompute"],
                     zero=1 if dp > 1 else 0)
    return get_preset("1B3"), cluster, SEED003_TRAINING, cand


def published_runs() -> list[dict]:
    return yaml.safe_load((DATA / "published_public.yaml").read_text())


def published_case(run: dict) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Candidate]:
    """A published A100 run as Megatron-LM ran it (fp16, no FlashAttention, its recompute/SP/VPP)."""
    md, p = run["model"], run["parallel"]
    model = ModelSpec(name=run["id"], layers=md["layers"], hidden=md["hidden"], heads=md["heads"],
                      kv_heads=md["heads"], ffn_hidden=md["ffn_hidden"], vocab=md["vocab"], seq_len=md["seq_len"])
    cluster = make_cluster(gpu="A100-80GB", gpus=run["hardware"]["total_gpus"], gpus_per_node=8)
    ac = p["activation_recompute"]
    recompute = "selective" if "selective" in ac else ("full" if "full" in ac else "none")
    # Megatron-LM of 2021-22 overlapped no communication (--overlap-grad-reduce / --overlap-param-gather and
    # overlap_p2p_comm came with Megatron-Core, 2023)
    training = TrainingSpec(global_batch=p["global_batch"], seq_len=md["seq_len"], precision="fp16",
                            framework="megatron-lm", flash_attention=False, overlap=())
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],
                     gas=p["global_batch"] // (p["micro_batch"] * p["dp"]), recompute=recompute,
                     sp=bool(p.get("sequence_parallel")), vpp=p.get("virtual_pipeline") or 1)
    return model, cluster, training, cand


# -- the development split: published_dev.yaml and hagemann_13b_dev.yaml --------------------------------------
# One home for the conversion and its assumptions: search.published_runs (tune replays the same runs).
DevCase = PublishedRun


@functools.cache
def runs_of(name: str) -> tuple[DevCase, ...]:
    """``read_runs`` of tests/data/``name``, read once per test process: the runs are frozen, and several test
    modules read the same file (~1.4 s of CPU for the two dev files)."""
    return tuple(read_runs(DATA / name))


@functools.cache
def tables_of(name: str) -> tuple[PublishedTable, ...]:
    """``read_tables`` of tests/data/``name``, read once per test process (frozen tables, as `runs_of`)."""
    return tuple(read_tables(str(DATA / name)))


def dev_cases() -> list[DevCase]:
    """Every usable dev run as planner inputs (flagged INVALID/EXCLUDE/range rows left out)."""
    return [*runs_of("published_dev.yaml"), *runs_of("hagemann_13b_dev.yaml")]


def modern_dev_cases() -> list[DevCase]:
    """published_modern_dev.yaml's usable runs (search.published_runs.modern_runs)."""
    return modern_runs(read_rows(DATA / "published_modern_dev.yaml"))


def modern_torchtitan_cases() -> list[DevCase]:
    """torchtitan's Dec-2024 H100 runs (FSDP2 x TP x PP x CP, float8, compile) of published_modern_dev.yaml."""
    return [c for c in modern_dev_cases() if c.id.startswith("torchtitan_2024_12")]


def seed003_dev_cases() -> list[DevCase]:
    """Seed 003's V100 tables as DevCases (a table per GPU memory x recompute)."""
    out = []
    for row in seed003_rows():
        model, cluster, training, cand = seed003_case(row)
        t = row["seconds_per_iteration"]
        out.append(DevCase(id=f"seed003_{row['table']}_tp{cand.tp}_pp{cand.pp}_mbs{cand.mbs}",
                           table=f"seed 003 {row['table']}", framework="Megatron-DeepSpeed", model=model,
                           cluster=cluster, training=training, cand=cand,
                           tokens_per_s_per_gpu=512 * 2048 / float(t) / cluster.world_size if t else None,
                           memory_gib=float(row["memory_gb"]) if row["memory_gb"] else None,
                           memory_definition="nvidia-smi",   # seed 003's figures and its context calibration
                           oom=row["status"].lower() == "oom" if row["status"] else None))
    return out
