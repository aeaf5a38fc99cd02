"""Every rule a candidate must pass, as a named check returning (Reason, detail).

Structural rules come from ../shared/MEGATRON_DEEPSPEED.md (megatron/arguments.py,
microbatches.py, DeepSpeed's pipeline engine) and the seeds; memory rules from
`planner.memory`. `violations()` returns all of them, so `--explain` can list every reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from planner import context_parallel, fp8, moe
from planner.hardware import ClusterSpec
from planner.memory import MemoryBreakdown
from planner.model import ModelSpec
from planner.rampup import rampup_problems
from planner.space import Candidate, TrainingSpec


class Reason(str, Enum):
    WORLD_SIZE = "world_size"
    TP_EXCEEDS_NODE = "tp_exceeds_node"
    TP_HEADS = "tp_divides_heads"
    TP_KV_HEADS = "tp_divides_kv_heads"
    TP_FFN = "tp_divides_ffn"
    PP_LAYERS = "pp_divides_layers"
    PP_EXCEEDS_LAYERS = "pp_exceeds_layers"
    VIRTUAL_PIPELINE = "virtual_pipeline"
    BATCH_DIVISIBILITY = "gbs_eq_mbs_dp_gas"
    MICROBATCHES_LT_STAGES = "microbatches_lt_stages"
    RAMPUP = "rampup_divisibility"
    FRAMEWORK_LIMIT = "framework_limit"
    REDUNDANT = "redundant"
    MEMORY_STATIC = "memory_static_rule"
    MEMORY_TOTAL = "memory_total"
    # context parallel, experts, FP8 (planner.context_parallel, planner.moe, planner.fp8)
    CP_SEQUENCE = "cp_sequence_divisibility"
    EP_EXPERTS = "ep_divides_experts"
    EP_GROUP = "ep_within_data_parallel"
    ETP_FFN = "etp_divides_expert_ffn"
    MOE_SP = "moe_needs_sequence_parallel"
    FP8_HARDWARE = "fp8_needs_hardware"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Violation:
    reason: Reason
    detail: str

    def to_dict(self) -> dict:
        return {"reason": self.reason.value, "detail": self.detail}


def structural_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec,
                          training: TrainingSpec) -> list[Violation]:
    """All non-memory rules; cheap, run before any memory or time is estimated."""
    out: list[Violation] = []
    fw = training.framework
    world = cluster.world_size
    if c.world != world:
        out.append(Violation(Reason.WORLD_SIZE, f"TP({c.tp}) * CP({c.cp}) * PP({c.pp}) * DP({c.dp}) = {c.world} "
                                                f"!= world size {world}"))
    if c.tp > cluster.gpus_per_node:
        out.append(Violation(Reason.TP_EXCEEDS_NODE, f"TP {c.tp} > {cluster.gpus_per_node} GPUs per node: TP "
                                                     "all-reduces every layer and must stay on the intra-node link (seed 004)"))
    if model.heads % c.tp:
        out.append(Violation(Reason.TP_HEADS, f"heads {model.heads} % TP {c.tp} != 0 (megatron/arguments.py)"))
    if model.kv_heads % c.tp and c.tp % model.kv_heads:
        out.append(Violation(Reason.TP_KV_HEADS, f"kv_heads {model.kv_heads} and TP {c.tp} do not divide each other"))
    if model.ffn_hidden % c.tp:
        out.append(Violation(Reason.TP_FFN, f"ffn_hidden {model.ffn_hidden} % TP {c.tp} != 0"))
    if c.pp > model.layers:
        out.append(Violation(Reason.PP_EXCEEDS_LAYERS, f"PP {c.pp} > {model.layers} layers"))
    elif model.layers % c.pp and fw == "fsdp":
        out.append(Violation(Reason.PP_LAYERS, f"layers {model.layers} % PP {c.pp} != 0 ({fw} needs equal stages; "
                                               "DeepSpeed's pipeline engine and Megatron-LM's "
                                               "--decoder-first/last-pipeline-num-layers split unevenly)"))
    if c.vpp > 1:
        if fw != "megatron-lm":
            out.append(Violation(Reason.VIRTUAL_PIPELINE, f"virtual pipeline stages need megatron-lm, not {fw}"))
        elif c.pp <= 2 or -(-model.layers // c.pp) % c.vpp or c.gas % c.pp:
            # Megatron-Core: each rank's layers split into VPP equal chunks; uneven first/last stages
            # (--decoder-first/last-pipeline-num-layers) absorb a remainder of layers % PP
            out.append(Violation(Reason.VIRTUAL_PIPELINE, f"interleaved 1F1B needs PP > 2, the {-(-model.layers // c.pp)} "
                                                          f"layers per stage divisible by VPP {c.vpp}, and micro-batches "
                                                          f"{c.gas} % PP == 0"))
    if c.mbs * c.dp * c.gas != training.global_batch:
        out.append(Violation(Reason.BATCH_DIVISIBILITY, f"GBS {training.global_batch} != MBS({c.mbs}) * DP({c.dp}) "
                                                        f"* GAS({c.gas}) = {c.mbs * c.dp * c.gas}"))
    if c.pp > 1 and c.gas < c.pp:
        out.append(Violation(Reason.MICROBATCHES_LT_STAGES, f"{c.gas} micro-batches < {c.pp} pipeline stages: "
                                                            "1F1B cannot fill the pipeline"))
    if training.rampup is not None:
        for problem in rampup_problems(training.rampup, training.global_batch, c.mbs, c.dp):
            out.append(Violation(Reason.RAMPUP, problem))
    out.extend(_framework_violations(c, training))
    for rules in (context_parallel.violations, moe.violations, fp8.violations):   # CP, EP/ETP, FP8
        out.extend(Violation(Reason(r), d) for r, d in rules(model, c, cluster, training))
    if c.zero > 0 and c.dp * c.cp == 1:
        out.append(Violation(Reason.REDUNDANT, f"ZeRO-{c.zero} with DP=1 shards nothing: same as ZeRO-0"))
    if c.sp and c.tp == 1:
        out.append(Violation(Reason.REDUNDANT, "sequence parallel with TP=1 is forced off by Megatron"))
    return out


def _framework_violations(c: Candidate, training: TrainingSpec) -> list[Violation]:
    fw = training.framework
    out = []
    if fw == "megatron-deepspeed":
        if c.zero >= 2:
            out.append(Violation(Reason.FRAMEWORK_LIMIT, f"ZeRO-{c.zero} is incompatible with DeepSpeed's pipeline "
                                                         "engine, which the BigScience fork always uses"))
        if c.recompute == "selective" or c.sp:
            out.append(Violation(Reason.FRAMEWORK_LIMIT, "selective recompute and sequence parallel are not in the "
                                                         "BigScience fork (use --framework megatron-lm)"))
    elif fw == "megatron-lm":
        if c.zero >= 2:
            out.append(Violation(Reason.FRAMEWORK_LIMIT, f"Megatron-LM shards only optimizer states (distributed "
                                                         f"optimizer = ZeRO-1), not ZeRO-{c.zero}"))
    elif fw == "fsdp":
        if c.tp > 1 or c.pp > 1:
            out.append(Violation(Reason.FRAMEWORK_LIMIT, "plain FSDP (seed 002) has no tensor or pipeline parallelism"))
        if c.zero == 1:
            out.append(Violation(Reason.FRAMEWORK_LIMIT, "FSDP has no ZeRO-1 strategy (NO_SHARD, SHARD_GRAD_OP, "
                                                         "FULL_SHARD, HYBRID_SHARD)"))
    if c.hybrid and (fw != "fsdp" or c.zero != 3):
        out.append(Violation(Reason.FRAMEWORK_LIMIT, "HYBRID_SHARD is an FSDP FULL_SHARD variant"))
    return out


def memory_violations(mem: MemoryBreakdown, cluster: ClusterSpec, training: TrainingSpec) -> list[Violation]:
    """Seed 004's rule on model states, then everything against the device memory."""
    out = []
    capacity = cluster.gpu.memory_bytes
    budget = training.memory_fraction * capacity
    if mem.static_bytes > budget:
        out.append(Violation(Reason.MEMORY_STATIC,
                             f"weights+grads+optimizer {mem.static_bytes / 1e9:.1f} GB > {training.memory_fraction:.0%} "
                             f"of {capacity / 1e9:.1f} GB (seed 004: model states must leave room for activations)"))
    usable = (1 - training.memory_headroom) * capacity
    if mem.total_bytes > usable:
        out.append(Violation(Reason.MEMORY_TOTAL,
                             f"predicted {mem.total_bytes / 1e9:.1f} GB on the {mem.stage} stage > {usable / 1e9:.1f} GB "
                             f"({1 - training.memory_headroom:.0%} of {capacity / 1e9:.1f} GB) "
                             f"(activations {mem.activations_bytes / 1e9:.1f}, logits {mem.logits_bytes / 1e9:.1f}, "
                             f"model states {mem.static_bytes / 1e9:.1f})"))
    return out
