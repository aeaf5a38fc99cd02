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


def test_dev_accuracy_holds_the_readme_figures():
    """The throughput half of tests/bench/validate.py's summary, as README claims it."""
    from validate import evaluate, shape_regrets

    s = evaluate()
    assert s.table_mape <= 0.16                  # README: mean of the tables' errors 14.8%
    assert s.table_mape < s.table_floor_mape     # and well under the constant-fraction floor (39.3%)
    assert s.median_spearman >= 0.85             # README: 0.87
    assert s.mean_regret <= 0.02 and s.max_regret <= 0.08
    shapes = shape_regrets(s)
    assert sum(v <= 0.05 for v in shapes.values()) >= len(shapes) - 1   # README: 8 of 9 BLOOM tr11 shapes
    ds = s.by_framework
    assert 0.85 <= ds["DeepSpeed ZeRO-3"][0] <= 1.15 and 0.9 <= ds["Megatron-DeepSpeed"][0] <= 1.15
