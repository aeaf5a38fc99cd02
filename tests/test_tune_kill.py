"""SIGKILL the tuner mid-study, rerun: no finished trial lost, the killed one retried (heartbeat).

    python -m pytest tests/test_tune_kill.py -q
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"


def argv(storage: str) -> list[str]:
    return [sys.executable, "-m", "search.cli", "--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8",
            "--gpus-per-node", "4", "--global-batch", "512", "--seq-len", "2048", "--precision", "fp16",
            "--recompute", "full", "--zero", "1", "--no-rampup", "--backend", "replay", "--results", str(DATA),
            "--results-table", "v100-32gb-recompute", "--replay-delay", "2.0", "--confirm-top", "0",
            "--heartbeat-s", "1", "--grace-s", "2", "--study", "kill", "--storage", storage, "--no-progress"]


@pytest.mark.slow
def test_sigkill_then_rerun_keeps_finished_and_retries_the_killed_trial(tmp_path):
    storage = f"sqlite:///{tmp_path}/tune.db"
    proc = subprocess.Popen(argv(storage), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="kill", storage=storage).trials
        except (KeyError, ValueError):
            continue
        done = [t for t in trials if t.state.name == "COMPLETE"]
        # a probe that started less than a second ago (of 2 s): still running when the kill lands
        running = [t for t in trials if t.state.name == "RUNNING" and "config" in t.user_attrs
                   and (datetime.now() - t.datetime_start).total_seconds() < 1.0]
        if len(done) >= 3 and running:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = optuna.load_study(study_name="kill", storage=storage).trials
    finished = {t.number: (t.user_attrs["config"], t.value) for t in before if t.state.name == "COMPLETE"}
    killed = [t for t in before if t.state.name == "RUNNING"]
    assert len(finished) >= 3 and len(killed) == 1
    time.sleep(3.0)                                             # past the grace period

    rerun = subprocess.run(argv(storage), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = optuna.load_study(study_name="kill", storage=storage).trials
    for number, (config, value) in finished.items():
        assert after[number].state.name == "COMPLETE" and after[number].value == value
        assert after[number].user_attrs["config"] == config
    assert after[killed[0].number].state.name == "FAIL"
    retried = [t for t in after if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].user_attrs["phase"] == "retry"
    configs = [t.user_attrs["config"] for t in after if t.state.name == "COMPLETE"]
    assert len(configs) == len(set(configs)) == 10            # every configuration once, none lost or repeated
