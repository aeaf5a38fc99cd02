"""search.published_runs is the one home of "a published dev row -> planner inputs and outcome": the replay
tables (tune --results), the validation cases (tests/published.py) and the memory cases (tests/memory_cases.py)
all plan a row the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_cases import bigscience_cases, hagemann_cases
from published import dev_cases

from search.published_runs import HAGEMANN_GBPS, JZ_A100_GBPS, read_runs
from search.published_tables import read_tables

DATA = Path(__file__).resolve().parent / "data"


def _gbps(cluster) -> float:
    return cluster.inter_node_bw_bytes_per_s * 8 / 1e9


def test_hagemann_rows_are_planned_alike_everywhere():
    dev = {c.id: c for c in dev_cases() if c.id.startswith("hagemann_")}
    mem = {c.id: c for c in hagemann_cases()}
    assert len(dev) == len(mem) == 422
    for cid, d in dev.items():
        m = mem[cid]
        assert (d.model, d.cluster, d.training, d.cand, d.fused_norm) == (m.model, m.cluster, m.training, m.cand,
                                                                         m.fused_norm), cid
    c = dev["hagemann_132173"]            # the sheet's first row: TP2 PP2 DP16 MBS8, flash_attention2 + RMS kernel
    t = c.training
    assert (t.framework, t.flavor, t.precision, t.global_batch, t.flash_attention) == \
        ("megatron-deepspeed", "microsoft", "bf16", 2048, True)
    assert c.cand.zero == 1 and c.fused_norm and _gbps(c.cluster) == HAGEMANN_GBPS == 1600
    tables = read_tables(str(DATA / "hagemann_13b_dev.yaml"))
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
    replayed = {r.tp * 10**6 + r.pp * 10**3 + r.mbs for t in read_tables(str(DATA / "published_dev.yaml"))
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
    r = next(r for r in read_runs(DATA / "published_dev.yaml") if r.cand.recompute == recompute)
    assert r.time_candidate() == r.cand