"""A layer as a list of operations (planner.ops): the list's FLOPs are the published formulas', the features edit it
(TP, CP, MoE, FP8, recompute), its sums are the compute term's, and `plan --explain` prints it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner import cli, flops
from planner.cost import layer_compute_s, layer_op_list, layer_op_rows
from planner.hardware import make_cluster
from planner.model import get_preset
from planner.ops import ATTENTION, ELEMENTWISE, GEMM, HOST
from planner.recompute import recomputed_of
from planner.space import Candidate, TrainingSpec

GPT3 = get_preset("gpt3-175b")
A100 = make_cluster(gpu="A100-80GB", gpus=64)
BF16 = TrainingSpec(global_batch=1536, seq_len=2048)


def _cand(**kw) -> Candidate:
    return Candidate(**{"tp": 1, "pp": 1, "dp": 64, "mbs": 1, "gas": 24, **kw})


def _flops(lo, *classes: str) -> float:
    return sum(op.flops for op in lo.ops if op.cls in classes)


def test_dense_layer_flops_are_megatron_eq3():
    """The GEMMs and attention core of GPT-3 175B's layer, x layers x 4 (forward, 2x backward, the recomputed
    forward) plus the LM head x 3, are Narayanan et al. 2021 Eq. 3 for a batch of 1536 (their Table 1's 175B row):
    96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    lo = layer_op_list(GPT3, _cand(), A100, BF16)
    per_sequence = 4 * _flops(lo, GEMM, ATTENTION) * GPT3.layers + 3 * flops.logits_forward_flops(GPT3, GPT3.seq_len)
    eq3 = flops.megatron_eq3_flops(global_batch=1536, seq_len=2048, layers=96, hidden=12288, vocab=GPT3.vocab)
    assert per_sequence * 1536 == pytest.approx(eq3, rel=1e-9)
    assert eq3 == pytest.approx(4.51e18, rel=0.01)   # Table 1's arithmetic: 4.5e18 FLOPs an iteration


def test_tp_shards_every_matmul():
    """Column- and row-parallel GEMMs and the heads split by TP: the TP ranks together do the TP1 layer's FLOPs."""
    one = layer_op_list(GPT3, _cand(), A100, BF16)
    eight = layer_op_list(GPT3, _cand(tp=8, dp=8), A100, BF16)
    assert 8 * _flops(eight, GEMM, ATTENTION) == pytest.approx(_flops(one, GEMM, ATTENTION), rel=1e-12)


def test_moe_swaps_the_mlp_for_experts():
    """Mixtral 8x7B at TP2 (SP) EP8 ETP1: the op list's matmul FLOPs are 1/TP of the top-2 experts', the router's and
    attention's (`planner.moe.layer_forward_matmul_flops`, Megatron-Core's count): attention split by TP, the router
    on the SP shard, the experts on the rank's share of the tokens' copies. The expert GEMMs wait on the
    dispatcher's host sync under Megatron-LM."""
    m = get_preset("mixtral-8x7b")
    t = replace(BF16, framework="megatron-lm", global_batch=512, seq_len=m.seq_len)
    cand = Candidate(tp=2, pp=1, dp=32, mbs=1, gas=16, sp=True, ep=8)
    lo = layer_op_list(m, cand, A100, t)
    names = [op.name for op in lo.ops]
    assert "fc1" not in names and {"router", "expert_fc1", "expert_fc2", "moe_permute"} <= set(names)
    assert all(op.after_sync for op in lo.ops if op.name.startswith("expert_fc"))
    tokens = m.seq_len * cand.mbs
    assert _flops(lo, GEMM, ATTENTION) == pytest.approx(flops.layer_forward_matmul_flops(m, tokens) / 2, rel=1e-3)


def test_context_parallel_runs_the_core_in_blocks():
    """CP 4 on 32K tokens: each rank's token-local ops see 8K tokens, its attention core CP blocks of 8K x 8K, so
    the core is a quarter of the whole sequence's and the GEMMs a quarter too."""
    m = get_preset("llama3-70b").with_overrides(seq_len=32768)
    t = TrainingSpec(global_batch=64, seq_len=32768, framework="megatron-lm")
    whole = layer_op_list(m, _cand(tp=8, dp=8, sp=True), A100, t)
    ranked = layer_op_list(m, _cand(tp=8, dp=2, sp=True, cp=4), A100, t)
    assert 4 * _flops(ranked, ATTENTION) == pytest.approx(_flops(whole, ATTENTION), rel=1e-12)
    assert 4 * _flops(ranked, GEMM) == pytest.approx(_flops(whole, GEMM), rel=1e-12)


def test_fp8_adds_casts_and_runs_the_core_in_bf16():
    m = get_preset("llama3-70b")
    h100 = make_cluster(gpu="H100-SXM", gpus=64)
    t = TrainingSpec(global_batch=128, seq_len=8192, framework="megatron-lm")
    cand = _cand(tp=4, dp=16, sp=True)
    bf16 = layer_op_list(m, cand, h100, t)
    fp8 = layer_op_list(m, cand, h100, replace(t, precision="fp8"))
    assert "fp8_casts" in [op.name for op in fp8.ops] and "fp8_casts" not in [op.name for op in bf16.ops]
    assert fp8.seconds(ATTENTION) == pytest.approx(bf16.seconds(ATTENTION))   # the core stays bf16
    assert fp8.seconds(GEMM) < 0.75 * bf16.seconds(GEMM)                        # twice the peak, less the FP8 factor


def test_unfused_attention_adds_the_score_traffic():
    """Without FlashAttention the softmax and dropout read and write the s x s scores (Korthikanti et al. 2022
    Sec. 4: 5as/h of the 34 + 5as/h), an element-wise op of its own."""
    flash = layer_op_list(GPT3, _cand(tp=8, dp=8), A100, BF16)
    plain = layer_op_list(GPT3, _cand(tp=8, dp=8), A100, replace(BF16, flash_attention=False))
    extra = {op.name for op in plain.ops} - {op.name for op in flash.ops}
    assert extra == {"softmax_dropout"}
    assert next(op for op in plain.ops if op.name == "softmax_dropout").cls == ELEMENTWISE


def test_a_megatron_style_trainer_runs_the_unfused_softmax_in_fp32():
    """--eager-ops with PyTorch's softmax (Megatron's forward_torch_softmax under attention_softmax_in_fp32): the
    scores cast to fp32, masked, softmaxed and cast back, 29 bytes a score forward and 33 backward. Against Hagemann
    et al.'s 64-GPU sheet (Llama 13B, TP2 DP32 MBS1, PyTorch norms): with PyTorch's attention 52.55 s a step, with
    flash-attn 2 35.54 s, 1.48x; predicted 1.26x with 16-bit softmax ops, 1.31x with the fp32 softmax."""
    from published import dev_cases
    from planner.ops import EAGER_SCORE_BYTES, FP32_SOFTMAX_SCORE_BYTES
    from planner.rank import estimate
    assert FP32_SOFTMAX_SCORE_BYTES == pytest.approx((29 + 33) / 3) and FP32_SOFTMAX_SCORE_BYTES > EAGER_SCORE_BYTES
    runs = {c.id: c for c in dev_cases() if c.id in ("hagemann_97686", "hagemann_132312")}
    step = {k: estimate(c.model, c.cluster, c.training, c.time_candidate()).step_time_s for k, c in runs.items()}
    assert runs["hagemann_97686"].step_time_s / runs["hagemann_132312"].step_time_s == pytest.approx(1.479, abs=0.01)
    assert step["hagemann_97686"] / step["hagemann_132312"] == pytest.approx(1.31, abs=0.01)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_table_adds_up_to_the_compute_term(recompute):
    """The rows' seconds (forward, 2x backward, recomputed) and the host's wait sum to the layer time the compute
    term uses; selective recompute re-runs the attention core only, full the whole forward."""
    cand = _cand(tp=8, dp=8, recompute=recompute)
    rows = layer_op_rows(GPT3, cand, A100, BF16)
    assert sum(r["seconds"] for r in rows) == pytest.approx(layer_compute_s(GPT3, cand, A100, BF16)[1], rel=1e-12)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    again = {r["class"] for r in rows if r["recompute_s"] > 0}
    assert again == {"none": set(), "selective": {ATTENTION}, "full": {GEMM, ATTENTION, ELEMENTWISE}}[recompute]


def test_a_host_bound_layer_shows_its_wait():
    """A small model under eager torchtitan launches slower than its GPU runs: the table says so in a host row."""
    tiny = get_preset("llama3-8b").with_overrides(layers=4, hidden=256, heads=4, kv_heads=4, ffn_hidden=768,
                                                  seq_len=128)
    t = TrainingSpec(global_batch=8, seq_len=128, framework="fsdp")
    cand = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, zero=3)
    rows = layer_op_rows(tiny, cand, A100, t)
    host = [r for r in rows if r["class"] == HOST]
    assert host and host[0]["share"] > 0.5
    rc = recomputed_of(tiny, cand, t.framework)
    lo = layer_op_list(tiny, cand, A100, t)
    assert lo.forward_s() == pytest.approx(lo.host_s) and lo.layer_s(rc) > 3 * lo.gpu_s


