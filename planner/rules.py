"""The one rulebook: whether a layout is legal for a target, every rule a named Reason with a detail.

A *target* is what will run the layout: a framework and, for Megatron-DeepSpeed, the fork flavour
(``plan``, ``--emit``, ``tune --probe megatron``), or the torch-native probe (``tune``). Enumeration
(`planner.space`) is a plain product; `plan` ranks what passes here, the emitters (`planner.emit`)
and the probe layout (`probes.layout`) refuse what fails here, so every survivor can be emitted,
probed and launched as ranked.

- `layout_violations`: the per-candidate rules of one target (cheap, no memory model);
- `model_violations`: what a target cannot express at all (a fork without GQA, an optimizer with no flag);
- `memory_violations` / `memory_advice`: the predicted total against the GPU (prunes) and seed 004's
  75% model-states rule (an advisory mark, not a wall);
- `setup_violations`: all of the above for one emitted setup.

Facts: ../shared/MEGATRON_DEEPSPEED.md (the forks' megatron/arguments.py, microbatches.py, DeepSpeed's
pipeline engine), NVIDIA/Megatron-LM megatron/training/arguments.py validate_args and
megatron/core/transformer/transformer_config.py (uneven pipeline stages), seeds 002-004; context parallel,
experts and FP8 from `planner.context_parallel`, `planner.moe` and `planner.fp8` (Megatron-LM has all of them,
torchtitan CP, EP and float8, the Megatron-DeepSpeed forks and the torch-native probe none).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Iterator, Sequence

from planner import (context_parallel, cuda_graphs, dualpipe, fp8, fsdp_parallel, model_facts, moe, offload,
                     pipeline_engine, recompute as recompute_modes)
from planner.hardware import ClusterSpec
from planner.memory import MemoryBreakdown, deepspeed_zero1_one_rank, host_offload_bytes, shard_group_size
from planner.model import DEFAULT_ROPE_THETA, ModelSpec, rope_theta
from planner.pipeline_split import megatron_lm_split
from planner.rampup import rampup_problems
from planner.space import FLAVORS, FRAMEWORKS, RECOMPUTE, REPLAYED_FRAMEWORKS, SIZES, Candidate, TrainingSpec, \
    candidate_with, offload_moments_conflict

PROBE = "probe"
"""the torch-native probe `tune` runs (probes/train.py)"""
TARGET_FRAMEWORKS = (*FRAMEWORKS, *REPLAYED_FRAMEWORKS, PROBE)
PP_SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B")
"""the torch-native probe's pipeline schedules (torch.distributed.pipelining)"""
MEGATRON_OPTIMIZERS = {"adamw": "adam", "sgd": "sgd"}
"""plantune optimizer -> Megatron's --optimizer (Megatron's adam is AdamW: decoupled weight decay)"""
"""virtual pipeline stages enumerated for Megatron-LM (interleaved 1F1B)"""


