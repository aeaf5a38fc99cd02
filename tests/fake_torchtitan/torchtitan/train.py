"""A stand-in for torchtitan 0.3.0's ``python -m torchtitan.train --module M --config F``: no torch, no GPU.

It reads the job plantune wrote into the folder it runs in (``plantune_torchtitan.py``: global batch, sequence
length, the parallel degrees; ``plantune_probe.py``: the steps), checks what torchtitan's trainer checks first
(world size = the product of the degrees, global batch divisible by local batch x data-parallel degree), sleeps
``FAKE_TORCHTITAN_STEP_MS`` per step (3x for the first) and prints, on rank 0, torchtitan's metrics line
(components/metrics.py MetricsProcessor.log, colours off): ``step: N  loss: ...  grad_norm: ...  memory:
X.XXGiB(P%)  tps: T  tflops: ...  mfu: ...%``, with ``tps`` = tokens per second per device as torchtitan counts
them. ``FAKE_TORCHTITAN_OOM_AT=N`` ends step N with CUDA's out-of-memory error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path


def _int(text: str, key: str, default: int | None = None) -> int:
    m = re.search(rf"\b{key}\s*=\s*(-?\d+)", text)
    if m is None:
        if default is None:
            sys.exit(f"fake torchtitan: no {key} in the job")
        return default
    return int(m.group(1))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchtitan.train")
    p.add_argument("--module", required=True)
    p.add_argument("--config", required=True)
    args, _overrides = p.parse_known_args(argv)
    job = Path("plantune_torchtitan.py").read_text()
    probe = Path(f"{args.module}.py").read_text()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    gbs, lbs, seq = _int(job, "global_batch_size"), _int(job, "local_batch_size"), _int(job, "seq_len")
    degrees = {k: _int(job, k, 1) for k in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                                            "pipeline_parallel_degree", "context_parallel_degree")}
    shard = _int(job, "data_parallel_shard_degree", 1)
    dp = degrees["data_parallel_replicate_degree"] * (shard if shard > 0 else 1)
    product = dp * degrees["tensor_parallel_degree"] * degrees["pipeline_parallel_degree"] * \
        degrees["context_parallel_degree"]
    if product != world:
        print(f"AssertionError: Invalid parallel dims: dp({dp}) * tp * pp * cp != WORLD_SIZE({world})",
              file=sys.stderr, flush=True)
        return 1
    if gbs % (lbs * dp):
        print(f"AssertionError: global batch size must be multiple of local batch size times data-parallel degree "
              f"({gbs} % ({lbs} * {dp}) != 0)", file=sys.stderr, flush=True)
        return 1
    steps = int(re.search(r"cfg\.training\.steps\s*=\s*(\d+)", probe).group(1))
    step_s = float(os.environ.get("FAKE_TORCHTITAN_STEP_MS", "100")) / 1000.0
    oom_at = int(os.environ.get("FAKE_TORCHTITAN_OOM_AT", "0"))
    for step in range(1, steps + 1):
        started = time.perf_counter()
        time.sleep(step_s * (3 if step == 1 else 1))
        if step == oom_at:
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", file=sys.stderr,
                  flush=True)
            return 1
        tps = gbs * seq / (world * (time.perf_counter() - started))
        if rank == 0:
            print(f"[titan] {time.strftime('%Y-%m-%d %H:%M:%S')},000 - root - INFO - step: {step:2}  loss: "
                  f"{10.0 - step * 0.1:8.5f}  grad_norm: {1.0:7.4f}  memory: {0.5:5.2f}GiB(0.63%)  "
                  f"tps: {round(tps):,}  tflops: {0.0:,.2f}  mfu: 0.00%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
