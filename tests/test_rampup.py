"""Rampup: Megatron's divisibility rules in closed form, and seed 003's relaunch schedule row by row."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from planner.hardware import make_cluster
from planner.model import Rampup, get_preset
from planner.rampup import rampup_problems
from planner.rampup_schedule import plan_launches, rampup_schedule, relaunch_batches
from planner.rank import plan
from planner.space import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]


def brute_force_bad(rampup: Rampup, global_batch: int, unit: int) -> list[int]:
    return [b for b in list(range(rampup.start, global_batch, rampup.increment)) + [global_batch] if b % unit]


def test_closed_form_divisibility_matches_every_size():
    rng = random.Random(3)
    for _ in range(3000):
        start, inc = rng.randint(1, 300), rng.randint(1, 96)
        gbs = start + inc * rng.randint(1, 200)
        mbs, dp = rng.randint(1, 8), rng.randint(1, 64)
        r = Rampup(start=start, increment=inc, samples=1000)
        bad = brute_force_bad(r, gbs, mbs * dp)
        problems = rampup_problems(r, gbs, mbs, dp)
        assert bool(problems) == bool(bad), (start, inc, gbs, mbs, dp)
        if bad:
            assert f"batch size {bad[0]} of the rampup" in problems[-1]
            assert (f"({len(bad)} rampup sizes fail)" in problems[-1]) == (len(bad) > 1)


def test_seed003_bloom_rampup_example_rules():
    """MEGATRON_DEEPSPEED.md: BLOOM's 192 16 ... to 2048 runs at MBS 2 x DP 8 and crashes at DP 16."""
    r = Rampup(start=192, increment=16, samples=9_765_625)
    assert rampup_problems(r, 2048, mbs=2, dp=8) == []
    assert "batch size 208 of the rampup is not divisible by MBS*DP = 2*16 = 32" in rampup_problems(r, 2048, 2, 16)[0]


def test_huge_rampup_is_checked_without_listing_sizes():
    r = Rampup(start=1, increment=1, samples=100)
    problems = rampup_problems(r, 10**12, mbs=1, dp=8)
    assert "batch size 1 of the rampup" in problems[0] and f"({10**12 - 10**12 // 8} rampup sizes fail)" in problems[0]
    assert len(relaunch_batches(r, 10**12)) == 41   # 1, 2, 4, ..., 2**39, 10**12


