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
    offloaded = [e for e in p.candidates if e.candidate.offload and not e.candidate.opt_offload]   # both: below
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


def test_plan_combines_both_offloads_where_neither_alone_fits():
    """Megatron-LM rules out neither offload with the other (arguments.py, transformer_config.py): a MoE layout that
    fits under no module set alone and no optimizer fraction alone gets both, the smallest fraction first, then the
    smallest set with it (planner.memory.PlanMemory.both_offloads_fitting), each cost shown."""
    from planner.memory import memory_breakdown
    from planner.offload import OPTIMIZER_FRACTIONS, SEARCHED_SETS

    p = _plan_offloading()
    both = [e for e in p.candidates if e.candidate.offload and e.candidate.opt_offload]
    assert both
    usable = 0.95 * p.cluster.gpu.memory_bytes

    def total(c, **kw):
        return memory_breakdown(p.model, replace(c, **kw), p.cluster, p.training).total_bytes

    for e in both:
        c = e.candidate
        assert total(c) <= usable and e.memory.total_bytes <= usable
        assert all(total(c, opt_offload=0.0, offload=m) > usable for m in SEARCHED_SETS)   # no set alone
        assert all(total(c, offload="", opt_offload=f) > usable for f in OPTIMIZER_FRACTIONS)   # no fraction alone
        smaller = [f for f in OPTIMIZER_FRACTIONS if f < c.opt_offload]
        assert all(total(c, opt_offload=f, offload=SEARCHED_SETS[-1]) > usable for f in smaller)
        earlier = SEARCHED_SETS[:SEARCHED_SETS.index(c.offload)]
        assert all(total(c, offload=m) > usable for m in earlier)
        d = e.to_dict()
        assert d["offload_cost"]["saves_gb"] > 0 and d["opt_offload_cost"]["added_s"] > 0