class Reason(str, Enum):
    WORLD_SIZE = "world_size"
    INVALID = "invalid_value"
    TP_EXCEEDS_NODE = "tp_exceeds_node"
    TP_HEADS = "tp_divides_heads"
    TP_KV_HEADS = "tp_divides_kv_heads"
    TP_FFN = "tp_divides_ffn"
    TP_VOCAB = "tp_divides_vocab"
    SP_SEQ = "tp_divides_seq"
    PP_LAYERS = "pp_divides_layers"
    PP_EXCEEDS_LAYERS = "pp_exceeds_layers"
    VIRTUAL_PIPELINE = "virtual_pipeline"
    PIPELINE_SCHEDULE = "pipeline_schedule"
    BATCH_DIVISIBILITY = "gbs_eq_mbs_dp_gas"
    MICROBATCHES_LT_STAGES = "microbatches_lt_stages"
    RAMPUP = "rampup_divisibility"
    FRAMEWORK_LIMIT = "framework_limit"
    MODEL_FEATURE = "model_feature"
    PRECISION = "precision"
    SEQ_LEN = "seq_len"
    REDUNDANT = "redundant"
    MEMORY_STATIC = "memory_static_rule"
    MEMORY_TOTAL = "memory_total"
    HOST_MEMORY = "host_memory"
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
    """A broken rule: its reason and one line saying why and what to change."""

    reason: Reason
    detail: str

    def to_dict(self) -> dict:
        return {"reason": self.reason.value, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Target:
    """What runs the layout: a framework (and fork flavour for megatron-deepspeed), or the probe."""

    framework: str
    flavor: str | None = None

    def __post_init__(self) -> None:
        if self.framework not in TARGET_FRAMEWORKS:
            raise ValueError(f"unknown target {self.framework!r}; use one of {', '.join(TARGET_FRAMEWORKS)}")
        if self.framework == "megatron-deepspeed":
            if self.flavor is None:
                object.__setattr__(self, "flavor", "bigscience")
            elif self.flavor not in FLAVORS:
                raise ValueError(f"unknown Megatron-DeepSpeed flavor {self.flavor!r}; use one of {', '.join(FLAVORS)}")
        else:
            object.__setattr__(self, "flavor", None)

    def __str__(self) -> str:
        if self.framework == "megatron-deepspeed":
            return f"megatron-deepspeed ({self.flavor} fork)"
        return "the torch-native probe" if self.framework == PROBE else self.framework


def target_of(training: TrainingSpec) -> Target:
    """The target `plan` ranks for: the training's framework and fork flavour."""
    return Target(training.framework, training.flavor)


def _targets(training: TrainingSpec, targets: Target | Sequence[Target] | None) -> tuple[Target, ...]:
    if targets is None:
        return (target_of(training),)
    return (targets,) if isinstance(targets, Target) else tuple(targets)


# -- what a target can enumerate --------------------------------------------------------------------------

def knob_values(target: Target, training: TrainingSpec) -> dict[str, tuple]:
    """The values each knob takes for ``target`` (a knob the target does not have stays at its default).

    Which knobs exist is a property of the framework (sequence parallelism and VPP are Megatron's,
    hybrid sharding is FSDP's); every combination of them is then judged by the rules below.
    """
    fw = target.framework
    zeros = tuple(training.zero_options)
    cp_ep = fw in ("megatron-lm", "fsdp")   # the targets with context and expert parallelism
    return {
        # partial and torchtitan modes only where the framework has them (an explicit --recompute list keeps them)
        "recompute": tuple(r for r in training.recompute_options if r in recompute_modes.CLASSIC
                           or recompute_modes.kind(r) in recompute_modes.FRAMEWORK_MODES.get(fw, PROBE_RECOMPUTE)
                           or training.recompute_options != recompute_modes.PLAN_DEFAULT),
        "zero": zeros,
        "sp": (False, True) if fw in ("megatron-lm", "fsdp") or target.flavor == "microsoft" else (False,),
        # None: every VPP the layers split into (pipeline_split.vpp_choices); fsdp: stages per rank (torchtitan)
        "vpp": None if fw in ("megatron-lm", "fsdp") else (1,),
        "hybrid": (False, True) if fw == "fsdp" and 3 in zeros else (False,),
        # None: the sizes planner.context_parallel.cp_choices / planner.moe.ep_choices give (a --cp / --ep list is
        # enumerated on every target, so that a target without them says why)
        "cp": None if cp_ep or training.cp_options else (1,),
        "ep": None if cp_ep or training.ep_options else ((1, 1),),
        "moe_needs_sp": fw == "megatron-lm",   # planner.moe.violations: EP with TP needs SP on Megatron
    }


# -- pipeline stages ---------------------------------------------------------------------------------------

def megatron_lm_stages(layers: int, pp: int, vpp: int = 1, mtp: int = 0) -> tuple[int, int, int] | None:
    """Layers on (first, each middle, last) pipeline rank as Megatron-LM runs them, or None when impossible.

    The split and the flags it needs (even; ``--account-for-embedding/loss-in-pipeline-split``; unequal first/last
    stages) come from `planner.pipeline_split.megatron_lm_split`. Llama 3 405B, 126 layers on PP=16: 7, 8, 7.
    """
    split = megatron_lm_split(layers, pp, vpp, mtp)
    return None if split is None else split.as_tuple()


# -- the rules ---------------------------------------------------------------------------------------------

def _bad_sizes(c: Candidate) -> str | None:
    if (type(c.tp) is int and type(c.pp) is int and type(c.dp) is int and type(c.mbs) is int  # the fast path
            and type(c.gas) is int and type(c.vpp) is int and type(c.cp) is int and type(c.ep) is int
            and type(c.etp) is int and min(c.tp, c.pp, c.dp, c.mbs, c.gas, c.vpp, c.cp, c.ep, c.etp) >= 1
            and c.zero in (0, 1, 2, 3) and (c.recompute in RECOMPUTE or recompute_modes.is_valid(c.recompute, search=True))):
        return None
    sizes = {k: getattr(c, k) for k in SIZES}
    bad = [f"{k}={v}" for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if c.zero not in (0, 1, 2, 3):
        bad.append(f"zero={c.zero} (ZeRO stages are 0-3)")
    if not recompute_modes.is_valid(c.recompute, search=True):
        bad.append(f"recompute={c.recompute!r} (one of {', '.join(recompute_modes.OPTIONS)})")
    return ", ".join(bad) if bad else None


def _tp_divides(model: ModelSpec, c: Candidate) -> Iterator[Violation]:
    if model.heads % c.tp:
        yield Violation(Reason.TP_HEADS, f"attention heads {model.heads} are not divisible by TP {c.tp} "
                                         f"(megatron/arguments.py); use a TP that divides {model.heads}")
    if model.kv_heads % c.tp:
        # Megatron: num_query_groups % tensor_model_parallel_size == 0; the probe shards KV heads the same way
        yield Violation(Reason.TP_KV_HEADS, f"key/value heads {model.kv_heads} are not divisible by TP {c.tp}; "
                                            f"use a TP that divides {model.kv_heads}")
    if model.ffn_hidden % c.tp:
        yield Violation(Reason.TP_FFN, f"ffn_hidden {model.ffn_hidden} % TP {c.tp} != 0")


def _degrees(model: ModelSpec, c: Candidate, cluster: ClusterSpec) -> Iterator[Violation]:
    """Rules on TP, PP, DP and CP alone (`Checker` caches them per degree tuple)."""
    world = cluster.world_size
    if c.world != world:
        cp = f"*CP({c.cp})" if c.cp > 1 else ""
        yield Violation(Reason.WORLD_SIZE, f"TP({c.tp})*PP({c.pp})*DP({c.dp}){cp} = {c.world} "
                                           f"!= world size {world} ({cluster.nodes} nodes x {cluster.gpus_per_node} "
                                           f"GPUs); pick DP = world / (TP*PP{'*CP' if cp else ''})")
    if c.tp > cluster.domain_gpus:   # the NVLink domain: the node, or a GB200 NVL72 rack's 72 GPUs across 18 trays
        where = (f"{cluster.domain_gpus} GPUs in the NVLink domain" if cluster.nvlink_domain
                 else f"{cluster.gpus_per_node} GPUs per node")
        yield Violation(Reason.TP_EXCEEDS_NODE, f"TP {c.tp} > {where}: TP all-reduces every layer and must stay on "
                                                "NVLink (seed 004)")
    yield from _tp_divides(model, c)
    if c.pp > model.layers:
        yield Violation(Reason.PP_EXCEEDS_LAYERS, f"PP {c.pp} > {model.layers} layers")


def _batches(c: Candidate, training: TrainingSpec) -> Iterator[Violation]:
    """Rules on MBS, DP, GAS and PP alone (`Checker` caches them)."""
    if c.mbs * c.dp * c.gas != training.global_batch:
        unit = c.mbs * c.dp
        fix = (f"use GAS = {training.global_batch // unit}" if training.global_batch % unit == 0
               else f"the global batch must be a multiple of MBS*DP = {unit}")
        yield Violation(Reason.BATCH_DIVISIBILITY, f"MBS({c.mbs})*DP({c.dp})*GAS({c.gas}) = {c.mbs * c.dp * c.gas} "
                                                   f"!= global batch {training.global_batch}; {fix}")
    if c.pp > 1 and c.gas < c.pp:
        yield Violation(Reason.MICROBATCHES_LT_STAGES, f"{c.gas} micro-batches < {c.pp} pipeline stages: "
                                                       "1F1B cannot fill the pipeline")
    if training.rampup is not None:
        for problem in rampup_problems(training.rampup, training.global_batch, c.mbs, c.dp):
            yield Violation(Reason.RAMPUP, f"rampup {' '.join(map(str, training.rampup.as_list()))}: {problem}")


def _redundant(c: Candidate, training: TrainingSpec) -> Iterator[Violation]:
    # the distributed optimizer shards over DP x CP; DeepSpeed's fp16 ZeRO-1 over one rank is not its ZeRO 0 (another
    # optimizer, another step: planner.memory.deepspeed_zero1_one_rank)
    if c.zero > 0 and c.dp * c.cp == 1 and not deepspeed_zero1_one_rank(c, training):
        yield Violation(Reason.REDUNDANT, f"ZeRO-{c.zero} with DP=1 shards nothing: same as ZeRO-0")
    if c.sp and c.tp == 1:
        yield Violation(Reason.REDUNDANT, "sequence parallelism needs TP > 1 (Megatron silently turns it off "
                                          "at TP=1); set sp=0")


def _common(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec) -> Iterator[Violation]:
    yield from _degrees(model, c, cluster)
    yield from _batches(c, training)
    yield from _redundant(c, training)


def _megatron_deepspeed(model: ModelSpec, c: Candidate, flavor: str) -> Iterator[Violation]:
    if c.hybrid:
        yield Violation(Reason.FRAMEWORK_LIMIT, "hybrid sharding is an FSDP strategy; Megatron-DeepSpeed has no "
                                                "HYBRID_SHARD (set hybrid=0)")
    split = pipeline_engine.deepspeed_stage_layers(model.layers, c.pp) if 1 < c.pp <= model.layers else None
    if split and split.empty:
        yield Violation(Reason.PP_LAYERS, f"DeepSpeed's partition puts {split.full} of the {model.layers} layers on "
                                          f"each stage and leaves {split.empty} of the PP {c.pp} stages without one, "
                                          f"which the fork cannot run; use PP {c.pp - split.empty}")
    if c.vpp > 1:
        yield Violation(Reason.VIRTUAL_PIPELINE, f"virtual pipeline (vpp={c.vpp}) is not in DeepSpeed's pipeline "
                                                 "engine; use --framework megatron-lm or vpp=1")
    if flavor == "bigscience":
        if c.zero >= 2:
            yield Violation(Reason.FRAMEWORK_LIMIT, f"ZeRO-{c.zero} is refused by DeepSpeed's pipeline engine, which "
                                                    "the bigscience fork always uses; use ZeRO 0 or 1 "
                                                    "(or --emit-flavor microsoft with PP=1)")
        if c.recompute == "selective":
            yield Violation(Reason.FRAMEWORK_LIMIT, "the bigscience fork cannot express selective recompute (use "
                                                    "recompute=full: --checkpoint-activations, or --emit-flavor "
                                                    "microsoft)")
        if c.sp:
            yield Violation(Reason.FRAMEWORK_LIMIT, "the bigscience fork cannot express sequence parallelism (use "
                                                    "--emit-flavor microsoft or --framework megatron-lm)")
    elif c.zero >= 2 and c.pp > 1:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"ZeRO-{c.zero} with PP={c.pp} is refused by DeepSpeed's pipeline "
                                                "engine ('incompatible with pipeline parallelism'); use ZeRO 0/1 or "
                                                "PP=1 (--no-pipeline-parallel)")


def _deepspeed(c: Candidate) -> Iterator[Violation]:
    """DeepSpeed's own engine on an eager model (planner.framework): data parallelism with ZeRO 0-3 and nothing else."""
    if c.tp > 1 or c.pp > 1:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"DeepSpeed's engine on a Hugging Face model runs data parallelism only "
                                                f"(TP {c.tp}, PP {c.pp}); use --framework megatron-deepspeed for TP/PP")
    if c.hybrid:
        yield Violation(Reason.FRAMEWORK_LIMIT, "hybrid sharding is an FSDP strategy; DeepSpeed has no HYBRID_SHARD "
                                                "(set hybrid=0)")


