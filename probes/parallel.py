"""Apply a `ProbeLayout` to GPT stages with PyTorch-native parallelism (imports torch).

    >>> mesh = build_mesh(layout, device_type="cpu")
    >>> stages = build_stages(model, layout, mesh, pos, device, seed)  # meta -> TP -> DP -> shard storage

Stages are built on the meta device (no storage), parallelized there, and only then given
storage (``to_empty``) and their initial values (`probes.gpt.init_parameters`): a rank allocates
its own shard and nothing more, as torchtitan does. Order as torchtitan's parallelize: tensor
parallel (DTensor Colwise/Rowwise, SequenceParallel for the norms when ``sp``; the token
embedding sharded along the vocabulary (`probes.gpt.Embedding`) and the LM head's logits left sharded
along the vocabulary for `probes.gpt.VocabParallelLoss`, as Megatron's vocab-parallel embedding
and cross-entropy), then activation checkpointing (inside `GPTStage`), then data parallel: DDP for plain DP (ZeRO 0, no TP/PP); FSDP2 ``fully_shard`` otherwise, with
``reshard_after_forward=False`` for ZeRO 1/2 and True for ZeRO 3, on a 2-D (replicate, shard)
mesh for hybrid sharding, and on a (dp, 1) mesh -- pure replication -- for ZeRO 0 under TP/PP
(DDP's reducer asserts under pipelining and does not take DTensor parameters).

Context parallel (``ProbeExtent.cp``, TP = PP = 1): ranks r*CP..r*CP+CP-1 share one DP slice of
the batch, each two of 2·CP sequence chunks; the gradient is averaged over DP x CP (DDP or FSDP2
over all ranks). Expert parallel (``ProbeExtent.ep``, TP = PP = 1, ZeRO 0): EP divides DP, ranks
r*EP..r*EP+EP-1 split the experts; DDP averages the dense parameters, the expert parameters are
left out of DDP and reduced by `reduce_expert_grads` (sum over the ranks that hold the same
experts, then / DP, DDP's mean).

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp (TP ranks adjacent, inside a node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.nn.parallel import DistributedDataParallel

from planner.model import ModelSpec
from probes.extent import ProbeExtent
from probes.gpt import (ContextParallel, ExpertParallel, GPTStage, MoEShape, VocabParallelLoss, init_parameters,
                        lm_loss, stage_layer_ids)
from probes.layout import ProbeLayout
from probes.memstat import current_bytes, peak_bytes, reset_peak_memory

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True)
class RankPosition:
    """Where this rank sits in the (pp, dp_replicate, dp_shard, tp) grid."""

    pp: int
    dp: int
    """index among the dp_run data-parallel replicas (dp_replicate * dp_shard flattened)"""
    tp: int
    cp: int = 0
    """index in the context-parallel group (0 without CP)"""


def rank_position(rank: int, layout: ProbeLayout, extent: ProbeExtent = ProbeExtent()) -> RankPosition:
    cp = extent.cp
    return RankPosition(pp=rank // (layout.tp * cp * layout.dp_run), dp=(rank // (layout.tp * cp)) % layout.dp_run,
                        tp=rank % layout.tp, cp=(rank // layout.tp) % cp)


def build_mesh(layout: ProbeLayout, device_type: str, extent: ProbeExtent = ProbeExtent()) -> DeviceMesh:
    return init_device_mesh(device_type, (layout.pp, layout.dp_replicate, layout.dp_shard, extent.cp, layout.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))


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
    """Shard the stage over ``tp_mesh``: blocks as Megatron, the token embedding along the vocabulary
    (each rank looks up its rows, an all-reduce sums them; under SP each rank then keeps its slice of
    the sequence, where Megatron reduce-scatters), the LM
    head column-wise with its logits left sharded along the vocabulary (`VocabParallelLoss`)."""
    for block in stage.layers.values():
        plan = _tp_block_plan(sp)
        if block.mlp.w3 is None:
            del plan["mlp.w3"]
        parallelize_module(block, tp_mesh, plan)
    embed = stage.embed
    if embed is not None:
        embed.tok.weight = nn.Parameter(distribute_tensor(embed.tok.weight, tp_mesh, [Shard(0)]))
        embed.set_vocab_parallel(tp_mesh.get_group(), tp_mesh.get_local_rank())
        if sp:
            # summed embedding (+ positions, norm) -> this rank's slice of the sequence (no communication)
            parallelize_module(embed, tp_mesh, PrepareModuleOutput(
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),)))
    if stage.head is not None:
        head_plan = {"output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                               output_layouts=Shard(-1))}
        if sp:
            head_plan["norm"] = SequenceParallel()
        parallelize_module(stage.head, tp_mesh, head_plan)


def expert_parameter_names(stage: nn.Module) -> list[str]:
    """Names (as ``stage.named_parameters`` gives them) of the parameters of MoE experts."""
    return [n for n, _ in stage.named_parameters() if ".experts." in n]


def apply_dp(stage: nn.Module, layout: ProbeLayout, mesh: DeviceMesh | None, device: torch.device,
             extent: ProbeExtent = ProbeExtent()) -> nn.Module:
    """Wrap a stage for data parallelism as `ProbeLayout.dp_impl` says (over DP x CP under CP)."""
    dp_impl = extent.dp_impl(layout)
    if dp_impl == "ddp":
        if extent.ep > 1:    # experts differ between EP ranks: reduced by reduce_expert_grads, not averaged
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(stage, expert_parameter_names(stage))
        return DistributedDataParallel(stage, device_ids=[device.index] if device.type == "cuda" else None)
    if dp_impl != "fsdp":
        return stage
    if mesh is None:
        raise ValueError("FSDP needs a device mesh")
    if extent.cp > 1:
        dp_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    else:
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


def _moe_shape(extent: ProbeExtent, pos: RankPosition) -> MoEShape | None:
    if extent.num_experts == 0:
        return None
    return MoEShape(num_experts=extent.num_experts, top_k=extent.moe_top_k, ep=extent.ep, ep_rank=pos.dp % extent.ep)


def expert_groups(extent: ProbeExtent, dp_run: int) -> tuple[object, object]:
    """(EP group of this rank, group of the ranks that hold the same experts); call on every rank.

    EP ranks are adjacent data-parallel ranks: dp // EP picks the EP group, dp % EP the expert shard."""
    import torch.distributed as dist

    ep, rank = extent.ep, dist.get_rank()
    mine_ep = mine_same = None
    for g in range(dp_run // ep):                      # new_group: every rank, same order
        grp = dist.new_group(list(range(g * ep, (g + 1) * ep)))
        if rank // ep == g:
            mine_ep = grp
    for e in range(ep):
        grp = dist.new_group(list(range(e, dp_run, ep)))
        if rank % ep == e:
            mine_same = grp
    return mine_ep, mine_same


def reduce_expert_grads(stages: list[nn.Module], dp_run: int, same_group: object, ep: int) -> None:
    """Expert gradients as DDP would give them: summed over the ranks holding the same experts, / DP."""
    import torch.distributed as dist

    for stage in stages:
        for name, p in stage.named_parameters():
            if ".experts." not in name or p.grad is None:
                continue
            if dp_run // ep > 1:
                dist.all_reduce(p.grad, group=same_group)
            p.grad.div_(dp_run)


def build_stages(m: ModelSpec, layout: ProbeLayout, mesh: DeviceMesh | None, pos: RankPosition,
                 device: torch.device, seed: int, extent: ProbeExtent = ProbeExtent(),
                 ep_group: object = None, stats: dict | None = None) -> list[nn.Module]:
    """This rank's model chunks (one, or ``vpp`` for interleaved schedules), parallelized.

    Built on the meta device and parallelized there; then ``to_empty`` gives each rank storage for
    its shard only and `init_parameters` fills it with the single-process values. ``stats`` receives
    ``materialise_peak_growth_bytes``: the largest rise of peak memory (CUDA allocated, CPU resident)
    over a chunk's storage and initialisation -- its shard plus one full parameter at most."""
    stage_ids = [pos.pp + k * layout.pp for k in range(layout.vpp)]
    moe = _moe_shape(extent, pos)
    out = []
    for sid in stage_ids:
        with torch.device("meta"):
            stage = GPTStage(m, layer_ids=stage_layer_ids(m.layers, layout.stages, sid), first=sid == 0,
                             last=sid == layout.stages - 1, seed=seed, recompute=layout.recompute, moe=moe)
        if extent.cp > 1 and mesh is not None:
            stage.set_context_parallel(ContextParallel(group=mesh.get_group("cp"), size=extent.cp, rank=pos.cp,
                                                       seq_len=m.seq_len))
        if extent.ep > 1 and ep_group is not None:
            stage.set_expert_parallel(ExpertParallel(group=ep_group, size=extent.ep, rank=pos.dp % extent.ep))
        if layout.tp > 1 and mesh is not None:
            apply_tp(stage, mesh["tp"], layout.sp)
        if extent.dp_impl(layout) == "fsdp":            # FSDP2 shards meta parameters; storage comes after
            stage = apply_dp(stage, layout, mesh, device, extent)
        base = current_bytes(device)
        reset_ok = reset_peak_memory(device)
        stage.to_empty(device=device)
        if (stage.head is not None and stage.embed is not None and m.tied_embeddings
                and stage.head.output.weight is not stage.embed.tok.weight):   # to_empty keeps ties; in case not
            stage.head.output.weight = stage.embed.tok.weight
        init_parameters(stage, seed)
        peak = peak_bytes(device)
        if stats is not None and reset_ok and base is not None and peak is not None:
            grew = max(0.0, peak - base)
            stats["materialise_peak_growth_bytes"] = max(stats.get("materialise_peak_growth_bytes", 0.0), grew)
        if extent.dp_impl(layout) == "ddp":             # DDP broadcasts real values: wrap after init
            stage = apply_dp(stage, layout, mesh, device, extent)
        out.append(stage)
    return out


def local_parameter_bytes(stages: list[nn.Module]) -> int:
    """Bytes of the parameters this rank stores (DTensor: the local shard), each tensor once."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for s in stages:
        for p in s.parameters():
            t = p.to_local() if isinstance(p, DTensor) else p
            seen[id(p)] = t.numel() * t.element_size()
    return sum(seen.values())


def local_parameter_count(stages: list[nn.Module]) -> int:
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for s in stages:
        for p in s.parameters():
            seen[id(p)] = (p.to_local() if isinstance(p, DTensor) else p).numel()
    return sum(seen.values())


def loss_fn(layout: ProbeLayout, mesh: DeviceMesh | None):
    """`lm_loss`, or the vocab-parallel loss on TP-sharded logits."""
    if layout.tp > 1 and mesh is not None:
        return VocabParallelLoss(mesh["tp"])
    return lm_loss


def build_schedule(stages: list[nn.Module], layout: ProbeLayout, mesh: DeviceMesh, pos: RankPosition,
                   device: torch.device):
    """A torch.distributed.pipelining schedule over this rank's stages (gas micro-batches)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = mesh.get_group("pp")
    pipe = [PipelineStage(s, pos.pp + k * layout.pp, layout.stages, device, group=group)
            for k, s in enumerate(stages)]
    loss = loss_fn(layout, mesh)
    if layout.schedule == "Interleaved1F1B":
        return ScheduleInterleaved1F1B(pipe, n_microbatches=layout.gas, loss_fn=loss)
    cls = Schedule1F1B if layout.schedule == "1F1B" else ScheduleGPipe
    return cls(pipe[0], n_microbatches=layout.gas, loss_fn=loss)


__all__ = ["DTYPES", "RankPosition", "apply_dp", "apply_tp", "build_mesh", "build_schedule", "build_stages",
           "expert_groups", "expert_parameter_names", "local_parameter_bytes", "local_parameter_count", "loss_fn",
           "rank_position", "reduce_expert_grads"]
