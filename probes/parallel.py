"""Apply a `ProbeLayout` to GPT stages with PyTorch-native parallelism (imports torch).

    >>> mesh = build_mesh(layout, device_type="cpu")
    >>> stages = build_stages(model, layout, mesh, device, seed)      # TP -> recompute -> DP

Order as torchtitan's parallelize: tensor parallel (DTensor Colwise/Rowwise, SequenceParallel
for the norms when ``sp``), then activation checkpointing (inside `GPTStage`), then data
parallel: DDP for plain DP (ZeRO 0, no TP/PP); FSDP2 ``fully_shard`` otherwise, with
``reshard_after_forward=False`` for ZeRO 1/2 and True for ZeRO 3, on a 2-D (replicate, shard)
mesh for hybrid sharding, and on a (dp, 1) mesh -- pure replication -- for ZeRO 0 under TP/PP
(DDP's reducer asserts under pipelining and does not take DTensor parameters).

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, tp (TP ranks adjacent, inside a node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.nn.parallel import DistributedDataParallel

from planner.model import ModelSpec
from probes.gpt import GPTStage, lm_loss, stage_layer_ids
from probes.layout import ProbeLayout

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True)
class RankPosition:
    """Where this rank sits in the (pp, dp_replicate, dp_shard, tp) grid."""

    pp: int
    dp: int
    """index among the dp_run data-parallel replicas (dp_replicate * dp_shard flattened)"""
    tp: int


def rank_position(rank: int, layout: ProbeLayout) -> RankPosition:
    return RankPosition(pp=rank // (layout.tp * layout.dp_run), dp=(rank // layout.tp) % layout.dp_run,
                        tp=rank % layout.tp)


def build_mesh(layout: ProbeLayout, device_type: str) -> DeviceMesh:
    return init_device_mesh(device_type, (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))


def _tp_block_plan(sp: bool) -> dict:
    """Megatron's split: Q/K/V and MLP-in column-wise, O and MLP-out row-wise; norms sequence-parallel."""
    residual = Shard(1) if sp else Replicate()
    plan = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=residual),
        "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=residual),
    }
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(), "attn": gather, "mlp": gather})
    return plan


def apply_tp(stage: GPTStage, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard the stage over ``tp_mesh``; the embedding stays replicated, the LM head column-wise."""
    for block in stage.layers.values():
        plan = _tp_block_plan(sp)
        if block.mlp.w3 is None:
            del plan["mlp.w3"]
        parallelize_module(block, tp_mesh, plan)
    if stage.embed is not None and sp:
        # replicated embedding output -> this rank's slice of the sequence (no communication)
        parallelize_module(stage.embed, tp_mesh, PrepareModuleOutput(
            output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),)))
    if stage.head is not None:
        head_plan = {"output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                               output_layouts=Replicate())}
        if sp:
            head_plan["norm"] = SequenceParallel()
        parallelize_module(stage.head, tp_mesh, head_plan)


def apply_dp(stage: nn.Module, layout: ProbeLayout, mesh: DeviceMesh | None, device: torch.device) -> nn.Module:
    """Wrap a stage for data parallelism as `ProbeLayout.dp_impl` says."""
    if layout.dp_impl == "ddp":
        return DistributedDataParallel(stage, device_ids=[device.index] if device.type == "cuda" else None)
    if layout.dp_impl != "fsdp":
        return stage
    if mesh is None:
        raise ValueError("FSDP needs a device mesh")
    dp_mesh = mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
    mp = None
    if layout.precision != "fp32":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[layout.precision], reduce_dtype=torch.float32)
    kw = {"mesh": dp_mesh, "reshard_after_forward": layout.reshard_after_forward}
    if mp is not None:
        kw["mp_policy"] = mp
    for block in stage.layers.values():
        fully_shard(block, **kw)
    fully_shard(stage, **kw)
    return stage


def build_stages(m: ModelSpec, layout: ProbeLayout, mesh: DeviceMesh | None, pos: RankPosition,
                 device: torch.device, seed: int) -> list[nn.Module]:
    """This rank's model chunks (one, or ``vpp`` for interleaved schedules), parallelized."""
    stage_ids = [pos.pp + k * layout.pp for k in range(layout.vpp)]
    out = []
    with torch.device(device):
        for sid in stage_ids:
            stage = GPTStage(m, layer_ids=stage_layer_ids(m.layers, layout.stages, sid), first=sid == 0,
                             last=sid == layout.stages - 1, seed=seed, recompute=layout.recompute)
            if layout.tp > 1 and mesh is not None:
                apply_tp(stage, mesh["tp"], layout.sp)
            out.append(apply_dp(stage, layout, mesh, device))
    return out


def build_schedule(stages: list[nn.Module], layout: ProbeLayout, mesh: DeviceMesh, pos: RankPosition,
                   device: torch.device):
    """A torch.distributed.pipelining schedule over this rank's stages (gas micro-batches)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = mesh.get_group("pp")
    pipe = [PipelineStage(s, pos.pp + k * layout.pp, layout.stages, device, group=group)
            for k, s in enumerate(stages)]
    if layout.schedule == "Interleaved1F1B":
        return ScheduleInterleaved1F1B(pipe, n_microbatches=layout.gas, loss_fn=lm_loss)
    cls = Schedule1F1B if layout.schedule == "1F1B" else ScheduleGPipe
    return cls(pipe[0], n_microbatches=layout.gas, loss_fn=lm_loss)


__all__ = ["DTYPES", "RankPosition", "apply_dp", "apply_tp", "build_mesh", "build_schedule", "build_stages",
           "rank_position"]
