"""`tune` command line: one-line errors with exit 2, report (table, JSON, plots), calibrate passthrough,
and lazy imports.

    python -m pytest tests/test_tune_cli.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from search.cli import main, parse_duration

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
REPLAY = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
          "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
          "--backend", "replay", "--results", str(DATA), "--results-table", "v100-32gb-recompute", "--no-progress"]


@pytest.mark.parametrize("text, seconds", [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("600", 600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("argv, needle", [
    (["--model", "nope", "--gpus", "8"], "unknown model"),
    (["--model", "1B3", "--gpus", "12"], "not a multiple of the node size"),
    (["--model", "1B3", "--gpus", "8", "--budget", "soon"], "not a duration"),
    (["--model", "1B3", "--gpus", "8", "--backend", "replay"], "--results"),
    (["--model", "1B3", "--gpus", "8", "--storage", "tune.db"], "not a database URL"),
    (["--model", "1B3", "--gpus", "8", "--probe", "megatron"], "--command"),
    (["--gpus", "8"], "--model"),
    (["report"], "--study"),
    (["report", "--study", "missing", "--storage", "sqlite:///{tmp}/none.db"], "no study 'missing'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0]


def test_help_exits_0():
    assert subprocess.run([sys.executable, "-m", "search.cli", "--help"], cwd=ROOT, capture_output=True).returncode == 0
    assert subprocess.run([sys.executable, "-m", "search.cli", "report", "--help"], cwd=ROOT,
                          capture_output=True).returncode == 0


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_report_table_json_and_plots(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    assert main([*REPLAY, "--study", "r", "--storage", storage, "--max-probes", "5", "--confirm-top", "1",
                 "--repeats", "1"]) == 0
    run_out = capsys.readouterr()
    assert "measured TFLOPs" in run_out.out and "pred before" in run_out.out and "pred after" in run_out.out
    assert f"optuna-dashboard {storage}" in run_out.err
    plots = tmp_path / "plots"
    assert main(["report", "--study", "r", "--storage", storage, "--plots", str(plots), "--trials"]) == 0
    rep = capsys.readouterr()
    assert "tp=1,pp=1,dp=8,mbs=" in rep.out and f"optuna-dashboard {storage}" in rep.err
    assert "tune: best tp=" in rep.out and "model TFLOPs/GPU measured" in rep.out      # report names the best too
    assert "analytic" in rep.out and "confirm" in rep.out              # the per-trial table
    for name in ("fastest.png", "predicted_vs_measured.png", "probe_cost.png", "tflops_by_layout.png", "history.png"):
        assert (plots / name).stat().st_size > 5000
    assert main(["report", "--study", "r", "--storage", storage, "--format", "json", "--no-plots"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["n_measurements"] == 2 and d["dashboard"] == f"optuna-dashboard {storage}"
    first = d["configs"][0]
    assert {"pred_analytic_tflops", "pred_before_tflops", "pred_after_tflops", "median_tflops", "spread"} <= set(first)


def test_calibrate_passes_arguments_through(capsys):
    assert main(["calibrate", "--help"]) == 0
    assert "--nproc-per-node" in capsys.readouterr().out
    assert main(["calibrate", "--nproc-per-node", "2"]) == 2        # --out is required by probes.calibrate


def test_no_optuna_or_torch_on_import():
    code = ("import sys, search, search.cli, search.space, search.calibration, search.replay, search.report; "
            "bad = [m for m in ('optuna', 'torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plan_and_tune_define_their_shared_flags_once():
    """Every flag `tune` takes from the planner reads the same in `tune --help` as in `plan --help` (one definition:
    planner.cli.add_setup_arguments); --memory-fraction is advisory in both."""
    import argparse

    from planner.cli import add_setup_arguments, build_parser
    from search.cli import build_run_parser

    setup = argparse.ArgumentParser(add_help=False)
    add_setup_arguments(setup)
    plan_help = {a.dest: a.help for a in build_parser()._actions if a.option_strings}
    tune_help = {a.dest: a.help for a in build_run_parser()._actions if a.option_strings}
    shared = {a.dest for a in setup._actions} & set(plan_help) & set(tune_help)
    assert {"memory_fraction", "optimizer", "framework", "calibration"} <= shared
    assert {d: (plan_help[d], tune_help[d]) for d in shared if plan_help[d] != tune_help[d]} == {}
    assert "advisory" in tune_help["memory_fraction"]
