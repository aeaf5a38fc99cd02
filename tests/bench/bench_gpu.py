"""The probe on one GPU against the hardware and the planner (a script, not a pytest test).

    python tests/bench/bench_gpu.py                       # all three parts; skips cleanly without CUDA
    python tests/bench/bench_gpu.py --part matmul --mbs 2
    python tests/bench/bench_gpu.py --part largest --max-tries 4

1. ``matmul``: a 1-GPU bf16 probe of a ~1.1B Llama-shaped model (TinyLlama's shape: 22 layers,
   hidden 2048, 32 heads / 4 KV heads, SwiGLU 5632, vocab 32000, seq 2048) against plain bf16
   ``torch.mm`` of the same GEMMs (every layer's and the LM head's, forward and both backward
   products). Goal: probe model TFLOP/s >= 60% of the matmuls' TFLOP/s.
2. ``memory``: the same probe's peak memory against `planner.memory.stage_memory` for the same
   model and layout on the catalog GPU matching this one. Goal: within 10% -- the probe's peak
   reserved + non-allocator memory (context, NCCL, cuBLAS) against the planner's total, and the
   probe's peak allocated against the planner's total less context and buffers.
3. ``kernels``: one profiled step of the same probe, in this process: device time by kernel, the
   top ones and a summary by kind (GEMM, attention, optimizer, copies, other elementwise).
4. ``memsweep``: peak allocated memory against the planner over micro-batch sizes and recompute modes
   (the slope is the activation bytes per token, the intercept the model states).
5. ``largest``: the deepest model of that shape (layers added) that trains at mbs 1: the planner's
   largest predicted fit, then probes up and down from it (``--max-tries`` probes at most).

Prints ``SKIP: ...`` and exits 0 when torch sees no CUDA device. Each probe is a separate
process (`probes.launch.run_local`), so an OOM ends that probe only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.flops import layer_forward_matmul_flops, logits_forward_flops  # noqa: E402
from planner.hardware import catalog_id_for_device, make_cluster  # noqa: E402
from planner.memory import stage_memory, verdict  # noqa: E402
from planner.model import ModelSpec  # noqa: E402
from planner.space import Candidate, TrainingSpec  # noqa: E402
from probes.launch import run_local  # noqa: E402
from probes.result import ProbeResult, ProbeSpec  # noqa: E402

MODEL_1B = ModelSpec(name="llama-1.1b", layers=22, hidden=2048, heads=32, kv_heads=4, ffn_hidden=5632, vocab=32000,
                     seq_len=2048, glu=True, norm="rmsnorm", position="rope", bias=False, tied_embeddings=False)
"""TinyLlama-1.1B's shape (its config.json): 1.1B parameters"""
MATMUL_GOAL = 0.60
MEMORY_GOAL = 0.10
PROBE_TIMEOUT_S = 900.0


def probe(model: ModelSpec, mbs: int, *, steps: int, workdir: Path, recompute: str = "none") -> ProbeResult:
    cand = Candidate(tp=1, pp=1, dp=1, mbs=mbs, gas=1, recompute=recompute)
    spec = ProbeSpec(model=model.to_dict(), candidate=cand.to_dict(), precision="bf16", warmup_steps=3, steps=steps,
                     device="cuda", max_cv=0.05, profile=True)
    return run_local(spec, nproc=1, workdir=workdir, timeout_s=PROBE_TIMEOUT_S)


def sweep_probe(model: ModelSpec, cand: Candidate, *, steps: int, workdir: Path) -> ProbeResult:
    """One short, unprofiled probe of a sweep (memsweep, timesweep): one warm-up step, no spread limit."""
    spec = ProbeSpec(model=model.to_dict(), candidate=cand.to_dict(), precision="bf16", warmup_steps=1, steps=steps,
                     device="cuda", max_cv=10.0)
    return run_local(spec, nproc=1, workdir=workdir, timeout_s=PROBE_TIMEOUT_S)


def gemm_shapes(m: ModelSpec, tokens: int) -> list[tuple[int, int, int, int]]:
    """(M, K, N, count) of one training step's GEMMs: each forward X(MxK) W(KxN), its dX and dW."""
    h, f, kv = m.hidden, m.ffn_hidden, m.kv_dim
    per_layer = [(tokens, h, h + 2 * kv), (tokens, h, h), (tokens, h, f * (2 if m.glu else 1)), (tokens, f, h)]
    out = []
    for (mm, k, n), count in [*((s, m.layers) for s in per_layer), ((tokens, h, m.vocab), 1)]:
        out += [(mm, k, n, count), (mm, n, k, count), (k, mm, n, count)]   # forward, dX = dY W^T, dW = X^T dY
    return out


