"""Turn the rows of tests/data (seed 003's V100 tables, published_public.yaml) into planner inputs.

Shared by the validation tests and tests/bench/validate.py.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import yaml

from planner import flops
from planner.hardware import ClusterSpec, load_cluster, make_cluster
from planner.model import ModelSpec, get_preset
from planner.space import Candidate, TrainingSpec

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
    training = TrainingSpec(global_batch=p["global_batch"], seq_len=md["seq_len"], precision="fp16",
                            framework="megatron-lm", flash_attention=False)
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],
                     gas=p["global_batch"] // (p["micro_batch"] * p["dp"]), recompute=recompute,
                     sp=bool(p.get("sequence_parallel")), vpp=p.get("virtual_pipeline") or 1)
    return model, cluster, training, cand


# -- the development split: published_dev.yaml and hagemann_13b_dev.yaml --------------------------------------
@dataclass(frozen=True)
class DevCase:
    """One published run as planner inputs, with what was measured (like for like: tokens/s per GPU)."""

    id: str
    table: str
    """runs of one model on one cluster in one search: ranking is judged inside a table"""
    framework: str
    """the framework as published (for error by framework)"""
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    cand: Candidate
    tokens_per_s_per_gpu: float | None
    """measured throughput; None where the run only gives memory or OOM"""
    memory_gib: float | None
    """measured peak memory per GPU (nvidia-smi / peak reserved), GiB"""
    oom: bool | None
    """True: ran out of memory; False: ran; None: not said"""
    memory_stage: str = "first"
    """which stage the memory figure is of: first (BigScience: first node) | max"""


def _cluster(gpu: str, gpus: int, gpus_per_node: int, inter_node_gbps: float | None) -> ClusterSpec:
    return make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps)


# Jean Zay gpu_p5 (README_published.md: "4x100 Gb/s Omni-Path per node"); V100 partition: the same
# 100 Gb/s per node as examples/cluster-2x4-v100-32gb.yaml (an assumption the data does not settle).
JZ_A100_GBPS, JZ_V100_GBPS = 400.0, 100.0
# Selene (DGX A100 SuperPOD): 8 HDR 200 Gb/s compute NICs per node (NVIDIA DGX A100 user guide).
SELENE_GBPS = 1600.0


def _gpt_model(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
               ffn: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn_hidden=ffn or 4 * hidden, vocab=vocab, seq_len=seq)


def _bloom_layers(md: dict, pp: int) -> int:
    """NLAYERS of the 2022-02-20 tables ("tweaked to fit PP", not listed): the multiple of PP whose
    parameter count 12·l·h² + V·h is nearest the table's params_b (inferred)."""
    if md.get("layers"):
        return int(md["layers"])
    h, v = md["hidden"], md["vocab"]
    raw = (md["params_b"] * 1e9 - v * h) / (12 * h * h + 13 * h)
    return max(pp, round(raw / pp) * pp)


def _bloom(r: dict) -> DevCase:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    gpus = hw["total_gpus"]
    tp, pp = p["tp"], p["pp"]
    dp = gpus // (tp * pp)            # L648: DP=8 in the table is a typo for 4 (its notes)
    notes = r["notes"]
    gbs = p["global_batch"]
    if "heading says GBS=512" in notes:
        gbs = 512                     # its logged TFLOPs and step time agree with 512, not the column's 2048
    # heads: the NHEADS tables give their own; "all NHEADS=64 (above too)" for 02-21 on (notes); the 02-20
    # tables at NHIDDEN 14400 continue the 02-17 200B setup "NLAYERS=80, NHIDDEN=14400, NHEADS=96"
    # (chronicles-prequel.md, "Best TFLOPs"), an inference
    heads = md.get("heads") or (96 if md["hidden"] == 14400 else 64)
    model = _gpt_model(md["name"], _bloom_layers(md, pp), md["hidden"], heads, md["vocab"], md["seq_len"])
    zero = int(str(p["zero_stage"]).split()[0])
    section = notes.split("|")[0].replace("section:", "").strip()
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16",
                            framework="megatron-deepspeed", flash_attention=False)
    cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=p["micro_batch"], gas=max(1, gbs // (p["micro_batch"] * dp)),
                     recompute="full", zero=zero if dp > 1 else 0)
    tps = gbs * md["seq_len"] / me["seconds_per_iteration"] / gpus
    return DevCase(id=r["id"], table=f"bloom tr11: {section}", framework="Megatron-DeepSpeed", model=model,
                   cluster=_cluster("A100-80GB", gpus, 8, JZ_A100_GBPS), training=training, cand=cand,
                   tokens_per_s_per_gpu=tps, memory_gib=me.get("memory_gb_per_gpu"), oom=False)


