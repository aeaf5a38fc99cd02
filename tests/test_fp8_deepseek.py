"""DeepSeek-V3's training recipe as its report (arXiv 2412.19437) states it, and its own run's memory: FP8 activation
storage and FP8 dispatch (Sec. 3.3.3, --fp8-activations deepseek), BF16 AdamW moments (Sec. 3.3.3,
--optimizer-state-dtype bf16), DualPipe's ranks (Sec. 3.2.1, deepseek-ai/DualPipe) and the SMs its all-to-all takes
(Sec. 3.2.2); what Megatron-LM can run of it is emitted, the rest refused in one line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from planner import dualpipe, fp8, load_model, make_cluster, moe
from planner.errors import InputError
from planner.memory import (ADAM_MOMENT_BYTES, layer_activations, memory_breakdown, param_bytes, stage_memory,
                            training_param_bytes)
from planner.rank import estimate
from planner.rules import Reason, Target, layout_violations, model_violations
from planner.space import Candidate, TrainingSpec

H800_BYTES = 80 * 2**30   # the H800's 80 GB of HBM3 (binary, as the catalog keeps it)


def _run(**training) -> tuple:
    """DeepSeek-V3's own run (report Sec. 3.1-3.3, 4.2): 2,048 H800, PP16 EP64 ZeRO-1 (DP 128), MBS 1 x GAS 120 =
    15,360 sequences of 4,096, FP8 with 1x128 / 128x128 tiles, RMSNorm and MLA up-projections recomputed, DualPipe,
    activations cached and dispatched in FP8, AdamW's moments in BF16."""
    m = load_model("deepseek-v3")
    cluster = make_cluster(gpu="H800", gpus=2048)
    t = TrainingSpec(**{**dict(global_batch=15360, seq_len=4096, precision="fp8", fp8_recipe="blockwise",
                               framework="megatron-lm", pp_schedule="DualPipe", fp8_activations="deepseek",
                               optimizer_state_dtype="bf16"), **training})
    c = Candidate(tp=1, pp=16, dp=128, ep=64, mbs=1, gas=120, recompute="modules:layernorm+mla_up_proj", zero=1)
    return m, cluster, t, c


def test_e5m6_and_tile_scales():
    """Sec. 3.3.3 (1): the attention output in "a customized E5M6 data format", 12 bits; Sec. 3.3.1: one FP32 scale per
    1x128 tile; the FP8 dispatch carries 1 byte and that scale an element."""
    assert fp8.E5M6_BYTES == 1.5
    assert fp8.TILE_SCALE_BYTES == pytest.approx(4 / 128)
    assert moe.FP8_DISPATCH_BYTES == pytest.approx(1 + 4 / 128) == 1 + fp8.TILE_SCALE_BYTES


def test_deepseek_v3_layer_keeps_what_sec_333_lists():
    """Per token of a DeepSeek-V3 layer (h 7168, 128 heads of value width 128, latents 1536 + 512 and a 64-wide rope
    key, 8 of 256 experts of 2048 and one shared, 3 dense layers of 18432 of 61), RMSNorms and MLA up-projections
    recomputed (Sec. 3.2.3): the two norm inputs in BF16, the latents in BF16, the attention output in E5M6, the 8
    dispatched tokens in FP8, the routed and shared SwiGLU inputs in FP8; a dense layer's FC1 and FC2 inputs in FP8 and
    its SwiGLU input in BF16."""
    m, cluster, t, c = _run()
    q8 = 1 + 4 / 128
    attention = 2 * 7168 + 2 * (1536 + 512 + 64) + (1.5 + 4 / 128) * 128 * 128
    moe_layer = 2 * 7168 + 8 * q8 * (7168 + 2 * 2048) + q8 * 2 * 2048
    dense_layer = 2 * 7168 + (q8 + 4) * 18432
    expected = attention + (58 * moe_layer + 3 * dense_layer) / 61
    assert fp8.deepseek_layer_bytes(m, c, t, ("layernorm", "mla_up_proj")) == pytest.approx(expected)
    per_layer = layer_activations(m, c, t).stored_bytes
    assert per_layer == pytest.approx(expected * 4096)
    # about half of what Transformer Engine keeps for the same layer (bf16 permuted tokens, bf16 SwiGLU inputs and
    # their FP8 copies, the attention output in bf16 and FP8)
    te = layer_activations(m, c, replace(t, fp8_activations="te")).stored_bytes
    assert 0.45 < per_layer / te < 0.6