def time_matmuls(shapes, repeats: int = 20) -> tuple[float, float]:
    """(seconds, FLOPs) of plain bf16 torch.mm over ``shapes``: each shape's median time x its count."""
    import torch

    total_s = total_flops = 0.0
    for mm, k, n, count in shapes:
        a = torch.randn(mm, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        total_s += statistics.median(times) * count
        total_flops += 2.0 * mm * k * n * count
        del a, b
    return total_s, total_flops


def part_matmul(args, tmp: Path) -> ProbeResult:
    m = replace(MODEL_1B, seq_len=args.seq)
    r = probe(m, args.mbs, steps=args.steps, workdir=tmp / "matmul")
    if not r.ok:
        print(f"probe {r.status}: {r.reason}")
        return r
    tokens = args.mbs * m.seq_len
    mm_s, mm_flops = time_matmuls(gemm_shapes(m, tokens))
    mm_tflops = mm_flops / mm_s / 1e12
    gemm_step = 3 * (m.layers * layer_forward_matmul_flops(m, tokens) + logits_forward_flops(m, tokens))
    print(f"model {m.name}: {m.params / 1e9:.2f}B params, seq {m.seq_len}, mbs {args.mbs}, bf16, 1 GPU ({r.device})")
    print(f"probe: step {r.step_time_median_s * 1e3:.1f} ms (cv {r.step_time_cv:.3f}), model {r.model_tflops_per_device:.1f} "
          f"TFLOP/s, hardware {r.hardware_tflops_per_device:.1f} TFLOP/s")
    print(f"plain bf16 torch.mm of the same GEMMs: {mm_s * 1e3:.1f} ms, {mm_tflops:.1f} TFLOP/s "
          f"(GEMM FLOPs {mm_flops:.3e}; the step's model FLOPs {gemm_step:.3e} also count attention)")
    ratio = r.model_tflops_per_device / mm_tflops
    print(f"probe / matmul = {ratio:.1%} (goal >= {MATMUL_GOAL:.0%}): {'MET' if ratio >= MATMUL_GOAL else 'NOT MET'}")
    if r.timing_split:
        print(f"profiled step: {r.timing_split}")
    return r


def part_memory(args, r: ProbeResult) -> None:
    import torch

    if not r.ok:
        return
    m = replace(MODEL_1B, seq_len=args.seq)
    gpu = catalog_id_for_device(torch.cuda.get_device_name(0))
    cluster = make_cluster(gpu=gpu, gpus_per_node=8, nodes=1)
    cand = Candidate(tp=1, pp=1, dp=1, mbs=args.mbs, gas=1)
    training = TrainingSpec(global_batch=args.mbs, seq_len=m.seq_len, precision="bf16", framework="megatron-lm")
    (plan,) = stage_memory(m, cand, cluster, training)
    rec = r.memory_per_rank[0]
    measured_total = rec["peak_reserved_bytes"] + rec["non_allocator_bytes"]
    measured_alloc = rec["peak_allocated_bytes"]
    plan_alloc = plan.total_bytes - plan.context_bytes - plan.buffers_bytes
    print(f"memory on {gpu} ({torch.cuda.get_device_name(0)}), GB:")
    print(f"  planner: weights {plan.weights_bytes / 1e9:.2f} grads {plan.grads_bytes / 1e9:.2f} optimizer "
          f"{plan.optimizer_bytes / 1e9:.2f} activations {plan.activations_bytes / 1e9:.2f} logits "
          f"{plan.logits_bytes / 1e9:.2f} buffers {plan.buffers_bytes / 1e9:.2f} context {plan.context_bytes / 1e9:.2f}"
          f" = {plan.total_gb:.2f}")
    print(f"  probe:   params {rec['param_bytes'] / 1e9:.2f} grads {rec['grads_bytes'] / 1e9:.2f} optimizer states "
          f"{rec['optimizer_state_bytes'] / 1e9:.2f}; peak allocated {measured_alloc / 1e9:.2f}, peak reserved "
          f"{rec['peak_reserved_bytes'] / 1e9:.2f}, context at start {rec['context_bytes'] / 1e9:.2f}, "
          f"non-allocator at end {rec['non_allocator_bytes'] / 1e9:.2f}")
    for what, got, want in (("reserved + non-allocator vs planner total", measured_total, plan.total_bytes),
                            ("peak allocated vs planner less context and buffers", measured_alloc, plan_alloc)):
        err = got / want - 1
        print(f"  {what}: {got / 1e9:.2f} / {want / 1e9:.2f} = {err:+.1%} (goal within {MEMORY_GOAL:.0%}): "
              f"{'MET' if abs(err) <= MEMORY_GOAL else 'NOT MET'}")
    print(f"  precision: {r.precision_recipe}")


KERNEL_KINDS = (("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas")), ("attention", ("flash", "fmha", "attention")),
                ("optimizer", ("adam",)), ("copy", ("memcpy", "memset", "copy")), ("nccl", ("nccl",)))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