def _megatron_lm(model: ModelSpec, c: Candidate) -> Iterator[Violation]:
    if c.hybrid:
        yield Violation(Reason.FRAMEWORK_LIMIT, "hybrid sharding is an FSDP strategy; Megatron-LM has no "
                                                "HYBRID_SHARD (set hybrid=0)")
    if c.zero >= 2 and c.pp > 1:
        # ZeRO-2/3 on Megatron-LM is Megatron-FSDP (--use-megatron-fsdp, planner.emit.megatron_lm), which composes
        # with TP, CP and EP; Megatron-Core's Megatron-FSDP guide lists no pipeline parallelism
        yield Violation(Reason.FRAMEWORK_LIMIT, f"ZeRO-{c.zero} on Megatron-LM is Megatron-FSDP, which composes with "
                                                f"TP, CP and EP, not with PP {c.pp}; use zero=0 or 1 "
                                                "(--use-distributed-optimizer) with PP, or PP=1")
    if c.pp <= model.layers and megatron_lm_stages(model.layers, c.pp, c.vpp, model.mtp_layers) is None:
        yield Violation(Reason.PP_LAYERS, f"{model.layers} layers cannot be split over PP {c.pp} x VPP {c.vpp}: "
                                          "Megatron-LM needs equal stages (counting the embedding and the loss "
                                          "as a layer each, or not), or equal middle stages with first/last ones "
                                          "no larger, every stage a multiple of VPP, or a layout "
                                          "(--pipeline-model-parallel-layout) whose chunks differ only in the "
                                          "first and the last")
    if c.vpp > 1:
        # validate_args: interleaving needs PP > 1 with p2p overlap (on by default; the emitter keeps it), PP > 2
        # only under --no-overlap-p2p-communication; schedules.py: micro-batches % PP == 0 (group size PP)
        if c.pp < 2:
            yield Violation(Reason.VIRTUAL_PIPELINE, f"interleaved 1F1B needs PP > 1, got PP={c.pp}; set vpp=1")
        elif c.gas % c.pp:
            yield Violation(Reason.VIRTUAL_PIPELINE, f"interleaved 1F1B needs micro-batches {c.gas} % PP {c.pp} == 0")


def _fsdp(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec) -> Iterator[Violation]:
    """torchtitan: FSDP2/HSDP x TP (always sequence-parallel) x PP (its schedules) x CP (`planner.fsdp_parallel`)."""
    if c.tp > 1 and not c.sp:
        yield Violation(Reason.FRAMEWORK_LIMIT, "torchtitan's tensor parallel is sequence-parallel (norms sharded "
                                                "over the sequence, parallelize.py apply_tp): set sp=1 with TP > 1")
    for reason, detail in fsdp_parallel.schedule_violations(model, c, training):
        yield Violation(Reason(reason), detail)
    if c.zero == 1:
        yield Violation(Reason.FRAMEWORK_LIMIT, "FSDP has no ZeRO-1 strategy: use 0 (NO_SHARD), 2 (SHARD_GRAD_OP) "
                                                "or 3 (FULL_SHARD)")
    if c.hybrid:
        if c.zero != 3:
            yield Violation(Reason.FRAMEWORK_LIMIT, f"hybrid sharding is HYBRID_SHARD (FULL_SHARD inside a node); "
                                                    f"set zero=3, got zero={c.zero}")
        elif c.dp <= cluster.gpus_per_node:
            yield Violation(Reason.REDUNDANT, f"HYBRID_SHARD with DP {c.dp} <= {cluster.gpus_per_node} GPUs per node "
                                              "is FULL_SHARD")
        else:   # HSDP shards over the node's GPUs left by TP (torchtitan data_parallel_shard_degree)
            shard = shard_group_size(c, cluster.gpus_per_node)
            if shard == 1:
                yield Violation(Reason.REDUNDANT, f"HYBRID_SHARD with TP {c.tp} on {cluster.gpus_per_node} GPUs per "
                                                  "node shards over 1 GPU: it is NO_SHARD (zero=0)")
            elif c.dp % shard:
                yield Violation(Reason.FRAMEWORK_LIMIT, f"HYBRID_SHARD: DP {c.dp} is not a multiple of the shard "
                                                        f"group {shard} (a node's GPUs / TP); torchtitan needs "
                                                        "data_parallel_replicate_degree x data_parallel_shard_degree "
                                                        "= DP")


