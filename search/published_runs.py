"""One published run (copies in tests/data) as planner inputs and what was measured: the one home for
"a published dev row -> (model, cluster, training, candidate, measured outcome)".

Used by `search.published_tables` (``tune --results FILE.yaml`` replays them), tests/bench/validate.py,
tests/bench/memory_fit.py, tests/bench/bench_search.py and the tests that score the planner on the dev data.
README_published.md (in that folder) describes the fields.

Every assumption the sources leave open is stated once, below, beside the constant or function that holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from planner import flops
from planner.files import yaml_loaders
from planner.hardware import ClusterSpec, make_cluster
from planner.model import ModelSpec, get_preset
from planner.space import Candidate, TrainingSpec


@dataclass(frozen=True)
class PublishedRun:
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
    """measured peak memory per GPU, GiB (nvidia-smi's "GB" is MiB / 1024)"""
    oom: bool | None
    """True: ran out of memory; False: ran; None: not said"""
    memory_stage: str = "first"
    """which stage the memory figure is of: first (BigScience: first node) | max"""
    memory_definition: str = ""
    """what the memory figure counts: nvidia-smi (context and allocator cache included) | ..."""
    step_time_s: float | None = None
    """measured seconds per iteration where the source gives it"""
    caveat: str | None = None
    """why this run must not be compared with its table's other runs (the source's own warning), else None"""
    source_row: int = 0
    """position of the row in its file (1-based)"""

    def time_candidate(self) -> Candidate:
        """`cand` as run: the time model costs every recompute mode (planner.recompute: torchtitan's selective-op
        re-runs the matmuls op-level SAC does not save, selective-layer-N every N-th layer's forward)."""
        return self.cand


# -- networks (inter-node Gb/s per node) --------------------------------------------------------------------
# Jean Zay gpu_p5 A100: "4x100 Gb/s Omni-Path per node" (README_published.md, hardware.interconnect)
JZ_A100_GBPS = 400.0
# Jean Zay V100 partition: 100 Gb/s per node as examples/cluster-2x4-v100-32gb.yaml (ASSUMED; not in the data)
JZ_V100_GBPS = 100.0
# Selene (DGX A100 SuperPOD): 8 HDR 200 Gb/s compute NICs per node (NVIDIA DGX A100 user guide)
SELENE_GBPS = 1600.0
# fms-fsdp table header: 400 Gb/s per node on A100, 800 Gb/s on H100
FMS_GBPS = {"A100-80GB": 400.0, "H100-SXM": 800.0}
# Hagemann et al. 2023 do not state their network: ASSUMED DGX-A100-class 8x200 Gb/s per node (as Selene)
HAGEMANN_GBPS = 1600.0


def _cluster(gpu: str, gpus: int, gpus_per_node: int, inter_node_gbps: float | None) -> ClusterSpec:
    return make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps)


def _gpt_model(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
               ffn: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn_hidden=ffn or 4 * hidden, vocab=vocab, seq_len=seq)


# -- BLOOM tr11 prequel topology search (48x8 A100-80GB, Megatron-DeepSpeed bigscience fork, fp16) ----------
TR11_GROUP = "bloom176b_tr11_prequel_topology_search"
TR11_CAVEATS = (("different branches", "the source warns these rows ran on different code branches"),
                ("INCONSISTEN", "the source row is internally inconsistent (see its notes)"))


def tr11_layers(md: dict, pp: int) -> int:
    """NLAYERS of the 2022-02-20 tables ("tweaked to fit PP", not listed): the multiple of PP whose
    parameter count 12·l·h² + 13·l·h + V·h is nearest the table's params_b (INFERRED)."""
    if md.get("layers"):
        return int(md["layers"])
    h, v = md["hidden"], md["vocab"]
    raw = (md["params_b"] * 1e9 - v * h) / (12 * h * h + 13 * h)
    return max(pp, round(raw / pp) * pp)


