"""The planner against seed 003's measured 1.3B V100 tables (tests/data/bigscience_1b3_v100.csv).

Setting: BigScience tr3m-1B3 on 2 nodes x 4 V100 (examples/cluster-2x4-v100-*.yaml), fp16,
Megatron-DeepSpeed with ZeRO-1 where DP > 1, GBS 512, seq 2048, no FlashAttention.

Which GPU the "memory" column measured is not stated; it is the first pipeline stage's (GPU 0): at
PP=2 the table shows 15 GB at MBS 8 yet OOM at MBS 16 on 32 GB, which only the last stage's logits
explain. So measured memory is compared with the first stage as nvidia-smi reads it (planner.memory.reported_bytes:
the allocator's reserve, context and NCCL beside the live bytes), OOM rows with the busiest stage's total.

Known gap (asserted below, see README "Validation"): with TP=2 the fork's activation memory barely
shrank (21 GB vs 27 GB at TP=1 without recompute), where Korthikanti et al.'s formula, which the
planner uses, halves most of it.
"""

from __future__ import annotations

import pytest
from published import SEED003_TRAINING as TRAINING
from published import seed003_case, seed003_rows

from planner.memory import reported_bytes, stage_memory
from planner.model import get_preset
from planner.rank import estimate

KNOWN_MEMORY_GAP = {("v100-32gb-no-recompute", 2, 1, 1)}   # (table, tp, pp, mbs)


def _case(row: dict):
    _, cluster, _, cand = seed003_case(row)
    return cluster, cand


def test_predicted_memory_within_20_percent():
    model = get_preset("1B3")
    checked = 0
    for row in seed003_rows():
        if row["status"] != "ok":
            continue
        cluster, cand = _case(row)
        first = stage_memory(model, cand, cluster, TRAINING)[0]
        measured = float(row["memory_gb"])
        ratio = reported_bytes(first, cand, cluster, "nvidia-smi") / 2**30 / measured
        key = (row["table"], cand.tp, cand.pp, cand.mbs)
        if key in KNOWN_MEMORY_GAP:
            assert 0.7 < ratio < 0.8, f"{key}: known gap moved ({ratio:.2f})"
            continue
        assert 0.8 <= ratio <= 1.2, f"{row['table']} {cand.label()}: predicted {ratio:.2f} x measured"
        checked += 1
    assert checked == 22


def test_oom_rows_predicted_not_to_fit():
    model = get_preset("1B3")
    ooms = [r for r in seed003_rows() if r["status"] == "oom"]
    assert len(ooms) == 4
    for row in ooms:
        cluster, cand = _case(row)
        est = estimate(model, cluster, TRAINING, cand)
        usable = (1 - TRAINING.memory_headroom) * cluster.gpu.memory_bytes
        assert not est.fits or est.memory.total_bytes >= 0.95 * usable, f"{row['table']} {cand.label()}"


def test_ok_rows_predicted_to_fit():
    model = get_preset("1B3")
    for row in seed003_rows():
        if row["status"] == "ok" and (row["table"], int(row["tp"]), int(row["pp"]), int(row["micro_batch"])) \
                not in KNOWN_MEMORY_GAP:
            cluster, cand = _case(row)
            assert estimate(model, cluster, TRAINING, cand).fits, f"{row['table']} {cand.label()}"


def test_predicted_tflops_within_20_percent():
    model = get_preset("1B3")
    for row in seed003_rows():
        if row["status"] != "ok":
            continue
        cluster, cand = _case(row)
        est = estimate(model, cluster, TRAINING, cand)
        # the table's TFLOPs are seed 001's formula with factor 4 under recompute, 3 without: compare like for like
        predicted = est.throughput.hardware_tflops_per_gpu * float(row["seconds_per_iteration"]) / est.step_time_s
        ratio = float(row["seconds_per_iteration"]) / est.step_time_s
        assert 0.8 <= ratio <= 1.2, f"{row['table']} {cand.label()}: predicted/measured TFLOPs {ratio:.2f}"
        assert predicted > 0


@pytest.mark.parametrize("table,best", [("v100-32gb-recompute", {(1, 1, 4), (1, 1, 8)}),
                                        ("v100-32gb-no-recompute", {(1, 1, 1), (1, 2, 1)})])
def test_measured_fastest_ranked_first(table, best):
    """Among a table's configurations that the planner lets through, its top pick is a measured-fastest one."""
    model = get_preset("1B3")
    scored = []
    for row in seed003_rows():
        if row["table"] != table or row["status"] != "ok":
            continue
        cluster, cand = _case(row)
        est = estimate(model, cluster, TRAINING, cand)
        if est.fits:
            scored.append((est.step_time_s, (cand.tp, cand.pp, cand.mbs)))
    assert min(scored)[1] in best


def test_16gb_table_conclusion_pp2_mbs4():
    """Seed 003's 16GB conclusion is PP=2, MBS=4 (28 s), against PP=1, MBS=1 at 29 s ("borderline OOM").

    The planner ranks PP=2 MBS=4 first among the configurations with room to spare, and within 5%
    of its top pick overall: the one-second gap of the measurement is inside the model's accuracy.
    """
    model = get_preset("1B3")
    scored = {}
    for row in seed003_rows():
        if row["table"] != "v100-16gb-recompute" or row["status"] != "ok":
            continue
        cluster, cand = _case(row)
        est = estimate(model, cluster, TRAINING, cand)
        if est.fits:
            scored[(cand.tp, cand.pp, cand.mbs)] = est
    top = min(scored.values(), key=lambda e: e.step_time_s)
    assert scored[(1, 2, 4)].step_time_s <= 1.05 * top.step_time_s
    pp2_and_up = {k: e for k, e in scored.items() if k[1] >= 2}
    assert min(pp2_and_up, key=lambda k: pp2_and_up[k].step_time_s) == (1, 2, 4)
