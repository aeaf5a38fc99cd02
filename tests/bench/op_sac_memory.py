"""Activation bytes one probe layer keeps for its backward, per recompute mode, against planner.memory (CUDA).

    python3 tests/bench/op_sac_memory.py [--device cuda] [--small]

Counts torch.cuda.memory_allocated after the forward minus before (the output not counted), bf16, FlashAttention;
on CPU (--device cpu) it only checks that the script runs.
"""

from __future__ import annotations

import argparse

import torch

from planner.memory import layer_activations
from planner.model import ModelSpec
from planner.space import Candidate, TrainingSpec
from probes.gpt import GPTStage, init_parameters

MODES = ("none", "selective", "selective-op", "full")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    dims = dict(hidden=256, heads=4, kv_heads=2, ffn_hidden=704, seq_len=128) if args.small else \
        dict(hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=4096)   # a Llama 3 8B layer
    m = ModelSpec(name="layer", layers=1, vocab=128, glu=True, position="rope", norm="rmsnorm", bias=False,
                  tied_embeddings=False, **dims)
    b, dev, dtype = 1, torch.device(args.device), torch.bfloat16 if args.device == "cuda" else torch.float32
    for mode in MODES:
        with torch.device("meta"):
            stage = GPTStage(m, layer_ids=range(1), first=False, last=False, recompute=mode)
        stage.to_empty(device=dev)
        init_parameters(stage, seed=1)
        stage.to(dtype)
        x = torch.randn(b, m.seq_len, m.hidden, device=dev, dtype=dtype, requires_grad=True)
        with torch.no_grad():
            stage(x)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
        y = stage(x)
        kept = (torch.cuda.memory_allocated() - before - y.numel() * y.element_size()) if dev.type == "cuda" else 0
        y.float().sum().backward()
        act = layer_activations(m, Candidate(tp=1, pp=1, dp=1, mbs=b, gas=1, recompute=mode),
                                TrainingSpec(global_batch=b, seq_len=m.seq_len, framework="fsdp", precision="bf16",
                                             flash_attention=True))
        planned = act.stored_bytes - 2 * b * m.seq_len * m.hidden
        print(f"{mode:13s} measured {kept / 2**20:9.1f} MiB   planner {planned / 2**20:9.1f} MiB", flush=True)
        del stage, x, y


if __name__ == "__main__":
    main()
