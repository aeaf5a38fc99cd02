"""The development split (tests/data/published_dev.yaml, hagemann_13b_dev.yaml) as planner inputs,
and the accuracy tests/bench/validate.py reports on it."""

from __future__ import annotations

import sys
from pathlib import Path

from published import dev_cases, seed003_dev_cases

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))


def test_every_dev_case_fills_its_cluster():
    cases = dev_cases()
    assert len(cases) >= 500
    for c in cases:
        assert c.cand.world == c.cluster.world_size, c.id
        assert c.cand.global_batch <= c.training.global_batch, c.id
        assert c.tokens_per_s_per_gpu or c.oom, c.id


def test_bloom_tables_carry_the_jean_zay_network():
    bloom = [c for c in dev_cases() if c.table.startswith("bloom")]
    assert len(bloom) == 60
    assert {c.cluster.inter_node_bw_bytes_per_s * 8 / 1e9 for c in bloom} == {400.0}


def test_seed003_cases_have_the_csv_rows():
    assert len(seed003_dev_cases()) == 27