def probe_layout_violations(model: ModelSpec, c: Candidate, *, layers_run: int | None = None,
                            schedule: str = "1F1B") -> Iterator[Violation]:
    """The torch-native probe's rules (probes/parallel.py): what its TP, PP and schedule can build.
    `probes.layout.resolve_layout` asks exactly these."""
    layers = model.layers if layers_run is None else layers_run
    yield from _tp_divides(model, c)
    if c.tp > 1 and model.vocab % c.tp:
        yield Violation(Reason.TP_VOCAB, f"vocab {model.vocab} % TP {c.tp} != 0 (the probe does not pad the "
                                         "vocabulary)")
    if c.sp and c.tp == 1:
        yield Violation(Reason.REDUNDANT, "sequence parallelism needs TP > 1; set sp=0")
    if c.sp and c.tp > 1 and model.seq_len % c.tp:
        yield Violation(Reason.SP_SEQ, f"seq_len {model.seq_len} % TP {c.tp} != 0 (sequence parallel)")
    if c.hybrid and c.zero != 3:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"hybrid sharding needs zero=3, got zero={c.zero}")
    if c.pp == 1:
        if c.vpp > 1:
            yield Violation(Reason.VIRTUAL_PIPELINE, f"vpp {c.vpp} > 1 needs pp > 1")
        return
    if schedule not in PP_SCHEDULES:
        yield Violation(Reason.PIPELINE_SCHEDULE, f"pp_schedule {schedule!r} is not one of {', '.join(PP_SCHEDULES)}")
        return
    if c.vpp > 1 and schedule == "1F1B":
        schedule = "Interleaved1F1B"
    vpp = 1
    if schedule == "Interleaved1F1B":
        vpp = c.vpp
        if vpp < 2:
            yield Violation(Reason.VIRTUAL_PIPELINE, "Interleaved1F1B needs vpp >= 2 model chunks per pipeline rank")
        rounds = max(1, c.gas // c.pp)
        if c.gas % rounds:
            yield Violation(Reason.PIPELINE_SCHEDULE, f"Interleaved1F1B needs gas (micro-batches) {c.gas} to be a "
                                                      f"multiple of max(1, gas // pp) = {rounds}")
    elif c.vpp > 1:
        yield Violation(Reason.VIRTUAL_PIPELINE, f"vpp {c.vpp} > 1 needs pp_schedule Interleaved1F1B, not {schedule}")
    if schedule in ("1F1B", "Interleaved1F1B") and c.gas < c.pp:
        yield Violation(Reason.MICROBATCHES_LT_STAGES, f"{schedule} needs micro-batches (gas) {c.gas} >= pipeline "
                                                       f"stages (pp) {c.pp}")
    if layers % (c.pp * vpp):
        yield Violation(Reason.PP_LAYERS, f"layers {layers} are not divisible by pp {c.pp} * vpp {vpp} (the probe "
                                          "splits layers into equal stages)")


def probe_extent_violations(model: ModelSpec, c: Candidate, *, cp: int, ep: int, num_experts: int, moe_top_k: int,
                            dp_run: int, dp_impl: str) -> Iterator[Violation]:
    """The torch-native probe's context-parallel and expert-parallel rules (probes/gpt.py, probes/parallel.py):
    what its all-gather CP and its dropless top-k MoE with EP inside DP can build. `probes.extent` asks these."""
    if cp > 1:
        if c.tp > 1 or c.pp > 1:
            yield Violation(Reason.FRAMEWORK_LIMIT, f"cp {cp} is probed with tp = pp = 1 only (got tp {c.tp}, pp {c.pp})")
        if model.seq_len % (2 * cp):
            yield Violation(Reason.SEQ_LEN, f"seq_len {model.seq_len} is not divisible by 2 * cp = {2 * cp} "
                                            "(load-balanced causal chunks)")
        if c.hybrid:
            yield Violation(Reason.FRAMEWORK_LIMIT, "cp with hybrid sharding is not probed: use hybrid = false")
        if ep > 1:
            yield Violation(Reason.FRAMEWORK_LIMIT, "cp and ep together are not probed: use one of them")
    if num_experts:
        if not 1 <= moe_top_k <= num_experts:
            yield Violation(Reason.INVALID, f"moe_top_k {moe_top_k} must be in 1..num_experts {num_experts}")
        if c.tp > 1:
            yield Violation(Reason.FRAMEWORK_LIMIT, "mixture of experts is probed with tp = 1 (no expert tensor "
                                                    "parallelism)")
        if num_experts % ep:
            yield Violation(Reason.INVALID, f"num_experts {num_experts} is not divisible by ep {ep}")
        if recompute_modes.kind(c.recompute) == "selective-op":
            # its share of re-run matmuls counts a dense layer's projections (planner.recompute.op_sac_matmuls)
            yield Violation(Reason.FRAMEWORK_LIMIT, "the probe's op-level SAC (recompute=selective-op) covers dense "
                                                    "layers only; use recompute=full or selective with experts")
    if ep > 1:
        if not num_experts:
            yield Violation(Reason.INVALID, f"ep {ep} needs num_experts > 0")
        if dp_run % ep:
            yield Violation(Reason.INVALID, f"ep {ep} must divide the data-parallel ranks run ({dp_run})")
        if c.pp > 1 or dp_impl != "ddp":
            yield Violation(Reason.FRAMEWORK_LIMIT, f"ep {ep} is probed with pp = 1 and zero = 0 (DDP) only")
    if c.etp > 1:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"etp {c.etp}: the probe has no expert tensor parallelism; use etp = 1")


def probe_dp_impl(c: Candidate, dp_run: int) -> str:
    """The probe's data-parallel wrapper for ``dp_run`` ranks (none | ddp | fsdp), as `probes.layout.resolve_layout`
    picks it: DDP only for plain replicas without TP/PP, FSDP2 for sharding, hybrid or replicas under TP/PP."""
    if dp_run <= 1:
        return "none"
    return "ddp" if c.zero == 0 and not c.hybrid and c.tp == 1 and c.pp == 1 else "fsdp"


def probe_model_violations(model: ModelSpec) -> Iterator[Violation]:
    """What the probe's model (probes/gpt.py) cannot build: its MoE puts top-k routed experts of the dense MLP's
    width in every layer, without shared experts, and its attention is multi-head/grouped-query."""
    if not moe.is_moe(model):
        return
    cannot = [(model.moe_ffn_hidden not in (0, model.ffn_hidden), f"experts {model.moe_ffn_hidden} wide (the probe's "
                                                                   f"are the MLP's {model.ffn_hidden})"),
              (model.shared_experts > 0, f"{model.shared_experts} shared experts"),
              (model.moe_layer_freq != 1 or model.first_dense_layers > 0, "dense layers between MoE layers"),
              (bool(model.kv_lora_rank), "multi-latent attention")]
    for bad, what in cannot:
        if bad:
            yield Violation(Reason.MODEL_FEATURE, f"the torch-native probe cannot build {what}; tune this model with "
                                                  "--probe megatron, or probe a model without it")


