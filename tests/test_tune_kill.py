"""SIGKILL the tuner mid-study, rerun at once: no finished trial lost, the killed one probed again before any
result is printed, without waiting for the heartbeat's grace period (the dead tuner's pid says it is lost).

    python -m pytest tests/test_tune_kill.py -q
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import study_trials

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
HANG_S = 1800
"""a run that has not ended after this long hangs (these take seconds); no speed limit"""


def argv(storage: str, delay_s: float = 2.0) -> list[str]:
    # --grace-s 3600: were the killed trial left to the heartbeat, the rerun would wait an hour (and hit HANG_S)
    # delay_s: each replayed probe takes that long, so the poller below finds one running to kill; the rerun, which
    # nothing interrupts, replays without it (the delay is no setting of the study's: the rerun resumes it as is)
    return [sys.executable, "-m", "search.cli", "--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8",
            "--gpus-per-node", "4", "--global-batch", "512", "--seq-len", "2048", "--precision", "fp16",
            "--recompute", "full", "--zero", "1", "--no-rampup", "--backend", "replay", "--results", str(DATA),
            "--results-table", "v100-32gb-recompute", "--replay-delay", str(delay_s), "--confirm-top", "0",
            "--heartbeat-s", "1", "--grace-s", "3600", "--study", "kill", "--storage", storage, "--no-progress"]


@pytest.mark.slow
def test_sigkill_then_rerun_keeps_finished_and_reprobes_the_killed_trial(tmp_path):
    storage = f"sqlite:///{tmp_path}/tune.db"
    proc = subprocess.Popen(argv(storage), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:               # the event: 3 finished, one probing (it takes 2 s)
        time.sleep(0.2)
        trials = study_trials(storage, "kill")
        done = [t for t in trials if t.state.name == "COMPLETE"]
        running = [t for t in trials if t.state.name == "RUNNING" and "config" in t.user_attrs]
        if len(done) >= 3 and running:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG_S)
    before = optuna.load_study(study_name="kill", storage=storage).trials
    finished = {t.number: (t.user_attrs["config"], t.value) for t in before
                if t.state.name == "COMPLETE" and "config" in t.user_attrs}   # not tune's pick, a trial of its own
    killed = [t for t in before if t.state.name == "RUNNING"]
    assert len(finished) >= 3 and len(killed) <= 1

    rerun = subprocess.run(argv(storage, delay_s=0.0), cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "tune: best" in rerun.stderr
    after = optuna.load_study(study_name="kill", storage=storage).trials
    for number, (config, value) in finished.items():
        assert after[number].state.name == "COMPLETE" and after[number].value == value
        assert after[number].user_attrs["config"] == config
    for k in killed:
        assert after[k.number].state.name == "FAIL" and after[k.number].user_attrs["outcome"] == "interrupted"
        if "config" in k.user_attrs:
            again = [t for t in after if t.number > k.number and t.user_attrs.get("config") == k.user_attrs["config"]]
            assert [t.state.name for t in again] == ["COMPLETE"]
    assert not [t for t in after if t.state.name in ("RUNNING", "WAITING")]
    configs = [t.user_attrs["config"] for t in after if t.state.name == "COMPLETE" and "config" in t.user_attrs]
    assert len(configs) == len(set(configs)) == 10            # every configuration once, none lost or repeated
