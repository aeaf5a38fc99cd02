"""The training probe: a GPT trained a few steps under one candidate layout, timed like a benchmark.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m probes.train --spec spec.json --out probe-dir

``spec.json`` is a `probes.result.ProbeSpec`. Rank 0 prints one line ``PLANTUNE_RESULT {json}``
and writes ``probe-dir/result.json``; every rank writes ``probe-dir/pid-rank{r}`` at start and,
when it fails, ``probe-dir/error-rank{r}.json`` (status oom | crash, message, time) for the
launcher to pick the root cause. Processes end with ``os._exit`` right after that (see
CPU_PROBES.md: avoids a SIGABRT in process-group teardown).

Timing: ``warmup_steps`` untimed steps, then windows of ``steps`` timed steps with a device
sync on both sides of the timer; a step's time is the slowest rank's. While the last window's
coefficient of variation is above ``max_cv`` another window is measured, at most
`MAX_MEASURE_ROUNDS` in all. FLOPs come from `planner.flops` for the model actually run.

Precision: bf16/fp16 run under ``torch.autocast`` (and FSDP2's MixedPrecisionPolicy: bf16/fp16
parameters, fp32 gradient reduction); fp16 has no loss scaler -- the timing is faithful, the
recipe is not. fp32 runs plain.

Debug environment variables (tests): ``PLANTUNE_PROBE_FAULT`` = ``hang:R`` | ``raise:R`` |
``exit:R:CODE`` makes rank R misbehave after its first step; ``PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES``
caps each CPU rank's address space at its size before the first step plus that many bytes.
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
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.flops import hardware_flops_per_iteration, model_flops_per_iteration, tflops_per_gpu
from probes.gpt import lm_loss
from probes.launch import die_with_parent
from probes.layout import LayoutError, ProbeLayout, model_run, model_spec, resolve_layout
from probes.outcome import OOM_MARKERS
from probes.parallel import DTYPES, build_mesh, build_schedule, build_stages, rank_position
from probes.result import ProbeResult, ProbeSpec

RESULT_PREFIX = "PLANTUNE_RESULT "
ERROR_PREFIX = "PLANTUNE_ERROR "
MAX_MEASURE_ROUNDS = 3
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


class Trainer:
    """One rank's model chunks, optimizer, data slice and step function."""

    def __init__(self, spec: ProbeSpec, layout: ProbeLayout, rank: int, world: int, device: torch.device) -> None:
        self.spec, self.layout, self.device = spec, layout, device
        self.model = model_run(spec, layout)
        self.pos = rank_position(rank, layout)
        self.mesh = build_mesh(layout, device.type) if world > 1 else None
        self.stages = build_stages(self.model, layout, self.mesh, self.pos, device, spec.seed)
        params = list({id(p): p for s in self.stages for p in s.parameters()}.values())
        self.optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0)
        self.schedule = build_schedule(self.stages, layout, self.mesh, self.pos, device) if layout.pp > 1 else None
        self.first = self.pos.pp == 0
        self.last = self.pos.pp == layout.pp - 1
        per_replica = layout.mbs * layout.gas
        self.rows = slice(self.pos.dp * per_replica, (self.pos.dp + 1) * per_replica)

    def step(self, step: int) -> torch.Tensor:
        """One optimizer step; returns (mean loss over this rank's micro-batches, 1) or (0, 0) off the last stage."""
        lay = self.layout
        x, y = synthetic_batch(self.spec, self.model.vocab, self.model.seq_len, lay.global_batch_run, step, self.rows)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with _autocast(self.device, lay.precision):
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
                    skip_sync = lay.dp_impl == "ddp" and i < lay.gas - 1
                    with model.no_sync() if skip_sync else contextlib.nullcontext():
                        loss = lm_loss(model(xm), ym)
                        (loss / lay.gas).backward()
                    total += loss.detach().float()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if total is None:
            return torch.zeros(2, device=self.device)
        return torch.stack([total / lay.gas, torch.ones((), device=self.device)])


def _global_loss(local: torch.Tensor, world: int) -> float:
    """Mean loss over the ranks holding one (the last pipeline stage; TP ranks agree)."""
    if world > 1:
        dist.all_reduce(local)
    return float(local[0] / local[1])