def _probe(model: ModelSpec, c: Candidate) -> Iterator[Violation]:
    yield from (v for v in probe_layout_violations(model, c) if v.reason not in _TP_REASONS)  # _common said those


_TP_REASONS = (Reason.TP_HEADS, Reason.TP_KV_HEADS, Reason.TP_FFN, Reason.MICROBATCHES_LT_STAGES, Reason.REDUNDANT)


def parallel_extras(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    target: Target) -> Iterator[Violation]:
    """Context parallel, experts (EP/ETP, MoE layers) and FP8 on ``target``: Megatron-LM has all of them,
    torchtitan (fsdp) CP, EP and float8 (no ETP), the torch-native probe its own CP and MoE/EP
    (`probe_extent_violations`), the Megatron-DeepSpeed forks none."""
    fw = target.framework
    if fw in ("megatron-lm", "fsdp"):
        for rules in (context_parallel.violations, moe.violations, fp8.violations, cuda_graphs.violations):
            for reason, detail in rules(model, c, cluster, training, fw):
                yield Violation(Reason(reason), detail)
        if fw == "fsdp" and moe.is_moe(model) and c.ep > 1 and not c.cp <= c.ep <= c.dp * c.cp:
            yield Violation(Reason.EP_GROUP, f"torchtitan needs CP <= EP <= DP*CP (job_config.py "
                                             f"expert_parallel_degree), got CP={c.cp} EP={c.ep} DP={c.dp}")
        return
    if fw == PROBE:   # its own CP and MoE/EP (probes.extent), on the full layout (dp_run = DP)
        yield from probe_model_violations(model)
        yield from probe_extent_violations(model, c, cp=c.cp, ep=c.ep, num_experts=model.num_experts,
                                           moe_top_k=model.moe_topk, dp_run=c.dp, dp_impl=probe_dp_impl(c, c.dp))
        if training.precision == "fp8":
            yield Violation(Reason.FRAMEWORK_LIMIT, "the torch-native probe has no FP8 training; use --precision bf16 "
                                                    "or --probe megatron")
        return
    fix = "use --framework megatron-lm (or fsdp: torchtitan)"
    if c.cp > 1:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"{target} has no context parallelism (cp={c.cp}); {fix} or cp=1")
    if moe.is_moe(model):
        yield Violation(Reason.FRAMEWORK_LIMIT, f"{target} has no mixture-of-experts layers ({model.num_experts} "
                                                f"experts); use --framework megatron-lm (plantune's torchtitan "
                                                "emit writes dense models only)")
    elif c.ep > 1 or c.etp > 1:
        yield Violation(Reason.REDUNDANT, f"EP={c.ep}, ETP={c.etp} on a dense model: there are no experts to shard")
    if training.precision == "fp8":
        yield Violation(Reason.FRAMEWORK_LIMIT, f"{target} has no FP8 training; {fix} or --precision bf16")


def _target_rules(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                  targets: Sequence[Target]) -> Iterator[Violation]:
    yield from _target_rules_but_extras(model, c, cluster, training, targets)
    for target in targets:
        yield from parallel_extras(model, c, cluster, training, target)


PROBE_RECOMPUTE = recompute_modes.CLASSIC + ("block", "selective-op")
"""what the torch-native probe checkpoints (probes/gpt.py): the classic modes, the first N layers of each chunk and
torchtitan's op-level SAC"""


def _recompute(model: ModelSpec, c: Candidate, fw: str) -> Iterator[Violation]:
    """The recompute modes a framework has (`planner.recompute.FRAMEWORK_MODES`), and partial recompute that
    checkpoints every layer anyway (block-N with N at least the model chunk's layers is full)."""
    kind = recompute_modes.kind(c.recompute)
    has = recompute_modes.FRAMEWORK_MODES.get(fw, PROBE_RECOMPUTE)
    if kind not in has:
        yield Violation(Reason.FRAMEWORK_LIMIT, f"recompute={c.recompute} is not one of {fw}'s modes "
                                                f"({', '.join(has)}); use recompute=full or another of those")
    elif recompute_modes.module_problems(model, c.recompute):
        lacks = recompute_modes.module_problems(model, c.recompute)
        yield Violation(Reason.MODEL_FEATURE, f"recompute={c.recompute}: {model.name} has nothing for "
                                              f"{', '.join(lacks)} to recompute (no MLA, MoE or dense layer); drop "
                                              "them from the modules")
    elif kind == "block":
        chunk = recompute_modes.chunk_layers(model, c.pp, c.vpp, fw)
        n = recompute_modes.parse(c.recompute).n
        if n >= chunk:
            yield Violation(Reason.REDUNDANT, f"recompute={c.recompute} checkpoints every layer of the {chunk}-layer "
                                              "model chunks: the same as recompute=full")


def _target_rules_but_extras(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                             targets: Sequence[Target]) -> Iterator[Violation]:
    for target in targets:
        fw = target.framework
        if c.recompute not in recompute_modes.CLASSIC:
            yield from _recompute(model, c, fw)
        if c.offload and fw != "megatron-lm":   # plan searches it for Megatron-LM targets only (planner.offload)
            yield Violation(Reason.FRAMEWORK_LIMIT, f"offload={c.offload} is Megatron-LM's fine-grained activation "
                                                    f"offload; {target} has none: drop offload")
        if c.opt_offload and fw != "megatron-lm":   # plan searches it for Megatron-LM targets only (planner.offload)
            yield Violation(Reason.FRAMEWORK_LIMIT, f"opt_offload={c.opt_offload:g} is Megatron-LM's CPU optimizer "
                                                    f"offload; {target} has none: drop opt_offload")
        elif fw == "megatron-lm" and c.opt_offload and training.optimizer_state_dtype != "fp32":
            yield Violation(Reason.FRAMEWORK_LIMIT, offload_moments_conflict(training.optimizer_state_dtype)
                            + ": drop opt_offload or --optimizer-state-dtype")
        elif fw == "megatron-lm" and c.zero == 0 and (offload.optimizer_fraction(c, training)
                                                       or training.optimizer_state_dtype != "fp32"):
            what = "CPU optimizer offload" if offload.optimizer_fraction(c, training) else \
                f"--optimizer-state-dtype {training.optimizer_state_dtype}"
            yield Violation(Reason.FRAMEWORK_LIMIT, f"{what} runs Megatron's precision-aware optimizer, "
                                                    "which needs the distributed optimizer (optimizer_config.py: "
                                                    "'only supported with distributed optimizer'): set zero=1")
        if fw == "megatron-deepspeed":
            yield from _megatron_deepspeed(model, c, target.flavor or "bigscience")
        elif fw == "megatron-lm":
            yield from _megatron_lm(model, c)
            # DeepSeek's DualPipe (torchtitan's DualPipeV: fsdp_parallel.schedule_violations)
            yield from (Violation(Reason(r), d) for r, d in dualpipe.problems(training.pp_schedule, c.pp, c.vpp, c.gas))
        elif fw == "fsdp":
            yield from _fsdp(model, c, cluster, training)
        elif fw == "deepspeed":
            yield from _deepspeed(c)
        else:
            yield from _probe(model, c)