def test_recomputing_the_norms_drops_their_fp8_outputs():
    """Without the RMSNorm recompute the norms' outputs stay, cached in FP8 for the Linear after them (the router's input
    in BF16): 1 + 1 bytes of h for the attention and the latents, 2 + 1 for the MoE block's."""
    m, _, t, c = _run()
    q8 = 1 + 4 / 128
    kept = fp8.deepseek_layer_bytes(m, c, t, ("mla_up_proj",)) - fp8.deepseek_layer_bytes(m, c, t,
                                                                                       ("layernorm", "mla_up_proj"))
    assert kept == pytest.approx(q8 * 7168 + q8 * (1536 + 512) + (58 * (2 + q8) * 7168 + 3 * q8 * 7168) / 61)


def test_bf16_moments_halve_adams_states():
    """Sec. 3.3.3: "BF16 ... to track the first and second moments in the AdamW optimizer", the master weights and
    gradients in FP32: 2 + 2 bytes of moments, 4 of master weights, 4 of gradients, beside the 2 of FP8 weights."""
    m, _, t, _ = _run()
    pb = training_param_bytes(t)
    assert (pb.master, pb.optimizer, pb.grads) == (4, 2 * ADAM_MOMENT_BYTES["bf16"], 4) == (4, 4, 4)
    assert training_param_bytes(replace(t, optimizer_state_dtype="fp32")).optimizer == 8
    assert param_bytes("fp8", "adamw").optimizer == 8   # the cached default is unchanged


def test_fp8_dispatch_halves_the_dispatch_not_the_combine():
    """Sec. 3.3.3: the dispatch and the activation gradient before the down-projections in FP8, both combines in BF16:
    two of the four all-to-alls of a MoE layer carry 1 + 4/128 bytes an element, two carry 2."""
    from planner.topology import Topology, collective_time_s

    m, cluster, t, c = _run()
    topo = Topology(cluster)
    tokens = 4096
    bf16 = moe.all_to_all_layer_s(m, c, replace(t, fp8_activations="te"), tokens, topo, collective_time_s, 2,
                                  recomputed_layers=0)
    low = moe.all_to_all_layer_s(m, c, t, tokens, topo, collective_time_s, 2, recomputed_layers=0)
    fp8_only = moe.all_to_all_s(topo, c.etp, c.ep, moe.dispatch_bytes(m, c, t, tokens, moe.FP8_DISPATCH_BYTES),
                                collective_time_s)
    share = moe.moe_layer_count(m) / m.layers
    assert low == pytest.approx(bf16 / 2 + 2 * fp8_only * share)
    assert 0.7 < low / bf16 < 0.8


def test_dualpipe_compute_beside_its_all_to_all_on_112_of_132_sms():
    """Sec. 3.2.2: 20 SMs run the all-to-all; the H800's 132 SMs leave 112 for the merged chunks' compute (PP 16, GAS
    120: 97 of 120 merged, dualpipe.py steps 4-5)."""
    factor = dualpipe.overlapped_compute_factor("DualPipe", 16, 120, 132)
    assert factor == pytest.approx(1 + (97 / 120) * 20 / 112)
    assert dualpipe.overlapped_compute_factor("DualPipeV", 8, 64, 132) == 1.0
    assert dualpipe.overlapped_compute_factor("DualPipe", 1, 120, 132) == 1.0


def test_deepseek_v3_run_fits_the_h800_it_ran_on():
    """The run ran on 80 GB H800s. As the report states it, the busiest rank (DualPipe's end rank: 16 chunks of the
    first stage, one of the last with the MTP layer and the logits) holds under 80 GB; without the FP8 storage, the BF16
    moments or DualPipe's peak as dualpipe.py runs it (PP + 1 chunks of the larger end stage, MTP counted on each), it
    would not: 150 GB before this accounting."""
    m, cluster, t, c = _run()
    busiest = memory_breakdown(m, c, cluster, t)
    assert busiest.stage == "end"
    assert busiest.total_bytes < H800_BYTES
    end, middle = stage_memory(m, c, cluster, t)
    assert middle.total_bytes < end.total_bytes
    assert memory_breakdown(m, c, cluster, replace(t, fp8_activations="te")).total_bytes > 1.4 * H800_BYTES
    no_bf16 = memory_breakdown(m, c, cluster, replace(t, optimizer_state_dtype="fp32"))
    assert no_bf16.optimizer_bytes == pytest.approx(busiest.optimizer_bytes * 12 / 8)


def test_deepseek_v3_run_throughput_within_10_percent():
    """1,543 tokens/s a GPU (Sec. 1: 180K H800 GPU hours a trillion tokens), with the FP8 dispatch and the SMs the
    all-to-all takes."""
    m, cluster, t, c = _run()
    tok = estimate(m, cluster, t, c).throughput.tokens_per_s / 2048
    assert 0.9 < tok / 1543 < 1.1