def test_no_offload_search_keeps_only_the_layouts_that_fit_without(capsys):
    """--no-offload-search (TrainingSpec.offload_search): neither offload is searched; what is left is exactly the
    default plan's rows without one; the flag is refused in one line where plan searches nothing."""
    from planner.cli import main
    from planner.offload import optimizer_searched, searched_sets

    t = TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm", offload_search=False)
    assert searched_sets(load_model("deepseek-v3"), t) == () and optimizer_searched(load_model("deepseek-v3"), t) == ()
    default, off = _plan_offloading(), _plan_offloading(offload_search=False)
    assert any(e.candidate.offload or e.candidate.opt_offload for e in default.candidates)
    assert not any(e.candidate.offload or e.candidate.opt_offload for e in off.candidates)
    assert [e.candidate for e in off.candidates] == \
        [e.candidate for e in default.candidates if not (e.candidate.offload or e.candidate.opt_offload)]
    for argv, what in ((["--model", "llama3-8b", "--gpus", "8", "--framework", "megatron-lm"], "dense"),
                       (["--model", "deepseek-v3", "--gpus", "1024", "--framework", "fsdp"], "fsdp")):
        rc = main([*argv, "--gpu", "H100-SXM", "--no-offload-search"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "--no-offload-search" in err and what in err


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


# -- CPU optimizer offload as a dimension of the layout (Candidate.opt_offload) -----------------------------------------
def _plan_bf16(**kw):
    from planner import plan

    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", **kw)
    return plan(load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024), t)


@pytest.fixture(scope="module")
def bf16_plan():
    return _plan_bf16()


def test_plan_searches_optimizer_offload_where_it_lets_a_layout_fit(bf16_plan):
    """DeepSeek-V3 on 1,024 H100 (bf16, Megatron-LM): layouts memory rules out that fit with a fraction of their
    optimizer on the host are ranked, each with the smallest of planner.offload.OPTIMIZER_FRACTIONS that fits, the
    distributed optimizer (ZeRO 1, which the precision-aware optimizer asks), and what it saves and costs."""
    from planner.memory import memory_breakdown
    from planner.offload import OPTIMIZER_FRACTIONS

    p = bf16_plan
    rows = [e for e in p.candidates if e.candidate.opt_offload and not e.candidate.offload]   # both: below
    assert len(rows) > 20
    usable = 0.95 * p.cluster.gpu.memory_bytes
    for e in rows[:12]:
        c = e.candidate
        assert c.opt_offload in OPTIMIZER_FRACTIONS and c.zero >= 1 and not c.offload
        without = memory_breakdown(p.model, replace(c, opt_offload=0.0), p.cluster, p.training)
        assert without.total_bytes > usable >= e.memory.total_bytes
        smaller = [f for f in OPTIMIZER_FRACTIONS if f < c.opt_offload]
        assert all(memory_breakdown(p.model, replace(c, opt_offload=f), p.cluster, p.training).total_bytes > usable
                   for f in smaller)
        # the offloaded share of the optimizer (fp32 master weights and Adam moments) leaves the GPU
        assert e.memory.optimizer_bytes == pytest.approx(without.optimizer_bytes * (1 - c.opt_offload))
        cost = e.to_dict()["opt_offload_cost"]
        assert cost["saves_gb"] == pytest.approx((without.total_bytes - e.memory.total_bytes) / 1e9, abs=1e-3)
        assert cost["added_s"] > 0 and 0 < cost["host_gb_per_node"] < 2048 * 2**30 / 1e9
        assert c.label().endswith(f"opt_offload={c.opt_offload:g}")
    # a row carrying both offloads does not fit with its activation offload alone (the combination: below)
    assert all(memory_breakdown(p.model, replace(e.candidate, opt_offload=0.0), p.cluster, p.training).total_bytes
               > usable for e in p.candidates if e.candidate.offload and e.candidate.opt_offload)


def test_optimizer_offload_is_searched_only_where_megatron_runs_it():
    from planner.offload import optimizer_searched, optimizer_searched_on

    t, m = TrainingSpec(global_batch=8, seq_len=4096, framework="megatron-lm"), load_model("deepseek-v3")
    assert optimizer_searched(m, t) == (0.25, 0.5, 0.75, 1.0)
    assert optimizer_searched(m, replace(t, framework="fsdp")) == ()   # torchtitan: no CPU optimizer
    assert optimizer_searched(m, replace(t, optimizer="sgd")) == ()     # precision-aware optimizer: Adam only
    assert optimizer_searched(m, replace(t, optimizer_offload=0.5)) == ()   # the user's fraction, every layout's
    assert optimizer_searched(load_model("llama3-70b"), t) == ()   # dense: not searched (--optimizer-offload plans it)
    assert not optimizer_searched_on(0) and optimizer_searched_on(1)


def test_optimizer_offload_rules_say_why():
    """Megatron asserts --use-precision-aware-optimizer under --optimizer-cpu-offload, and that only with the
    distributed optimizer (optimizer_config.py); other frameworks have no HybridDeviceOptimizer."""
    from planner.rules import Reason

    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm")
    m, cl = load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024)
    e = estimate(m, cl, t, replace(C, zero=0, opt_offload=0.5))
    assert any(v.reason is Reason.FRAMEWORK_LIMIT and "distributed optimizer" in v.detail and "zero=1" in v.detail
               for v in e.reasons)
    dense = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, zero=1, opt_offload=0.5)
    fsdp = TrainingSpec(global_batch=8, seq_len=2048, framework="fsdp")
    e = estimate(load_model("llama3-8b"), make_cluster(gpu="H100-SXM", gpus=8), fsdp, dense)
    assert any(v.reason is Reason.FRAMEWORK_LIMIT and "drop opt_offload" in v.detail for v in e.reasons)