def iter_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                    targets: Target | Sequence[Target] | None = None) -> Iterator[Violation]:
    """Every layout rule, lazily (the first one is what `plan` counts)."""
    bad = _bad_sizes(c)
    if bad:  # nothing else can be checked (or divided by)
        yield Violation(Reason.INVALID, f"layout sizes must be positive integers, got {bad}")
        return
    yield from _common(model, c, cluster, training)
    yield from _target_rules(model, c, cluster, training, _targets(training, targets))


class Checker:
    """The first broken rule of each candidate of one plan, as `iter_violations` gives it, with the rules on
    (TP, PP, DP) and on (MBS, DP, GAS, PP) evaluated once per distinct value (a plain product repeats them)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 targets: Target | Sequence[Target] | None = None) -> None:
        self.model, self.cluster, self.training = model, cluster, training
        self.targets = _targets(training, targets)
        self._probe = any(t.framework == PROBE for t in self.targets)
        self._gas_read = (self._probe or any(t.framework == "fsdp" for t in self.targets)
                          or training.pp_schedule in dualpipe.SCHEDULES)
        """the rules read GAS itself (the probe's and torchtitan's schedule rounds, DualPipe's two directions), not
        only GAS % PP"""
        self._pipe_read = "ep-a2a" in (training.overlap or ())
        """the extras read PP and VPP (the EP all-to-all overlap's rules)"""
        self._megatron_rows = all(t.framework == "megatron-lm" for t in self.targets) and not self._gas_read
        """`row` reads TP and DP x CP only as whether they are 1 (`row_key`): Megatron-LM's row rules
        (`_redundant`, `_recompute`, `_megatron_lm`) read no other TP, DP or CP"""
        self._degrees: dict[tuple, Violation | None] = {}
        self._batches: dict[tuple, Violation | None] = {}
        self._extras: dict[tuple, Violation | None] = {}
        self._row_extras: dict[tuple, tuple[Violation | None, ...]] = {}
        self._targets: dict[tuple, Violation | None] = {}
        self._rows: dict[tuple, Violation | None] = {}

    def shared(self, c: Candidate) -> Violation | None:
        """The first broken rule on (TP, PP, DP, CP) or on (MBS, DP, GAS, PP): the same for every candidate of a
        `planner.enumeration.Group`, and `first`'s answer whenever it is not None."""
        key = (c.tp, c.pp, c.dp, c.cp)
        if key not in self._degrees:
            self._degrees[key] = next(_degrees(self.model, c, self.cluster), None)
        v = self._degrees[key]
        if v is None:
            key = (c.mbs, c.dp, c.gas, c.pp)
            if key not in self._batches:
                self._batches[key] = next(_batches(c, self.training), None)
            v = self._batches[key]
        return v

    def group_key(self, tp: int, pp: int, dp: int, cp: int, gas: int) -> tuple:
        """What `row` reads of a row's (TP, PP, DP, CP, GAS) (`row_key`'s head): the frameworks' rules read GAS only
        as GAS % PP == 0 (interleaved 1F1B), the probe's GAS itself (its schedules' rounds), as do torchtitan's
        (`planner.fsdp_parallel.schedule_violations`). Megatron-LM's alone read TP only as TP == 1 (sequence
        parallelism needs TP > 1) and DP x CP only as DP x CP == 1 (ZeRO then shards nothing): rows of other TP, DP
        and CP share their answer (a tenth as many rows to check in Mixtral-8x22B's plan on 1,024 GPUs)."""
        if self._megatron_rows:
            return (tp == 1, pp, dp * cp == 1, gas % pp == 0)
        return (tp, pp, dp, cp, gas if self._gas_read else gas % pp == 0)

    @staticmethod
    def row_key(group_key: tuple, recompute: str, zero: int, sp: bool, vpp: int, hybrid: bool) -> tuple:
        """What `row` reads: the row's `group_key`, and its recompute, ZeRO, SP, VPP and hybrid."""
        return (*group_key, recompute, zero, sp, vpp, hybrid)

    def row_known(self, key: tuple) -> tuple[bool, Violation | None]:
        """(whether `row` was answered for ``key`` (`row_key`), its answer): a known row needs no candidate built.
        The answer's words may name another GAS of the same key; `plan` shows only the first of each reason."""
        return (key in self._rows, self._rows.get(key))

    def row(self, c: Candidate) -> Violation | None:
        """After `shared`: the redundancy and framework rules, which read no EP, ETP or MBS (the same for every
        candidate of a row of `planner.enumeration.Group.rows`), remembered by `row_key`."""
        key = self.row_key(self.group_key(c.tp, c.pp, c.dp, c.cp, c.gas), c.recompute, c.zero, c.sp, c.vpp, c.hybrid)
        if key not in self._rows:
            self._rows[key] = self._row(c)
        return self._rows[key]

    def _row(self, c: Candidate) -> Violation | None:
        v = next(_redundant(c, self.training), None)
        if v is None:  # the frameworks' rules read no CP / EP / MBS: one answer per EP and CP value
            key = (c.tp, c.pp, c.dp, c.gas, c.zero, c.recompute, c.sp, c.vpp, c.hybrid)
            if key not in self._targets:
                self._targets[key] = next(_target_rules_but_extras(self.model, c, self.cluster, self.training,
                                                                      self.targets), None)
            v = self._targets[key]
        return v

    def first(self, c: Candidate) -> Violation | None:
        """For candidates of `enumerate_candidates` (well-formed by construction: no INVALID check)."""
        v = self.shared(c)
        if v is None:
            v = self.row(c)
        if v is None:
            v = self.extras(c, c.ep, c.etp)
        return v

    def extras(self, c: Candidate, ep: int, etp: int, recompute: str | None = None) -> Violation | None:
        """After `row`: the CP / EP / FP8 rules for ``c`` with EP ``ep`` and ETP ``etp`` (a row's candidates differ
        only in those; ``c`` with them is built only when the answer is not known yet), and with ``recompute`` instead
        of its own mode when given (`planner.rank`'s resolved block-N / module sets)."""
        if recompute is None:
            recompute = c.recompute
        # CP / EP / FP8 rules read only these fields (and the plan's fixed model and training);
        # the probe's also pp, zero and hybrid (probe_extent_violations, probe_dp_impl)
        # and the recompute mode (the EP-overlap and CUDA-graph rules refuse some: planner.moe, planner.cuda_graphs)
        # and, under the EP all-to-all overlap, whether there is a pipeline, interleaved or not (planner.moe.violations)
        key = (c.tp, c.cp, c.dp, ep, etp, c.sp, recompute) + ((c.pp, c.zero, c.hybrid) if self._probe else ()) \
            + ((c.pp == 1, c.vpp == 1) if self._pipe_read else ())
        if key not in self._extras:
            c = c if (c.ep, c.etp, c.recompute) == (ep, etp, recompute) else candidate_with(c, ep=ep, etp=etp,
                                                                                            recompute=recompute)
            self._extras[key] = next((x for t in self.targets
                                      for x in parallel_extras(self.model, c, self.cluster, self.training, t)), None)
        return self._extras[key]

    def row_extras(self, head: Candidate, eps: tuple[tuple[int, int], ...]) -> tuple[Violation | None, ...]:
        """`extras` of ``head`` with each (EP, ETP) of ``eps`` (a row of `planner.enumeration.Group.rows`), remembered
        by the row's key: the rows of other MBS, GAS and ZeRO (unless the probe reads them) ask the same."""
        key = (head.tp, head.cp, head.dp, head.sp, head.recompute, eps) \
            + ((head.pp, head.zero, head.hybrid) if self._probe else ()) \
            + ((head.pp == 1, head.vpp == 1) if self._pipe_read else ())
        found = self._row_extras.get(key)
        if found is None:
            found = self._row_extras[key] = tuple(self.extras(head, ep, etp) for ep, etp in eps)
        return found


def structural_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                          targets: Target | Sequence[Target] | None = None) -> list[Violation]:
    """All non-memory rules of the targets (default: the training's framework and flavour)."""
    return list(iter_violations(model, c, cluster, training, targets))


def layout_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                      target: Target) -> list[Violation]:
    return list(iter_violations(model, c, cluster, training, (target,)))