def test_specs_refuse_what_cannot_run_it():
    """--fp8-activations deepseek needs FP8, DeepSeek's tiles and a Megatron-style plan; --optimizer-state-dtype bf16
    is Megatron-LM's precision-aware optimizer (Adam only)."""
    base = dict(global_batch=64, seq_len=4096)
    with pytest.raises(InputError, match="add --precision fp8"):
        TrainingSpec(**base, framework="megatron-lm", fp8_activations="deepseek")
    with pytest.raises(InputError, match="add --fp8-recipe blockwise"):
        TrainingSpec(**base, framework="megatron-lm", precision="fp8", fp8_activations="deepseek")
    with pytest.raises(InputError, match="add --framework megatron-lm"):
        TrainingSpec(**base, framework="fsdp", optimizer_state_dtype="bf16")
    with pytest.raises(InputError, match="use --optimizer adamw"):
        TrainingSpec(**base, framework="megatron-lm", optimizer="sgd", optimizer_state_dtype="bf16")


def test_megatron_lm_refuses_the_storage_and_needs_the_distributed_optimizer_for_bf16_moments():
    m, cluster, t, c = _run(pp_schedule="")
    refused = [v for v in model_violations(m, t, cluster, Target("megatron-lm"), emit=True)
               if v.reason == Reason.FRAMEWORK_LIMIT and "fp8-activations" in v.detail]
    assert refused and "--fp8-activations te" in refused[0].detail
    assert not [v for v in model_violations(m, t, cluster, Target("megatron-lm"), emit=False)
                if "fp8-activations" in v.detail]
    zero0 = layout_violations(m, replace(c, zero=0), cluster, t, Target("megatron-lm"))
    assert any("--optimizer-state-dtype bf16" in v.detail and "zero=1" in v.detail for v in zero0)


def test_cli_plans_notes_and_emits(tmp_path):
    base = [sys.executable, "-m", "planner", "--model", "deepseek-v3", "--gpus", "2048", "--gpu", "H800",
            "--framework", "megatron-lm", "--precision", "fp8", "--fp8-recipe", "blockwise", "--global-batch", "15360",
            "--optimizer-state-dtype", "bf16",
            "--explain", "tp=1,pp=16,mbs=1,zero=1,ep=64,recompute=modules:layernorm+mla_up_proj"]
    planned = subprocess.run(base + ["--fp8-activations", "deepseek", "--pp-schedule", "DualPipe"],
                             capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert "--fp8-activations deepseek is DeepSeek-V3's" in planned.stderr
    refused = subprocess.run(base + ["--fp8-activations", "deepseek", "--emit", "megatron-lm", "--out",
                                     str(tmp_path / "no")], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    # NVIDIA's DGX-H100 layout (1,024 GPUs, TP2 PP8 VP4 EP64) with DeepSeek's BF16 moments, which Megatron-LM runs
    nvidia = [sys.executable, "-m", "planner", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "H100-SXM",
              "--global-batch", "8192", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--grad-reduce-dtype",
              "bf16", "--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "64", "--zero", "1", "--max-mbs", "1",
              "--optimizer-state-dtype", "bf16"]
    emitted = subprocess.run(nvidia + ["--emit", "megatron-lm", "--out", str(tmp_path / "run")], capture_output=True,
                             text=True)
    assert emitted.returncode == 0, emitted.stderr
    args = (tmp_path / "run" / "args.txt").read_text().splitlines()
    assert "--use-precision-aware-optimizer" in args
    assert "--exp-avg-dtype bf16" in args and "--exp-avg-sq-dtype bf16" in args
    bad = subprocess.run([sys.executable, "-m", "planner", "--model", "llama3-8b", "--gpus", "8", "--framework", "fsdp",
                          "--optimizer-state-dtype", "bf16"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_mtp_shares_the_embedding_only_where_dualpipe_puts_it_on_the_same_rank():
    """Megatron-LM builds a word embedding on the MTP rank (gpt_model.py: pre_process or mtp_process), so its last stage
    holds a second 129,280 x 7,168 copy; DualPipe's end rank holds the first and the last stage, and the MTP module
    shares the main model's embedding and head (report Sec. 3.2.3): one copy each."""
    from planner.memory import stage_params

    m, cluster, t, c = _run()
    word = 129280 * 7168
    assert stage_params(m, c, "last", "megatron-lm") - stage_params(m, c, "last", "megatron-lm",
                                                                     mtp_embedding=False) == word
    end = stage_memory(m, c, cluster, t)[0]
    first, last = stage_memory(m, c, cluster, replace(t, pp_schedule=""))
    assert end.params_on_gpu == first.params_on_gpu + last.params_on_gpu - word
