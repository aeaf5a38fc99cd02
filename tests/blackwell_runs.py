"""Rows of tests/data/published_2025_dev.yaml (a copy of ../shared/data) as planner inputs: NeMo 25.04/25.07's
DGX-GB200 (NVL72) pre-training table and torchao's B200 float8 / MXFP8 table of Llama 3 8B.

Assumptions the rows leave open, stated once here:
- NeMo GB200 rows: the cluster is the gb200-nvl72 preset (a job of 128 GPUs in 64-GPU segments) (18 trays of 4 GPUs per 72-GPU NVLink domain, a 400G NIC
  per GPU: the rows' "hardware" says NVL72 rack, 4 GPUs a node); Megatron-Core with the distributed optimizer (the
  table's FSDP 0), selective recompute and SP at TP > 1 (NeMo's recipes; "not stated"), FP8 per-tensor current
  scaling as the page says (--fp8-recipe tensorwise).
- torchao B200 rows: one DGX B200 (dgx-b200 preset); torchtitan FSDP2 over 8 GPUs (ZeRO-3), torch.compile, per-op
  selective AC, as the row states; float8 tensorwise / rowwise / MXFP8 (mxfp8_cublas) as its "precision".
"""

from __future__ import annotations

from pathlib import Path

import yaml

from planner.hardware import preset_cluster
from planner.model import ModelSpec, get_preset
from planner.space import Candidate, TrainingSpec
from search.published_runs import PublishedRun

DATA = Path(__file__).resolve().parent / "data" / "published_2025_dev.yaml"


def rows() -> dict[str, dict]:
    return {r["id"]: r for r in yaml.safe_load(DATA.read_text())}


def _dense(md: dict, name: str, *, glu: bool, activation: str = "") -> ModelSpec:
    return ModelSpec(name=name, layers=md["layers"], hidden=md["hidden"], heads=md["heads"],
                     kv_heads=md.get("kv_heads") or md["heads"], ffn_hidden=md["ffn_hidden"],
                     vocab=md.get("vocab") or 51200, seq_len=md["seq_len"], glu=glu, activation=activation,
                     tied_embeddings=False, position="rope", norm="rmsnorm" if glu else "layernorm", bias=False)


def nemo_gb200_run(row_id: str) -> PublishedRun:
    """A NeMo 25.04/25.07 DGX-GB200 row as Megatron-Core ran it (see the module's assumptions)."""
    r = rows()[row_id]
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    seq = md["seq_len"]
    if "Mixtral" in md["name"]:
        model = get_preset("mixtral-8x7b")
        model = ModelSpec(**{**{f: getattr(model, f) for f in model.__dataclass_fields__}, "seq_len": seq})
    elif md.get("num_experts"):   # Llama 4 Scout's language model: every layer 16 experts top-1 + a shared expert
        dense = _dense({**md, "ffn_hidden": md["moe_ffn_hidden"]}, md["name"], glu=True)
        model = ModelSpec(**{**{f: getattr(dense, f) for f in ModelSpec.__dataclass_fields__},
                             "num_experts": md["num_experts"],
                             "moe_topk": md["moe_topk"], "moe_ffn_hidden": md["moe_ffn_hidden"],
                             "shared_experts": md.get("shared_experts", 0)})
    else:   # GPT-3 175B (GeLU), Nemotron-4 (squared ReLU: relu's cost)
        model = _dense(md, md["name"], glu=False, activation="gelu" if "GPT" in md["name"] else "relu")
    tp, pp, dp, ep = p["tp"], p["pp"], p["dp"], p.get("ep", 1)
    mbs, gbs = p["micro_batch"], p["global_batch"]
    cluster = preset_cluster("gb200-nvl72", gpus=hw["total_gpus"])
    training = TrainingSpec(global_batch=gbs, seq_len=seq, precision="fp8", fp8_recipe="tensorwise",
                            framework="megatron-lm", flash_attention=True)
    cand = Candidate(tp=tp, pp=pp, dp=dp, ep=ep, mbs=mbs, gas=gbs // (mbs * dp), recompute="selective", zero=1,
                     sp=tp > 1, vpp=p.get("vpp") or 1)
    return PublishedRun(id=row_id, table="NeMo 25.04/25.07 DGX-GB200", framework="NeMo/Megatron-Core", model=model,
                        cluster=cluster, training=training, cand=cand,
                        tokens_per_s_per_gpu=me["tokens_per_s_per_gpu"], memory_gib=None, oom=False)


TORCHAO_RECIPES = {"tensorwise": ("fp8", "tensorwise"),
                   "rowwise": ("fp8", "rowwise"), "mxfp8": ("fp8", "mxfp8"), "bf16": ("bf16", "delayed")}


def torchao_run(row_id: str) -> PublishedRun:
    """A torchtitan/torchao Blackwell row of one dense model under FSDP2: torchao's "Training e2e benchmarks on NVIDIA
    B200" (Llama 3 8B on one DGX B200) or torchtitan's nvfp4.md evidence tables (Llama 3 8B / Qwen3 8B on 4 GPUs,
    GB200 as the row ASSUMES: one NVL72 tray)."""
    r = rows()[row_id]
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    text = str(p["precision"]).lower()
    precision, recipe = next(v for k, v in TORCHAO_RECIPES.items() if k in text)
    model = _dense(md, md["name"], glu=True)
    gpus = hw["total_gpus"]
    cluster = preset_cluster("dgx-b200" if str(hw["gpu"]).startswith("B200") else "gb200-nvl72", gpus=gpus)
    training = TrainingSpec(global_batch=p["global_batch"], seq_len=md["seq_len"], precision=precision,
                            fp8_recipe=recipe, framework="fsdp", flash_attention=True, torch_compile=True)
    cand = Candidate(tp=1, pp=1, dp=p["dp"], mbs=p["micro_batch"], gas=1, recompute="selective-op", zero=3)
    return PublishedRun(id=row_id, table=f"{md['name']} on {gpus} {cluster.gpu.id}", framework="torchtitan/torchao",
                        model=model, cluster=cluster, training=training, cand=cand,
                        tokens_per_s_per_gpu=me["tokens_per_s_per_gpu"], memory_gib=me.get("memory_gb_per_gpu"),
                        oom=False)