def test_bf16_moments_and_the_cpu_optimizer_offload_are_refused_together(capsys):
    """Megatron's HybridDeviceOptimizer keeps fp32 moments whatever --exp-avg-dtype says (optimizer/__init__.py):
    the user's pair is refused (exit 2, one line), a layout's opt_offload under bf16 moments is a framework limit at
    --explain, and plan does not search the offload under bf16 moments."""
    from planner.cli import main
    from planner.offload import optimizer_searched
    from planner.rules import Reason

    with pytest.raises(InputError, match="HybridDeviceOptimizer keeps fp32 Adam moments"):
        TrainingSpec(global_batch=8, seq_len=128, framework="megatron-lm", optimizer_offload=0.5,
                     optimizer_state_dtype="bf16")
    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm", optimizer_state_dtype="bf16")
    assert optimizer_searched(load_model("deepseek-v3"), t) == ()
    e = estimate(load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024), t, replace(C, opt_offload=0.5))
    assert any(v.reason is Reason.FRAMEWORK_LIMIT and "drop opt_offload or --optimizer-state-dtype" in v.detail
               for v in e.reasons)
    rc = main(["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
               "--framework", "megatron-lm", "--optimizer-state-dtype", "bf16", "--optimizer-offload", "0.5"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--exp-avg-dtype" in err


def test_megatron_builds_the_hybrid_optimizer_without_the_moments_dtype():
    """The source fact behind the refusal: in get_megatron_optimizer's --optimizer-cpu-offload branch the
    HybridDeviceOptimizer gets lr, betas, eps and no exp_avg_dtype (the non-offloaded FusedAdam's kwargs take it),
    and its sub-optimizers step fp32 copies (param_update_in_fp32=True), so the moments (zeros_like) are fp32."""
    import os
    from pathlib import Path

    src = os.environ.get("MEGATRON_LM_SRC")
    init = Path(src or ".") / "megatron" / "core" / "optimizer" / "__init__.py"
    if not src or not init.is_file():
        pytest.skip("MEGATRON_LM_SRC not set to a Megatron-LM checkout")
    text = init.read_text()
    offload = text[text.index("if config.optimizer_cpu_offload:"):text.index("elif config.optimizer == 'adam':")]
    assert "HybridDeviceOptimizer(" in offload and "param_update_in_fp32=True" in offload
    assert "exp_avg_dtype" not in offload
    assert '"exp_avg_dtype": config.exp_avg_dtype' in text   # the GPU-only precision-aware path does pass it


def test_explain_and_emit_carry_the_layouts_optimizer_offload(capsys, tmp_path):
    """--explain opt_offload=F shows what it saves and costs and the host memory it pins; --emit writes Megatron's
    flags (the layout's fraction folded into the training's, planner.emit.setup)."""
    from planner.cli import main
    from planner.emit import load_plan_yaml

    label = "tp=2,pp=8,vpp=2,ep=8,mbs=1,sp=1,zero=1,recompute=full,opt_offload=0.75"
    base = ["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
            "--framework", "megatron-lm"]
    assert main(base + ["--explain", label]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("optimizer offload 0.75 (opt_offload="))
    gb, s = float(line.split("saves ")[1].split(" GB")[0]), float(line.split("costs ")[1].split(" s")[0])
    assert gb > 5 and s > 0
    assert "host memory the offloads pin:" in out
    assert main(base + ["--explain", label, "--emit", "megatron-lm", "--out", str(tmp_path / "run")]) == 0
    args = (tmp_path / "run" / "args.txt").read_text().splitlines()
    assert "--optimizer-cpu-offload" in args and "--optimizer-offload-fraction 0.75" in args
    assert "--use-precision-aware-optimizer" in args and "--overlap-cpu-optimizer-d2h-h2d" in args
    setup = load_plan_yaml(tmp_path / "run" / "plan.yaml")
    assert setup.training.optimizer_offload == 0.75 and not setup.candidate.opt_offload
    assert main(base + ["--explain", "tp=2,pp=8,opt_offload=1.5"]) == 2
    assert "fraction in [0, 1]" in capsys.readouterr().err


def test_the_table_shows_the_optimizer_offload_column_and_its_cost(capsys):
    """Where a shown row offloads its optimizer the table has an 'opt off' column and, under it, each such row's
    GPU memory saved, step seconds added and host memory; the JSON row its opt_offload_cost."""
    import json

    from planner.cli import main

    base = ["--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM", "--global-batch", "8192",
            "--framework", "megatron-lm", "--recompute", "full", "--tp", "2", "--top", "3"]
    assert main(base + ["--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert any(r["opt_offload"] for r in rows)
    assert all(r["opt_offload_cost"]["added_s"] > 0 for r in rows if r["opt_offload"])
    assert main(base) == 0
    out = capsys.readouterr().out
    assert " opt off " in next(x for x in out.splitlines() if x.startswith("#"))
    assert "opt off: the fraction of the optimizer" in out and ", host " in out


# -- host memory ---------------------------------------------------------------------------------------------------
def test_host_memory_per_node_from_the_datasheets():
    """DGX H100, H200 and B200 datasheets: 2 TB system memory; DGX A100 (320 GB) 1 TB; GB200 NVL72: 480 GB LPDDR5X per
    Grace, 2 a 4-GPU compute tray; a host the catalog does not know is not checked."""
    tib = 2**40
    assert make_cluster(gpu="H100-SXM", gpus=16).host_memory_bytes == 2 * tib
    assert make_cluster(gpu="H200", gpus=16).host_memory_bytes == 2 * tib
    assert make_cluster(gpu="B200", gpus=16).host_memory_bytes == 2 * tib
    assert make_cluster(gpu="A100-40GB", gpus=16).host_memory_bytes == tib
    assert make_cluster(gpu="GB200", gpus=72).host_memory_bytes == 960 * 2**30
    assert make_cluster(gpu="H100-PCIe", gpus=16).host_memory_bytes is None
    # a node of 4 H100 (--gpus-per-node 4): half the DGX's host, the same share a GPU
    assert make_cluster(gpu="H100-SXM", gpus=16, gpus_per_node=4).host_memory_bytes == tib


def test_cpu_adam_reads_the_hosts_memory_bandwidth():
    """CPU Adam's 28 bytes a parameter at the node's DDR bandwidth over its GPUs: DGX H100 2 x 8 DDR5-4800 channels
    (76.8 GB/s a GPU), DGX A100 2 EPYC 7742 x 8 DDR4-3200 (51.2), GB200 2 Grace x 512 GB/s LPDDR5X a 4-GPU tray
    (256); unknown hosts take the DGX H100's. On a DGX A100 the CPU step outlasts PCIe 4.0's 4 bytes at 32 GB/s."""
    from planner.offload import host_memory_bw_per_gpu, optimizer_searched_where

    bw = {g: host_memory_bw_per_gpu(make_cluster(gpu=g, gpus=64)) for g in ("H100-SXM", "A100-80GB", "GB200",
                                                                          "RTX-4090")}
    assert bw == pytest.approx({"H100-SXM": 76.8e9, "A100-80GB": 51.2e9, "GB200": 256e9, "RTX-4090": 76.8e9})
    assert host_step_s(1e9, make_cluster(gpu="A100-80GB", gpus=8)) == pytest.approx(28e9 / 51.2e9)
    # searched only where the catalog knows the host (its memory checked, its bandwidth priced)
    assert optimizer_searched_where(make_cluster(gpu="H100-SXM", gpus=8))
    assert not optimizer_searched_where(make_cluster(gpu="RTX-4090", gpus=8))


def test_host_bytes_of_the_offloads():
    """A GPU's host bytes: 18 a parameter of its offloaded optimizer share (pinned 16-bit copy 2, fp32 copy 4, Adam
    moments 8, pinned fp32 grad 4: hybrid_optimizer.py) and its offloaded module inputs of every micro-batch in
    flight."""
    from planner.memory import host_offload_bytes, in_flight_microbatches, stage_layers, stage_states
    from planner.memory import training_param_bytes
    from planner.offload import activation_offload_bytes, offloaded_layers

    m, cl = load_model("deepseek-v3"), make_cluster(gpu="H100-SXM", gpus=1024)
    t = TrainingSpec(global_batch=8192, seq_len=4096, framework="megatron-lm")
    pb = training_param_bytes(t)
    c = replace(C, opt_offload=0.5)
    whole = max(stage_states(m, c, cl, t, s, pb, opt_offload=0.0)[3] for s in ("first", "last"))
    assert host_offload_bytes(m, c, cl, t) == pytest.approx(0.5 * whole / 12 * 18)
    assert host_offload_bytes(m, C, cl, t) == 0.0
    a = replace(NONE, offload="expert_fc1+moe_act")
    lps = stage_layers(m, a, "megatron-lm", "first")
    expect = in_flight_microbatches(a) * offloaded_layers(lps, a) * activation_offload_bytes(m, a, t, 4096)
    assert host_offload_bytes(m, a, cl, t) >= expect


def test_host_memory_rule_rules_out_what_the_node_cannot_hold():
    """Llama 3 405B on 2 DGX H100 at TP8 PP2, its whole optimizer on the host: 25B parameters a GPU x 18 bytes x 8
    GPUs = 3.6 TB > the node's 2 TB: ruled out, saying why and what to change; a node the catalog does not know is
    not checked."""
    from planner.rules import Reason

    m = load_model("llama3-405b")
    t = TrainingSpec(global_batch=64, seq_len=4096, framework="megatron-lm")
    c = Candidate(tp=8, pp=2, dp=1, mbs=1, gas=64, zero=1, sp=True, recompute="full", opt_offload=1.0)
    e = estimate(m, make_cluster(gpu="H100-SXM", gpus=16), t, c)
    host = [v for v in e.reasons if v.reason is Reason.HOST_MEMORY]
    assert host and "pinned host memory a node" in host[0].detail and "smaller optimizer fraction" in host[0].detail
    assert e.host_gb_per_node > 2 * 2**40 / 1e9
    e = estimate(m, make_cluster(gpu="H100-PCIe", gpus=16), t, c)
    assert not [v for v in e.reasons if v.reason is Reason.HOST_MEMORY]


def test_plan_prunes_the_users_offload_by_host_memory(tmp_path):
    """--optimizer-offload on Llama 3 70B over 2 nodes of 8 H100 whose host has 512 GiB: the whole optimizer needs
    70B x 18 bytes / 2 nodes = 630 GB a node whatever the layout (ZeRO-1 shards it over DP): every layout that fits
    the GPUs is ruled out under host_memory; half of it (315 GB) fits, and no survivor needs more than the node has."""
    from planner import plan
    from planner.errors import DoesNotFitError
    from planner.rules import Reason

    gpu = tmp_path / "h100-small-host.yaml"
    gpu.write_text("id: H100-small-host\nbase: H100-SXM\nhost_memory_gib: 512\n")
    cl = make_cluster(gpu=str(gpu), gpus=16)
    m = load_model("llama3-70b")
    t = TrainingSpec(global_batch=64, seq_len=4096, framework="megatron-lm", optimizer_offload=1.0,
                     recompute_options=("full",))
    p = plan(m, cl, t, allow_empty=True)
    assert not p.candidates and p.pruned[Reason.HOST_MEMORY] > 0
    assert "> the node's 550 GB" in p.examples[Reason.HOST_MEMORY][1].detail
    with pytest.raises(DoesNotFitError):
        plan(m, cl, t)
    half = plan(m, cl, replace(t, optimizer_offload=0.5))
    assert half.candidates and all(e.host_gb_per_node == pytest.approx(70.6e9 * 9 / 2 / 1e9, rel=0.02)
                                   for e in half.candidates)


def test_the_host_link_is_the_catalogs_datasheet_figure(tmp_path):
    """What the offloads copy over, per direction: PCIe Gen3 x16 on V100 (datasheet: 32 GB/s both ways), Gen4 on
    A100 (64), Gen5 on H100 (128), NVLink-C2C on GH200 (900); a GPU YAML that does not say gets Gen5's 64 GB/s."""
    from planner.offload import host_link_bytes_per_s

    link = {g: host_link_bytes_per_s(make_cluster(gpu=g, gpus=8)) for g in ("V100-32GB", "A100-80GB", "H100-SXM",
                                                                            "H200", "GH200")}
    assert link == {"V100-32GB": 16e9, "A100-80GB": 32e9, "H100-SXM": 64e9, "H200": 64e9, "GH200": 450e9}
    gpu = tmp_path / "mine.yaml"
    gpu.write_text("id: MINE\nmemory_gib: 80\nfp16_tflops: 500\nfp32_tflops: 50\nhbm_gb_per_s: 3000\n"
                   "intra_node_gb_per_s: 450\nsm_count: 132\n")
    assert host_link_bytes_per_s(make_cluster(gpu=str(gpu), gpus=8)) == 64e9