def test_explain_prints_the_op_table(capsys):
    assert cli.main(["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("One layer's operations"):]
    for op in ("qkv", "attn_scores", "softmax_dropout", "fc1", "fc2", "norms"):
        assert f"\n{op} " in table
    assert cli.main(["--model", "176B", "--gpus", "384", "--explain", "tp=4,pp=12,mbs=2,recompute=full,zero=1",
                     "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    ops = {r["op"]: r for r in d["layer_ops"]}
    assert ops["fc1"]["class"] == GEMM and ops["fc1"]["recompute_s"] == ops["fc1"]["forward_s"]
    assert sum(r["share"] for r in d["layer_ops"]) == pytest.approx(1.0, abs=1e-3)


def test_latent_attention_replaces_qkv():
    """DeepSeek-V3's multi-latent attention: the down- and up-projections and the core of width nope+rope / v
    instead of a dense Q/K/V; with the MoE MLP the op list's FLOPs at TP1 are `flops.layer_forward_matmul_flops`
    (the DeepSeek-V3 report's shapes: 671B parameters, 37B active) within the routed rows' rounding."""
    m = get_preset("deepseek-v3")
    h100 = make_cluster(gpu="H100-SXM", gpus=2048)
    t = TrainingSpec(global_batch=2048, seq_len=m.seq_len, framework="megatron-lm")
    cand = Candidate(tp=1, pp=16, dp=128, mbs=1, gas=16, ep=64)
    lo = layer_op_list(m, cand, h100, t)
    names = [op.name for op in lo.ops]
    assert {"q_down", "q_up", "kv_down", "kv_up"} <= set(names) and "qkv" not in names
    assert _flops(lo, GEMM, ATTENTION) == pytest.approx(flops.layer_forward_matmul_flops(m, m.seq_len), rel=1e-3)
