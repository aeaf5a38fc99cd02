"""FLOPs arithmetic against published numbers (seed 001, seed 003, Narayanan et al. 2021 Eq. 3)."""

from __future__ import annotations

import pytest

from planner import flops
from planner.model import ModelSpec, get_preset


def test_seed001_perl_one_liner():
    # seed 001: perl -le '$ng=64; $ms=52; $gbs=1024; $sp=127; $seqlen=2048; print $ms*4*2*$seqlen*$gbs / ( $sp * $ng * 1e3)'
    tf = flops.seed001_tflops(params_b=52, seq_len=2048, global_batch=1024, seconds_per_iteration=127, gpus=64,
                              checkpoint_activations=True)
    assert tf == pytest.approx(52 * 4 * 2 * 2048 * 1024 / (127 * 64 * 1e3))
    assert tf == pytest.approx(107.33, abs=0.01)  # what the one-liner prints


def test_seed003_table_tflops_column():
    # seed 003: $ms=1.3 $gbs=512 $seqlen=2048 $ng=8 $sp=29 -> 47.0 (recompute); $sp=23 factor 3 -> 44.4
    assert flops.seed001_tflops(params_b=1.3, seq_len=2048, global_batch=512, seconds_per_iteration=29, gpus=8,
                                checkpoint_activations=True) == pytest.approx(47.0, abs=0.05)
    assert flops.seed001_tflops(params_b=1.3, seq_len=2048, global_batch=512, seconds_per_iteration=23, gpus=8,
                                checkpoint_activations=False) == pytest.approx(44.4, abs=0.06)  # table truncates 44.45


def test_hardware_flops_with_full_recompute_is_megatron_eq3():
    m = ModelSpec(name="gpt-145b", layers=80, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288,
                  vocab=51200, seq_len=2048)
    eq3 = flops.megatron_eq3_flops(global_batch=2304, seq_len=2048, layers=80, hidden=12288, vocab=51200)
    assert flops.hardware_flops_per_iteration(m, 2304, "full") == pytest.approx(eq3, rel=1e-12)


def test_model_flops_is_three_quarters_of_eq3_layer_term():
    m = ModelSpec(name="g", layers=24, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=50304,
                  seq_len=2048)
    b, s, l, h, v = 512, 2048, 24, 2048, 50304
    expected = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert flops.model_flops_per_iteration(m, b) == pytest.approx(expected, rel=1e-12)


def test_model_flops_close_to_6nd_for_llama():
    m = get_preset("llama2-7b")
    tokens = 1024 * m.seq_len
    six_nd = 6 * m.params * tokens
    # attention scores add 12·l·h·s per token (PaLM App. B); embeddings are not matmuls
    attn = 12 * m.layers * m.hidden * m.seq_len * tokens
    assert flops.model_flops_per_iteration(m, 1024) == pytest.approx(six_nd + attn, rel=0.03)


def test_published_megatron_tflops_recomputed_from_eq3(data_dir):
    import yaml

    rows = [r for r in yaml.safe_load((data_dir / "published_public.yaml").read_text())
            if r["group"] == "megatron2021_table1_weak_scaling"]
    assert len(rows) >= 8
    for r in rows:
        md, p, meas = r["model"], r["parallel"], r["measured"]
        total = flops.megatron_eq3_flops(global_batch=p["global_batch"], seq_len=md["seq_len"], layers=md["layers"],
                                         hidden=md["hidden"], vocab=md["vocab"])
        # aggregate PFLOP/s in the table = per-GPU TFLOPs x GPUs / 1000
        assert meas["tflops_per_gpu"] * r["hardware"]["total_gpus"] / 1e3 == pytest.approx(
            meas["aggregate_pflops"], rel=0.06), r["id"]
        assert total > 0


# Megatron-Bridge 25.11 performance summary (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md): each row's
# model TFLOP/s per GPU and tokens/s per GPU, as in tests/bench/validate_moe_cp.py. Bridge counts causal attention
# (flop_utils.py ``core_seq / 2``), so FLOPs per token x tokens/s must give its TFLOP/s under "causal", not "full".
BRIDGE_TFLOPS_AND_TOKENS = [("llama3-70b", 8192, 719, 1602), ("llama3.1-405b", 8192, 737, 292),
                            ("qwen3-30b-a3b", 4096, 121, 5275), ("deepseek-v3", 4096, 557, 2139)]


@pytest.mark.parametrize("name, seq, tflops, tokens", BRIDGE_TFLOPS_AND_TOKENS)
def test_causal_attention_count_reproduces_megatron_bridge_tflops(name, seq, tflops, tokens):
    from planner.model import load_model

    m = load_model(name).with_overrides(seq_len=seq)
    per_token = {a: flops.model_flops_per_iteration(m, 1, a) / seq for a in flops.ATTENTION_COUNTS}
    assert per_token["causal"] * tokens / 1e12 == pytest.approx(tflops, rel=0.01)
    assert per_token["full"] * tokens / 1e12 > tflops * 1.04          # full s^2: 4-22% more at 4K-8K


def test_causal_and_full_counts_grow_apart_with_the_sequence():
    """Llama 3.1 405B: 1.04x at 8K, 1.4x at 128K (issue 19's figures), towards 2x as attention dominates."""
    from planner.model import load_model

    ratios = []
    for seq in (8192, 131072, 1048576):
        m = load_model("llama3.1-405b").with_overrides(seq_len=seq)
        ratios.append(flops.model_flops_per_iteration(m, 1, "full") / flops.model_flops_per_iteration(m, 1, "causal"))
    assert ratios[0] == pytest.approx(1.04, abs=0.02)
    assert ratios[1] == pytest.approx(1.4, abs=0.1)
    assert 1.8 < ratios[2] < 2.0


def test_plan_says_which_count_it_uses():
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "planner.cli", "--model", "llama3-8b", "--gpus", "16", "--gpu", "H100",
            "--framework", "megatron-lm", "--top", "1"]
    table = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert "attention s^2 counted in full" in table
    full = json.loads(subprocess.run(base + ["--format", "json"], capture_output=True, text=True, check=True).stdout)
    causal = json.loads(subprocess.run(base + ["--format", "json", "--flops-attention", "causal"], capture_output=True,
                                       text=True, check=True).stdout)
    assert (full["flops_attention"], causal["flops_attention"]) == ("full", "causal")
    a, b = full["candidates"][0], causal["candidates"][0]
    assert a["step_time_s"] == b["step_time_s"] and a["model_tflops_per_gpu"] > b["model_tflops_per_gpu"]