def model_violations(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                     target: Target, *, emit: bool = True) -> list[Violation]:
    """What ``target`` cannot express whatever the layout: checked once, before enumerating.

    ``emit``: also what its emitter cannot write (FSDP is emitted as a torchtitan job, whose one dense model
    is Llama's; plain PyTorch FSDP, which `plan --framework fsdp` costs, runs any model).
    """
    out: list[Violation] = []
    fw, flavor = target.framework, target.flavor
    if training.precision == "bf16" and cluster.gpu.peak_bf16_flops is None:
        out.append(Violation(Reason.PRECISION, f"{cluster.gpu.id} has no bf16; use --precision fp16"))
    if training.precision == "fp8" and cluster.gpu.peak_fp8_flops is None:
        out.append(Violation(Reason.PRECISION, f"{cluster.gpu.id} has no FP8 tensor cores (H100, H200, B200 and MI300X "
                                               "do); use --precision bf16"))
    if training.precision == "fp8" and fw not in fp8.FRAMEWORKS_WITH_FP8:
        out.append(Violation(Reason.FRAMEWORK_LIMIT, f"{target} has no FP8 training; use --framework megatron-lm "
                                                     "(or fsdp: torchtitan float8) or --precision bf16"))
    if fw in ("megatron-deepspeed", "megatron-lm") and training.optimizer not in MEGATRON_OPTIMIZERS:
        out.append(Violation(Reason.FRAMEWORK_LIMIT, f"optimizer {training.optimizer!r} has no Megatron flag; plan "
                                                     f"with one of {', '.join(MEGATRON_OPTIMIZERS)}"))
    facts_target = {"megatron-lm": "megatron-lm", "fsdp": "torchtitan", "megatron-deepspeed": flavor}.get(fw)
    # the fix names the emitters that write the whole model (none writes Gemma 2's soft-capping or a parallel
    # residual; only the BigScience fork writes BLOOM's ALiBi)
    able = [flag for other, flag in _FACT_EMITTERS.items() if other != facts_target and _writes(model, other)]
    fix = f"use {' or '.join(able)}" if able else "no emitter plantune writes has arguments for all of this " \
                                                   "model's facts: plan without --emit"
    cannot: list[tuple[bool, str]] = []
    if fw == "megatron-deepspeed" and flavor == "bigscience":
        cannot = [(training.flash_attention, "FlashAttention")]
    elif fw == "fsdp" and emit:
        # torchtitan 0.2.2: bf16/fp32 mixed precision, Adam/AdamW, no batch rampup
        cannot = [(training.precision == "fp16", "fp16 mixed precision (bf16 or fp32 only)"),
                  (training.optimizer != "adamw", f"optimizer {training.optimizer!r} (AdamW)"),
                  (training.rampup is not None, "a batch-size rampup (use --no-rampup)")]
    where = "torchtitan (--emit fsdp)" if fw == "fsdp" else str(target)
    run_fix = "plan without --emit fsdp, or use --framework megatron-lm" if fw == "fsdp" else \
        "plan with --no-flash-attention"
    out += [Violation(Reason.MODEL_FEATURE, f"{where} cannot express {what}; {run_fix}") for bad, what in cannot if bad]
    if emit and training.eager_ops:
        out.append(Violation(Reason.FRAMEWORK_LIMIT, f"{where} runs fused element-wise kernels, not the PyTorch ops "
                                                     "--eager-ops costs; plan without --emit, or drop --eager-ops"))
    if emit and not training.fused_norm:
        out.append(Violation(Reason.FRAMEWORK_LIMIT, f"{where} runs fused norms, not the PyTorch ops --unfused-norm "
                                                     "costs; plan without --emit, or drop --unfused-norm"))
    if emit and fw == "megatron-lm" and training.pp_schedule == dualpipe.DUALPIPE:
        out.append(Violation(Reason.PIPELINE_SCHEDULE, dualpipe.NOT_EMITTED))
    if emit and fw == "megatron-lm" and training.deepseek_fp8_storage:
        out.append(Violation(Reason.FRAMEWORK_LIMIT, fp8.DEEPSEEK_NOTE))
    if facts_target and (fw != "fsdp" or emit):   # what the model is, that the target has no argument for
        out += [Violation(Reason.MODEL_FEATURE, f"{where} cannot express {what}; {fix}")
                for bad, what in _limits(model, facts_target) if bad]
    if emit and facts_target:   # the model's own facts (planner.model_facts) its emitter has no argument for
        out += [Violation(Reason.MODEL_FEATURE, f"{where} cannot express {what}; {fix}")
                for what in model_facts.unexpressed(model, facts_target)]
    if emit and fw != "megatron-lm" and model.kv_channels is not None and not model.kv_lora_rank:
        # a head width apart from hidden/heads (Gemma, Qwen3): only the Megatron-LM emitter writes --kv-channels
        out.append(Violation(Reason.MODEL_FEATURE, f"a head width of {model.kv_channels} (kv_channels, not "
                                                   "hidden/heads) is emitted for --emit megatron-lm only "
                                                   "(--kv-channels); plan it here, or emit for megatron-lm"))
    return out


