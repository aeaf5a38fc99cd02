"""Megatron-LM's CPU optimizer offload (planner.offload): memory, time, flags, and the rules Megatron asserts."""

from __future__ import annotations

import pytest

from planner import load_model, make_cluster
from planner.errors import InputError
from planner.offload import host_step_s
from planner.rank import estimate
from planner.space import Candidate, TrainingSpec

C = Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128, zero=1, vpp=4, recompute="selective")


def _est(fraction: float, **kw):
    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", optimizer_offload=fraction, **kw)
    return estimate(load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024), t, C)


def test_offload_moves_that_fraction_of_the_optimizer_to_the_host_and_costs_its_step():
    on_gpu, half, host = _est(0.0), _est(0.5), _est(1.0)
    assert half.memory.optimizer_bytes == pytest.approx(on_gpu.memory.optimizer_bytes / 2)
    assert host.memory.optimizer_bytes == 0 and host.memory.weights_bytes == on_gpu.memory.weights_bytes
    assert on_gpu.time.optimizer_s < half.time.optimizer_s < host.time.optimizer_s
    # DGX H100 host: 28 bytes a parameter at 76.8 GB/s a GPU (CPU Adam, memory-bound) beats PCIe's 4 bytes at 64 GB/s
    assert host_step_s(1e9, make_cluster(gpu="H100-SXM", gpus=8)) == pytest.approx(28e9 / 76.8e9)


def test_offload_flags_and_megatron_s_fp8_param_gather_rule():
    from planner.emit import RunSetup, render

    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", optimizer_offload=0.5,
                     precision="fp8", fp8_recipe="tensorwise")
    setup = RunSetup(model=load_model("deepseek-v3"), cluster=make_cluster(gpu="H100-SXM", gpus=1024), training=t,
                     candidate=C)
    args = render(setup, "megatron-lm")["args.txt"].split()
    for flag in ("--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"):
        assert flag in args
    assert args[args.index("--optimizer-offload-fraction") + 1] == "0.5"
    # arguments.py: with the offload, --fp8-param-gather only under the delayed recipe
    assert "--fp8-param-gather" not in args
    with pytest.raises(InputError, match="Megatron-LM"):
        TrainingSpec(global_batch=8, seq_len=128, framework="fsdp", optimizer_offload=0.5)
    with pytest.raises(InputError, match="fraction"):
        TrainingSpec(global_batch=8, seq_len=128, framework="megatron-lm", optimizer_offload=1.5)


def test_plan_cli_shows_the_offload(capsys):
    from planner.cli import main

    rc = main(["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
               "--optimizer-offload", "1", "--explain",
               "tp=2,pp=8,vpp=4,ep=64,mbs=1,sp=1,zero=1,recompute=modules:mla_up_proj+mlp"])
    out = capsys.readouterr().out
    assert rc == 0
    saved = {line.split(":")[0]: line for line in out.splitlines() if "saves" in line}
    assert set(saved) == {"recompute mla_up_proj+mlp (--recompute-modules)",
                          "optimizer offload 1 (--optimizer-offload-fraction)"}
    for line in saved.values():   # each saves memory and costs time
        gb, s = float(line.split("saves ")[1].split(" GB")[0]), float(line.split("costs ")[1].split(" s")[0])
        assert gb > 1 and s > 0
    assert main(["--model", "llama3-8b", "--gpus", "8", "--framework", "fsdp", "--optimizer-offload", "0.5"]) == 2