def _slowest(times: list[float], device: torch.device, world: int) -> list[float]:
    t = torch.tensor(times, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _peak_memory(device: torch.device, world: int) -> tuple[list[float], list[float], str]:
    """Per rank: (peak bytes, CUDA max reserved bytes or [], kind)."""
    if device.type == "cuda":
        mine = [float(torch.cuda.max_memory_allocated(device)), float(torch.cuda.max_memory_reserved(device))]
        kind = "cuda_max_allocated"
    else:
        mine = [float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, 0.0]  # Linux: KiB
        kind = "rss"
    t = torch.tensor(mine, dtype=torch.float64, device=device)
    if world > 1:
        gathered = [torch.zeros_like(t) for _ in range(world)]
        dist.all_gather(gathered, t)
    else:
        gathered = [t]
    peaks = [g[0].item() for g in gathered]
    reserved = [g[1].item() for g in gathered] if device.type == "cuda" else []
    return peaks, reserved, kind


def _cv(times: list[float]) -> float:
    return statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0


def _projection(spec: ProbeSpec, layout: ProbeLayout, median_s: float) -> dict:
    """The full configuration from a reduced run: step time x (layers / layers_run), DP scaled ideally."""
    if not layout.reduced:
        return {}
    full = model_spec(spec)
    step_s = median_s * layout.layers_full / layout.layers_run
    gbs = layout.mbs * layout.dp_full * layout.gas
    world = layout.tp * layout.pp * layout.dp_full
    return {
        "step_time_s": step_s,
        "samples_per_s": gbs / step_s,
        "tokens_per_s": gbs * full.seq_len / step_s,
        "model_tflops_per_device": tflops_per_gpu(model_flops_per_iteration(full, gbs), step_s, world),
        "hardware_tflops_per_device": tflops_per_gpu(
            hardware_flops_per_iteration(full, gbs, layout.recompute), step_s, world),
        "world_size": world,
        "global_batch": gbs,
        "note": (f"step time scaled by layers {layout.layers_full}/{layout.layers_run} (embedding and LM head "
                 f"scaled too, a slight overestimate); {layout.dp_full} DP replicas from {layout.dp_run} assume "
                 "perfect data-parallel scaling (no extra gradient all-reduce time)"),
    }


def run_probe(spec: ProbeSpec, layout: ProbeLayout, rank: int, world: int, device: torch.device,
              started: float) -> ProbeResult:
    trainer = Trainer(spec, layout, rank, world, device)
    _cap_address_space()
    losses: list[float] = []
    step = 0
    for _ in range(spec.warmup_steps):
        losses.append(_global_loss(trainer.step(step), world))
        if step == 0:
            _inject_fault(rank)
        step += 1
    if world > 1:
        dist.barrier()
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
            if rank == 0:                   # the tuner's live progress reads this (search.study.STEP_MARK)
                print(f"[probe] step {step} {times[-1]:.6f} s", flush=True)
            losses.append(_global_loss(local, world))
            if step == 0:
                _inject_fault(rank)
            step += 1
        window = _slowest(times, device, world)
        all_times += window
        if _cv(window) <= spec.max_cv:
            break
    median = statistics.median(window)
    cv = _cv(window)
    m = trainer.model
    gbs = layout.global_batch_run
    model_flops = model_flops_per_iteration(m, gbs)
    hw_flops = hardware_flops_per_iteration(m, gbs, layout.recompute)
    peaks, reserved, kind = _peak_memory(device, world)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ProbeResult(
        status="ok", step_times_s=all_times, step_time_median_s=median, step_time_cv=cv, stable=cv <= spec.max_cv,
        samples_per_s=gbs / median, tokens_per_s=gbs * m.seq_len / median,
        model_tflops_per_device=tflops_per_gpu(model_flops, median, world),
        hardware_tflops_per_device=tflops_per_gpu(hw_flops, median, world),
        peak_memory_bytes_per_rank=peaks, memory_kind=kind, reduced=layout.reduced,
        projected=_projection(spec, layout, median), losses=losses,
        device=f"{dev_name} ({'nccl' if device.type == 'cuda' else 'gloo'})", world_size=world,
        wall_s=time.time() - started,
        extra={"layout": asdict(layout), "model_flops_per_step": model_flops, "hardware_flops_per_step": hw_flops,
               "global_batch_run": gbs, "measure_rounds": rounds, "timed_steps_last_window": len(window),
               "cuda_max_reserved_bytes_per_rank": reserved, "torch": torch.__version__,
               "note": "median and cv over the last window of timed steps; a step's time is the slowest rank's"})


def count_step_flops(spec: ProbeSpec) -> float:
    """FLOPs one training step really executes, counted by torch's FlopCounterMode (one process, CPU).

    Counts the matmuls and attention of forward, backward and any recomputed forward; compare
    with `planner.flops.hardware_flops_per_iteration`. SDPA runs its math backend here: the
    counter has no formula for the CPU flash kernel (it would count attention as 0).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    layout = resolve_layout(spec, world=1)
    if layout.world_run != 1:
        raise LayoutError("count_step_flops runs one process: use tp = pp = 1 and one DP replica")
    trainer = Trainer(spec, layout, 0, 1, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        trainer.step(0)
    return float(counter.get_total_flops())


def _is_oom(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}"
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS)


def _finish(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    die_with_parent()   # a killed torchrun (or tuner) takes its workers with it
    parser = argparse.ArgumentParser(prog="python -m probes.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="ProbeSpec JSON file")
    parser.add_argument("--out", required=True, help="probe folder (result.json, error and pid files)")
    args = parser.parse_args(argv)
    spec = ProbeSpec.from_dict(json.loads(Path(args.spec).read_text()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    (out / f"pid-rank{rank}").write_text(f"{os.getpid()}\n")
    try:
        layout = resolve_layout(spec, world=world, local_world=local_world)
    except LayoutError as err:
        if rank == 0:
            _emit(ProbeResult(status="invalid", reason=str(err), world_size=world, workdir=str(out)), out)
        _finish(0)
        return 0
    try:
        use_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
        if use_cuda:
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
            if "OMP_NUM_THREADS" not in os.environ:
                torch.set_num_threads(1)
        if world > 1:
            dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
        result = run_probe(spec, layout, rank, world, device, started)
    except Exception as err:  # noqa: BLE001 -- recorded for the launcher, then the process ends
        status = "oom" if _is_oom(err) else "crash"
        message = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        record = {"rank": rank, "status": status, "message": message, "time": time.time(),
                  "traceback": traceback.format_exc()}
        (out / f"error-rank{rank}.json").write_text(json.dumps(record) + "\n")
        print(f"{ERROR_PREFIX}rank {rank} {status}: {message}", file=sys.stderr)
        traceback.print_exc()
        _finish(1)
        return 1
    if rank == 0:
        _emit(ProbeResult(**{**result.to_dict(), "workdir": str(out)}), out)
    _finish(0)
    return 0


def _emit(result: ProbeResult, out: Path) -> None:
    result.write(out / "result.json")
    print(RESULT_PREFIX + result.to_json(), flush=True)


if __name__ == "__main__":
    main()
