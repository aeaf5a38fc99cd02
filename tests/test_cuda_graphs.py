"""CUDA graphs as Megatron-LM captures them (planner.cuda_graphs): the published run that used them, the host launches
each scope takes out, Megatron's refusals as rules and one-line input errors, and the flags."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner import cuda_graphs, load_model, make_cluster
from planner.constants import KERNEL_LAUNCH_S
from planner.cost import layer_op_list
from planner.errors import InputError
from planner.model import get_preset
from planner.rank import estimate
from planner.space import Candidate, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
QWEN3_B200 = Candidate(tp=1, pp=1, dp=8, ep=8, mbs=1, gas=64, recompute="none", zero=1)


def _qwen3_b200(graphs: tuple[str, ...]) -> tuple[float, TrainingSpec]:
    """Megatron-Bridge 25.11's DGX-B200 Qwen3-30B-A3B row (docs/performance-summary.md: 8 GPUs, FP8-MX, GBS 512,
    MBS 1, seq 4096, TP1 PP1 EP8: 9,299 tokens/s per GPU) as tests/bench/validate_moe_cp.py scores it: tokens/s per
    GPU and the training."""
    t = TrainingSpec(global_batch=512, seq_len=4096, precision="fp8", fp8_recipe="mxfp8", framework="megatron-lm",
                     grad_reduce_dtype="bf16", overlap=("grad-reduce", "param-gather", "p2p"), cuda_graphs=graphs)
    e = estimate(load_model("qwen3-30b-a3b"), make_cluster(gpu="B200", gpus=8), t, QWEN3_B200)
    return 512 * 4096 / e.step_time_s / 8, t


def test_published_b200_qwen3_row_with_its_cuda_graphs():
    # its config (Megatron-Bridge v0.2.0 QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG, which FP8_MX aliases):
    # transformer_engine graphs of moe_router + moe_preprocess; measured 9,299 tokens/s per GPU
    graphed, eager = _qwen3_b200(("moe_router", "moe_preprocess"))[0], _qwen3_b200(())[0]
    assert 0.7 < graphed / 9299 < 1.3
    assert graphed > 1.2 * eager   # the router's host work was a large part of the eager layer


def test_router_scope_keeps_the_launches_after_the_dispatcher_sync():
    _, t = _qwen3_b200(("moe_router", "moe_preprocess"))
    m, cl = load_model("qwen3-30b-a3b"), make_cluster(gpu="B200", gpus=8)
    graphed = layer_op_list(m, QWEN3_B200, cl, t)
    eager = layer_op_list(m, QWEN3_B200, cl, replace(t, cuda_graphs=()))
    assert graphed.sync_host_s == eager.sync_host_s > 0   # the per-expert GEMMs after the sync stay eager
    assert graphed.host_s < eager.host_s


def test_whole_layer_graph_of_a_dense_layer_leaves_one_launch():
    m, cl = get_preset("llama3-70b"), make_cluster(gpu="H100", gpus=64)
    c = Candidate(tp=4, pp=2, dp=8, sp=True, mbs=1, gas=64, zero=1)
    t = TrainingSpec(global_batch=512, seq_len=8192, framework="megatron-lm")
    eager, whole = layer_op_list(m, c, cl, t), layer_op_list(m, c, cl, replace(t, cuda_graphs=("layer",)))
    attn = layer_op_list(m, c, cl, replace(t, cuda_graphs=("attn",)))
    assert whole.host_s == pytest.approx(KERNEL_LAUNCH_S)
    assert whole.host_s < attn.host_s < eager.host_s


def test_full_iteration_of_a_drop_and_pad_moe_removes_every_launch():
    m, cl = get_preset("mixtral-8x22b"), make_cluster(gpu="H100", gpus=128)
    c = Candidate(tp=4, pp=4, dp=8, ep=8, sp=True, mbs=1, gas=64, zero=1)
    t = TrainingSpec(global_batch=512, seq_len=4096, framework="megatron-lm", moe_capacity_factor=1.25,
                     cuda_graphs=("full_iteration",))
    lo = layer_op_list(m, c, cl, t)
    assert lo.host_s == lo.sync_host_s == 0.0
    assert not cuda_graphs.violations(m, c, cl, t)


QWEN3_EP8 = Candidate(tp=1, pp=1, dp=8, ep=8, mbs=1, gas=64, zero=1)
LLAMA = Candidate(tp=4, pp=2, dp=8, sp=True, mbs=1, gas=64, zero=1)


@pytest.mark.parametrize("model,cand,training,words", [
    ("qwen3-30b-a3b", QWEN3_EP8, dict(cuda_graphs=("full_iteration",)), "dropless MoE syncs"),
    ("qwen3-30b-a3b", QWEN3_EP8, dict(cuda_graphs=("moe",)), "drop-padding"),
    ("llama3-70b", LLAMA, dict(cuda_graphs=("moe_router",)), "only supported for MoE"),
    ("llama3-70b", replace(LLAMA, recompute="full"), dict(cuda_graphs=("attn",)),
     "full recompute is only supported with full iteration"),
    ("qwen3-30b-a3b", replace(QWEN3_EP8, recompute="modules:moe"), dict(cuda_graphs=("moe_router",)),
     "moe recompute is not supported"),
    ("qwen3-30b-a3b", QWEN3_EP8, dict(cuda_graphs=("moe_router", "moe_preprocess"), moe_capacity_factor=1.0),
     "DtoH copies"),
])
def test_megatron_s_refusals_are_rules(model, cand, training, words):
    t = TrainingSpec(global_batch=512, seq_len=4096, framework="megatron-lm", **training)
    found = cuda_graphs.violations(get_preset(model), cand, None, t)
    assert any(words in detail for _, detail in found), found


def test_rules_reach_plan():
    """The refused module recompute is never the plan's pick with the router graphed (the rule sees the module set
    the search resolves, not its token)."""
    from planner.rank import plan

    t = TrainingSpec(global_batch=512, seq_len=4096, precision="fp8", fp8_recipe="mxfp8", framework="megatron-lm",
                     pins=(("pp", 1), ("tp", 1)), ep_options=(8,), cuda_graphs=("moe_router", "moe_preprocess"))
    p = plan(load_model("qwen3-30b-a3b"), make_cluster(gpu="B200", gpus=8), t)
    assert p.candidates and all("moe" not in e.candidate.recompute.removeprefix("modules:").split("+")
                                for e in p.candidates)


@pytest.mark.parametrize("training,words", [
    (dict(cuda_graphs=("moe_preprocess",), framework="megatron-lm"), "needs moe_router"),
    (dict(cuda_graphs=("moe", "moe_router"), framework="megatron-lm"), "exclude each other"),
    (dict(cuda_graphs=("full_iteration", "attn"), framework="megatron-lm"), "stand alone"),
    (dict(cuda_graphs=("attn",), framework="fsdp"), "Megatron-LM's"),
    (dict(cuda_graphs=("router",), framework="megatron-lm"), "unknown CUDA graph scope"),
])
def test_training_spec_refuses_scopes_megatron_refuses(training, words):
    with pytest.raises(InputError, match=words):
        TrainingSpec(global_batch=8, seq_len=2048, **training)


def test_flags_per_implementation():
    te = TrainingSpec(global_batch=8, seq_len=2048, framework="megatron-lm",
                      cuda_graphs=("moe_router", "moe_preprocess"))
    ep8 = Candidate(tp=1, pp=1, dp=8, ep=8, mbs=1, gas=1)
    assert cuda_graphs.megatron_lm_args(te, ep8) == [
        ("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", "moe_router", "moe_preprocess")]
    assert cuda_graphs.megatron_lm_args(replace(te, cuda_graphs=("full_iteration",)), ep8) == [
        ("--cuda-graph-impl", "local"), ("--cuda-graph-scope", "full_iteration"),
        ("--no-check-for-nan-in-loss-and-grad",), ("--moe-pad-experts-for-cuda-graph-inference",)]
    assert cuda_graphs.megatron_lm_args(replace(te, cuda_graphs=("layer",)), replace(ep8, ep=1)) == [
        ("--cuda-graph-impl", "transformer_engine")]


def test_cli_bad_scope_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "qwen3-30b-a3b", "--gpus", "8", "--framework",
                        "megatron-lm", "--cuda-graphs", "moe_preprocess"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "needs moe_router" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
