"""Megatron-LM's CPU optimizer offload (planner.offload): memory, time, flags, and the rules Megatron asserts."""

from __future__ import annotations

from dataclasses import replace

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


# -- fine-grained activation offload --------------------------------------------------------------------------------
NONE = Candidate(tp=2, pp=8, dp=64, ep=64, sp=True, mbs=1, gas=128, zero=1, vpp=4, recompute="none")


def _act(modules: tuple[str, ...], cand: Candidate = NONE, **kw):
    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", activation_offload=modules, **kw)
    return estimate(load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024), t, cand)


def test_offloaded_module_inputs_are_the_tensors_megatron_names():
    """Bytes a mean DeepSeek-V3 layer offloads per micro-batch of 4096 tokens at TP2 with SP: expert_fc1 the permuted
    tokens, 58/61 x 8 copies x 7168 / 2 x 2 bytes a token; moe_act the SwiGLU FC1 output, 58/61 x 8 x 2 x 2048 / 2 x 2;
    attn_norm the layer input, 7168 / 2 x 2 (transformer_config.py offload_modules: each module's input)."""
    from planner.offload import activation_offload_bytes, offloaded_layers

    m = load_model("deepseek-v3")
    t = lambda mods, **kw: TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm",   # noqa: E731
                                        activation_offload=mods, **kw)
    share = 58 / 61
    assert activation_offload_bytes(m, NONE, t(("expert_fc1",)), 4096) == pytest.approx(
        4096 * share * 8 * 7168 / 2 * 2)
    assert activation_offload_bytes(m, NONE, t(("moe_act",)), 4096) == pytest.approx(
        4096 * share * 8 * 2 * 2048 / 2 * 2)
    assert activation_offload_bytes(m, NONE, t(("attn_norm",)), 4096) == pytest.approx(4096 * 7168 / 2 * 2)
    # under FP8 Transformer Engine keeps a linear's input as its FP8 cast: 1 byte
    assert activation_offload_bytes(m, NONE, t(("expert_fc1",), precision="fp8"), 4096) == pytest.approx(
        4096 * share * 8 * 7168 / 2)
    # the last layer of each model chunk keeps its inputs (fine_grained_activation_offload.py): 8 layers, VPP 4
    assert offloaded_layers(8, NONE) == 4 and offloaded_layers(3, Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1)) == 2


def test_activation_offload_frees_memory_and_hides_its_copies_under_compute():
    """NVIDIA's DGX-H100 DeepSeek-V3 layout without recompute: offloading the experts' inputs frees 350 MB a layer and
    micro-batch on the GPU (first stage: 4 of 8 layers x ~9.75 micro-batches in flight), and its 11 ms of PCIe copies
    a layer (2 x 350 MB at 64 GB/s) hide under the layer's compute."""
    plain, off = _act(()), _act(("expert_fc1", "moe_act"))
    freed = plain.memory.activations_bytes - off.memory.activations_bytes
    assert 12e9 < freed < 16e9
    assert off.memory.weights_bytes == plain.memory.weights_bytes
    assert off.time.step_time_s == pytest.approx(plain.time.step_time_s, rel=1e-3)   # hidden


def test_activation_offload_rules_flags_and_env():
    from planner.emit import RunSetup, render
    from planner.model import get_preset
    from test_emit_argnames import MEGATRON_LM

    with pytest.raises(InputError, match="core_attn too"):
        TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm", activation_offload=("attn_proj",))
    with pytest.raises(InputError, match="Megatron-LM's"):
        TrainingSpec(global_batch=8, seq_len=4096, framework="fsdp", activation_offload=("moe_act",))
    with pytest.raises(InputError, match="unknown offload module"):
        TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm", activation_offload=("mlp",))
    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", activation_offload=("expert_fc1",
                                                                                                  "moe_act"))
    files = render(RunSetup(model=get_preset("deepseek-v3"), cluster=make_cluster(gpu="H100-SXM", gpus=1024),
                            training=t, candidate=NONE), "megatron-lm")
    lines = files["args.txt"].splitlines()
    assert "--fine-grained-activation-offloading" in lines and "--offload-modules expert_fc1 moe_act" in lines
    assert {"--fine-grained-activation-offloading", "--offload-modules"} <= MEGATRON_LM
    assert "export NVTE_CPU_OFFLOAD_V1=1" in files["launch.sbatch"]