def tr11_heads(md: dict) -> int:
    """NHEADS where a table does not give it (INFERRED): "all NHEADS=64 (above too)" for 02-21 on (notes); the
    02-20 tables at NHIDDEN 14400 continue the 02-17 200B setup "NLAYERS=80, NHIDDEN=14400, NHEADS=96"
    (chronicles-prequel.md, "Best TFLOPs")."""
    return md.get("heads") or (96 if md["hidden"] == 14400 else 64)


def tr11_section(notes: str) -> str:
    return notes.split("|")[0].replace("section:", "").strip()


def tr11_run(r: dict, line: int = 0) -> PublishedRun:
    """Full recompute (every tr11 slurm has --checkpoint-activations), ALiBi and embedding LayerNorm (the
    bloom-176b preset: tr11-176B-ml.slurm), FFN 4h, Jean Zay's 4x100 Gb/s."""
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    gpus = hw["total_gpus"]
    tp, pp = p["tp"], p["pp"]
    dp = gpus // (tp * pp)            # L648: DP=8 in the table is a typo for 4 (its notes)
    notes, verification = str(r.get("notes", "")), str(r.get("verification", ""))
    gbs = p["global_batch"]
    if "heading says GBS=512" in notes:
        gbs = 512                     # its logged TFLOPs and step time agree with 512, not the column's 2048
    model = get_preset("bloom-176b").with_overrides(
        name=md["name"], layers=tr11_layers(md, pp), hidden=md["hidden"], heads=tr11_heads(md),
        kv_heads=tr11_heads(md), ffn_hidden=4 * md["hidden"], vocab=md["vocab"], seq_len=md["seq_len"], rampup=None)
    zero = int(str(p["zero_stage"]).split()[0])
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16",
                            framework="megatron-deepspeed", flash_attention=False)
    # ZeRO-1 over one DP rank (L658-L660) is DeepSpeed's ZeRO optimizer, not ZeRO 0 (planner.memory.deepspeed_zero1_one_rank)
    cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=p["micro_batch"], gas=max(1, gbs // (p["micro_batch"] * dp)),
                     recompute="full", zero=zero)
    t = float(me["seconds_per_iteration"])
    caveat = next((why for text, why in TR11_CAVEATS if text in notes or text in verification), None)
    return PublishedRun(id=r["id"], table=f"bloom tr11: {tr11_section(notes)}", framework="Megatron-DeepSpeed",
                        model=model, cluster=_cluster("A100-80GB", gpus, 8, JZ_A100_GBPS), training=training,
                        cand=cand, tokens_per_s_per_gpu=gbs * md["seq_len"] / t / gpus,
                        memory_gib=me.get("memory_gb_per_gpu"), oom=False, memory_definition="nvidia-smi",
                        step_time_s=t, caveat=caveat, source_row=line)


# -- BigScience tr8-104B on 128 V100-32GB ------------------------------------------------------------------
def tr8_run(r: dict, line: int = 0) -> PublishedRun | None:
    """None for the rows the source invalidates (EXCLUDE/INVALID: FFN misconfig) or gives only as a range.
    Shape: "same conf as normal 104B" (the rows' notes) read as tr8b-104B, 64 layers x 11600 hidden x 80 heads
    (ASSUMED: the arch_notes allow tr8-104B-wide too)."""
    if "EXCLUDE" in str(r.get("notes", "")) or "INVALID" in r["id"] or "range" in str(r.get("verification", "")):
        return None
    p, hw, me = r["parallel"], r["hardware"], r["measured"]
    model = _gpt_model("bigscience tr8b-104B", 64, 11600, 80, 50257, 2048)
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    optimizer = "adamw-8bit" if "bnb" in str(p.get("optimizer", "")) else "adamw"
    training = TrainingSpec(global_batch=gbs, seq_len=2048, precision="fp16", framework="megatron-deepspeed",
                            optimizer=optimizer, flash_attention=False)
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],   # ZeRO-1 at DP 1 too (its data)
                     gas=gbs // (p["micro_batch"] * p["dp"]), recompute="full", zero=int(str(p["zero_stage"]).split()[0]))
    t = me.get("seconds_per_iteration")
    return PublishedRun(id=r["id"], table="bigscience tr8-104B on 128 V100", framework="Megatron-DeepSpeed",
                        model=model, cluster=_cluster("V100-32GB", gpus, 4, JZ_V100_GBPS), training=training,
                        cand=cand, tokens_per_s_per_gpu=gbs * 2048 / t / gpus if t else None,
                        memory_gib=me.get("memory_gb_per_gpu"), oom=bool(me.get("oom")),
                        memory_definition="nvidia-smi", step_time_s=float(t) if t else None, source_row=line)


