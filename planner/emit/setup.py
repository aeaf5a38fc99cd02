"""`RunSetup` (what an emitter renders) and the one list of rules an emitted config must obey.

Every rule here is one that would make the framework refuse the config at start-up or, worse,
crash hours into the run (a rampup batch size not divisible by MBS·DP is asserted at every
iteration). The facts come from ../shared/MEGATRON_DEEPSPEED.md, which cites the forks'
megatron/arguments.py, megatron/microbatches.py and DeepSpeed's pipeline engine.

    >>> from planner.emit.setup import setup_problems      # [] when the setup can be emitted
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from planner.emit import parallel_extras
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.rampup import rampup_problems
from planner.space import RECOMPUTE, Candidate, TrainingSpec

KINDS = ("megatron-deepspeed", "megatron-lm", "fsdp")
FLAVORS = ("bigscience", "microsoft")
"""Megatron-DeepSpeed forks: bigscience-workshop/Megatron-DeepSpeed, microsoft (now deepspeedai)/Megatron-DeepSpeed"""

MEGATRON_OPTIMIZERS = {"adamw": "adam", "sgd": "sgd"}
"""plantune optimizer -> Megatron's --optimizer (Megatron's adam is AdamW: decoupled weight decay)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the planner predicted for the chosen layout (recorded in plan.yaml, never recomputed here)."""

    memory_gb_per_gpu: float
    """peak memory per GPU, GB = 1e9 bytes"""
    step_time_s: float
    """one optimizer step at the final global batch"""
    model_tflops_per_gpu: float
    """model FLOPs (no recompute) per second per GPU / 1e12"""
    hardware_tflops_per_gpu: float
    """hardware FLOPs (recompute included) per second per GPU / 1e12"""
    mfu: float
    """model FLOPs utilisation, a fraction of the GPU's dense peak"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSetup:
    """Everything an emitter needs: the model, the cluster, what is fixed, the chosen layout."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    candidate: Candidate
    prediction: Prediction | None = None


def train_samples(training: TrainingSpec) -> int | None:
    """Megatron's ``--train-samples``: the token budget in whole sequences (rounded up); None when unknown."""
    if training.train_tokens is None:
        return None
    return math.ceil(training.train_tokens / training.seq_len)


