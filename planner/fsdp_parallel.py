"""The ``fsdp`` framework as torchtitan runs it: FSDP2 (or HSDP) over the data-parallel mesh dimension with tensor
parallel (always sequence-parallel; async TP under torch.compile), pipeline schedules, context parallel, float8 and
torch.compile. Small pure functions; `planner.cost`, `planner.memory` and `planner.rules` call them.

torchtitan's device mesh is [pp, dp_replicate, dp_shard, cp, tp] (torchtitan/distributed/parallel_dims.py): TP is
innermost (inside a node), CP strides by TP, FSDP shards parameters, gradients and optimizer states over dp_shard x cp
(the "dp_shard_cp" mesh its parallelize_llama hands to fully_shard), PP ranks hold their stage. Pipeline schedules are
torch.distributed.pipelining's (schedules.py), chosen by ``pipeline_parallel_schedule``; the number of micro-batches is
local_batch_size / pipeline_parallel_microbatch_size: plantune's GAS and MBS under PP.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from planner import dualpipe
from planner.constants import ASYNC_TP_HIDDEN, MEGATRON_HOST_S
from planner.framework import Framework
from planner.space import PP_SCHEDULES_FSDP

if TYPE_CHECKING:
    from planner.model import ModelSpec
    from planner.space import Candidate, TrainingSpec

SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
"""one stage per rank (torch.distributed.pipelining PipelineScheduleSingle)"""
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", dualpipe.DUALPIPE_V)
"""several stages per rank (PipelineScheduleMulti); ZBV and DualPipeV need exactly two (schedules.py
ScheduleZBVZeroBubble, ScheduleDualPipeV)"""
SCHEDULES = PP_SCHEDULES_FSDP   # SINGLE_STAGE_SCHEDULES + MULTI_STAGE_SCHEDULES, named where TrainingSpec checks them
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble")

# Share of the TP collectives async TP hides: ASYNC_TP_HIDDEN (planner.constants, fitted on torchtitan Table 4).

# torchtitan's pipeline split counts the embedding and the LM head as this many layers each
# (pipeline_parallel_first_stage_less_layers / _last_stage_less_layers, default 1; pipeline_parallel.py
# _generate_llm_fqn_per_model_part).
PP_EDGE_WEIGHT = 1


def schedule(cand: "Candidate", training: "TrainingSpec") -> str:
    """The pipeline schedule torchtitan runs: the user's, else 1F1B with one stage per rank and Interleaved1F1B with
    more (torchtitan's default is 1F1B; plantune's VPP > 1 means several stages per rank)."""
    if training.pp_schedule:
        return training.pp_schedule
    return "1F1B" if cand.vpp == 1 else "Interleaved1F1B"


def bubble_slots(name: str, pp: int, vpp: int, recompute: str) -> float:
    """Pipeline bubble in units of one micro-batch's stage time (forward + backward).

    1F1B and GPipe: PP-1 (Narayanan et al. 2021 Sec. 2.2); interleaved over v stages per rank: (PP-1)/v (ibid.
    Sec. 2.2.2). Zero-bubble schedules split the backward into input-gradient B and weight-gradient W and fill the
    bubble with W (Qi et al. 2024, arXiv 2401.10241 Sec. 3): ZB-H1 (InterleavedZeroBubble) leaves (F + B - W) of the
    (F + B + W) per bubble slot, ZB-V (ZBVZeroBubble, two chunks per rank) (F + B - 2W) over two chunks. With F = B = W
    (backward = 2x forward, split evenly) and a full recompute doubling F's share inside B. DeepSeek's DualPipe and
    DualPipeV: `planner.dualpipe.bubble_slots` (DeepSeek-V3 report Table 2)."""
    if pp <= 1:
        return 0.0
    if name in dualpipe.SCHEDULES:
        return dualpipe.bubble_slots(name, pp, recompute)
    f, b, w = 1.0, 1.0 + (1.0 if recompute == "full" else 0.0), 1.0
    if name == "InterleavedZeroBubble":
        return (pp - 1) / vpp * (f + b - w) / (f + b + w)
    if name == "ZBVZeroBubble":
        return (pp - 1) * max(0.0, f + b - 2 * w) / (2 * (f + b + w))
    return (pp - 1) / vpp


def schedule_violations(model: "ModelSpec", c: "Candidate", training: "TrainingSpec") -> list[tuple[str, str]]:
    """(reason value, detail) for each pipeline rule torchtitan / torch.distributed.pipelining would raise on."""
    name = schedule(c, training)
    if c.pp == 1:
        return ([("virtual_pipeline", f"VPP {c.vpp} needs pipeline parallelism (PP > 1); set vpp=1")]
                if c.vpp > 1 else [])
    out = []
    if name in SINGLE_STAGE_SCHEDULES and c.vpp != 1:
        out.append(("virtual_pipeline", f"{name} runs one stage per rank (PipelineScheduleSingle), got VPP {c.vpp}; "
                                        "use vpp=1 or --pp-schedule Interleaved1F1B"))
    if name in MULTI_STAGE_SCHEDULES and c.vpp < 2:
        out.append(("virtual_pipeline", f"{name} needs at least 2 stages per rank (torchtitan pipeline_parallel.py), "
                                        "got VPP 1; use vpp>=2 or --pp-schedule 1F1B"))
    if name == "ZBVZeroBubble" and c.vpp > 2:
        out.append(("virtual_pipeline", f"ZBVZeroBubble needs exactly 2 stages per rank (schedules.py), "
                                        f"got VPP {c.vpp}"))
    out += [p for p in dualpipe.problems(name, c.pp, c.vpp, c.gas) if not (p[0] == "virtual_pipeline" and c.vpp < 2)]
    if name == dualpipe.DUALPIPE_V and c.ep > 1 and c.recompute != "none":
        out.append(("framework_limit", "torchtitan's DualPipeV with EP overlaps the expert all-to-all only without "
                                       "activation checkpointing (dual_pipe_v.py get_dual_pipe_v_flag: 'Expert Parallel "
                                       "with DualPipeV and Activation Checkpointing cannot be used together'); use "
                                       "recompute=none"))
    stages = c.pp * c.vpp   # 1F1B's micro-batches >= PP (torch Schedule1F1B raises): planner.rules._batches
    if name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, c.gas // c.pp)
        if c.gas % rounds:
            out.append(("virtual_pipeline", f"{name}: micro-batches {c.gas} must be a multiple of their rounds "
                                            f"{rounds} = max(1, {c.gas} // PP) (torch schedules.py)"))
    effective = model.layers + 2 * PP_EDGE_WEIGHT
    if c.vpp > 1 and -(-effective // layers_per_stage(model, c)) != stages:
        out.append(("pp_divides_layers", f"no pipeline_parallel_layers_per_stage gives PP {c.pp} x VPP {c.vpp} = "
                                         f"{stages} stages of {model.layers} layers (+ embedding and head): "
                                         f"torchtitan makes ceil({effective} / {layers_per_stage(model, c)}) of them"))
    if effective // stages < max(1, PP_EDGE_WEIGHT):
        out.append(("pp_divides_layers", f"{stages} pipeline stages over {model.layers} layers (+ embedding and "
                                         f"head as {PP_EDGE_WEIGHT} each) leave a stage empty (torchtitan "
                                         "pipeline_parallel.py)"))
    return out


def probe_schedule(training: "TrainingSpec") -> str:
    """The schedule the torch-native probe runs for the training's (probes/parallel.py builds 1F1B, GPipe and
    Interleaved1F1B): a zero-bubble schedule and DualPipeV are probed as Interleaved1F1B over the same stages per
    rank, DualPipe as 1F1B, approximations that measure the same stages and micro-batches with the larger bubble."""
    name = training.pp_schedule or "1F1B"
    if name == dualpipe.DUALPIPE:   # one chunk a rank: probed as 1F1B, the larger bubble, no overlap
        return "1F1B"
    return "Interleaved1F1B" if name in ZERO_BUBBLE or name == dualpipe.DUALPIPE_V else name


def layers_per_stage(model: "ModelSpec", c: "Candidate") -> int:
    """torchtitan's pipeline_parallel_layers_per_stage for PP x VPP stages (the embedding and the head count as
    PP_EDGE_WEIGHT layers each); it builds ceil((layers + edges) / this) stages (pipeline_parallel.py)."""
    return -(-(model.layers + 2 * PP_EDGE_WEIGHT) // (c.pp * c.vpp))


def runtime_framework(fw: Framework, training: "TrainingSpec") -> Framework:
    """The framework's element-wise traffic and host time as run: torch.compile (Inductor) fuses each norm and
    SwiGLU chain into one kernel, as Megatron's fused kernels do (``eager`` False, a third of the eager
    launches: `planner.constants.MEGATRON_HOST_S`), but not torchtitan's complex-number RoPE
    (planner.ops.COMPILED_COMPLEX_ROPE_BYTES); nothing fitted. Against torchtitan's Dec-2024 Tables 1 and 3
    (Llama 3.1 8B FSDP on 8 and 128 H100): predicted +18.3% and +18.6% tokens/s, measured +15.7% and +16.2%."""
    if training.framework != "fsdp" or not training.torch_compile:
        return fw
    return replace(fw, eager=False, host_s_per_layer_forward=MEGATRON_HOST_S)


def tp_exposed_fraction(training: "TrainingSpec") -> float:
    """Share of the TP collectives left on the critical path: all of them, or 1 - ASYNC_TP_HIDDEN with async TP."""
    return 1.0 - ASYNC_TP_HIDDEN if training.framework == "fsdp" and training.async_tp else 1.0


def sharded_collectives(cand: "Candidate", training: "TrainingSpec", recomputed_layers: float) -> tuple[float, int]:
    """(parameter all-gathers, gradient reduce-scatters) of each FSDP unit per step. Per micro-batch: a gather for the
    forward, one for the backward, one more for a recomputed forward (ZeRO paper Sec. 7.2.2), one reduce-scatter.
    torchtitan under PP: once per step, as torch.distributed.pipelining runs every micro-batch but the last without
    gradient sync (stage.py backward_maybe_with_nosync) and torchtitan keeps the stage unsharded after the forward
    (fsdp_reshard_after_forward "default" = not under PP, torchtitan parallelize.py). ``recomputed_layers``: the
    share of layers whose forward is re-run (planner.recompute.recomputed_of: 1 under full, N/chunk under block-N)."""
    if training.framework == "fsdp" and cand.pp > 1:
        return 1, 1
    return cand.gas * (2 + recomputed_layers), cand.gas


def unsharded_stage_bytes(stage_params: int, cand: "Candidate", training: "TrainingSpec") -> float:
    """Bytes FSDP2 holds unsharded for the whole step under PP: the stage's 16-bit parameters (not resharded after
    forward, see `sharded_collectives`) and the unsharded gradients it accumulates across micro-batches without sync,
    upcast to the fp32 reduce dtype (torch fully_shard FSDPParam.to_accumulated_grad_if_needed). ``stage_params``:
    after TP."""
    if training.framework != "fsdp" or cand.pp == 1 or cand.zero < 2:
        return 0.0
    param, grad = (2.0, 4.0) if training.precision != "fp32" else (4.0, 4.0)
    return stage_params * (param + grad)


__all__ = ["ASYNC_TP_HIDDEN", "MULTI_STAGE_SCHEDULES", "PP_EDGE_WEIGHT", "SCHEDULES", "SINGLE_STAGE_SCHEDULES",
           "ZERO_BUBBLE", "bubble_slots", "layers_per_stage", "probe_schedule", "runtime_framework", "schedule",
           "schedule_violations", "sharded_collectives", "tp_exposed_fraction", "unsharded_stage_bytes"]