# -- Narayanan et al. 2021 Table 2 (175B on Selene: PTD-P vs ZeRO-3) ---------------------------------------
def table2_run(r: dict, line: int = 0) -> PublishedRun:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    model = _gpt_model(md["name"], md["layers"], md["hidden"], md["heads"], md["vocab"], md["seq_len"],
                       md["ffn_hidden"])
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    zero3 = p["zero_stage"] == 3
    # ZeRO-3 without model parallelism: Megatron's layers under DeepSpeed's own engine, which Megatron-DeepSpeed's
    # microsoft fork runs at PP 1 (--no-pipeline-parallel; the bigscience fork always builds the pipeline engine,
    # which refuses ZeRO-2/3)
    fw = "megatron-deepspeed" if zero3 else "megatron-lm"
    # Megatron-LM of 2021 overlapped nothing (--overlap-grad-reduce / --overlap-param-gather came with Megatron-Core)
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16", framework=fw, flavor="microsoft",
                            flash_attention=False, overlap=None if zero3 else ())
    cand = Candidate(tp=p["tp"], pp=p["pp"], dp=p["dp"], mbs=p["micro_batch"],
                     gas=gbs // (p["micro_batch"] * p["dp"]), recompute="full", zero=3 if zero3 else 0)
    eq3 = flops.megatron_eq3_flops(global_batch=gbs, seq_len=md["seq_len"], layers=md["layers"],
                                   hidden=md["hidden"], vocab=md["vocab"])
    step = eq3 / (me["tflops_per_gpu"] * 1e12 * gpus)        # Table 2 TFLOPs are Eq. 3 (with recompute)
    return PublishedRun(id=r["id"], table=f"Narayanan 2021 Table 2 ({gpus} GPUs)",
                        framework="DeepSpeed ZeRO-3" if zero3 else "Megatron-LM", model=model,
                        cluster=_cluster("A100-80GB", gpus, 8, SELENE_GBPS), training=training, cand=cand,
                        tokens_per_s_per_gpu=gbs * md["seq_len"] / step / gpus, memory_gib=None, oom=False,
                        step_time_s=step, source_row=line)


# -- FSDP: torchtitan 2024-04 (64 A100) and fms-fsdp Llama-2 (A100/H100) -----------------------------------
def _llama_model(md: dict, name: str) -> ModelSpec:
    return ModelSpec(name=name, layers=md["layers"], hidden=md["hidden"], heads=md["heads"],
                     kv_heads=md.get("kv_heads") or md["heads"], ffn_hidden=md["ffn_hidden"], vocab=md["vocab"],
                     seq_len=md["seq_len"], glu=True, tied_embeddings=False, position="rope", norm="rmsnorm",
                     bias=False)


def fsdp_recompute(text: str, fms: bool) -> str:
    """torchtitan's "selective op" = selective-op, "selective layer" = selective-layer (every 2nd layer);
    fms-fsdp's "selective" checkpoints every k-th block (its selective_checkpointing): selective-layer."""
    t = str(text).lower()
    if "selective op" in t:
        return "selective-op"
    if "selective" in t:
        return "selective-layer"
    return "full" if "full" in t else "none"


def fsdp_runs(r: dict, line: int = 0) -> list[PublishedRun]:
    """The run (it trained, so it fits), and for torchtitan's footnote (Llama-2 70B at local batch 2 with
    selective AC ran out of memory) that OOM run too."""
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    fms = r["group"].startswith("fms")
    gpu = "H100-SXM" if hw["gpu"].startswith("H100") else "A100-80GB"
    gpus, gbs = hw["total_gpus"], p["global_batch"]
    table, framework = (("fms-fsdp Llama-2", "FSDP/fms-fsdp") if fms else ("torchtitan 2024-04", "FSDP/torchtitan"))
    model = _llama_model(md, r["id"])
    cluster = _cluster(gpu, gpus, 8, FMS_GBPS[gpu] if fms else None)
    recompute = fsdp_recompute(p["activation_recompute"], fms)
    hybrid = "HYBRID" in str(p.get("fsdp", ""))
    # fms-fsdp: FSDP1 and CrossEntropyLoss on the model's 16-bit logits (fms-fsdp main_training train_utils)
    trainer = "fms-fsdp" if fms else ""
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="bf16", framework="fsdp",
                            flash_attention=True, fsdp_trainer=trainer)
    cand = Candidate(tp=1, pp=1, dp=gpus, mbs=p["micro_batch"], gas=gbs // (p["micro_batch"] * gpus),
                     recompute=recompute, zero=3, hybrid=hybrid)
    out = [PublishedRun(id=r["id"], table=f"{table} on {gpus} {gpu}", framework=framework, model=model,
                        cluster=cluster, training=training, cand=cand,
                        tokens_per_s_per_gpu=me["tokens_per_s_per_gpu"], memory_gib=None, oom=False,
                        source_row=line)]
    if "bs2" in str(me.get("oom_note", "")):
        oom = Candidate(tp=1, pp=1, dp=gpus, mbs=2, gas=1, recompute=recompute, zero=3, hybrid=hybrid)
        out.append(PublishedRun(id=r["id"].replace("bs1", "bs2") + "_oom", table=f"{table} on {gpus} {gpu}",
                                framework=framework, model=model, cluster=cluster,
                                training=TrainingSpec(global_batch=2 * gpus, seq_len=md["seq_len"], precision="bf16",
                                                      framework="fsdp", flash_attention=True,
                                                      fsdp_trainer=trainer),
                                cand=oom, tokens_per_s_per_gpu=None, memory_gib=None, oom=True, source_row=line))
    return out


