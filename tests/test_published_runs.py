"""search.published_runs is the one home of "a published dev row -> planner inputs and outcome": the replay
tables (tune --results), the validation cases (tests/published.py) and the memory cases (tests/memory_cases.py)
all plan a row the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_cases import bigscience_cases, hagemann_cases
from published import dev_cases, runs_of, tables_of

from search.published_runs import HAGEMANN_GBPS, JZ_A100_GBPS, read_runs
from planner.rank import estimate

DATA = Path(__file__).resolve().parent / "data"


def _gbps(cluster) -> float:
    return cluster.inter_node_bw_bytes_per_s * 8 / 1e9


def test_hagemann_rows_are_planned_alike_everywhere():
    dev = {c.id: c for c in dev_cases() if c.id.startswith("hagemann_")}
    mem = {c.id: c for c in hagemann_cases()}
    assert len(dev) == len(mem) == 422
    for cid, d in dev.items():
        m = mem[cid]
        assert (d.model, d.cluster, d.training, d.cand) == (m.model, m.cluster, m.training, m.cand), cid
    c = dev["hagemann_132173"]            # the sheet's first row: TP2 PP2 DP16 MBS8, flash_attention2 + RMS kernel
    t = c.training
    assert (t.framework, t.flavor, t.precision, t.global_batch, t.flash_attention) == \
        ("megatron-deepspeed", "microsoft", "bf16", 2048, True)
    assert c.cand.zero == 1 and t.fused_norm and _gbps(c.cluster) == HAGEMANN_GBPS == 1600
    tables = tables_of("hagemann_13b_dev.yaml")
    assert sum(len(t.table.rows) for t in tables) == 422
    for t in tables:
        assert (t.training.framework, t.training.flavor, _gbps(t.cluster)) == ("megatron-deepspeed", "microsoft",
                                                                                HAGEMANN_GBPS)


def test_tr11_rows_are_planned_alike_everywhere():
    dev = {c.id: c for c in dev_cases() if c.table.startswith("bloom tr11")}
    mem = {c.id: c for c in bigscience_cases() if c.table.startswith("bloom")}
    assert dev.keys() == mem.keys() and len(dev) == 60
    for cid, d in dev.items():
        assert (d.model, d.cluster, d.training, d.cand) == (mem[cid].model, mem[cid].cluster, mem[cid].training,
                                                            mem[cid].cand), cid
        assert _gbps(d.cluster) == JZ_A100_GBPS == 400 and d.model.position == "alibi"
    one_node = [d for d in dev.values() if d.cluster.world_size == 8]
    assert one_node and all(d.training.global_batch == 512 for d in one_node)    # the heading's GBS, not 2048
    replayed = {r.tp * 10**6 + r.pp * 10**3 + r.mbs for t in tables_of("published_dev.yaml")
                for r in t.table.rows}
    assert replayed <= {d.cand.tp * 10**6 + d.cand.pp * 10**3 + d.cand.mbs for d in dev.values()}


def test_flagged_rows_are_left_out_or_kept_apart():
    runs = read_runs(DATA / "published_dev.yaml")
    ids = {r.id for r in runs}
    assert not any("INVALID" in i for i in ids)                         # tr8's FFN-misconfigured table
    assert "bigsci_tr8_104b_a100_16nodes_tp4_pp32" not in ids          # a range, not a figure
    flagged = {r.id: r.caveat for r in runs if r.caveat}
    assert "different code branches" in flagged["bloom_prequel_L670_n48_tp8_pp12_dp4_mbs2_h64_gbs2048"]
    assert next(r for r in runs if r.id.startswith("bloom_prequel_L648")).cand.dp == 4   # its DP=8 typo


@pytest.mark.parametrize("recompute", ["selective-op", "selective-layer", "full"])
def test_time_candidate_is_the_run_as_recorded(recompute):
    """The time model costs every recompute mode (planner.recompute), torchtitan's included."""
    r = next(r for r in runs_of("published_dev.yaml") if r.cand.recompute == recompute)
    assert r.time_candidate() == r.cand