def one_line(text: str) -> str:
    """Text safe inside a one-line comment of a written file (control characters become spaces)."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


def _common_problems(s: RunSetup) -> list[str]:
    m, c, t, cl = s.model, s.candidate, s.training, s.cluster
    sizes = {"tp": c.tp, "pp": c.pp, "dp": c.dp, "mbs": c.mbs, "gas": c.gas, "vpp": c.vpp}
    bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:  # nothing else can be checked (or divided by)
        return [f"layout sizes must be positive integers, got {', '.join(bad)}"]
    out: list[str] = []
    if c.world != cl.world_size:
        out.append(f"TP({c.tp})*PP({c.pp})*DP({c.dp}) = {c.world} != world size {cl.world_size} of the cluster "
                   f"({cl.nodes} nodes x {cl.gpus_per_node} GPUs); pick DP = world / (TP*PP)")
    if c.global_batch != t.global_batch:
        unit = c.mbs * c.dp
        fix = (f"use GAS = {t.global_batch // unit}" if t.global_batch % unit == 0
               else f"the global batch must be a multiple of MBS*DP = {unit}")
        out.append(f"MBS({c.mbs})*DP({c.dp})*GAS({c.gas}) = {c.global_batch} != global batch {t.global_batch}; {fix}")
    if c.recompute not in RECOMPUTE:
        out.append(f"recompute {c.recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if m.heads % c.tp:
        out.append(f"attention heads {m.heads} are not divisible by TP {c.tp}; use a TP that divides {m.heads}")
    if m.kv_heads % c.tp:
        out.append(f"key/value heads {m.kv_heads} are not divisible by TP {c.tp}; use a TP that divides {m.kv_heads}")
    if m.ffn_hidden % c.tp:
        out.append(f"ffn hidden {m.ffn_hidden} is not divisible by TP {c.tp}")
    if c.sp and c.tp == 1:
        out.append("sequence parallelism needs TP > 1 (Megatron silently turns it off at TP=1); set sp=0")
    if t.seq_len > m.seq_len:
        out.append(f"sequence length {t.seq_len} exceeds the model's {m.seq_len} positions; "
                   f"use --seq-len <= {m.seq_len} or raise the model's seq_len")
    if t.precision == "bf16" and cl.gpu.peak_bf16_flops is None:
        out.append(f"{cl.gpu.id} has no bf16; use --precision fp16")
    if t.rampup is not None:
        out += [f"rampup {' '.join(map(str, t.rampup.as_list()))}: {p}"
                for p in rampup_problems(t.rampup, t.global_batch, c.mbs, c.dp)]
    return out


def _megatron_optimizer_problems(t: TrainingSpec) -> list[str]:
    if t.optimizer in MEGATRON_OPTIMIZERS:
        return []
    return [f"optimizer {t.optimizer!r} has no Megatron flag; plan with one of {', '.join(MEGATRON_OPTIMIZERS)}"]


def _megatron_deepspeed_problems(s: RunSetup, flavor: str) -> list[str]:
    m, c, t = s.model, s.candidate, s.training
    out = _megatron_optimizer_problems(t)
    if c.hybrid:
        out.append("hybrid sharding is an FSDP strategy; Megatron-DeepSpeed has no HYBRID_SHARD (set hybrid=0)")
    if c.vpp > 1:
        out.append(f"virtual pipeline (vpp={c.vpp}) is not available under DeepSpeed's pipeline engine; set vpp=1")
    if c.zero not in (0, 1, 2, 3):
        out.append(f"ZeRO stage {c.zero} does not exist; use 0-3")
    if flavor == "bigscience":
        if c.zero in (2, 3):
            out.append(f"ZeRO-{c.zero} is refused by DeepSpeed's pipeline engine, which the bigscience fork always "
                       "uses; use ZeRO 0 or 1 (or --emit-flavor microsoft with PP=1)")
        cannot = [(c.recompute == "selective", "selective recompute (use recompute=full: --checkpoint-activations)"),
                  (c.sp, "sequence parallelism"),
                  (m.kv_heads != m.heads, f"grouped-query attention ({m.kv_heads} kv heads)"),
                  (t.flash_attention, "FlashAttention (plan with flash attention off)"),
                  (m.norm == "rmsnorm", "RMSNorm"),
                  (not m.tied_embeddings, "untied input/output embeddings"),
                  (not m.bias, "linear layers without biases")]
        out += [f"the bigscience fork cannot express {what}; use --emit-flavor microsoft or change the plan"
                for bad, what in cannot if bad]
    else:
        if c.zero in (2, 3) and c.pp > 1:
            out.append(f"ZeRO-{c.zero} with PP={c.pp} is refused by DeepSpeed's pipeline engine "
                       "('incompatible with pipeline parallelism'); use ZeRO 0/1 or PP=1 (--no-pipeline-parallel)")
        cannot = [(m.position == "alibi", "ALiBi positions (use --emit-flavor bigscience)"),
                  (m.embedding_norm, "a layernorm after the word embedding (use --emit-flavor bigscience)")]
        out += [f"the microsoft fork cannot express {what}" for bad, what in cannot if bad]
    return out


def _megatron_lm_problems(s: RunSetup) -> list[str]:
    m, c = s.model, s.candidate
    out = _megatron_optimizer_problems(s.training)
    if c.hybrid:
        out.append("hybrid sharding is an FSDP strategy; Megatron-LM has no HYBRID_SHARD (set hybrid=0)")
    if c.zero not in (0, 1):
        out.append(f"Megatron-LM has no ZeRO-{c.zero}; use zero=0, or zero=1 (--use-distributed-optimizer)")
    if m.layers % c.pp:
        out.append(f"{m.layers} layers are not divisible by PP {c.pp} (required without DeepSpeed's pipeline "
                   "engine); pick a PP that divides the layer count")
    if c.vpp > 1:
        if c.pp <= 2:
            out.append(f"virtual pipeline needs PP > 2, got PP={c.pp}; set vpp=1")
        elif m.layers % (c.pp * c.vpp):
            out.append(f"{m.layers} layers are not divisible by PP*VPP = {c.pp * c.vpp}; pick another vpp")
    if m.position == "alibi":
        out.append("Megatron-LM has no ALiBi positions; emit this model for the bigscience fork")
    if m.embedding_norm:
        out.append("Megatron-LM has no layernorm after the word embedding; emit this model for the bigscience fork")
    return out


def _fsdp_problems(s: RunSetup) -> list[str]:
    c = s.candidate
    out: list[str] = []
    if c.zero not in (0, 2, 3):
        out.append(f"FSDP has no ZeRO-{c.zero} strategy; use zero=0 (NO_SHARD), 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD)")
    if c.hybrid and c.zero != 3:
        out.append(f"hybrid sharding is HYBRID_SHARD (ZeRO-3 inside a node); set zero=3, got zero={c.zero}")
    if c.vpp > 1 and s.model.layers % (c.pp * c.vpp):
        out.append(f"{s.model.layers} layers are not divisible by PP*VPP = {c.pp * c.vpp}; pick another vpp")
    return out


def setup_problems(setup: RunSetup, kind: str, flavor: str = "bigscience") -> list[str]:
    """Every rule the setup breaks for this emitter kind (and fork flavor); empty when it can be emitted."""
    if kind not in KINDS:
        return [f"unknown emitter kind {kind!r}; use one of {', '.join(KINDS)}"]
    if kind == "megatron-deepspeed" and flavor not in FLAVORS:
        return [f"unknown Megatron-DeepSpeed flavor {flavor!r}; use one of {', '.join(FLAVORS)}"]
    out = _common_problems(setup)
    if kind == "megatron-deepspeed":
        out += _megatron_deepspeed_problems(setup, flavor)
    elif kind == "megatron-lm":
        out += _megatron_lm_problems(setup)
    else:
        out += _fsdp_problems(setup)
    out += parallel_extras.problems(setup, kind)   # CP / EP / MoE / FP8, by the planner's rules for this target
    return out


__all__ = ["FLAVORS", "KINDS", "MEGATRON_OPTIMIZERS", "Prediction", "RunSetup", "one_line", "setup_problems",
           "train_samples"]