def _tr8(r: dict) -> DevCase | None:
    if "EXCLUDE" in r["notes"] or "range" in r["verification"]:
        return None
    p, hw, me = r["parallel"], r["hardware"], r["measured"]
    # "same conf as normal 104B": tr8b-104B, 64 layers x 11600 hidden x 80 heads (the row's arch_notes)
    model = _gpt_model("bigscience tr8b-104B", 64, 11600, 80, 50257, 2048)
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    training = TrainingSpec(global_batch=gbs, seq_len=2048, precision="fp16", framework="megatron-deepspeed",
                            flash_attention=False)
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"], gas=gbs // (p["micro_batch"] * p["dp"]),
                     recompute="full", zero=1 if p["dp"] > 1 else 0)
    t = me.get("seconds_per_iteration")
    return DevCase(id=r["id"], table="bigscience tr8-104B on 128 V100", framework="Megatron-DeepSpeed", model=model,
                   cluster=_cluster("V100-32GB", gpus, 4, JZ_V100_GBPS), training=training, cand=cand,
                   tokens_per_s_per_gpu=gbs * 2048 / t / gpus if t else None, memory_gib=me.get("memory_gb_per_gpu"),
                   oom=bool(me.get("oom")))


def _table2(r: dict) -> DevCase:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    model = _gpt_model(md["name"], md["layers"], md["hidden"], md["heads"], md["vocab"], md["seq_len"],
                       md["ffn_hidden"])
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    zero3 = p["zero_stage"] == 3
    fw = "megatron-deepspeed" if zero3 else "megatron-lm"
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16", framework=fw,
                            flash_attention=False)
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],
                     gas=gbs // (p["micro_batch"] * p["dp"]), recompute="full", zero=3 if zero3 else 0)
    eq3 = flops.megatron_eq3_flops(global_batch=gbs, seq_len=md["seq_len"], layers=md["layers"],
                                   hidden=md["hidden"], vocab=md["vocab"])
    step = eq3 / (me["tflops_per_gpu"] * 1e12 * gpus)        # Table 2 TFLOPs are Eq. 3 (with recompute)
    return DevCase(id=r["id"], table=f"Narayanan 2021 Table 2 ({gpus} GPUs)",
                   framework="DeepSpeed ZeRO-3" if zero3 else "Megatron-LM", model=model,
                   cluster=_cluster("A100-80GB", gpus, 8, SELENE_GBPS), training=training, cand=cand,
                   tokens_per_s_per_gpu=gbs * md["seq_len"] / step / gpus, memory_gib=None, oom=False)


def _llama_model(md: dict) -> ModelSpec:
    return ModelSpec(name=md["name"], layers=md["layers"], hidden=md["hidden"], heads=md["heads"],
                     kv_heads=md.get("kv_heads") or md["heads"], ffn_hidden=md["ffn_hidden"], vocab=md["vocab"],
                     seq_len=md["seq_len"], glu=True, tied_embeddings=False, position="rope", norm="rmsnorm",
                     bias=False)


def _recompute(text: str) -> str:
    """torchtitan's "selective op" ~ Megatron selective; "selective layer" (every 2nd layer fully
    checkpointed) and fms-fsdp's "selective" (a fraction of layers) counted as full (an approximation)."""
    t = str(text)
    if t.startswith("none"):
        return "none"
    if "op" in t.split():
        return "selective"
    return "full"


def _fsdp(r: dict, table: str, framework: str, inter_gbps: dict[str, float | None]) -> DevCase:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    model = _llama_model(md)
    gpu = "H100-SXM" if hw["gpu"].startswith("H100") else "A100-80GB"
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    hybrid = "HYBRID" in str(p.get("fsdp", ""))
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="bf16", framework="fsdp",
                            flash_attention=True)
    cand = Candidate(tp=1, pp=1, dp=gpus, mbs=p["micro_batch"], gas=gbs // (p["micro_batch"] * gpus),
                     recompute=_recompute(p["activation_recompute"]), zero=3, hybrid=hybrid)
    return DevCase(id=r["id"], table=f"{table} on {gpus} {gpu}", framework=framework, model=model,
                   cluster=_cluster(gpu, gpus, 8, inter_gbps[gpu]), training=training, cand=cand,
                   tokens_per_s_per_gpu=me["tokens_per_s_per_gpu"], memory_gib=None, oom=False)