# -- torchtitan Dec 2024 (benchmarks/llama3_h100_202412_torchtitan.md): FSDP2 x TP x PP x CP on H100 -------------
TORCHTITAN_2412_GROUP = "torchtitan_2024_12_llama31_h100"
# Grand Teton: "RDMA backend network 400 Gb/s per GPU", 8 GPUs a node
TORCHTITAN_2412_GBPS = 8 * 400.0
# "Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth ... the default 500W power limit"
# (the benchmark file's Hardware section): the catalog's H100-HBM2e-96GB (its memory, bandwidth, and GEMM rate under
# the 500 W cap: planner/accelerators.yaml)
TORCHTITAN_2412_GPU = "H100-HBM2e-96GB"
# torchtitan at the benchmarked commit (9dec370, torchtitan/parallelisms/pipelining_utils.py): micro-batches default
# to the PP degree (experimental.pipeline_parallel_microbatches None -> pp) and a looped schedule builds 2 stages per
# rank (generate_split_points); float8 is torchao's tensorwise dynamic scaling with float8 all-gather
# (train_configs/llama3_405b.toml [float8]); selective AC is selective_ac_option "op" (llama3_8b.toml)
TORCHTITAN_2412_STAGES_PER_RANK = 2


def torchtitan_2412_run(r: dict, line: int = 0) -> PublishedRun:
    """One row of torchtitan's Dec-2024 H100 tables as the layout torchtitan ran (see the constants above)."""
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    tp, pp, cp, dp = (int(p[k]) for k in ("tp", "pp", "cp", "dp"))
    local = p["micro_batch"] if isinstance(p["micro_batch"], int) else int(re.findall(r"\d+", p["micro_batch"])[0])
    gbs = p.get("global_batch") or local * dp   # Table 6 gives the local batch only: global = local x FSDP degree
    mbs, gas = (local // pp, pp) if pp > 1 else (local, gbs // (local * dp))
    schedule = str(p.get("pipeline_schedule") or "").replace(" ", "")
    vpp = TORCHTITAN_2412_STAGES_PER_RANK if schedule.startswith("Interleaved") else 1
    precision = "fp8" if "float8" in str(p["precision"]).lower() else "bf16"
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision=precision, framework="fsdp",
                            flash_attention=True, fp8_recipe="tensorwise" if precision == "fp8" else "delayed",
                            pp_schedule=schedule if pp > 1 else "", torch_compile=bool(p.get("torch_compile")),
                            async_tp=bool(p.get("async_tp")) and tp > 1)
    recompute = "selective-op" if "selective" in str(p["activation_recompute"]) else "full"
    cand = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, gas=gas, recompute=recompute, zero=3, sp=tp > 1, vpp=vpp)
    gpus = hw["total_gpus"]
    cluster = _cluster(TORCHTITAN_2412_GPU, gpus, 8, TORCHTITAN_2412_GBPS)
    table = r["source"]["table"]
    return PublishedRun(id=r["id"], table=f"torchtitan 2024-12 {table}: {md['name']} on {gpus} H100",
                        framework="FSDP2/torchtitan 2024-12", model=_llama_model(md, r["id"]), cluster=cluster,
                        training=training, cand=cand, tokens_per_s_per_gpu=me["tokens_per_s_per_gpu"],
                        memory_gib=me.get("memory_gb_per_gpu"), oom=False, memory_stage="max",
                        memory_definition=str(me.get("memory_definition", "")), source_row=line)


