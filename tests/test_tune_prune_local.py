"""Pruning and phase accounting with real probes on CPU (torchrun, 2 gloo processes, a tiny GPT), issue 30.

    flock /tmp/plantune-slow.lock python -m pytest -q -m slow tests/test_tune_prune_local.py     # ~2 minutes, 2 cores

The study of tests/test_tune_local.py with TP pinned to 1 (`--tp 1`): its 9 PP/DP layouts of 2 processes x MBS
1/2/4 (VPP 1/2 under PP), the many-micro-batch ones far behind on a tiny model; run twice: pruning off, then on.
The TP layouts stay out: on CPU each costs ~5 s of DTensor CPU time a probe (against ~1 s for these), for a
pruning decision the others show as well (tests/test_tune_local.py still probes them).
"""

from __future__ import annotations

import json
import subprocess

import optuna
import pytest
from test_tune_local import HANG_S, ROOT, tiny_argv


def _run(tmp, name, *extra):
    argv = tiny_argv(tmp, "--tp", "1", "--probe-steps", "6", "--probe-warmup", "1", "--confirm-top", "1",
                     "--repeats", "1", "--format", "json", *extra)
    argv[argv.index("--storage") + 1] = f"sqlite:///{tmp}/{name}.db"
    argv[argv.index("--workdir") + 1] = str(tmp / name)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = optuna.load_study(study_name="cpu", storage=f"sqlite:///{tmp}/{name}.db").trials
    probes = [t for t in trials if t.user_attrs.get("phase") != "pick"]   # tune's pick is a trial of its own
    assert len(probes) == len(trials) - 1
    return json.loads(done.stdout), probes, done.stderr


@pytest.mark.slow
def test_cpu_probes_prune_the_slow_ones_find_the_same_best_and_account_every_second(tmp_path):
    off, trials_off, _ = _run(tmp_path, "off", "--no-prune")
    on, trials_on, err = _run(tmp_path, "on")
    assert len({t.user_attrs["config"] for t in trials_on}) >= 6
    pruned = [t for t in trials_on if t.state.name == "PRUNED"]
    assert len(pruned) >= 2, [(t.user_attrs.get("config"), t.user_attrs.get("outcome")) for t in trials_on]
    for t in pruned:
        ua = t.user_attrs
        assert ua["outcome"] == "pruned" and "behind the best so far" in ua["reason"]
        assert 1 <= ua["pruned_steps"] < 6 and len(t.intermediate_values) >= ua["pruned_steps"]
    assert not [t for t in trials_off if t.state.name == "PRUNED"]
    # pruning's pick is one the study without pruning measured among its faster half: two 6-step CPU probes of one
    # configuration land far apart on a 2-core machine (24% between two studies' picks, measured), so "the same best"
    # is the noise's to decide here (issue 30 stays open on it); a pick pruning got badly wrong would fail this
    off_median = {c["config"]: c["median_tflops"] for c in off["configs"] if c.get("median_tflops")}
    ranked = sorted(off_median.values(), reverse=True)
    assert off_median[on["best"]["config"]] >= ranked[len(ranked) // 2]
    # every probe's seconds by phase, summing to its wall time; timed steps in every measured one
    for t in trials_on:
        ua = t.user_attrs
        if "probe_wall_s" not in ua or ua.get("outcome") == "invalid":
            continue
        phases = ua["phases"]
        assert set(phases) <= {"queue", "launch", "rendezvous", "build", "warmup", "steps", "teardown"}
        assert sum(phases.values()) == pytest.approx(ua["probe_wall_s"], rel=0.1, abs=1.0)
        assert phases.get("steps", 0) > 0 and ua["probe_gpus"] == 2
    steps_off = sum(t.user_attrs.get("phases", {}).get("steps", 0) for t in trials_off)
    steps_on = sum(t.user_attrs.get("phases", {}).get("steps", 0) for t in trials_on)
    assert steps_on < steps_off
    assert "measured steps took" in err and "of the reservation" in err
    report = subprocess.run([*tiny_argv(tmp_path)[:3], "report", "--study", "cpu", "--workdir", str(tmp_path / "on"),
                             "--storage", f"sqlite:///{tmp_path}/on.db"], cwd=ROOT, capture_output=True, text=True,
                            timeout=HANG_S)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "GPU-hours by phase" in report.stdout and "steps" in report.stdout
    assert (tmp_path / "on" / "report" / "gpu_hours_by_phase.png").is_file()