def _limits(model: ModelSpec, target: str) -> list[tuple[bool, str]]:
    """What the model is that ``target`` (megatron-lm | microsoft | bigscience | torchtitan) cannot train, whatever
    the run: its positions, norms, embeddings, biases and layer kinds (the run's own limits are model_violations')."""
    if target == "bigscience":
        theta = _other_rope_base(model)
        return [(model.kv_heads != model.heads, f"grouped-query attention ({model.kv_heads} kv heads)"),
                (model.norm == "rmsnorm", "RMSNorm"),
                (not model.tied_embeddings, "untied input/output embeddings"),
                (not model.bias, "linear layers without biases"),
                (theta is not None, f"RoPE base {theta or 0:g} (its rotary base is fixed at 10000)"),
                (moe.is_moe(model), "mixture-of-experts layers"), (bool(model.kv_lora_rank), "multi-latent attention")]
    limits = [(model.position == "alibi", "ALiBi positions"),
              (model.embedding_norm, "a layernorm after the word embedding")]
    if target == "microsoft":
        return limits + [(moe.is_moe(model), "mixture-of-experts layers (as planned here: Megatron-Core MoE)"),
                         (bool(model.kv_lora_rank), "multi-latent attention")]
    if target == "torchtitan":   # one dense model, Llama's (RoPE, RMSNorm, SwiGLU, no biases, untied embeddings): each
        # fact named (its MLP's activation is planner.model_facts.unexpressed's)
        llama3 = "torchtitan's llama3"
        positions = {"alibi": "ALiBi positions", "learned": "learned absolute positions"}.get(model.position, "")
        return [(model.tied_embeddings, f"tied input/output embeddings ({llama3} has its own output layer)"),
                (model.norm != "rmsnorm", f"LayerNorm ({llama3} normalises with RMSNorm)"),
                (model.position != "rope", f"{positions} ({llama3} rotates with RoPE)"),
                (model.bias, f"linear layers with biases ({llama3}'s have none)"),
                (model.embedding_norm, "a layernorm after the word embedding"),
                (moe.is_moe(model), f"mixture-of-experts layers ({llama3} is dense)"),
                (bool(model.kv_lora_rank), f"multi-latent attention ({llama3} has grouped-query attention)")]
    return limits


def _writes(model: ModelSpec, target: str) -> bool:
    """``target``'s emitter writes every fact of this model (planner.model_facts targets)."""
    return not any(bad for bad, _ in _limits(model, target)) and not model_facts.unexpressed(model, target)


_FACT_EMITTERS = {"megatron-lm": "--framework megatron-lm",
                  "microsoft": "--framework megatron-deepspeed --emit-flavor microsoft",
                  "bigscience": "--framework megatron-deepspeed --emit-flavor bigscience",
                  "torchtitan": "--framework fsdp"}
"""each planner.model_facts target and how a plan picks its emitter"""


def _other_rope_base(model: ModelSpec) -> float | None:
    """The model's RoPE base when it is not the BigScience fork's fixed 10000; None otherwise."""
    if model.position != "rope":
        return None
    theta = rope_theta(model)
    return None if theta == DEFAULT_ROPE_THETA else theta


def setup_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec, training: TrainingSpec,
                     target: Target) -> list[Violation]:
    """Every rule an emitted setup must obey: the model, the layout, and the sequence length."""
    out = model_violations(model, training, cluster, target)
    if training.seq_len > model.positions:
        out.append(Violation(Reason.SEQ_LEN, f"sequence length {training.seq_len} exceeds the model's "
                                             f"{model.positions} positions; use --seq-len <= {model.positions} or "
                                             "raise the model's max_positions"))
    return out + layout_violations(model, c, cluster, training, target)


# -- memory ------------------------------------------------------------------------------------------------

def memory_violations(mem: MemoryBreakdown, cluster: ClusterSpec, training: TrainingSpec) -> list[Violation]:
    """The predicted total against the GPU minus headroom: the only memory rule that prunes."""
    capacity = cluster.gpu.memory_bytes
    usable = (1 - training.memory_headroom) * capacity
    if mem.total_bytes <= usable:
        return []
    return [Violation(Reason.MEMORY_TOTAL,
                      f"predicted {mem.total_bytes / 1e9:.1f} GB on the {mem.stage} stage > {usable / 1e9:.1f} GB "
                      f"({1 - training.memory_headroom:.0%} of {capacity / 1e9:.1f} GB) "
                      f"(activations {mem.activations_bytes / 1e9:.1f}, logits {mem.logits_bytes / 1e9:.1f}, "
                      f"model states {mem.static_bytes / 1e9:.1f})")]


def host_memory_violations(model: ModelSpec, c: Candidate, cluster: ClusterSpec,
                           training: TrainingSpec) -> list[Violation]:
    """The offloads' pinned host memory against the node's (`ClusterSpec.host_memory_bytes`, the catalog's): GPUs a
    node x the busiest GPU's offloaded bytes (`planner.memory.host_offload_bytes`: its CPU-optimizer share with the
    pinned copies and grads, its offloaded activations). A lower bound of what the node needs (the OS, the data
    loader, the processes' own memory not counted): a layout over it cannot run. Nothing is checked where the
    catalog does not know the host."""
    if cluster.host_memory_bytes is None:
        return []
    return host_memory_of(host_offload_bytes(model, c, cluster, training), cluster)


def host_memory_of(per_gpu: float, cluster: ClusterSpec) -> list[Violation]:
    """`host_memory_violations` of a GPU's offloaded bytes ``per_gpu`` (plan's: `PlanMemory.host_offload_bytes`)."""
    node = cluster.host_memory_bytes
    if node is None:
        return []
    need = per_gpu * cluster.gpus_per_node
    if need <= node:
        return []
    return [Violation(Reason.HOST_MEMORY,
                      f"offloads need {need / 1e9:.0f} GB of pinned host memory a node ({cluster.gpus_per_node} GPUs x "
                      f"{per_gpu / 1e9:.1f} GB) > the node's {node / 1e9:.0f} GB ({cluster.gpu.id} reference "
                      "system): offload a smaller optimizer fraction or fewer modules, or shard more (ZeRO, EP, PP)")]


def memory_advice(mem: MemoryBreakdown, cluster: ClusterSpec, training: TrainingSpec) -> list[Violation]:
    """Seed 004's first guess (model states <= 75% of the GPU), shown as a mark, never a reason to prune."""
    capacity = cluster.gpu.memory_bytes
    if mem.static_bytes <= training.memory_fraction * capacity:
        return []
    return [Violation(Reason.MEMORY_STATIC,
                      f"weights+grads+optimizer {mem.static_bytes / 1e9:.1f} GB > {training.memory_fraction:.0%} "
                      f"of {capacity / 1e9:.1f} GB (seed 004's first guess; the total decides)")]


def first(violations: Iterable[Violation]) -> Violation | None:
    return next(iter(violations), None)


__all__ = ["Checker", "FLAVORS", "MEGATRON_OPTIMIZERS", "PP_SCHEDULES", "PROBE", "Reason", "TARGET_FRAMEWORKS", "Target",
           "Violation", "iter_violations", "knob_values", "layout_violations", "megatron_lm_stages",
           "memory_advice", "memory_violations", "model_violations", "parallel_extras", "probe_dp_impl",
           "probe_extent_violations", "probe_layout_violations", "probe_model_violations", "setup_violations",
           "structural_violations", "target_of"]