# -- DeepSpeed autotuning of Hugging Face GPT-2 on one DGX-2 ------------------------------------------------
# The ZeRO stage of rows whose measured block leaves it out: GPT2-xl's "HF + DS hand-tuned" is "Zero1 (27.462, gas = 1,
# mbs = 1)" (DeepSpeedExamples autotuning/hf/gpt2-xl/README.md, Throughput Comparsion table)
DS_AUTOTUNING_ZERO = {"ds_autotuning_gpt2_xl_hf_ds_handtuned": 1}


def ds_autotuning_run(r: dict, line: int = 0) -> PublishedRun | None:
    md, p, hw, me = r["model"], r["parallel"], r["hardware"], r["measured"]
    if not me.get("samples_per_s") or not p.get("micro_batch"):
        return None
    # Hugging Face's GPT-2: activation_function gelu_new, NewGELUActivation's Python ops (transformers GPT2Config)
    model = _gpt_model(md["name"], md["layers"], md["hidden"], md["heads"], md["vocab"], md["seq_len"]).with_overrides(
        activation="gelu_tanh", activation_as_ops=True)
    gbs, gpus = p["global_batch"], hw["total_gpus"]
    z = str(p.get("zero_stage", DS_AUTOTUNING_ZERO.get(r["id"])))
    # with DeepSpeed: DeepSpeed's engine on the eager Hugging Face model (planner's `deepspeed`), at the run's ZeRO
    # stage; the vanilla HF baseline (DDP, no ZeRO) is the planner's eager framework, fsdp, at ZeRO 0 (NO_SHARD)
    ds = z.isdigit()
    training = TrainingSpec(global_batch=gbs, seq_len=md["seq_len"], precision="fp16",
                            framework="deepspeed" if ds else "fsdp", flash_attention=False,
                            fsdp_trainer="" if ds else "hugging-face")
    cand = Candidate(tp=1, pp=1, dp=gpus, mbs=p["micro_batch"], gas=gbs // (p["micro_batch"] * gpus),
                     zero=int(z) if ds else 0)
    # DGX-2: 16 V100-32GB on NVSwitch, one node (memory size not stated: ASSUMED 32 GB)
    return PublishedRun(id=r["id"], table=f"DeepSpeed autotuning HF {md['name']} on 16 V100",
                        framework="HF+DeepSpeed", model=model, cluster=_cluster("V100-32GB", gpus, 16, None),
                        training=training, cand=cand,
                        tokens_per_s_per_gpu=me["samples_per_s"] * md["seq_len"] / gpus, memory_gib=None,
                        oom=False, source_row=line)