def _ds_autotuning(r: dict) -> DevCase | None:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    if not me.get("samples_per_s") or not p.get("micro_batch"):
        return None
    model = _gpt_model(md["name"], md["layers"], md["hidden"], md["heads"], md["vocab"], md["seq_len"])
    gbs, gpus = p["global_batch"], hw["total_gpus"]
    z = str(p.get("zero_stage"))
    # an eager Hugging Face model: the planner's eager framework is fsdp (ZeRO stage as the run had it)
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16", framework="fsdp",
                            flash_attention=False)
    cand = Candidate(tp=1, pp=1, dp=gpus, mbs=p["micro_batch"], gas=gbs // (p["micro_batch"] * gpus),
                     zero=int(z) if z.isdigit() else 0)
    # DGX-2: 16 V100-32GB on NVSwitch, one node (memory size not stated: assumed 32 GB)
    return DevCase(id=r["id"], table=f"DeepSpeed autotuning HF {md['name']} on 16 V100", framework="HF+DeepSpeed",
                   model=model, cluster=_cluster("V100-32GB", gpus, 16, None), training=training, cand=cand,
                   tokens_per_s_per_gpu=me["samples_per_s"] * md["seq_len"] / gpus, memory_gib=None, oom=False)


# Hagemann et al. 2023: the sheets' GBS (MFU x step time implies 2048 sequences at seq 2048, 512 at 8192)
HAGEMANN_GBS = {2048: 2048, 8192: 512}


def _hagemann(r: dict) -> DevCase:
    from planner.model import get_preset

    seq = r["seq_len"]
    model = get_preset("llama2-13b").with_overrides(seq_len=seq)
    gbs = HAGEMANN_GBS[seq]
    kernel = r["kernel"]
    training = TrainingSpec(global_batch=gbs, seq_len=seq, precision="bf16", framework="megatron-lm",
                            flash_attention="flash" in kernel)
    tp, pp, dp, mbs = r["tp"], r["pp"], r["dp"], r["micro_batch"]
    # Aleph Alpha's Megatron-style trainer shards the optimizer over DP (ZeRO-1; 13B at DP=64 fits only so)
    cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=max(1, gbs // (mbs * dp)),
                     recompute="full" if r["activation_checkpointing"] == "every_layer" else "none",
                     zero=1 if dp > 1 else 0, sp=bool(r["sequence_parallel"]) and tp > 1)
    sheet = r["file"].rsplit("/", 1)[-1].removesuffix(".xlsx")
    oom = bool(r.get("error"))
    tps = None if oom else gbs * seq / r["step_time_s"] / r["world_size"]
    return DevCase(id=f"hagemann_{r['trial_id']}", table=f"Hagemann {sheet}", framework="Megatron-style (Hagemann)",
                   model=model, cluster=_cluster("A100-80GB", r["world_size"], 8, 1600.0), training=training,
                   cand=cand, tokens_per_s_per_gpu=tps, memory_gib=None, oom=oom)


def dev_cases() -> list[DevCase]:
    """Every usable dev run as planner inputs (flagged INVALID/EXCLUDE/range rows left out)."""
    out: list[DevCase | None] = []
    for r in yaml.safe_load((DATA / "published_dev.yaml").read_text()):
        g = r["group"]
        if g.startswith("bloom176b"):
            out.append(_bloom(r))
        elif g.startswith("bigscience_tr8"):
            out.append(_tr8(r))
        elif g.startswith("megatron2021_table2"):
            out.append(_table2(r))
        elif g.startswith("torchtitan"):
            out.append(_fsdp(r, "torchtitan 2024-04", "FSDP/torchtitan", {"A100-80GB": None}))
        elif g.startswith("fms_fsdp"):
            # table header: 400 Gb/s per node on A100, 800 Gb/s on H100
            out.append(_fsdp(r, "fms-fsdp Llama-2", "FSDP/fms-fsdp", {"A100-80GB": 400.0, "H100-SXM": 800.0}))
        elif g.startswith("deepspeed_autotuning"):
            out.append(_ds_autotuning(r))
    out += [_hagemann(r) for r in yaml.safe_load((DATA / "hagemann_13b_dev.yaml").read_text())]
    return [c for c in out if c is not None]


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
                           oom=row["status"].lower() == "oom" if row["status"] else None))
    return out