def test_plan_cli_shows_what_activation_offload_costs(capsys):
    """The issue's ask: `plan --model deepseek-v3` with an offload shows the memory and time it costs."""
    from planner.cli import main

    rc = main(["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
               "--activation-offload", "expert_fc1,moe_act",
               "--explain", "tp=2,pp=8,vpp=4,ep=64,mbs=1,sp=1,zero=1,recompute=none"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("activation offload expert_fc1+moe_act"))
    assert "saves" in line and "GB of GPU memory" in line and "s of step time" in line


def _plan_offloading(**kw):
    from planner import plan

    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", precision="fp8",
                     recompute_options=("none",), **kw)
    return plan(load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024), t)


def test_plan_searches_activation_offload_where_it_lets_a_layout_fit():
    """Activation offload as a dimension of the layout (planner.space.DIMENSIONS ``offload``): on DeepSeek-V3 at 1,024
    H100 without recompute, plan offers layouts that fit only with their expert (and more) inputs on the host, each
    with the first of planner.offload.SEARCHED_SETS that fits, and what it saves and costs."""
    from planner.memory import memory_breakdown
    from planner.offload import SEARCHED_SETS

    p = _plan_offloading()
    offloaded = [e for e in p.candidates if e.candidate.offload]
    assert offloaded and p.candidates[0].candidate.offload   # none of the layouts fits without
    usable = 0.95 * p.cluster.gpu.memory_bytes
    for e in offloaded[:20]:
        c = e.candidate
        assert c.offload in SEARCHED_SETS
        without = memory_breakdown(p.model, replace(c, offload=""), p.cluster, p.training)
        assert without.total_bytes > usable >= e.memory.total_bytes
        earlier = SEARCHED_SETS[:SEARCHED_SETS.index(c.offload)]   # no smaller set fits
        assert all(memory_breakdown(p.model, replace(c, offload=s), p.cluster, p.training).total_bytes > usable
                   for s in earlier)
        cost = e.to_dict()["offload_cost"]
        assert cost["saves_gb"] == pytest.approx((without.total_bytes - e.memory.total_bytes) / 1e9, abs=1e-3)
        assert cost["exposed_s"] >= 0 and cost["hidden_s"] > 0
        assert c.label().endswith(f"offload={c.offload}")


def test_offload_is_not_searched_when_given_or_on_dense_models():
    given = _plan_offloading(activation_offload=("expert_fc1", "moe_act"))
    assert not any(e.candidate.offload for e in given.candidates)
    from planner.offload import searched_sets

    dense = TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm")
    assert searched_sets(load_model("llama3-70b"), dense) == ()
    assert searched_sets(load_model("deepseek-v3"), replace(dense, framework="fsdp")) == ()


def test_plan_table_json_and_emit_carry_the_offload(capsys, tmp_path):
    """The ranked table has an offload column and each offloaded row's cost; the JSON row its offload_cost; the
    emitted run the Megatron-LM flags (the layout's offload folded into the training's, planner.emit.setup)."""
    import json

    from planner.cli import main

    base = ["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
            "--framework", "megatron-lm", "--precision", "fp8", "--recompute", "none", "--top", "3"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert " offload " in next(x for x in out.splitlines() if x.startswith("#"))
    assert "  #1: saves " in out
    assert main(base + ["--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert rows[0]["offload"] and rows[0]["offload_cost"]["saves_gb"] > 0
    assert main(base + ["--emit", "megatron-lm", "--out", str(tmp_path / "run")]) == 0
    args = (tmp_path / "run" / "args.txt").read_text().splitlines()
    assert f"--offload-modules {rows[0]['offload'].replace('+', ' ')}" in args
    from planner.emit import load_plan_yaml

    setup = load_plan_yaml(tmp_path / "run" / "plan.yaml")
    assert setup.training.activation_offload == tuple(rows[0]["offload"].split("+")) and not setup.candidate.offload