def part_kernels(args) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from probes.extent import resolve_probe
    from probes.train import Trainer

    m = replace(MODEL_1B, seq_len=args.seq)
    cand = Candidate(tp=1, pp=1, dp=1, mbs=args.mbs, gas=1)
    spec = ProbeSpec(model=m.to_dict(), candidate=cand.to_dict(), precision="bf16", device="cuda")
    layout, ext = resolve_probe(spec, world=1)
    trainer = Trainer(spec, layout, 0, 1, torch.device("cuda", 0), ext)
    for step in range(3):
        trainer.step(step)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        trainer.step(3)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU or getattr(e, "is_user_annotation", False):
            continue
        rec = by_name.setdefault(e.name, [0.0, 0])
        rec[0] += e.time_range.elapsed_us() / 1e3
        rec[1] += 1
    total = sum(v[0] for v in by_name.values())
    by_kind: dict[str, float] = {}
    for name, (ms, _) in by_name.items():
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + ms
    print(f"kernels: one step {wall * 1e3:.1f} ms wall, {total:.1f} ms of device time in {len(by_name)} kernels")
    print("  by kind: " + ", ".join(f"{k} {v:.1f} ms ({v / total:.0%})" for k, v in
                                    sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {ms:8.2f} ms {n:5d}x  {kernel_kind(name):9s} {name[:110]}")
    del trainer
    torch.cuda.empty_cache()


def part_memsweep(args, tmp: Path) -> None:
    import torch

    m = replace(MODEL_1B, seq_len=args.seq)
    gpu = catalog_id_for_device(torch.cuda.get_device_name(0))
    cluster = make_cluster(gpu=gpu, gpus_per_node=8, nodes=1)
    print(f"memsweep on {gpu}: peak allocated (GB) vs the planner's total less context and buffers")
    for recompute in ("none", "selective", "full"):
        for mbs in (1, 2, 4, 8):
            cand = Candidate(tp=1, pp=1, dp=1, mbs=mbs, gas=1, recompute=recompute)
            training = TrainingSpec(global_batch=mbs, seq_len=m.seq_len, precision="bf16", framework="megatron-lm")
            (plan,) = stage_memory(m, cand, cluster, training)
            want = plan.total_bytes - plan.context_bytes - plan.buffers_bytes
            r = sweep_probe(m, cand, steps=2, workdir=tmp / f"sweep-{recompute}-{mbs}")
            if not r.ok:
                print(f"  {recompute:9s} mbs {mbs}: {r.status} (planner {want / 1e9:.2f})")
                continue
            got = r.memory_per_rank[0]["peak_allocated_bytes"]
            print(f"  {recompute:9s} mbs {mbs}: probe {got / 1e9:6.2f}  planner {want / 1e9:6.2f} "
                  f"(activations {plan.activations_bytes / 1e9:5.2f}, logits {plan.logits_bytes / 1e9:4.2f})  "
                  f"{got / want - 1:+.1%}")


def part_timesweep(args, tmp: Path) -> None:
    """The planner's ranking on this GPU: one global batch (8 sequences) laid out as MBS 1-8 x no/selective/full
    recompute, each probed; measured step time against the planner's Megatron-LM estimate (ratio per row and
    Spearman's rank correlation over the rows, tests/bench/validate.py's)."""
    import torch

    from planner.rank import estimate
    from validate import spearman

    m, gbs = replace(MODEL_1B, seq_len=args.seq), 8
    gpu = catalog_id_for_device(torch.cuda.get_device_name(0))
    cluster = make_cluster(gpu=gpu, gpus_per_node=8, nodes=1)
    training = TrainingSpec(global_batch=gbs, seq_len=m.seq_len, precision="bf16", framework="megatron-lm")
    print(f"timesweep on {gpu}: {m.name}, {gbs} sequences of {m.seq_len} a step; measured vs the planner's step time")
    rows = []
    for recompute in ("none", "selective", "full"):
        for mbs in (1, 2, 4, 8):
            cand = Candidate(tp=1, pp=1, dp=1, mbs=mbs, gas=gbs // mbs, recompute=recompute)
            planned = estimate(m, cluster, training, cand).time.step_time_s
            r = sweep_probe(m, cand, steps=3, workdir=tmp / f"time-{recompute}-{mbs}")
            if not r.ok:
                print(f"  {recompute:9s} mbs {mbs} gas {gbs // mbs}: {r.status} (planner {planned * 1e3:.0f} ms)")
                continue
            got = r.step_time_median_s
            rows.append((planned, got))
            print(f"  {recompute:9s} mbs {mbs} gas {gbs // mbs}: probe {got * 1e3:6.1f} ms  planner {planned * 1e3:6.1f} ms"
                  f"  planner/probe {planned / got:.2f}")
    if len(rows) >= 3:
        ratios = [p / g for p, g in rows]
        print(f"Spearman (planner vs probe step time, {len(rows)} layouts): "
              f"{spearman([p for p, _ in rows], [g for _, g in rows]):.2f}; planner/probe geometric mean "
              f"{statistics.geometric_mean(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")


def part_largest(args, tmp: Path) -> None:
    import torch

    gpu = catalog_id_for_device(torch.cuda.get_device_name(0))
    cluster = make_cluster(gpu=gpu, gpus_per_node=8, nodes=1)
    base = replace(MODEL_1B, seq_len=args.seq)
    cand = Candidate(tp=1, pp=1, dp=1, mbs=1, gas=1, recompute="full")
    training = TrainingSpec(global_batch=1, seq_len=base.seq_len, precision="bf16", framework="megatron-lm")
    visible = torch.cuda.mem_get_info(0)[1]

    def fits(layers: int) -> bool:        # the planner's own rule: total within (1 - headroom) of the catalog's HBM
        return all(verdict(b, cluster, training).fits
                   for b in stage_memory(replace(base, layers=layers), cand, cluster, training))

    layers = 1
    while fits(layers + 1):
        layers += 1
    print(f"largest: planner predicts {layers} layers ({replace(base, layers=layers).params / 1e9:.2f}B params) fit "
          f"at mbs 1, full recompute ({gpu}: {cluster.gpu.memory_bytes / 2**30:.2f} GiB in the catalog, "
          f"{training.memory_headroom:.0%} headroom; CUDA sees {visible / 2**30:.2f} GiB on this device)")
    ok, bad, tries = 0, None, 0
    step = max(1, layers // 10)
    cur = layers
    while tries < args.max_tries:
        tries += 1
        t0 = time.monotonic()
        r = probe(replace(base, layers=cur), 1, steps=2, workdir=tmp / f"largest-{cur}", recompute="full")
        print(f"  {cur} layers ({replace(base, layers=cur).params / 1e9:.2f}B): {r.status} "
              f"({time.monotonic() - t0:.0f} s){'' if r.ok else ' ' + r.reason[:120]}")
        if r.ok:
            ok = max(ok, cur)
            cur = cur + step if bad is None else (cur + bad) // 2
        else:
            bad = cur if bad is None else min(bad, cur)
            cur = (ok + cur) // 2 if ok else max(1, cur - step)
        if bad is not None and bad - ok <= 1:
            break
    if ok:
        big = replace(base, layers=ok)
        print(f"largest that trained: {ok} layers, {big.params / 1e9:.2f}B params (planner: {layers} layers)")
    else:
        print("largest: no probe succeeded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "matmul", "memory", "kernels", "memsweep", "timesweep", "largest"),
                        default="all")
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-tries", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="kernels: how many of the costliest kernels to list")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed; bench_gpu needs torch with CUDA")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} sees no CUDA device; bench_gpu measures a 1-GPU probe against "
              "bf16 matmuls and the planner's memory, and needs one")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as d:
        tmp = Path(d)
        if args.part in ("all", "matmul", "memory"):
            r = part_matmul(args, tmp)
            if args.part in ("all", "memory"):
                part_memory(args, r)
        if args.part in ("all", "kernels"):
            part_kernels(args)
        if args.part == "memsweep":           # not in "all": 12 probes
            part_memsweep(args, tmp)
        if args.part == "timesweep":          # not in "all": 12 probes
            part_timesweep(args, tmp)
        if args.part in ("all", "largest"):
            part_largest(args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
