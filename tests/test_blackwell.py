"""The clusters of now: an NVLink domain apart from the node (GB200 NVL72: 72 GPUs over 18 trays of 4), the DGX B200
and GB200 NVL72 presets, MI355X, and block-scaled FP8 (MXFP8, DeepSeek-V3's 128-element blocks) as their own recipes,
checked on published Blackwell runs (tests/data/published_2025_dev.yaml: NeMo 25.04's DGX-GB200 table, torchao's
B200 table, torchtitan's nvfp4.md evidence)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner import fp8, moe
from planner.constants import BY_NAME, RANKING_ERROR
from planner.emit import load_plan_yaml
from planner.hardware import CLUSTER_PRESETS, get_accelerator, make_cluster, preset_cluster
from planner.model import get_preset
from planner.rank import estimate, plan
from planner.rules import Reason
from planner.space import Candidate, TrainingSpec
from planner.topology import Topology
from tests import blackwell_runs as B

ROOT = Path(__file__).resolve().parents[1]


def _tps(run) -> float:
    e = estimate(run.model, run.cluster, run.training, run.cand)
    return run.training.global_batch * run.training.seq_len / e.step_time_s / run.cluster.world_size


# -- presets and catalog ------------------------------------------------------------------------------------------
def test_gb200_nvl72_and_dgx_b200_presets_carry_their_datasheet_figures():
    nvl = CLUSTER_PRESETS["gb200-nvl72"]   # DGX GB200 user guide: 18 trays x 4 GPUs, 4 ConnectX-7 400G per tray
    assert (nvl.gpu, nvl.gpus_per_node, nvl.nvlink_domain, nvl.nics_per_node, nvl.nic_gbps) == ("GB200", 4, 72, 4, 400)
    b200 = CLUSTER_PRESETS["dgx-b200"]     # DGX B200 user guide: 8 B200, 8 single-port ConnectX-7 400G
    assert (b200.gpu, b200.gpus_per_node, b200.nvlink_domain, b200.nics_per_node) == ("B200", 8, None, 8)
    cl = preset_cluster("gb200-nvl72", gpus=72)
    # NVLink 5: 1.8 TB/s per GPU bidirectional = 900 GB/s a direction, across trays inside the domain
    assert cl.intra_node_bw_bytes_per_s == 900e9 and cl.domain_gpus == 72 and cl.nodes == 18
    assert "NVLink domain of 72 GPUs (18 nodes of 4)" in cl.network_line()
    # a job beyond one rack: 16-tray segments (Slurm --segment 16, NVIDIA's recommendation for 128+ GPU jobs)
    assert preset_cluster("gb200-nvl72", gpus=128).domain_gpus == 64
    assert preset_cluster("gb200-nvl72", gpus=128, nvlink_domain=72).domain_gpus == 72   # unless told


def test_mi355x_is_its_own_catalog_entry_from_amds_datasheet():
    acc = get_accelerator("MI355X")
    # 256 CUs x 8,192 FP8 FLOP/clock x 2.4 GHz (AMD, CDNA 4) = the datasheet's 5.0 PF FP8 dense; bf16 half of it
    assert acc.peak_fp8_flops == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert acc.peak_bf16_flops == pytest.approx(acc.peak_fp8_flops / 2)
    assert (acc.memory_bytes / 2**30, acc.memory_bw_bytes_per_s, acc.power_w) == (288, 8e12, 1400)
    assert acc.intra_node_bw_bytes_per_s == pytest.approx(1075.2e9 / 2)   # 7 Infinity Fabric links, bidirectional
    assert acc.mx_block_scaling and acc.peak_tf32_flops is None
    assert get_accelerator("MI300X").memory_bytes != acc.memory_bytes and not get_accelerator("H100").mx_block_scaling


def test_an_nvlink_domain_that_is_not_whole_nodes_is_one_line():
    with pytest.raises(Exception, match="not a whole number of 4-GPU nodes; use 68"):
        make_cluster(gpu="GB200", gpus=144, nvlink_domain=70)
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "llama3-8b", "--cluster", "gb200-nvl72",
                        "--gpus", "144", "--nvlink-domain", "70"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- collectives inside the domain ----------------------------------------------------------------------------------
def test_groups_inside_the_domain_use_nvlink_across_trays_and_not_beyond():
    topo = Topology(preset_cluster("gb200-nvl72", gpus=128, nvlink_domain=72))
    assert topo.tp_link(8).kind == "intra"                      # two trays, one rack
    assert topo.tp_link(16).kind == "inter"                     # 72 % 16: some TP-16 blocks straddle two racks
    assert Topology(preset_cluster("gb200-nvl72", gpus=128)).tp_link(16).kind == "intra"   # 64-GPU segments
    assert topo.dp_link(2, 4).kind == "intra" and topo.dp_link(1, 128).kind == "inter"
    assert topo.dp_link(1, 8).kind == "intra"                   # CP 8 at TP 1 (Megatron: CP strides by TP)
    one_rack = Topology(preset_cluster("gb200-nvl72", gpus=64))    # the job inside one domain: every group on NVLink
    assert {one_rack.dp_link(1, 64).kind, one_rack.pp_link(4, 4, 4).kind, one_rack.tp_link(64).kind} == {"intra"}
    dgx = Topology(preset_cluster("dgx-b200", gpus=128))          # DGX B200: the node is the domain
    assert dgx.tp_link(16).kind == "inter" and dgx.tp_link(8).kind == "intra"


def test_dp_block_that_does_not_divide_the_rack_leaves_it():
    topo = Topology(preset_cluster("gb200-nvl72", gpus=128, nvlink_domain=72))
    assert topo.dp_link(4, 8).kind == "inter"   # 32-rank blocks at 64..95 straddle the first rack's end (72)
    assert topo.dp_link(4, 2).kind == "intra"   # 8-rank blocks tile 72
    # a group leaving the rack is priced as between nodes: no more than a tray's NICs
    assert topo.dp_link(1, 128).bus_bw_bytes_per_s <= topo.cluster.inter_node_bw_bytes_per_s


def test_expert_all_to_all_across_trays_runs_at_nvlink_speed():
    from planner.topology import collective_time_s

    nvl, trays = (Topology(preset_cluster("gb200-nvl72", gpus=64, nvlink_domain=d)) for d in (None, 4))
    message = 64e6
    fast = moe.all_to_all_s(nvl, 1, 8, message, collective_time_s)
    slow = moe.all_to_all_s(trays, 1, 8, message, collective_time_s)
    # 900 GB/s NVLink against one 400 Gb/s (50 GB/s) NIC per GPU: an order of magnitude
    assert slow > 8 * fast


# -- rules and ranking: TP / EP across trays ------------------------------------------------------------------------
def test_nvl72_ranks_ep_across_trays_first_as_nemo_ran_mixtral():
    """NeMo 25.04 DGX-GB200: Mixtral 8x7B on 64 GPUs at TP1 EP8 (EP over two trays). On the NVL72 preset the plan's
    pick has EP 8 across trays and is faster than anything on 4-GPU trays without the domain."""
    run = B.nemo_gb200_run("nemo_2504_gb200_mixtral_8x7b_ep8_64g")
    training = replace(run.training, zero_options=(1,), max_mbs=2)
    best_nvl = plan(run.model, run.cluster, training).candidates[0]
    trays = preset_cluster("gb200-nvl72", gpus=64, nvlink_domain=4)
    best_trays = plan(run.model, trays, training).candidates[0]
    assert best_nvl.candidate.ep == 8 > run.cluster.gpus_per_node and best_nvl.candidate.tp == 1
    assert best_trays.candidate.ep <= 4
    assert best_nvl.step_time_s < 0.85 * best_trays.step_time_s
    # NeMo's own layout is faster inside the domain than over the NICs
    assert (estimate(run.model, run.cluster, run.training, run.cand).step_time_s
            < 0.8 * estimate(run.model, trays, run.training, run.cand).step_time_s)


def test_tp_across_trays_is_ruled_in_inside_the_domain_and_out_beyond_it():
    """NeMo's Nemotron-4 340B at TP8 PP4 VPP12 on 128 GB200: TP over two trays; allowed and ranked among the tied best
    on NVL72 (faster than anything with 4-GPU trays alone), ruled out where the tray is the domain, and TP past the
    domain is ruled out."""
    run = B.nemo_gb200_run("nemo_2504_gb200_nemotron4_340b_tp8pp4vp12_128g")
    ok = estimate(run.model, run.cluster, run.training, run.cand)
    assert not [r for r in ok.reasons if r.reason is Reason.TP_EXCEEDS_NODE]
    trays = preset_cluster("gb200-nvl72", gpus=128, nvlink_domain=4)
    ruled = estimate(run.model, trays, run.training, run.cand)
    assert [r for r in ruled.reasons if r.reason is Reason.TP_EXCEEDS_NODE]
    big = replace(run.cand, tp=96, pp=1, dp=1, mbs=1, gas=32, sp=True, vpp=1)
    cl96 = preset_cluster("gb200-nvl72", gpus=96)
    assert any("NVLink domain" in r.detail for r in estimate(run.model, cl96, run.training, big).reasons
               if r.reason is Reason.TP_EXCEEDS_NODE)
    training = replace(run.training, zero_options=(1,), max_mbs=1)
    p = plan(run.model, run.cluster, training)
    best = p.candidates[0].step_time_s
    tp8 = [e for e in p.candidates if e.candidate.tp == 8]
    assert tp8 and tp8[0].step_time_s <= best * (1 + RANKING_ERROR)   # in the plan's tie band at the top
    assert tp8[0].step_time_s < plan(run.model, trays, training).candidates[0].step_time_s


def _emit(tmp_path, name: str, *flags: str) -> tuple[str, object]:
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "planner", *flags, "--cluster", "gb200-nvl72", "--precision", "fp8",
                        "--fp8-recipe", "mxfp8", "--zero", "1", "--emit", "megatron-lm", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return " ".join((out / "args.txt").read_text().split()), load_plan_yaml(out / "plan.yaml")


def test_nvl72_picks_tp8_over_two_trays_where_trays_alone_fit_nothing():
    """Llama 3 405B on 64 GB200 with a global batch of 8 (too few micro-batches for deep pipelines): the NVL72 plan's
    pick runs TP 8 over two trays; with 4-GPU trays as the only NVLink domains no layout passes the rules."""
    model = get_preset("llama3-405b")
    t = TrainingSpec(global_batch=8, seq_len=8192, precision="fp8", fp8_recipe="tensorwise", framework="megatron-lm",
                     zero_options=(1,))
    best = plan(model, preset_cluster("gb200-nvl72", gpus=64), t).candidates[0].candidate
    assert best.tp == 8 and best.tp > 4
    assert not plan(model, preset_cluster("gb200-nvl72", gpus=64, nvlink_domain=4), t, allow_empty=True).candidates


def test_emit_megatron_lm_writes_tp_and_ep_across_trays(tmp_path):
    # the plan's own pick: EP 8 over two trays (as NeMo ran Mixtral on GB200)
    args, setup = _emit(tmp_path, "moe", "--model", "mixtral-8x7b", "--gpus", "64", "--seq-len", "4096",
                        "--global-batch", "256")
    assert "--expert-model-parallel-size 8" in args and "--fp8-recipe mxfp8" in args
    assert setup.cluster.nvlink_domain == 72 and setup.candidate.ep == 8   # the domain round-trips through plan.yaml
    # TP 8 over two trays, pinned
    args, setup = _emit(tmp_path, "tp", "--model", "llama3-70b", "--gpus", "128", "--tp", "8", "--global-batch", "256")
    assert "--tensor-model-parallel-size 8" in args and setup.cluster.nvlink_domain == 64


# -- published GB200 rows -------------------------------------------------------------------------------------------
NEMO_GB200 = ["nemo_2504_gb200_gpt3_175b_tp4pp4vp12_128g", "nemo_2504_gb200_nemotron4_15b_dp64_64g",
              "nemo_2504_gb200_nemotron4_340b_tp8pp4vp12_128g", "nemo_2504_gb200_mixtral_8x7b_ep8_64g",
              "nemo_2507_gb200_llama4_scout_ep16_64g"]


def test_llama4_scout_ep16_over_four_trays_is_explained_by_the_domain_alone():
    """NeMo 25.07 DGX-GB200, Llama 4 Scout on 64 GPUs at EP16 (four trays): within 5% on NVL72, 0.63x over the NICs."""
    run = B.nemo_gb200_run("nemo_2507_gb200_llama4_scout_ep16_64g")
    trays = replace(run, cluster=preset_cluster("gb200-nvl72", gpus=64, nvlink_domain=4))
    assert _tps(run) / run.tokens_per_s_per_gpu == pytest.approx(1.0, abs=0.05)
    assert _tps(trays) / run.tokens_per_s_per_gpu < 0.7


def test_nemo_gb200_rows_within_20_percent_on_the_nvl72_preset():
    ratios = {rid: _tps(B.nemo_gb200_run(rid)) / B.nemo_gb200_run(rid).tokens_per_s_per_gpu for rid in NEMO_GB200}
    assert all(0.8 < x < 1.2 for x in ratios.values()), ratios
    assert 0.9 < math.exp(sum(map(math.log, ratios.values())) / len(ratios)) < 1.15, ratios


# -- block-scaled FP8 -----------------------------------------------------------------------------------------------
def test_block_scaled_cast_traffic_is_what_the_scaling_does():
    m = get_preset("llama3-8b")
    c = Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1)
    tokens = 8192
    norm_fed = tokens * 2 * m.hidden
    delayed = fp8.cast_traffic_bytes(m, c, "fp8", tokens)
    # Transformer Engine: the norm's bf16 round trip (UNFUSED for MX quantizers), E8M0 scales 1/32 on both copies
    te = fp8.cast_traffic_bytes(m, c, "fp8", tokens, "mxfp8", "megatron-lm") - delayed
    fc1, fc2 = moe.mlp_gemm_input_widths(m, c)
    elements = tokens * (m.hidden + m.q_dim + fc1 + fc2)   # the QKV, projection, FC1 and FC2 inputs
    assert te == pytest.approx(4 * norm_fed + 2 / 32 * elements)
    # DeepSeek-V3's 1x128 tiles with fp32 scales: 2 x 4/128 bytes an element
    bw = fp8.cast_traffic_bytes(m, c, "fp8", tokens, "blockwise", "megatron-lm") - delayed
    assert bw == pytest.approx(4 * norm_fed + 2 * 4 / 128 * elements)
    # torchao MXLinear: the dim1 cast reads the bf16 input again
    ao = fp8.cast_traffic_bytes(m, c, "fp8", tokens, "mxfp8", "fsdp") - delayed
    assert ao == pytest.approx(te + 2 * elements)


def test_torchao_b200_mxfp8_runs_slower_than_tensorwise_and_faster_than_bf16_as_measured():
    runs = {k: B.torchao_run(f"torchao_b200_llama3_8b_{k}_fsdp8")
            for k in ("bf16", "float8_tensorwise", "mxfp8_cublas")}
    pred = {k: _tps(r) for k, r in runs.items()}
    meas = {k: r.tokens_per_s_per_gpu for k, r in runs.items()}
    assert meas["mxfp8_cublas"] / meas["float8_tensorwise"] == pytest.approx(0.957, abs=0.001)
    # BLOCK_SCALED_GEMM_EFFICIENCY was fitted on this pair (planner.constants): the ratio within a point
    assert pred["mxfp8_cublas"] / pred["float8_tensorwise"] == pytest.approx(0.957, abs=0.01)
    assert pred["bf16"] < pred["mxfp8_cublas"] < pred["float8_tensorwise"]
    assert "torchao" in BY_NAME["BLOCK_SCALED_GEMM_EFFICIENCY"].fitted_on


def test_mxfp8_over_bf16_on_torchtitans_blackwell_rows_within_10_percent():
    """The check rows of BLOCK_SCALED_GEMM_EFFICIENCY: torchtitan nvfp4.md's MXFP8 / BF16 pairs (4 GPUs)."""
    for model in ("llama3_8b", "qwen3_8b"):
        mx, bf = (B.torchao_run(f"torchtitan_nvfp4doc_{model}_{k}_fsdp4") for k in ("mxfp8", "bf16"))
        pred, meas = _tps(mx) / _tps(bf), mx.tokens_per_s_per_gpu / bf.tokens_per_s_per_gpu
        assert pred > 1 and abs(pred / meas - 1) < 0.1, (model, pred, meas)