def test_modern_dev_runs_load_with_their_stated_assumptions():
    """published_modern_dev.yaml (copy in tests/data): 44 of its 50 rows carry an architecture and a throughput."""
    from search.published_runs import modern_runs, read_rows

    runs = modern_runs(read_rows(DATA / "published_modern_dev.yaml"))
    assert len(runs) == 44
    by_id = {r.id: r for r in runs}
    assert by_id["megascale_table2_175b_megatron_256gpus_gbs768"].training.overlap == ()
    assert by_id["megascale_table2_175b_megascale_256gpus_gbs768"].training.overlap == (
        "grad-reduce", "param-gather", "tp-comm", "p2p")
    titan = by_id["torchtitan_2024_12_t1_llama31_8b_8gpus_fsdp"]
    assert (titan.training.framework, titan.cand.zero, titan.cand.recompute) == ("fsdp", 3, "selective-op")
    mtnlg = by_id["mtnlg530b_2240gpus"]   # seconds per iteration -> tokens/s per GPU
    assert mtnlg.tokens_per_s_per_gpu == pytest.approx(1920 * 2048 / 60.1 / 2240)


def test_overlap_is_what_separates_megascale_from_its_megatron_baseline():
    """MegaScale 2024 Table 2: the same layouts, Megatron baseline vs MegaScale (which overlaps TP, PP and DP
    communication, its Table 3): with the overlaps as terms the planner's error on the table is below the floor
    of one constant MFU for the table, and it ranks MegaScale's runs above the baseline's."""
    import statistics

    from search.published_runs import modern_runs, read_rows

    runs = [r for r in modern_runs(read_rows(DATA / "published_modern_dev.yaml"))
            if r.table.startswith("MegaScale")]
    pred = {r.id: estimate(r.model, r.cluster, r.training, r.cand).throughput.tokens_per_s / r.cand.world
            for r in runs}
    err = statistics.fmean(abs(pred[r.id] / r.tokens_per_s_per_gpu - 1) for r in runs)
    level = statistics.geometric_mean(r.tokens_per_s_per_gpu for r in runs)   # one constant (same model and peak)
    floor = statistics.fmean(abs(level / r.tokens_per_s_per_gpu - 1) for r in runs)
    assert err < floor
    for r in runs:
        if "_megascale_" in r.id:
            baseline = r.id.replace("_megascale_", "_megatron_")
            assert pred[r.id] > pred[baseline]


def test_deepspeed_runs_are_read_as_the_engine_that_ran_them():
    """DeepSpeed's autotuning examples ran Hugging Face GPT-2 under DeepSpeed's own engine at ZeRO 1 (its README's
    "Zero1" / "z = 1"), Narayanan 2021's ZeRO-3 rows Megatron's layers under DeepSpeed's engine without a pipeline
    (the microsoft fork at PP 1): both read as such, and neither is ruled out by a framework rule."""
    rows = {c.id: c for c in dev_cases()}
    hf = [c for c in rows.values() if c.id.startswith("ds_autotuning") and "baseline" not in c.id]
    assert len(hf) == 8 and {(c.training.framework, c.cand.zero) for c in hf} == {("deepspeed", 1)}
    assert {c.training.framework for c in rows.values() if "baseline_hf_ddp" in c.id} == {"fsdp"}
    zero3 = [c for c in rows.values() if c.id.startswith("megatron2021_table2_zero3")]
    assert len(zero3) == 3 and {(c.training.framework, c.training.flavor, c.cand.zero, c.cand.pp)
                                for c in zero3} == {("megatron-deepspeed", "microsoft", 3, 1)}
    for c in hf + zero3:
        assert estimate(c.model, c.cluster, c.training, c.cand).fits, c.id


def test_gpt2_xl_hand_tuned_and_autotuned_are_one_layout():
    """GPT2-xl: hand-tuned "Zero1 (27.462, gas = 1, mbs = 1)", autotuned "Zero1 (27.497, gas = 1, mbs = 1)"
    (DeepSpeedExamples autotuning/hf/gpt2-xl/README.md): one layout, 0.1% apart measured, one prediction."""
    rows = {c.id: c for c in dev_cases()}
    hand, auto = rows["ds_autotuning_gpt2_xl_hf_ds_handtuned"], rows["ds_autotuning_gpt2_xl_hf_ds_autotuned"]
    assert hand.cand == auto.cand and hand.cand.zero == 1
    assert hand.tokens_per_s_per_gpu == pytest.approx(27.462 * 1024 / 16)
    assert auto.tokens_per_s_per_gpu / hand.tokens_per_s_per_gpu == pytest.approx(1.0, abs=0.002)
    assert estimate(hand.model, hand.cluster, hand.training, hand.cand).step_time_s == \
        estimate(auto.model, auto.cluster, auto.training, auto.cand).step_time_s
