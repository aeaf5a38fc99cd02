"""Two `tune` workers on one PostgreSQL study probe disjoint configurations (a real server, started here).

    python -m pytest tests/test_tune_postgres.py -q
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

from conftest import skip_missing_server
from pg import Unavailable, postgres_url

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
ARGS = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
        "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
        "--backend", "replay", "--results", str(DATA), "--results-table", "v100-32gb-recompute",
        "--replay-delay", "0.5", "--confirm-top", "2", "--repeats", "1", "--no-progress", "--study", "pg"]


@pytest.mark.slow
def test_two_workers_probe_disjoint_configurations():
    try:
        server = postgres_url()
        url = server.__enter__()
    except Unavailable as err:          # not installed; a server that fails to start fails the test (StartFailed)
        skip_missing_server(str(err))
    # what a user types (and --help shows): tune must pick the installed driver itself (SQLAlchemy 2.1 would
    # pick psycopg 3 for a bare postgresql://, which plantune[tune] does not install)
    user_url = url.replace("postgresql+psycopg2://", "postgresql://")
    assert user_url.startswith("postgresql://")
    try:
        workers = [subprocess.Popen([sys.executable, "-m", "search.cli", *ARGS, "--storage", user_url,
                                     "--seed", str(i)],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for i in range(2)]
        outs = [w.communicate(timeout=1800) for w in workers]   # a hang guard, no speed limit
        for w, (out, err) in zip(workers, outs):
            assert w.returncode == 0, err[-3000:]
        trials = optuna.load_study(study_name="pg", storage=url).trials
    finally:
        server.__exit__(None, None, None)
    probed = [t for t in trials if "probe_wall_s" in t.user_attrs]
    search = [t.user_attrs["config"] for t in probed if t.user_attrs["phase"] != "confirm"]
    confirm = [t.user_attrs["slot"] for t in probed if t.user_attrs["phase"] == "confirm"]
    assert len(search) == len(set(search)) == 10, Counter(search)
    assert len(confirm) == len(set(confirm)) == 2
    assert len({t.user_attrs["worker"] for t in probed}) == 2          # both workers probed
    for t in trials:
        if t.user_attrs.get("phase") == "pick":   # tune's pick: a trial of its own (search.study.record_pick)
            continue
        assert t.state.name in ("COMPLETE", "FAIL", "PRUNED") and t.user_attrs.get("outcome")