def _rows(launches, replica, gpus_per_node):
    return [(launch.dp * replica // gpus_per_node, launch.batch, launch.mbs) for launch in launches]


def test_seed003_32gb_schedule_row_by_row():
    """Seed 003, 32GB V100 nodes (4 GPUs), best layout TP1 PP1 MBS1, rampup from 32:
    | NNODES | BS | MBS |: 8 32 1, 16 64 1, 32 128 1 (on 32 nodes, the rest of the ramp needs no relaunch)."""
    launches = plan_launches(Rampup(start=32, increment=32, samples=2_000_000), 512, replica_gpus=1, best_mbs=1,
                             gpus_per_node=4, max_gpus=32 * 4)
    assert _rows(launches, 1, 4) == [(8, 32, 1), (16, 64, 1), (32, 128, 1)]


def test_seed003_16gb_schedule_row_by_row():
    """Seed 003, 16GB V100 nodes, best layout TP1 PP2 MBS4 (a replica is 2 GPUs), rampup from 32:
    | NNODES | BS | MBS |: 16 32 1, 16 64 2, 16 128 4, 32 256 4, 64 512 4."""
    launches = plan_launches(Rampup(start=32, increment=32, samples=2_000_000), 512, replica_gpus=2, best_mbs=4,
                             gpus_per_node=4, max_gpus=64 * 4)
    assert _rows(launches, 2, 4) == [(16, 32, 1), (16, 64, 2), (16, 128, 4), (32, 256, 4), (64, 512, 4)]


def test_bloom_schedule_whole_nodes_few_launches_never_shrinks():
    """BLOOM on 48x8 A100: a handful of launches on whole nodes, one layout, GPU counts never fall (the ramp's
    start, 192, already feeds every replica of the plan's layout, so BigScience's one launch on 48 nodes)."""
    model = get_preset("176B")
    cluster = make_cluster(gpu="A100-80GB", gpus=384)
    training = TrainingSpec(global_batch=2048, seq_len=2048, precision="bf16", flash_attention=False)
    rows = rampup_schedule(plan(model, cluster, training, allow_empty=True), model.rampup)
    assert 1 <= len(rows) <= 6
    assert all(r.gpus % cluster.gpus_per_node == 0 for r in rows)
    assert [r.gpus for r in rows] == sorted(r.gpus for r in rows)
    assert len({(r.tp, r.pp, r.recompute, r.zero) for r in rows}) == 1
    assert rows[0].first_batch == 192 and rows[-1].last_batch == 2048
    for r in rows:   # every launch's own batch sizes obey megatron/microbatches.py
        assert r.first_batch % r.batch_multiple == 0


def test_small_cluster_schedule_grows_by_whole_nodes():
    """1.3B on 16x4 V100-16GB from batch 32 (seed 003's setting): several launches, whole nodes, never fewer GPUs."""
    model = get_preset("1B3")
    cluster = make_cluster(gpu="V100-16GB", gpus=64, gpus_per_node=4)
    training = TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", flash_attention=False,
                            recompute_options=("full",))
    rows = rampup_schedule(plan(model, cluster, training, allow_empty=True), Rampup(start=32, increment=32,
                                                                                     samples=2_000_000))
    assert 1 <= len(rows) <= 5 and rows[0].first_batch == 32 and rows[-1].last_batch == 512
    assert all(r.gpus % 4 == 0 for r in rows) and [r.gpus for r in rows] == sorted(r.gpus for r in rows)
    assert all(b.first_batch == a.last_batch + 32 for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize("gbs", ["20000000", str(10**12)])
def test_cli_huge_global_batch_with_rampup_answers(gbs):
    """--global-batch 20000000 (or 10**12) --rampup 1 1 100: no scan of every rampup size, no MemoryError."""
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "--model", "1B3", "--gpus", "16", "--global-batch", gbs,
                           "--rampup", "1", "1", "100", "--rampup-schedule", "--format", "json", "--top", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    if proc.returncode == 0:
        rows = json.loads(proc.stdout).get("rampup_schedule") or []
        assert len(rows) <= 45


@pytest.mark.parametrize("model_name, gpus, gpu, framework, rampup, gbs", [
    ("176B", 384, "A100-80GB", "megatron-deepspeed", Rampup(start=192, increment=16, samples=9_765_625), 2048),
    ("176B", 384, "A100-80GB", "megatron-deepspeed", Rampup(start=32, increment=32, samples=6_000_000), 2048),
    # a ramp that rules out DP 8 (steps of 4): the rampup-free best is a candidate this plan prunes for the rampup
    ("176B", 384, "A100-80GB", "megatron-deepspeed", Rampup(start=12, increment=4, samples=6_000_000), 2048),
    ("1B3", 16, "V100-32GB", "megatron-deepspeed", Rampup(start=16, increment=16, samples=100_000), 512),
    ("llama3-8b", 64, "H100-SXM", "megatron-lm", Rampup(start=24, increment=24, samples=100_000), 504),
])
def test_free_best_is_the_rampup_free_plans_best(model_name, gpus, gpu, framework, rampup, gbs):
    """`plan(..., free_best=True)` finds in one pass what a second plan without the rampup rule ranks first (the
    rampup schedule's layout), and its own ranking and pruned counts are those of the plan without the flag."""
    from dataclasses import replace

    model = get_preset(model_name)
    cluster = make_cluster(gpu=gpu, gpus=gpus, gpus_per_node=4 if gpu.startswith("V100") else 8)
    training = TrainingSpec(global_batch=gbs, seq_len=2048, precision="fp16" if gpu.startswith("V100") else "bf16",
                            framework=framework, rampup=rampup,
                            flash_attention=framework != "megatron-deepspeed")
    one = plan(model, cluster, training, allow_empty=True, free_best=True)
    plain = plan(model, cluster, training, allow_empty=True)
    free = plan(model, cluster, replace(training, rampup=None), allow_empty=True)
    assert one.pruned == plain.pruned and one.total == plain.total
    assert [e.candidate for e in one.candidates] == [e.candidate for e in plain.candidates]
    assert one.free_best is not None and free.candidates
    assert one.free_best.candidate == free.best.candidate
    assert one.free_best.step_time_s == free.best.step_time_s
    assert plain.free_best is None
