"""Every second of a probe accounted: phases from rank 0's marks and the launcher's clock (probes.phases), GPU-hours
per phase and per probe (search.accounting), the `tune report` table and plot, tune's steps share.

    python -m pytest tests/test_accounting.py -q          # fast
"""

from __future__ import annotations

import json

import pytest

from probes.phases import MARKS_FILE, PhaseMarks, phases_of, read_marks
from search.accounting import format_phases, gpu_seconds, plot_phases, steps_line, steps_share
from search.objective import TrialRecord


def test_phases_sum_to_the_wall_time_and_stop_where_the_probe_was(tmp_path):
    marks = PhaseMarks(tmp_path)
    for name, at in (("start", 103.0), ("rendezvous", 104.0), ("build", 106.0), ("warmup", 107.5), ("steps", 112.5)):
        marks.mark(name, at)
    got = read_marks(tmp_path)
    assert json.loads((tmp_path / MARKS_FILE).read_text()) == got and len(got) == 5
    done = phases_of(got, spawned=100.0, stopped=113.0, ended=114.0, queue_s=7.0)
    assert done == pytest.approx({"queue": 7.0, "launch": 3.0, "rendezvous": 1.0, "build": 2.0, "warmup": 1.5,
                                  "steps": 5.0, "teardown": 1.5})
    assert sum(done.values()) == pytest.approx(7.0 + 114.0 - 100.0)
    # stopped (pruned) during the timed steps: steps up to the stop, the kill and exit are teardown
    cut = phases_of({k: v for k, v in got.items() if k != "steps"}, spawned=100.0, stopped=109.0, ended=109.5)
    assert cut == pytest.approx({"queue": 0.0, "launch": 3.0, "rendezvous": 1.0, "build": 2.0, "warmup": 1.5,
                                 "steps": 1.5, "teardown": 0.5})
    # killed before its own code ran (torch still importing): all launch
    assert phases_of({}, spawned=100.0, stopped=130.0, ended=131.0) == pytest.approx(
        {"queue": 0.0, "launch": 30.0, "teardown": 1.0})
    assert read_marks(tmp_path / "nowhere") == {}
    with pytest.raises(ValueError):
        marks.mark("lunch")


def rec(number, outcome, gpus, phases=None, wall=None, vpp=False):
    attrs = {"probe_wall_s": wall if wall is not None else sum((phases or {}).values()), "probe_gpus": gpus}
    if phases:
        attrs["phases"] = phases
    return TrialRecord(number=number, state="COMPLETE" if outcome == "ok" else "FAIL", params={},
                       config=f"tp={number},pp=1,dp=1,mbs=1,gas=8" + (",vpp=2" if vpp else ""), slot=None,
                       phase="sampler", outcome=outcome,
                       reason="", value=None, attrs=attrs)


def test_gpu_hours_per_phase_and_per_probe(tmp_path):
    records = [rec(0, "ok", 8, {"launch": 10.0, "build": 20.0, "warmup": 10.0, "steps": 50.0, "teardown": 10.0}),
               rec(1, "pruned", 4, {"launch": 10.0, "build": 20.0, "warmup": 10.0, "steps": 20.0, "teardown": 5.0}),
               rec(2, "ok", 2, None, wall=90.0)]                     # a backend without phases: all "other"
    secs = gpu_seconds(records)
    assert secs["steps"] == 8 * 50 + 4 * 20 and secs["launch"] == 8 * 10 + 4 * 10 and secs["other"] == 2 * 90
    text = format_phases(records)
    assert "GPU-hours by phase (3 probes" in text and "pruned" in text and "other" in text
    assert "tp=1,pp=1,dp=1,mbs=1,vpp=2" in format_phases([rec(1, "ok", 2, {"steps": 1.0}, vpp=True)])
    steps, share = steps_share(records, reservation_gpu_s=8 * 3600.0)
    assert steps == 480 and share == pytest.approx(480 / 28800)
    line = steps_line(records, reservation_gpu_s=8 * 3600.0, gpus=8, elapsed_s=3600.0)
    assert line.startswith("measured steps took 1.7% of the reservation")
    plot_phases(records, tmp_path / "p.png", study="s")
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert format_phases([]) == "GPU-hours by phase: no probe ran"


def test_budget_takes_a_duration_or_gpu_hours():
    import argparse

    from search.cli import build_run_parser, parse_budget

    assert parse_budget("40gpuh") == ("gpuh", 40.0) and parse_budget("2.5 GPUh") == ("gpuh", 2.5)
    assert parse_budget("1h30m") == ("wall", 5400.0)
    for bad in ("0gpuh", "40gpus", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_budget(bad)
    args = build_run_parser().parse_args(["--model", "1B3", "--gpus", "8", "--budget", "2h", "--budget", "40gpuh"])
    assert args.budget == 7200.0 and args.budget_gpuh == 40.0


def test_a_gpu_hours_budget_ends_the_study_with_its_best_so_far(tmp_path):
    from conftest import seed003_plan
    from test_pruning import Steps

    from search.objective import Objective, ProbeSettings
    from search.progress import Progress
    from search.report import best, summarize
    from search.settings import TuneSettings
    from search.space import SearchSpace
    from search.storage import open_study
    from search.study import gpu_hours_spent, run
    from search.objective import Ledger

    space = SearchSpace.from_plan(seed003_plan())
    budget = 1.0                          # GPU-hours: a fake probe holds 8 GPUs for 5 steps of 30-100 s
    settings = TuneSettings(study_name="g", storage_url=f"sqlite:///{tmp_path}/g.db", seed=0, budget_gpuh=budget)
    study = open_study(settings, space, {"test": "gpuh"})
    progress = Progress(total=len(space), budget_s=None, enabled=False)
    objective = Objective(space=space, backend=Steps(), settings=ProbeSettings(steps=5, prune=False))
    records = run(study, objective, space, settings, progress)
    probes = [r for r in records if r.counted]
    spent = gpu_hours_spent(Ledger.of(study), progress)
    assert 0 < len(probes) < len(space)                      # stopped early, by the budget
    assert spent >= budget and spent - budget < max(gpu_seconds([p])["steps"] for p in probes) / 3600 + 1e-9
    assert best(summarize(records)) is not None              # ... with its best so far