def test_megatron_block_scaled_recipes_cost_more_than_tensorwise_on_the_gpt3_row():
    run = B.nemo_gb200_run("nemo_2504_gb200_gpt3_175b_tp4pp4vp12_128g")
    t = {r: estimate(run.model, run.cluster, replace(run.training, fp8_recipe=r), run.cand).step_time_s
         for r in ("tensorwise", "mxfp8", "blockwise")}
    assert t["tensorwise"] < t["mxfp8"] <= t["blockwise"] < 1.1 * t["tensorwise"]


def test_mxfp8_needs_mx_tensor_cores_and_blockwise_is_transformer_engines():
    h100 = make_cluster(gpu="H100-SXM", gpus=8)
    m, c = get_preset("llama3-8b"), Candidate(tp=1, pp=1, dp=8, mbs=1, gas=1, zero=1)
    t = TrainingSpec(global_batch=8, seq_len=8192, precision="fp8", fp8_recipe="mxfp8", framework="megatron-lm")
    assert [r for r in fp8.violations(m, c, h100, t) if r[0] == "fp8_needs_hardware"]
    assert not fp8.violations(m, c, make_cluster(gpu="MI355X", gpus=8), t)
    assert not fp8.violations(m, c, h100, replace(t, fp8_recipe="blockwise"))
    with pytest.raises(Exception, match="blockwise is Transformer Engine"):
        TrainingSpec(global_batch=8, seq_len=8192, precision="fp8", fp8_recipe="blockwise", framework="fsdp")
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "llama3-8b", "--gpu", "H100", "--gpus", "8",
                        "--precision", "fp8", "--fp8-recipe", "mxfp8", "--framework", "megatron-lm"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no MX block scales" in r.stderr and "Traceback" not in r.stderr


def test_megatron_lm_knows_the_recipe_names_emitted(monkeypatch):
    """--fp8-recipe mxfp8 / blockwise are Megatron-Core's Fp8Recipe values (megatron/core/enums.py)."""
    import os

    src = os.environ.get("MEGATRON_LM_SRC")
    if not src or not (Path(src) / "megatron" / "core" / "enums.py").is_file():
        pytest.skip("MEGATRON_LM_SRC not set to a Megatron-LM checkout")
    text = (Path(src) / "megatron" / "core" / "enums.py").read_text()
    for recipe in ("mxfp8", "blockwise", "tensorwise", "delayed"):
        assert f'{recipe} = "{recipe}"' in text


def test_emit_fsdp_writes_torchaos_mx_converter_for_mxfp8(tmp_path):
    out = tmp_path / "tt"
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "8",
                        "--framework", "fsdp", "--precision", "fp8", "--fp8-recipe", "mxfp8", "--torch-compile",
                        "--emit", "fsdp", "--torchtitan-version", "0.2.2", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    toml = (out / "torchtitan.toml").read_text()
    assert 'converters = ["quantize.linear.mx"]' in toml and 'recipe_name = "mxfp8_cublas"' in toml
