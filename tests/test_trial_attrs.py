"""The trial protocol, typed: every user attribute a tune study writes is a `search.trial_attrs.TrialAttrs` field."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from search.cli import main
from search.trial_attrs import TrialAttrs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"


def test_a_name_that_is_not_a_field_is_refused():
    assert TrialAttrs.user_attrs(outcome="ok", measured_step_s=1.5) == {"outcome": "ok", "measured_step_s": 1.5}
    with pytest.raises(TypeError):
        TrialAttrs.user_attrs(measured_stepp_s=1.5)
    assert TrialAttrs.from_user_attrs({"outcome": "oom", "from_a_newer_tune": 1}).outcome == "oom"


def test_a_studys_trials_carry_only_typed_attributes(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    argv = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
            "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
            "--backend", "replay", "--results", str(DATA), "--results-table", "v100-32gb-recompute", "--no-progress",
            "--max-probes", "4", "--confirm-top", "1", "--repeats", "1", "--study", "t", "--storage", storage,
            "--workdir", str(tmp_path)]
    assert main(argv) == 0
    trials = optuna.load_study(study_name="t", storage=storage).trials
    names = set(TrialAttrs.names())
    assert trials and all(set(t.user_attrs) <= names for t in trials), [set(t.user_attrs) - names for t in trials]
    ok = [TrialAttrs.from_user_attrs(t.user_attrs) for t in trials if t.user_attrs.get("outcome") == "ok"]
    assert ok and all(a.measured_step_s > 0 and a.candidate and a.phase for a in ok)
