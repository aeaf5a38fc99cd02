"""How long a probe takes end to end and how stable its figure is (a script, not a pytest test).

    cd /work/main && python tests/bench/bench_probe.py              # CPU: 2 ranks x 3 repeats
    python tests/bench/bench_probe.py --repeats 5 --nproc 2 --layout tp=2

CPU: the same probe (fp32, gloo) run ``--repeats`` times back to back through `run_local`;
prints per repeat the wall time from launch to result, the median step time, its CV and the
model TFLOP/s per rank, then the median and spread ((max - min) / median) over the repeats.
GPU (when torch sees one): a 1-GPU bf16 probe's model and hardware TFLOP/s next to a plain
bf16 matmul of the probe's MLP shape, and the matmul's own rate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.model import ModelSpec  # noqa: E402
from planner.space import Candidate  # noqa: E402
from probes.launch import run_local  # noqa: E402
from probes.result import ProbeSpec  # noqa: E402

CPU_MODEL = ModelSpec(name="bench-cpu", layers=4, hidden=256, heads=4, kv_heads=4, ffn_hidden=1024, vocab=1024,
                      seq_len=128, tied_embeddings=False)
"""~3.5M parameters: a probe of a few seconds on 2 CPU ranks"""
GPU_MODEL = ModelSpec(name="bench-gpu", layers=8, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=32000,
                      seq_len=2048, tied_embeddings=False)
"""~0.5B parameters, seq 2048: large enough GEMMs for a GPU"""


def _candidate(layout: str, nproc: int, mbs: int, gas: int) -> Candidate:
    kw = {"tp": 1, "pp": 1}
    for part in filter(None, layout.split(",")):
        k, v = part.split("=")
        kw[k.strip()] = int(v)
    dp = nproc // (kw["tp"] * kw["pp"])
    return Candidate(dp=dp, mbs=mbs, gas=gas, **kw)


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) if values else float("nan")


def bench_cpu(args: argparse.Namespace) -> None:
    c = _candidate(args.layout, args.nproc, args.mbs, args.gas)
    spec = ProbeSpec(model=CPU_MODEL.to_dict(), candidate=c.to_dict(), precision="fp32", warmup_steps=2,
                     steps=args.steps, device="cpu")
    print(f"CPU probe: {CPU_MODEL.name} ({CPU_MODEL.params / 1e6:.1f}M params, seq {CPU_MODEL.seq_len}), "
          f"{c.label()}, {args.nproc} ranks, fp32, {args.repeats} repeats")
    print(f"{'repeat':>6} {'status':>7} {'wall_s':>7} {'step_ms':>8} {'cv':>6} {'rounds':>6} {'model_GFLOPs/rank':>18}")
    walls, steps, tflops = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        for i in range(args.repeats):
            t0 = time.monotonic()
            r = run_local(spec, nproc=args.nproc, workdir=Path(tmp) / f"r{i}", timeout_s=300)
            wall = time.monotonic() - t0
            if not r.ok:
                print(f"{i:>6} {r.status:>7} {wall:7.2f}  {r.reason}")
                continue
            walls.append(wall)
            steps.append(r.step_time_median_s)
            tflops.append(r.model_tflops_per_device)
            print(f"{i:>6} {r.status:>7} {wall:7.2f} {r.step_time_median_s * 1e3:8.2f} {r.step_time_cv:6.3f} "
                  f"{r.extra['measure_rounds']:>6} {r.model_tflops_per_device * 1e3:18.3f}")
    if walls:
        print(f"median: wall {statistics.median(walls):.2f} s (spread {_spread(walls):.1%}), "
              f"step {statistics.median(steps) * 1e3:.2f} ms (spread {_spread(steps):.1%}), "
              f"model {statistics.median(tflops) * 1e3:.3f} GFLOP/s per rank (spread {_spread(tflops):.1%})")


def bench_gpu(args: argparse.Namespace) -> None:
    import torch

    m = GPU_MODEL
    c = Candidate(tp=1, pp=1, dp=1, mbs=args.gpu_mbs, gas=2)
    spec = ProbeSpec(model=m.to_dict(), candidate=c.to_dict(), precision="bf16", warmup_steps=3, steps=10,
                     device="cuda")
    with tempfile.TemporaryDirectory(prefix="bench-probe-gpu-") as tmp:
        t0 = time.monotonic()
        r = run_local(spec, nproc=1, workdir=Path(tmp), timeout_s=600)
        wall = time.monotonic() - t0
    dev = torch.device("cuda", 0)
    tokens = c.mbs * m.seq_len
    a = torch.randn(tokens, m.hidden, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m.hidden, m.ffn_hidden, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize(dev)
    n, t0 = 50, time.perf_counter()
    for _ in range(n):
        a @ b
    torch.cuda.synchronize(dev)
    mm = 2.0 * tokens * m.hidden * m.ffn_hidden * n / (time.perf_counter() - t0) / 1e12
    print(f"GPU: {torch.cuda.get_device_name(dev)}; probe {m.name} ({m.params / 1e9:.2f}B params, seq {m.seq_len}), "
          f"{c.label()}, bf16")
    if not r.ok:
        print(f"probe {r.status}: {r.reason} (wall {wall:.1f} s)")
    else:
        print(f"probe: wall {wall:.1f} s, step {r.step_time_median_s * 1e3:.1f} ms (cv {r.step_time_cv:.3f}), "
              f"model {r.model_tflops_per_device:.1f} TFLOP/s, hardware {r.hardware_tflops_per_device:.1f} TFLOP/s, "
              f"peak memory {r.peak_memory_bytes_per_rank[0] / 2**30:.1f} GiB")
    print(f"plain bf16 matmul [{tokens} x {m.hidden}] @ [{m.hidden} x {m.ffn_hidden}]: {mm:.1f} TFLOP/s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--layout", default="", help="e.g. tp=2 or pp=2 (dp fills the rest); default plain DP")
    p.add_argument("--mbs", type=int, default=4)
    p.add_argument("--gas", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--gpu-mbs", type=int, default=2)
    p.add_argument("--no-gpu", action="store_true")
    args = p.parse_args(argv)
    bench_cpu(args)
    if not args.no_gpu:
        import torch

        if torch.cuda.is_available():
            bench_gpu(args)
        else:
            print("GPU: none visible to torch; GPU comparison skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
