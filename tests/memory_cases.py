"""Dev-data runs with a memory outcome, as planner inputs: Hagemann et al.'s 422 Llama-13B rows (ran / OOM),
BLOOM tr11 and tr8-104B nvidia-smi maxima, torchtitan and fms-fsdp runs (ran, so they must fit).

Shared by tests/test_memory_published.py and tests/bench/memory_fit.py. Reads tests/data (copies of
../shared/data/hagemann_13b_dev.yaml and published_dev.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from planner.hardware import ClusterSpec, make_cluster
from planner.model import ModelSpec, get_preset
from planner.space import Candidate, TrainingSpec

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class MemoryCase:
    id: str
    table: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    cand: Candidate
    ran: bool
    """the run trained (False: the source reports an out-of-memory error)"""
    measured_gib: float | None = None
    """peak memory per GPU in GiB as the source measured it (None: not recorded)"""
    definition: str = ""
    """what the measurement counts: nvidia-smi (context and allocator cache included) | peak allocated"""
    fused_norm: bool | None = None
    """the run normalised with a fused kernel (None: the framework's default)"""


def _hagemann_model(seq_len: int) -> ModelSpec:
    # Hagemann et al. 2023 Sec. 4: Llama 13B (40 layers, 5120 hidden, 40 heads, vocab 32000), the llama2-13b shape
    return get_preset("llama2-13b").with_overrides(seq_len=seq_len, name="hagemann-llama-13b")


def hagemann_cases() -> list[MemoryCase]:
    """Hagemann et al. 2023 sheets (A100-80GB). GBS 2048 at seq 2048 and 512 at seq 8192 (the file header:
    implied by MFU x step time). Their framework holds 16-bit gradients and shards the optimizer over DP
    (inferred: Llama 13B at TP1 PP1 ran, which fp32 gradients, 4 bytes/param = 52 GB, plus 16-bit weights
    would not allow); modelled as DeepSpeed-style ZeRO-1 (framework megatron-deepspeed)."""
    rows = yaml.safe_load((DATA / "hagemann_13b_dev.yaml").read_text())
    out = []
    for r in rows:
        seq = int(r["seq_len"])
        gbs = 2048 if seq == 2048 else 512
        model = _hagemann_model(seq)
        flash = "flash" in r["kernel"]
        training = TrainingSpec(global_batch=gbs, seq_len=seq, precision="bf16", framework="megatron-deepspeed",
                                flash_attention=flash)
        tp, pp, dp, mbs = (int(r[k]) for k in ("tp", "pp", "dp", "micro_batch"))
        recompute = "full" if r["activation_checkpointing"] == "every_layer" else "none"
        cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=max(gbs // (mbs * dp), 1), recompute=recompute,
                         zero=1 if dp > 1 else 0, sp=bool(r["sequence_parallel"]))
        cluster = make_cluster(gpu="A100-80GB", gpus=int(r["world_size"]))
        # the sheets' kernel column: "+ RMS kernel" and "fused" are fused RMSNorm kernels, the others PyTorch's
        fused = "RMS kernel" in r["kernel"] or r["kernel"] == "fused"
        out.append(MemoryCase(id=f"hagemann_{r['trial_id']}", table=Path(r["file"]).stem, model=model,
                              cluster=cluster, training=training, cand=cand, ran=not r.get("error"), fused_norm=fused))
    return out


def _published_rows() -> list[dict]:
    return yaml.safe_load((DATA / "published_dev.yaml").read_text())


def _gpt_shape(r: dict) -> ModelSpec:
    """A BigScience GPT-style shape; layers from params_b when the table does not list them (12·L·h² + V·h)."""
    m = r["model"]
    h, v = m["hidden"], m["vocab"]
    layers = m.get("layers") or round((m["params_b"] * 1e9 - v * h) / (12 * h * h))
    # assumed where the table does not say (only the no-flash score term uses it): head size 128 or 120
    heads = m.get("heads") or h // next(d for d in (128, 120, 96, 64) if h % d == 0)
    return ModelSpec(name=r["id"], layers=layers, hidden=h, heads=heads, kv_heads=heads, ffn_hidden=4 * h,
                     vocab=v, seq_len=m["seq_len"], position="alibi", embedding_norm=True)


def bigscience_cases() -> list[MemoryCase]:
    """BLOOM tr11 prequel (48x8 A100-80GB, fp16, full recompute, ZeRO-1) and tr8-104B (V100-32GB):
    nvidia-smi's maximum on the first node. tr8 rows flagged EXCLUDE/INVALID are skipped."""
    out = []
    for r in _published_rows():
        g, p, meas = r["group"], r["parallel"], r["measured"]
        if g not in ("bloom176b_tr11_prequel_topology_search", "bigscience_tr8_104b_v100_tuning"):
            continue
        if "EXCLUDE" in (r.get("notes") or "") or "INVALID" in r["id"]:
            continue
        if g == "bloom176b_tr11_prequel_topology_search":
            model, gpu = _gpt_shape(r), "A100-80GB"
        else:
            if "16nodes" in r["id"] or "a100" in r["id"]:
                continue
            # tr8-104B-wide: 32 layers x 16384 hidden x 32 heads (bigscience tr8-104B slurm); the table does not
            # restate which of the two 104B shapes it ran, the wide one is assumed
            model = ModelSpec(name=r["id"], layers=32, hidden=16384, heads=32, kv_heads=32, ffn_hidden=4 * 16384,
                              vocab=50257, seq_len=2048)
            gpu = "V100-32GB"
        optimizer = "adamw-8bit" if "bnb" in str(p.get("optimizer", "")) else "adamw"
        zero = 0 if str(p.get("zero_stage")).strip().startswith("0") else 1
        tp, pp, dp, mbs, gbs = p["tp"], p["pp"], p["dp"], p["micro_batch"], p["global_batch"]
        training = TrainingSpec(global_batch=gbs, seq_len=model.seq_len, precision="fp16", optimizer=optimizer,
                                framework="megatron-deepspeed", flash_attention=False)
        cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=max(gbs // (mbs * dp), 1), recompute="full",
                         zero=zero if dp > 1 else 0)
        gpus = tp * pp * dp
        per_node = 8 if gpu.startswith("A100") else 4
        cluster = make_cluster(gpu=gpu, gpus=max(gpus, per_node), gpus_per_node=per_node)
        gb = meas.get("memory_gb_per_gpu")  # nvidia-smi "GB" is MiB / 1024 (A100-80GB tops out at 80)
        out.append(MemoryCase(id=r["id"], table=g, model=model, cluster=cluster, training=training, cand=cand,
                              ran=not meas.get("oom"), measured_gib=gb, definition="nvidia-smi"))
    return out


def _recompute_of(text: str) -> str:
    text = text.lower()
    if "selective op" in text:
        return "selective-op"
    if "selective layer" in text:
        return "selective-layer"
    if "selective" in text:
        return "selective"
    return "full" if "full" in text else "none"


def fsdp_cases() -> list[MemoryCase]:
    """torchtitan 2024-04 (FSDP2 on 64 A100) and fms-fsdp (FSDP/HSDP on A100/H100): every listed run trained.
    torchtitan's footnote: Llama-2 70B at local batch 2 with selective AC ran out of memory."""
    out = []
    for r in _published_rows():
        g, p, m = r["group"], r["parallel"], r["model"]
        if g not in ("torchtitan_2024_04_a100", "fms_fsdp_llama2_a100_h100"):
            continue
        kv = m.get("kv_heads") or m["heads"]
        model = ModelSpec(name=r["id"], layers=m["layers"], hidden=m["hidden"], heads=m["heads"], kv_heads=kv,
                          ffn_hidden=m["ffn_hidden"], vocab=m["vocab"], seq_len=m["seq_len"], glu=True,
                          tied_embeddings=False, position="rope", norm="rmsnorm", bias=False)
        gpu = "H100-SXM" if "H100" in r["hardware"]["gpu"] else "A100-80GB"
        cluster = make_cluster(gpu=gpu, gpus=r["hardware"]["total_gpus"])
        training = TrainingSpec(global_batch=p["global_batch"], seq_len=m["seq_len"], framework="fsdp")
        hybrid = "HYBRID" in p["fsdp"]
        recompute = _recompute_of(str(p["activation_recompute"]))
        if g.startswith("fms") and recompute == "selective":
            recompute = "selective-layer"  # fms-fsdp's "selective" checkpoints every k-th block (selective_checkpointing)
        cand = Candidate(tp=1, pp=1, dp=p["dp"], mbs=p["micro_batch"], gas=1, recompute=recompute, zero=3,
                         hybrid=hybrid)
        out.append(MemoryCase(id=r["id"], table=g, model=model, cluster=cluster, training=training, cand=cand,
                              ran=True))
        if "oom_note" in r["measured"] and "bs2" in r["measured"]["oom_note"]:
            oom = Candidate(tp=1, pp=1, dp=p["dp"], mbs=2, gas=1, recompute=recompute, zero=3)
            out.append(MemoryCase(id=r["id"].replace("bs1", "bs2") + "_oom", table=g, model=model, cluster=cluster,
                                  training=TrainingSpec(global_batch=2 * p["dp"], seq_len=m["seq_len"],
                                                        framework="fsdp"), cand=oom, ran=False))
    return out


def all_cases() -> list[MemoryCase]:
    return hagemann_cases() + bigscience_cases() + fsdp_cases()

