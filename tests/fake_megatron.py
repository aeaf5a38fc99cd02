"""A stand-in for Megatron-DeepSpeed's pretrain_gpt.py: checks its arguments, prints real-format log lines.

    python -m torch.distributed.run --standalone --nproc_per_node 2 --tee 3 \\
        tests/fake_megatron.py --num-layers 4 --hidden-size 64 ... --fake-format microsoft

No torch, no GPU: each "iteration" sleeps ``--fake-step-ms`` (3x for the first, a warm-up) and the
last rank prints the iteration line in the chosen fork's format (bigscience: seconds; microsoft:
ms + tgs; megatron-lm: ms + throughput per GPU); rank 0 prints the ``[Rank 0] (after 1
iterations) memory (MB)`` report once. Like the forks, it refuses a world size not divisible by
TP*PP, a global batch not divisible by MBS*DP, a ds_config.json that disagrees with the flags, and
``--rampup-batch-size`` with ``--train-iters``. Its TFLOPs figure is the forks' (Eq. 3, factor 4
under --checkpoint-activations), i.e. recompute-inflated on purpose.
Faults for tests: ``--fake-oom-at N``, ``--fake-crash-at N``, ``--fake-hang-at N``.
``FAKE_MEGATRON_MAX_ITERS`` caps the iterations (an emitted sbatch script gives --train-samples).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime

from planner.flops import megatron_eq3_flops

VOCAB = 50304
"""GPT-2's 50257 padded to a multiple of 128 (the forks' --make-vocab-size-divisible-by default)"""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
                 "--global-batch-size"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--train-iters", type=int, default=None)
    p.add_argument("--train-samples", type=int, default=None)
    p.add_argument("--rampup-batch-size", nargs=3, type=int, default=None)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--deepspeed_config", default=None)
    p.add_argument("--checkpoint-activations", action="store_true")
    p.add_argument("--fake-format", choices=("bigscience", "microsoft", "megatron-lm"), default="bigscience")
    p.add_argument("--fake-step-ms", type=float, default=100.0)
    p.add_argument("--fake-oom-at", type=int, default=None)
    p.add_argument("--fake-crash-at", type=int, default=None)
    p.add_argument("--fake-hang-at", type=int, default=None)
    args, _unknown = p.parse_known_args(argv)  # data, tokenizer, lr ... are the real script's business
    return args


def fail(message: str) -> None:
    print(f"AssertionError: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(args: argparse.Namespace, world: int) -> int:
    """The forks' start-up assertions; the data-parallel size."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if world % (tp * pp):
        fail(f"world size ({world}) is not divisible by tensor model parallel size ({tp}) times pipeline "
             f"model parallel size ({pp})")
    dp = world // (tp * pp)
    if args.num_attention_heads % tp:
        fail(f"num_attention_heads ({args.num_attention_heads}) not divisible by tensor parallel size ({tp})")
    if args.global_batch_size % (args.micro_batch_size * dp):
        fail(f"global batch size ({args.global_batch_size}) is not divisible by micro batch size "
             f"({args.micro_batch_size}) times data parallel size ({dp})")
    if args.rampup_batch_size and args.train_iters is not None:
        fail("expected iteration-based learning rate decay; rampup batch size is not supported with --train-iters")
    if args.deepspeed_config:
        with open(args.deepspeed_config) as f:
            ds = json.load(f)
        gas = args.global_batch_size // (args.micro_batch_size * dp)
        if ds["train_batch_size"] != ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * dp:
            fail(f"Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                 f"gradient_acc_step * world_size {ds['train_batch_size']} != "
                 f"{ds['train_micro_batch_size_per_gpu']} * {ds['gradient_accumulation_steps']} * {dp}")
        if (ds["train_micro_batch_size_per_gpu"], ds["train_batch_size"], ds["gradient_accumulation_steps"]) != \
                (args.micro_batch_size, args.global_batch_size, gas):
            fail("ds_config.json batch sizes disagree with --micro-batch-size/--global-batch-size")
    return dp


def iteration_line(fmt: str, *, it: int, total: int, step_s: float, args: argparse.Namespace, world: int,
                   loss: float) -> str:
    gbs, seq = args.global_batch_size, args.seq_length
    factor = 4 if args.checkpoint_activations else 3
    flops = megatron_eq3_flops(global_batch=gbs, seq_len=seq, layers=args.num_layers, hidden=args.hidden_size,
                               vocab=VOCAB) * factor / 4
    tflops = flops / (step_s * world * 1e12)
    samples = it * gbs
    if fmt == "megatron-lm":
        return (f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {it:8d}/{total:8d} | consumed samples: "
                f"{samples:12d} | elapsed time per iteration (ms): {step_s * 1000:.1f} | throughput per GPU "
                f"(TFLOP/s/GPU): {tflops:.1f} | learning rate: {6e-5:.6E} | global batch size: {gbs:5d} | lm loss: "
                f"{loss:.6E} | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
                f"number of nan iterations:   0 |")
    elapsed = (f"elapsed time per iteration (s): {step_s:.2f}" if fmt == "bigscience"
               else f"elapsed time per iteration (ms): {step_s * 1000:.1f}")
    line = (f" iteration {it:8d}/{total:8d} | consumed samples: {samples:12d} | consumed tokens: "
            f"{samples * seq:12d} | {elapsed} | learning rate: {6e-5:.3E} | global batch size: {gbs:5d} | "
            f"lm loss: {loss:.6E} | grad norm: 0.174 | num zeros: 0.0 | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 | samples per second: {gbs / step_s:.3f} |")
    if fmt == "microsoft":
        line += f" tokens per gpu per second (tgs): {gbs * seq / step_s / world:.3f} |"
    return line + f" TFLOPs: {tflops:.2f} |"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    check(args, world)
    total = args.train_iters if args.train_iters is not None else \
        (args.train_samples or args.global_batch_size) // args.global_batch_size
    cap = os.environ.get("FAKE_MEGATRON_MAX_ITERS")
    if cap:
        total = min(total, int(cap))
    params_mb = 12 * args.num_layers * args.hidden_size ** 2 * 18 / world / 2**20
    for it in range(1, total + 1):
        if it == args.fake_oom_at and rank == 0:
            print("Traceback (most recent call last):\n  File \"pretrain_gpt.py\", line 231, in <module>",
                  file=sys.stderr)
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                  "capacity of 79.15 GiB of which 1.06 GiB is free.", file=sys.stderr, flush=True)
            return 1
        if it == args.fake_crash_at and rank == 0:
            print("RuntimeError: fake_megatron: crash requested by --fake-crash-at", file=sys.stderr, flush=True)
            return 1
        if it == args.fake_hang_at:
            while True:
                time.sleep(1)
        step_s = args.fake_step_ms / 1000 * (3 if it == 1 else 1)
        time.sleep(step_s)
        if rank == world - 1 and it % args.log_interval == 0:
            print(iteration_line(args.fake_format, it=it, total=total, step_s=step_s, args=args, world=world,
                                 loss=11.0 - 0.1 * it), flush=True)
        if rank == 0 and it == 1:
            print(f"[Rank 0] (after 1 iterations) memory (MB) | allocated: {params_mb:.4f} | max allocated: "
                  f"{params_mb * 1.5:.4f} | reserved: {params_mb * 1.7:.1f} | max reserved: {params_mb * 1.7:.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