# -- Hagemann et al. 2023: Llama 13B on A100-80GB, 422 configurations with OOMs ----------------------------
HAGEMANN_GBS = {2048: 2048, 8192: 512}
"""seq_len -> global batch (sequences): not in the sheets; MFU x step time implies them (file header)"""
HAGEMANN_NO_FLASH = ("torch", "fused")
"""kernel column values without FlashAttention (the others name flash_attention v1/v2)"""
HAGEMANN_KERNELS = {"torch": "unfused", "fused": "fused-softmax", "flash_attentionv1.0.8": "fa1",
                    "flash_attention2": "fa2"}
"""kernel column (its attention part, before " + RMS kernel") -> planner.attention's kernel: PyTorch's softmax ops,
Megatron's fused scale-mask-softmax, flash-attn v1.0.8, flash-attn 2"""
HAGEMANN_FUSED_NORM = ("RMS kernel", "fused")
"""kernel column values with a fused RMSNorm kernel ("+ RMS kernel", "fused"); the others use PyTorch's"""
HAGEMANN_RECOMPUTE = {"disabled": "none", "every_layer": "full"}


def hagemann_run(r: dict, line: int = 0) -> PublishedRun:
    """Their Megatron-style trainer holds 16-bit gradients and shards the optimizer over DP (INFERRED: Llama 13B
    at TP1 PP1 ran, which fp32 gradients, 4 bytes/param = 52 GB, beside 16-bit weights would not allow):
    planned as Megatron-DeepSpeed ZeRO-1, microsoft fork (the fork with FlashAttention). bf16; sequence
    parallelism only where TP > 1 (it is a no-op at TP 1). Its element-wise ops run as PyTorch ops (eager_ops;
    ASSUMED from Aleph Alpha's open-source successor, Aleph-Alpha/scaling: SwiGLU as silu(x) * gate in
    src/scaling/core/nn/mlp.py, RoPE as q·cos + rotate_half(q)·sin in rotary.py), the norms one kernel only with
    their "RMS kernel"; the attention kernel as the sheet's kernel column names it (HAGEMANN_KERNELS)."""
    seq = int(r["seq_len"])
    if seq not in HAGEMANN_GBS:
        raise ValueError(f"trial {r['trial_id']}: sequence length {seq} has no known global batch")
    recompute = HAGEMANN_RECOMPUTE.get(str(r["activation_checkpointing"]))
    if recompute is None:
        raise ValueError(f"trial {r['trial_id']}: activation_checkpointing {r['activation_checkpointing']!r} "
                         f"is not one of {', '.join(HAGEMANN_RECOMPUTE)}")
    error = r.get("error")
    if error is not None and "OOM" not in str(error):
        raise ValueError(f"trial {r['trial_id']}: error {error!r} is not an OOM; say what it is")
    gbs, kernel = HAGEMANN_GBS[seq], str(r["kernel"])
    # Hagemann et al. 2023 Sec. 4: Llama 13B (40 layers, 5120 hidden, 40 heads, vocab 32000), the llama2-13b shape
    model = get_preset("llama2-13b").with_overrides(name="hagemann-llama-13b", seq_len=seq, rampup=None)
    training = TrainingSpec(global_batch=gbs, seq_len=seq, precision="bf16", framework="megatron-deepspeed",
                            flavor="microsoft", flash_attention=kernel not in HAGEMANN_NO_FLASH,
                            attention_kernel=HAGEMANN_KERNELS[kernel.split(" + ")[0]],
                            fused_norm=any(k in kernel for k in HAGEMANN_FUSED_NORM), eager_ops=True,
                            recompute_options=("none", "full"), zero_options=(1,))
    tp, pp, dp, mbs = (int(r[k]) for k in ("tp", "pp", "dp", "micro_batch"))
    cand = Candidate(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=max(1, gbs // (mbs * dp)), recompute=recompute,
                     zero=1 if dp > 1 else 0, sp=bool(r["sequence_parallel"]) and tp > 1)
    sheet = Path(str(r["file"])).stem
    t = None if error else float(r["step_time_s"])
    world = int(r["world_size"])
    return PublishedRun(id=f"hagemann_{r['trial_id']}", table=f"Hagemann {sheet}",
                        framework="Megatron-style (Hagemann)", model=model,
                        cluster=_cluster("A100-80GB", world, 8, HAGEMANN_GBPS), training=training, cand=cand,
                        tokens_per_s_per_gpu=None if error else gbs * seq / t / world, memory_gib=None,
                        oom=bool(error),
                        step_time_s=t, source_row=line)


# -- published_modern_dev.yaml: MT-NLG 530B, MegaScale 175B, torchtitan Dec-2024 H100, NeMo 24.07 H100 FP8 -----------
MODERN_SOURCES = {"mtnlg530b": "MT-NLG 530B (Smith et al. 2022)", "megascale": "MegaScale 2024 Table 2",
                  "torchtitan_2024_12": "torchtitan Dec-2024 H100", "nemo_2407": "NeMo 24.07 H100 FP8"}
# MegaScale does not give its network: ASSUMED 8x200 Gb/s HDR per node, as Selene (A100 generation)
MEGASCALE_GBPS = 1600.0
# NeMo's DGX-H100: 8 NDR 400 Gb/s NICs
NEMO_GBPS = 3200.0
# GPT-3 uses GPT-2's BPE vocabulary (Brown et al. 2020 Sec. 2.1): 50257, where NeMo's table gives no vocabulary
GPT3_VOCAB = 50257


def modern_source(group: str) -> str | None:
    return next((name for prefix, name in MODERN_SOURCES.items() if group.startswith(prefix)), None)


def _int_in(text: object) -> int | None:
    m = re.search(r"\d+", str(text))
    return int(m.group()) if m else None


def modern_run(r: dict, line: int = 0) -> PublishedRun | None:
    """One run of published_modern_dev.yaml, or None where the row lacks the architecture or a throughput.

    ASSUMED where the sources are silent (each the framework's default or the common practice of the time):
    MegaScale's and NeMo's recompute is selective (Megatron's --recompute-activations) with SP at TP > 1 and the
    distributed optimizer (ZeRO-1); MegaScale's micro-batch is 1; MT-NLG ran bf16, micro-batch 1, full recompute,
    ZeRO-1 (Smith et al. 2022 Sec. 2); torchtitan's rows as `torchtitan_2412_run` reads them (its pipeline splits a
    rank's local batch into PP micro-batches, its interleaved schedule runs 2 stages a rank); MegaScale's baseline
    Megatron overlaps nothing and MegaScale's own runs overlap TP, PP and DP communication (its Table 3 ablation),
    NeMo overlaps as Megatron-LM's default here. The H100s' 500 W cap (torchtitan) is not modelled."""
    g, md, p, hw, me = str(r.get("group", "")), r["model"], r["parallel"], r["hardware"], r["measured"]
    source = modern_source(g)
    if source is None or not all(k in md for k in ("layers", "hidden", "heads")):
        return None
    if g == TORCHTITAN_2412_GROUP:   # as torchtitan ran it (its schedules, float8, compile, async TP)
        return replace(torchtitan_2412_run(r, line), framework=source)
    gpus, seq = hw["total_gpus"], md["seq_len"]
    tp, pp, cp = p.get("tp", 1), p.get("pp", 1), p.get("cp", 1) or 1
    dp = p.get("dp") or gpus // (tp * pp * cp)
    llama = "llama" in md["name"].lower()
    if llama:
        model = _llama_model(md, md["name"])
    else:
        model = _gpt_model(md["name"], md["layers"], md["hidden"], md["heads"], md.get("vocab") or GPT3_VOCAB, seq,
                           md.get("ffn_hidden"))
    precision_text = str(p.get("precision", "")).lower()
    precision = "fp8" if "fp8" in precision_text or "float8" in precision_text else "bf16"
    vpp = p.get("virtual_pipeline") or 1
    if source.startswith("MT-NLG"):
        framework, zero, flash, overlap, mbs, recompute = "megatron-deepspeed", 1, False, None, 1, "full"
        gbs, sp = p["global_batch"], False
        cluster = _cluster("A100-80GB", gpus, 8, SELENE_GBPS)
    else:   # Megatron-LM: MegaScale's baseline and its own, NeMo 24.07
        framework, zero, flash, recompute, sp = "megatron-lm", 1, True, "selective", tp > 1
        gbs = p["global_batch"]
        mbs = p["micro_batch"] if isinstance(p.get("micro_batch"), int) else 1
        if source.startswith("MegaScale"):
            ours = "megascale" in r["id"].split("_")[3]
            overlap = ("grad-reduce", "param-gather", "tp-comm", "p2p") if ours else ()
            cluster = _cluster("A100-80GB", gpus, 8, MEGASCALE_GBPS)
        else:
            overlap = None
            cluster = _cluster("H100-SXM", gpus, 8, NEMO_GBPS)
    tps = me.get("tokens_per_s_per_gpu")
    step = me.get("seconds_per_iteration")
    if not tps and step:
        tps = gbs * seq / step / gpus
    if not tps:
        return None
    training = TrainingSpec(global_batch=gbs, seq_len=seq, precision=precision, framework=framework,
                            flash_attention=flash, overlap=overlap)
    cand = Candidate(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, gas=max(1, gbs // (mbs * dp)), recompute=recompute,
                     zero=zero, sp=sp, vpp=vpp)
    return PublishedRun(id=r["id"], table=f"{source}: {g}", framework=source, model=model, cluster=cluster,
                        training=training, cand=cand, tokens_per_s_per_gpu=tps, memory_gib=None, oom=False,
                        step_time_s=step, source_row=line)


def modern_runs(rows: list[dict]) -> list[PublishedRun]:
    """The usable runs of published_modern_dev.yaml (rows without an architecture or a throughput left out)."""
    return [x for i, r in enumerate(rows, 1) if (x := modern_run(r, i)) is not None]


# -- the files ---------------------------------------------------------------------------------------------
def read_rows(path: str | Path) -> list[dict]:
    data = yaml.load(Path(path).read_text(), Loader=yaml_loaders()[1])   # noqa: S506 - safe_load's, on libyaml
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ValueError(f"{path}: expected a YAML list of runs (published_dev.yaml or hagemann_13b_dev.yaml)")
    return data


def dev_runs(rows: list[dict]) -> list[PublishedRun]:
    """Every usable run of published_dev.yaml's rows (flagged INVALID/EXCLUDE/range rows left out)."""
    out: list[PublishedRun | None] = []
    for i, r in enumerate(rows, 1):
        g = str(r.get("group", ""))
        if g == TR11_GROUP:
            out.append(tr11_run(r, i))
        elif g.startswith("bigscience_tr8"):
            out.append(tr8_run(r, i))
        elif g.startswith("megatron2021_table2"):
            out.append(table2_run(r, i))
        elif g == TORCHTITAN_2412_GROUP:
            out.append(torchtitan_2412_run(r, i))
        elif g.startswith(("torchtitan", "fms_fsdp")):
            out += fsdp_runs(r, i)
        elif g.startswith("deepspeed_autotuning"):
            out.append(ds_autotuning_run(r, i))
    return [c for c in out if c is not None]


def hagemann_runs(rows: list[dict]) -> list[PublishedRun]:
    return [hagemann_run(r, i) for i, r in enumerate(rows, 1)]


def read_runs(path: str | Path) -> list[PublishedRun]:
    """The runs of a published_dev.yaml or hagemann_13b_dev.yaml file."""
    rows = read_rows(path)
    if "trial_id" in rows[0]:
        return hagemann_runs(rows)
    if "group" in rows[0]:
        return dev_runs(rows)
    raise ValueError(f"{path}: not a published_dev.yaml or hagemann_13b_dev.yaml list (no group/trial_id keys)")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
