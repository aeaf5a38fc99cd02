"""The training probe: a GPT trained a few steps under one candidate layout, timed like a benchmark.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m probes.train --spec spec.json --out probe-dir

``spec.json`` is a `probes.result.ProbeSpec`. Rank 0 prints one line ``PLANTUNE_RESULT {json}``
and writes ``probe-dir/result.json``; every rank writes ``probe-dir/pid-rank{r}`` at start and,
when it fails, ``probe-dir/error-rank{r}.json`` (status oom | crash, message, time) for the
launcher to pick the root cause. Processes end with ``os._exit`` right after that (see
CPU_PROBES.md: avoids a SIGABRT in process-group teardown). ``--serve DIR`` instead keeps the
processes for probe after probe handed over in DIR (warm workers: `probes.warm_worker`).

Set-up: each rank builds its stages on the meta device and materialises only its shard
(`probes.parallel.build_stages`), makes every synthetic batch it will use on the device, and
then resets the peak-memory counters, so the reported peak is the training steps' own.

Timing: ``warmup_steps`` untimed steps, then windows of ``steps`` timed steps with a device
sync on both sides of the timer; a step's time is the slowest rank's. While the last window's
coefficient of variation is above ``max_cv`` another window is measured, at most
`MAX_MEASURE_ROUNDS` in all. FLOPs come from `planner.flops` for the model actually run (an
MoE layer counts its top-k experts). With ``spec.profile`` one more step runs under
torch.profiler and `profile_split` reports compute and communication seconds per dimension, and compute per op
class (gemm, attention, elementwise, optimizer: `op_class`).

Memory (`memory_record`, per rank): parameter, gradient and optimizer-state bytes of the local
shards in the planner's terms (planner.memory.MemoryBreakdown), the peak after set-up (CUDA
allocated and reserved, the CUDA context, memory outside the allocator; CPU resident set).

Precision (`precision_recipe`): bf16/fp16 run under ``torch.autocast`` on fp32 parameters --
the fp32 parameters are the master weights, autocast's 16-bit copies the weights the forward
uses, fp32 gradients and Adam states: the planner's 18 bytes per parameter, with the 16-bit copy
alive from a step's first forward to its end. FSDP2 runs its MixedPrecisionPolicy (16-bit
unsharded parameters while computing, fp32 sharded master, fp32 gradient reduction). fp16 has no
loss scaler -- the timing is faithful, the recipe is not. fp32 runs plain.

Debug environment variables (tests): ``PLANTUNE_PROBE_FAULT`` = ``hang:R`` | ``raise:R`` |
``exit:R:CODE`` makes rank R misbehave after its first step; ``PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES``
caps each CPU rank's address space at its size before the first step plus that many bytes;
``PLANTUNE_PROBE_HOLD`` = ``setup[:R]`` | ``teardown[:R]`` stops ranks there (`probes.lifeline.hold`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.flops import hardware_flops_per_iteration, model_flops_per_iteration, tflops_per_gpu
from planner.recompute import Recomputed, recomputed
from torch.distributed.tensor.parallel import loss_parallel

from probes.extent import ProbeExtent, probe_extent, resolve_probe
from probes.forkserver import RDZV_FILE_ENV
from probes.layout import LayoutError, ProbeLayout, model_run, model_spec
from probes.lifeline import hold
from probes.memstat import reset_peak_memory, vm_kib
from probes.phases import PhaseMarks
from probes.profile_events import step_events
from probes.outcome import OOM_MARKERS
from probes.parallel import (DTYPES, build_mesh, build_schedule, build_stages, expert_groups, local_parameter_count,
                             loss_fn, rank_position, reduce_expert_grads)
from probes.result import ProbeResult, ProbeSpec

RESULT_PREFIX = "PLANTUNE_RESULT "
ERROR_PREFIX = "PLANTUNE_ERROR "
MAX_MEASURE_ROUNDS = 3
BATCH_CYCLE = 64
"""the distinct synthetic batches a probe makes; a longer probe cycles through them (set-up time and memory stay
bounded whatever --probe-steps: 3 x 100,000 planned steps took minutes to prepare; the token values never change a
step's time)"""
LEARNING_RATE = 1e-3
DATA_STRIDES = (1, 2)
"""synthetic sequences: token[t] = (start + t * stride) % vocab, start and stride drawn per sequence"""
FAULT_ENV = "PLANTUNE_PROBE_FAULT"
RLIMIT_ENV = "PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES"
PG_TIMEOUT_S = 600


def synthetic_batch(spec: ProbeSpec, vocab: int, seq_len: int, global_batch: int, step: int,
                    rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for ``rows`` of step ``step``'s global batch (seeded, no download).

    Every layout draws the same global batch and takes its data-parallel slice of it, so the
    global loss is the same whatever the layout.
    """
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    starts = torch.randint(0, vocab, (global_batch,), generator=g)[rows]
    strides = torch.tensor(DATA_STRIDES)[torch.randint(0, len(DATA_STRIDES), (global_batch,), generator=g)][rows]
    tokens = (starts[:, None] + torch.arange(seq_len + 1)[None, :] * strides[:, None]) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def _inject_fault(rank: int) -> None:
    """Debug: ``hang:R``, ``raise:R`` or ``exit:R:CODE`` in PLANTUNE_PROBE_FAULT."""
    fault = os.environ.get(FAULT_ENV, "")
    if not fault:
        return
    parts = fault.split(":")
    if int(parts[1]) != rank:
        return
    if parts[0] == "hang":
        while True:
            time.sleep(3600)
    if parts[0] == "raise":
        raise RuntimeError(f"injected fault ({FAULT_ENV}={fault})")
    if parts[0] == "exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(parts[2]))


def _cap_address_space() -> None:
    """Debug: RLIMIT_AS = current virtual size + PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES (forces a CPU OOM)."""
    headroom = os.environ.get(RLIMIT_ENV)
    if not headroom:
        return
    vm_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                 if line.startswith("VmSize:"))
    limit = vm_kb * 1024 + int(headroom)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _tensor_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        seen[id(t)] = local.numel() * local.element_size()
    return sum(seen.values())


def fusable_groups(params: list[torch.Tensor]) -> list[dict]:
    """Optimizer parameter groups that a fused AdamW step can take: plain tensors apart from DTensors,
    DTensors apart by device mesh (order kept within a group)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        mesh = getattr(p, "device_mesh", None)
        groups.setdefault(None if mesh is None else id(mesh), []).append(p)
    return [{"params": ps} for ps in groups.values()]


class Trainer:
    """One rank's model chunks, optimizer, data slice and step function.

    Set-up builds the stages on the meta device and materialises this rank's shard only
    (`probes.parallel.build_stages`); `prepare_batches` makes the synthetic batches on the device
    before anything is timed."""

    def __init__(self, spec: ProbeSpec, layout: ProbeLayout, rank: int, world: int, device: torch.device,
                 extent: ProbeExtent | None = None) -> None:
        self.spec, self.layout, self.device = spec, layout, device
        self.extent = extent if extent is not None else probe_extent(spec)
        self.model = model_run(spec, layout)
        self.pos = rank_position(rank, layout, self.extent)
        self.mesh = build_mesh(layout, device.type, self.extent) if world > 1 else None
        ep_group = self.same_experts = None
        if self.extent.ep > 1:
            ep_group, self.same_experts = expert_groups(self.extent, layout.dp_run)
        self.build_stats: dict = {}
        self.stages = build_stages(self.model, layout, self.mesh, self.pos, device, spec.seed, self.extent,
                                   ep_group=ep_group, stats=self.build_stats)
        self.params = list({id(p): p for s in self.stages for p in s.parameters()}.values())
        # fused: one kernel over all parameters and no full-size temporaries (the default foreach
        # implementation holds a copy of every state per step), as Megatron's and DeepSpeed's fused Adam;
        # one group per kind of tensor: a fused call takes plain tensors or DTensors of one mesh, not both
        self.optimizer = torch.optim.AdamW(fusable_groups(self.params), lr=LEARNING_RATE, weight_decay=0.0,
                                           fused=True)
        self.loss_fn = loss_fn(layout, self.mesh)
        self.schedule = build_schedule(self.stages, layout, self.mesh, self.pos, device) if layout.pp > 1 else None
        self.first = self.pos.pp == 0
        self.last = self.pos.pp == layout.pp - 1
        per_replica = layout.mbs * layout.gas
        self.rows = slice(self.pos.dp * per_replica, (self.pos.dp + 1) * per_replica)
        self.batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's inputs and targets of step ``step`` on the device (made now if not prepared; steps past
        `BATCH_CYCLE` reuse the earlier batches)."""
        step %= BATCH_CYCLE
        if step not in self.batches:
            lay, m = self.layout, self.model
            x, y = synthetic_batch(self.spec, m.vocab, m.seq_len, lay.global_batch_run, step, self.rows)
            if self.extent.cp > 1:       # this rank's two load-balanced sequence chunks
                from probes.gpt import ContextParallel
                idx = ContextParallel(group=None, size=self.extent.cp, rank=self.pos.cp, seq_len=m.seq_len).positions()
                x, y = x[:, idx], y[:, idx]
            self.batches[step] = (x.to(self.device), y.to(self.device))
        return self.batches[step]

    def prepare_batches(self, steps: range) -> None:
        for step in steps:
            self.batch(step)

    def static_bytes(self) -> dict:
        """Bytes this rank holds in parameters, gradients and optimizer states (local shards), by kind."""
        states = [t for st in self.optimizer.state.values() for t in st.values()
                  if isinstance(t, torch.Tensor) and t.dim() > 0]
        return {"params_on_gpu": local_parameter_count(self.stages),
                "param_bytes": _tensor_bytes(self.params),
                "grads_bytes": _tensor_bytes([p.grad for p in self.params]),
                "optimizer_state_bytes": _tensor_bytes(states),
                "largest_param_full_bytes": max((p.numel() * 4 for p in self.params), default=0)}

    def step(self, step: int) -> torch.Tensor:
        """One optimizer step; returns (mean loss over this rank's micro-batches, 1) or (0, 0) off the last stage."""
        lay = self.layout
        x, y = self.batch(step)
        vocab_parallel = lay.tp > 1 and self.mesh is not None
        with _autocast(self.device, lay.precision), (loss_parallel() if vocab_parallel else contextlib.nullcontext()):
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                if self.first:
                    self.schedule.step(x)
                elif self.last:
                    self.schedule.step(target=y, losses=losses)
                else:
                    self.schedule.step()
                total = torch.stack([t.detach().float() for t in losses]).sum() if losses else None
            else:
                model = self.stages[0]
                total = torch.zeros((), device=self.device)
                for i, (xm, ym) in enumerate(zip(x.chunk(lay.gas), y.chunk(lay.gas))):
                    skip_sync = self.extent.dp_impl(lay) == "ddp" and i < lay.gas - 1
                    with model.no_sync() if skip_sync else contextlib.nullcontext():
                        loss = self.loss_fn(model(xm), ym)
                        (loss / lay.gas).backward()
                    total += loss.detach().float()
        if self.extent.ep > 1:
            reduce_expert_grads(self.stages, lay.dp_run, self.same_experts, self.extent.ep)
        self.optimizer.step()
        # gradients stay allocated (as Megatron's grad buffer), zeroed one by one: torch's zero_grad under
        # fused=True zeroes all groups in one foreach call, which cannot mix DTensors and plain tensors nor
        # take a DTensor gradient that is Partial (sequence-parallel norms)
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
        if total is None:
            return torch.zeros(2, device=self.device)
        return torch.stack([total / lay.gas, torch.ones((), device=self.device)])


def _global_loss(local: torch.Tensor, world: int, stop: bool = False) -> tuple[float, bool]:
    """Mean loss over the ranks holding one (the last pipeline stage; TP ranks agree), and whether any rank asked
    to stop (a warm worker's tuner pruned the probe: `serve`), in the same all-reduce."""
    flag = torch.ones((1,), device=local.device) if stop else torch.zeros((1,), device=local.device)
    local = torch.cat([local, flag])
    if world > 1:
        dist.all_reduce(local)
    return float(local[0] / local[1]), bool(local[2] > 0)


class Stopped(Exception):
    """The tuner stopped the probe (pruned) between two steps; every rank raises it after the same step."""


def _slowest(times: list[float], device: torch.device, world: int) -> list[float]:
    t = torch.tensor(times, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _stage_name(layout: ProbeLayout, pp_rank: int) -> str:
    """The planner's names for a pipeline rank (planner.memory.MemoryBreakdown.stage)."""
    if layout.pp == 1:
        return "only"
    return "first" if pp_rank == 0 else "last" if pp_rank == layout.pp - 1 else "middle"


def memory_record(trainer: Trainer, before: dict) -> dict:
    """This rank's memory after the measured steps, in `planner.memory.MemoryBreakdown`'s terms.

    Measured: parameter, gradient and optimizer-state bytes (the local shards' tensors), and the
    peak since `reset_peak_memory` (after set-up). CUDA: peak allocated and reserved from the
    caching allocator, ``context_bytes`` = device memory in use right after CUDA initialisation
    (before any tensor), ``non_allocator_bytes`` = in use now minus reserved (context, NCCL and
    cuBLAS workspaces: the planner's context + NCCL buffers). CPU: resident set sizes; allocated,
    reserved and context are None (not measurable)."""
    device = trainer.device
    static = trainer.static_bytes()
    master = precision_recipe(trainer.layout, trainer.extent)["master_weights"]
    rec = {"rank": dist.get_rank() if dist.is_initialized() else 0, "stage": _stage_name(trainer.layout, trainer.pos.pp),
           **static, **trainer.build_stats, "peak_reset": before["peak_reset"],
           # the planner's terms: weights = the copy the forward uses, optimizer = fp32 master + states
           "weights_bytes": None if master else static["param_bytes"],
           "optimizer_bytes": static["optimizer_state_bytes"] + (static["param_bytes"] if master else 0)}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        rec.update(peak_allocated_bytes=float(torch.cuda.max_memory_allocated(device)),
                   peak_reserved_bytes=float(torch.cuda.max_memory_reserved(device)),
                   context_bytes=before.get("context_bytes"),
                   non_allocator_bytes=float(total - free - torch.cuda.memory_reserved(device)),
                   setup_allocated_bytes=before.get("setup_allocated_bytes"),
                   rss_peak_bytes=None, rss_start_bytes=None)
    else:
        hwm = vm_kib("VmHWM")
        rec.update(peak_allocated_bytes=None, peak_reserved_bytes=None, context_bytes=None, non_allocator_bytes=None,
                   setup_allocated_bytes=None,
                   rss_peak_bytes=None if hwm is None else hwm * 1024.0,
                   rss_start_bytes=before.get("rss_start_bytes"),
                   rss_after_setup_bytes=before.get("rss_after_setup_bytes"))
    return rec


def _gather_records(rec: dict, world: int) -> list[dict]:
    if world == 1:
        return [rec]
    out: list = [None] * world
    dist.all_gather_object(out, rec)
    return out


def precision_recipe(layout: ProbeLayout, extent: ProbeExtent) -> dict:
    """How the probe keeps parameters, and where that differs from the planner's 18 bytes per parameter
    (planner.memory.param_bytes: 2 bf16 weights + 4 fp32 master + 4 fp32 grads + 8 Adam states)."""
    if layout.precision == "fp32":
        return {"param_dtype": "float32", "compute_dtype": "float32", "master_weights": False,
                "grad_dtype": "float32", "optimizer_state_dtype": "float32", "bytes_per_param": 16,
                "differs_from_planner": ""}
    half = "bfloat16" if layout.precision == "bf16" else "float16"
    if extent.dp_impl(layout) == "fsdp":
        return {"param_dtype": "float32 (sharded)", "compute_dtype": f"{half} (FSDP2 MixedPrecisionPolicy)",
                "master_weights": True, "grad_dtype": "float32 (reduce_dtype, sharded)",
                "optimizer_state_dtype": "float32", "bytes_per_param": 16,
                "differs_from_planner": (f"the fp32 sharded parameters are the master weights; the {half} weights "
                                         "exist only unsharded, per FSDP unit, while it computes (not 2 bytes "
                                         "per parameter held for the whole step)")}
    return {"param_dtype": "float32", "compute_dtype": f"{half} (torch.autocast)", "master_weights": True,
            "grad_dtype": "float32", "optimizer_state_dtype": "float32", "bytes_per_param": 18,
            "differs_from_planner": (f"the fp32 parameters are the master weights; the {half} weights are "
                                     "autocast's cached copies, made in the first forward of a step and freed "
                                     "at its end (the planner's 2 bytes, present from forward to backward); "
                                     "gradients are fp32 as Megatron's main_grad")}


def _cv(times: list[float]) -> float:
    return statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0


def _projection(spec: ProbeSpec, layout: ProbeLayout, median_s: float,
                extent: ProbeExtent | None = None) -> dict:
    """The full configuration from a reduced run: step time x (layers / layers_run), DP scaled ideally."""
    if not layout.reduced:
        return {}
    extent = extent if extent is not None else probe_extent(spec)
    full = flops_model(model_spec(spec), extent)
    step_s = median_s * layout.layers_full / layout.layers_run
    gbs = layout.mbs * layout.dp_full * layout.gas
    world = layout.tp * extent.cp * layout.pp * layout.dp_full
    return {
        "step_time_s": step_s,
        "samples_per_s": gbs / step_s,
        "tokens_per_s": gbs * full.seq_len / step_s,
        "model_tflops_per_device": tflops_per_gpu(model_flops_per_iteration(full, gbs), step_s, world),
        "hardware_tflops_per_device": tflops_per_gpu(
            hardware_flops_per_iteration(full, gbs, probe_recomputed(full, layout)), step_s, world),
        "world_size": world,
        "global_batch": gbs,
        "note": (f"step time scaled by layers {layout.layers_full}/{layout.layers_run} (embedding and LM head "
                 f"scaled too, a slight overestimate); {layout.dp_full} DP replicas from {layout.dp_run} assume "
                 "perfect data-parallel scaling (no extra gradient all-reduce time)"),
    }


COMM_KINDS = (("all_to_all", "alltoall"), ("send", "recv", "sendrecv"), ("all_gather", "allgather"),
              ("reduce_scatter", "reducescatter"), ("all_reduce", "allreduce"), ("broadcast",))
"""how communication events are named: gloo:<op> on gloo's threads (CPU), nccl...Kernel_<Op> (CUDA)"""


def _comm_kind(name: str) -> str | None:
    """The collective of a profiler event, or None for computation."""
    low = name.lower()
    if not (low.startswith("gloo:") or "nccl" in low):
        return None
    flat = low.replace("_", "")
    for names in COMM_KINDS:
        if any(n.replace("_", "") in flat for n in names):
            return names[0] if names[0] != "send" else "send_recv"
    return "other"


OP_CLASSES = ("gemm", "attention", "elementwise", "optimizer")
"""the profiled step's compute by class: planner.ops' GEMM, ATTENTION and ELEMENTWISE op classes, and the optimizer
step (the planner's memory-bound `optimizer` term, outside the op list)"""
ATTENTION_MARKERS = ("scaled_dot_product", "flash", "fmha", "attention", "sdpa")
"""an attention core: torch's SDPA ops on CPU (aten::_scaled_dot_product_flash_attention_for_cpu and its backward,
the math path's bmm under aten::scaled_dot_product_attention), FlashAttention / memory-efficient / cuDNN kernels
(pytorch_flash::flash_fwd_kernel, fmha_cutlassF/B, cudnn ... sdpa)"""
OPTIMIZER_MARKERS = ("optimizer.step", "adam", "sgd")
"""the optimizer step: torch's 'Optimizer.step#AdamW.step' span and aten::_fused_adamw_ on CPU, fused / multi-tensor
Adam kernels on CUDA"""
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmv",
            "aten::mv", "aten::dot")
"""CPU: the operators whose own time is a GEMM (torch.profiler key names)"""
GEMM_KERNEL_MARKERS = ("gemm", "xmma", "nvjet", "cutlass", "cublas", "splitkreduce", "wgmma")
"""CUDA: cuBLAS / cuBLASLt / CUTLASS kernel names (sm90_xmma_gemm_*, ampere_bf16_s16816gemm_*, nvjet_*,
cutlass::Kernel2<...gemm...>, splitKreduce_kernel)"""


def op_class(name: str, ancestors: tuple[str, ...] = (), *, kernel: bool = False) -> str:
    """The class of a compute event (`OP_CLASSES`): by its own name and, on CPU, its parents' (an operator inside
    SDPA or the optimizer step belongs to it). ``kernel``: a CUDA kernel name, else a torch operator's."""
    names = [n.lower() for n in (name, *ancestors)]
    if any(m in n for n in names for m in OPTIMIZER_MARKERS):
        return "optimizer"
    if any(m in n for n in names for m in ATTENTION_MARKERS):
        return "attention"
    low = name.lower()
    if kernel:
        return "gemm" if any(m in low for m in GEMM_KERNEL_MARKERS) else "elementwise"
    return "gemm" if low in GEMM_OPS else "elementwise"


def attribute_comm(by_kind: dict[str, float], layout: ProbeLayout, extent: ProbeExtent) -> dict[str, float]:
    """Seconds per parallel dimension from seconds per collective: send/recv is PP's, all-to-all EP's;
    all-reduce, all-gather and reduce-scatter belong to whichever of TP, DP, CP is > 1 -- when more
    than one is, they stay together under ``tp_dp_cp`` (the profiler does not say which group ran them)."""
    out: dict[str, float] = {}
    if by_kind.get("send_recv"):
        out["pp"] = by_kind["send_recv"]
    if by_kind.get("all_to_all"):
        out["ep"] = by_kind["all_to_all"]
    collective = sum(v for k, v in by_kind.items() if k not in ("send_recv", "all_to_all"))
    if collective:
        dims = [d for d, n in (("tp", layout.tp), ("dp", layout.dp_run), ("cp", extent.cp)) if n > 1]
        out[dims[0] if len(dims) == 1 else "tp_dp_cp"] = collective
    return out


def profile_split(trainer: Trainer, step: int, world: int) -> dict:
    """One more step under torch.profiler: compute and communication seconds, by collective and by dimension, and
    compute by op class (`op_class`: gemm, attention, elementwise, optimizer; they sum to ``compute_s``).

    CUDA: kernel time on the device, NCCL kernels as communication, the rest compute (sums of kernel
    durations, overlap not removed), classed by kernel name. CPU (gloo): gloo's worker-thread spans
    (``gloo:<op>``, from the collective's start to its completion, waiting for peers included) as communication,
    the self time of the torch operators (aten::) on the training thread as compute, classed by operator name and
    the operators it runs inside. Rank 0's view; the step's wall time too."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if world > 1:
        dist.barrier()
    _sync(trainer.device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        trainer.step(step)
        _sync(trainer.device)
        wall = time.perf_counter() - t0
    by_kind: dict[str, float] = {}
    by_class = dict.fromkeys(OP_CLASSES, 0.0)
    for e in step_events(prof):
        # CUDA: kernels and copies only; a user annotation ('nccl:all_reduce', a record_function) spans
        # kernels that are counted themselves
        if cuda and (not e.on_device or e.annotation):
            continue
        kind = _comm_kind(e.name)
        if kind is not None:
            by_kind[kind] = by_kind.get(kind, 0.0) + e.seconds
        elif cuda:
            by_class[op_class(e.name, kernel=True)] += e.seconds
        elif e.name.startswith("aten::"):
            by_class[op_class(e.name, e.ancestors)] += e.self_seconds
    layout, extent = trainer.layout, trainer.extent
    return {"step_s": wall, "compute_s": sum(by_class.values()), "compute_s_by_class": by_class,
            "comm_s_by_collective": by_kind,
            "comm_s_by_dim": attribute_comm(by_kind, layout, extent), "source": "cuda kernels" if cuda else "cpu",
            "note": "one profiled step after timing (rank 0); sums of event durations, overlap not removed"}


def probe_recomputed(m, layout) -> Recomputed:
    """What the probe re-runs (planner.recompute): block-N checkpoints the first N layers of each of the PP x VPP
    stages, each a PP x VPP-th of ``m``'s layers (probes/gpt.py GPTStage)."""
    return recomputed(m, layout.recompute, m.layers // max(layout.pp, 1), max(layout.vpp, 1))


def flops_model(m, extent: ProbeExtent):
    """The dense model whose planner.flops equal the probe's: an MoE layer runs top_k experts per token
    (the router's 2·h·E FLOPs per token are not counted)."""
    if extent.num_experts:
        return replace(m, ffn_hidden=m.ffn_hidden * extent.moe_top_k)
    return m


def run_probe(spec: ProbeSpec, layout: ProbeLayout, rank: int, world: int, device: torch.device,
              started: float, extent: ProbeExtent | None = None, marks: PhaseMarks | None = None,
              stop=None) -> ProbeResult:
    """``stop``: a callable rank 0 asks after each step (warm workers: the tuner's stop file); when it is true every
    rank raises `Stopped` after that step."""
    extent = extent if extent is not None else probe_extent(spec)
    ask = (lambda: False) if stop is None or rank != 0 else stop

    def loss_of(local: torch.Tensor) -> float:
        loss, stopped = _global_loss(local, world, ask())
        if stopped:
            raise Stopped()
        return loss

    marks = marks if marks is not None else PhaseMarks(None)
    before: dict = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        before["context_bytes"] = float(total - free - torch.cuda.memory_reserved(device))
    else:
        kib = vm_kib("VmRSS")
        before["rss_start_bytes"] = None if kib is None else kib * 1024.0
    trainer = Trainer(spec, layout, rank, world, device, extent)
    planned_steps = spec.warmup_steps + spec.steps * MAX_MEASURE_ROUNDS
    trainer.prepare_batches(range(min(planned_steps, BATCH_CYCLE)))       # synthetic data on the device before any timing
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before["setup_allocated_bytes"] = float(torch.cuda.memory_allocated(device))
    else:
        kib = vm_kib("VmRSS")
        before["rss_after_setup_bytes"] = None if kib is None else kib * 1024.0
    before["peak_reset"] = reset_peak_memory(device)
    _cap_address_space()
    marks.mark("build")
    losses: list[float] = []
    step = 0
    for _ in range(spec.warmup_steps):
        losses.append(loss_of(trainer.step(step)))
        if step == 0:
            _inject_fault(rank)
        step += 1
    if world > 1:
        dist.barrier()
    marks.mark("warmup")
    all_times: list[float] = []
    window: list[float] = []
    rounds = 0
    while rounds < MAX_MEASURE_ROUNDS:
        rounds += 1
        times = []
        for _ in range(spec.steps):
            _sync(device)
            t0 = time.perf_counter()
            local = trainer.step(step)
            _sync(device)
            times.append(time.perf_counter() - t0)
            if rank == 0:                   # the tuner reads this as it comes (probes.steps.STEP_MARK): progress, pruning
                print(f"[probe] step {step} {times[-1]:.6f} s", flush=True)
            losses.append(loss_of(local))
            if step == 0:
                _inject_fault(rank)
            step += 1
        window = _slowest(times, device, world)
        all_times += window
        if _cv(window) <= spec.max_cv:
            break
    marks.mark("steps")
    median = statistics.median(window)
    cv = _cv(window)
    records = _gather_records(memory_record(trainer, before), world)
    split = profile_split(trainer, step, world) if spec.profile else {}
    m = flops_model(trainer.model, extent)
    gbs = layout.global_batch_run
    model_flops = model_flops_per_iteration(m, gbs)
    hw_flops = hardware_flops_per_iteration(m, gbs, probe_recomputed(m, layout))
    if device.type == "cuda":
        peaks, kind = [r["peak_allocated_bytes"] for r in records], "cuda_max_allocated"
    else:
        peaks, kind = [r["rss_peak_bytes"] or 0.0 for r in records], "rss"
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ProbeResult(
        status="ok", step_times_s=all_times, step_time_median_s=median, step_time_cv=cv, stable=cv <= spec.max_cv,
        samples_per_s=gbs / median, tokens_per_s=gbs * m.seq_len / median,
        model_tflops_per_device=tflops_per_gpu(model_flops, median, world),
        hardware_tflops_per_device=tflops_per_gpu(hw_flops, median, world),
        peak_memory_bytes_per_rank=peaks, memory_kind=kind, reduced=layout.reduced,
        projected=_projection(spec, layout, median, extent), losses=losses,
        device=f"{dev_name} ({'nccl' if device.type == 'cuda' else 'gloo'})", world_size=world,
        wall_s=time.time() - started, memory_per_rank=records, precision_recipe=precision_recipe(layout, extent),
        timing_split=split,
        extra={"layout": asdict(layout), "extent": asdict(extent), "dp_impl": extent.dp_impl(layout),
               "model_flops_per_step": model_flops, "hardware_flops_per_step": hw_flops,
               "global_batch_run": gbs, "measure_rounds": rounds, "timed_steps_last_window": len(window),
               "cuda_max_reserved_bytes_per_rank": [r["peak_reserved_bytes"] for r in records
                                                    if r["peak_reserved_bytes"] is not None],
               "torch": torch.__version__,
               "note": "median and cv over the last window of timed steps; a step's time is the slowest rank's"})


def count_step_flops(spec: ProbeSpec) -> float:
    """FLOPs one training step really executes, counted by torch's FlopCounterMode (one process, CPU).

    Counts the matmuls and attention of forward, backward and any recomputed forward; compare
    with `planner.flops.hardware_flops_per_iteration`. SDPA runs its math backend here: the
    counter has no formula for the CPU flash kernel (it would count attention as 0).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    layout, _ = resolve_probe(spec, world=1)
    if layout.world_run != 1:
        raise LayoutError("count_step_flops runs one process: use tp = pp = 1 and one DP replica")
    trainer = Trainer(spec, layout, 0, 1, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        trainer.step(0)
    return float(counter.get_total_flops())


ONEDNN_CREATE_FAILURE = "could not create a primitive"
"""oneDNN's (CPU kernels') error when it cannot set up a kernel, which includes failing to allocate its buffers"""


def _is_oom(err: BaseException) -> bool:
    """A memory failure: torch's and Python's own, or, in an address space capped below the machine's
    (``PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES``, a scheduler's limit), oneDNN failing to set up a kernel: which
    allocation meets the cap first depends on timing, and under the cap oneDNN's failure is its allocation's."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS):
        return True
    return ONEDNN_CREATE_FAILURE in text and resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def _finish(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _device_of(spec: ProbeSpec, local_rank: int) -> torch.device:
    """Where this rank runs ``spec`` (set as the current CUDA device; one CPU thread unless OMP says otherwise)."""
    if spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    return torch.device("cpu")


def rendezvous(rank: int, world: int) -> dict:
    """init_process_group's rendezvous arguments: the file store `probes.forkserver` names for its ranks on one
    node, else none (env://: torchrun's, or a multi-node fork server's MASTER_ADDR/MASTER_PORT)."""
    store = os.environ.get(RDZV_FILE_ENV)
    return {"init_method": f"file://{store}", "rank": rank, "world_size": world} if store else {}


def _fail(err: BaseException, rank: int, out: Path) -> None:
    """Record ``err`` for the launcher (``error-rank{r}.json``, one line on stderr) and end the process."""
    status = "oom" if _is_oom(err) else "crash"
    message = f"{type(err).__name__}: {err}".splitlines()[0][:500]
    record = {"rank": rank, "status": status, "message": message, "time": time.time(),
              "traceback": traceback.format_exc()}
    (out / f"error-rank{rank}.json").write_text(json.dumps(record) + "\n")
    print(f"{ERROR_PREFIX}rank {rank} {status}: {message}", file=sys.stderr)
    traceback.print_exc()
    _finish(1)


def main(argv: list[str] | None = None) -> int:
    started = time.time()   # started behind a probes.lifeline: a killed torchrun (or tuner) takes it along
    parser = argparse.ArgumentParser(prog="python -m probes.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="ProbeSpec JSON file")
    parser.add_argument("--out", help="probe folder (result.json, error and pid files)")
    parser.add_argument("--serve", help="warm worker: run the probes handed to this folder one after another "
                                        "(probes.warm)")
    args = parser.parse_args(argv)
    if args.serve:
        from probes.warm_worker import serve

        serve(Path(args.serve), started)
        return 0
    if not (args.spec and args.out):
        parser.error("give --spec and --out (one probe), or --serve DIR (warm worker)")
    spec = ProbeSpec.from_dict(json.loads(Path(args.spec).read_text()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    (out / f"pid-rank{rank}").write_text(f"{os.getpid()}\n")
    marks = PhaseMarks(out if rank == 0 else None)
    marks.mark("start", started)
    try:
        layout, extent = resolve_probe(spec, world=world, local_world=local_world)
    except LayoutError as err:
        if rank == 0:
            _emit(ProbeResult(status="invalid", reason=str(err), world_size=world, workdir=str(out)), out)
        _finish(0)
        return 0
    try:
        device = _device_of(spec, local_rank)
        hold("setup")
        if world > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=timedelta(seconds=PG_TIMEOUT_S), **rendezvous(rank, world))
        marks.mark("rendezvous")
        result = run_probe(spec, layout, rank, world, device, started, extent, marks)
    except Exception as err:  # noqa: BLE001 -- recorded for the launcher, then the process ends
        _fail(err, rank, out)
        return 1
    if rank == 0:
        _emit(ProbeResult(**{**result.to_dict(), "workdir": str(out)}), out)
    hold("teardown")
    _finish(0)
    return 0


def _emit(result: ProbeResult, out: Path) -> None:
    result.write(out / "result.json")
    print(RESULT_PREFIX + result.to_json(), flush=True)


if __name__ == "__main__":
    main()
