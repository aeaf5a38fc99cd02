"""`tune --backend replay` on seed 003's V100 tables: finds the measured best, resumes, dedups, implies OOMs.

    python -m pytest tests/test_tune_replay.py -q
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest

from search.cli import main

DATA = Path(__file__).resolve().parent / "data" / "bigscience_1b3_v100.csv"
TABLES = {"v100-32gb-recompute": ("V100-32GB", "full"), "v100-32gb-no-recompute": ("V100-32GB", "none"),
          "v100-16gb-recompute": ("V100-16GB", "full")}


def replay_argv(table: str, storage: str, *extra: str, results: Path = DATA) -> list[str]:
    gpu, recompute = TABLES.get(table, ("V100-32GB", "full"))
    return ["--model", "1B3", "--gpu", gpu, "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
            "--seq-len", "2048", "--precision", "fp16", "--recompute", recompute, "--zero", "1", "--no-rampup",
            "--backend", "replay", "--results", str(results), "--results-table", table, "--study", table,
            "--storage", storage, "--no-progress", *extra]


def measured_best(table: str) -> set[tuple[int, int, int]]:
    rows = [r for r in csv.DictReader(DATA.open()) if r["table"] == table and r["status"] == "ok"]
    best = min(float(r["seconds_per_iteration"]) for r in rows)
    return {(int(r["tp"]), int(r["pp"]), int(r["micro_batch"])) for r in rows
            if float(r["seconds_per_iteration"]) == best}


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_finds_the_measured_best_within_a_few_probes(table, tmp_path, capsys):
    out = run_json(capsys, replay_argv(table, f"sqlite:///{tmp_path}/t.db", "--seed", "0", "--max-probes", "4",
                                       "--confirm-top", "0"))
    best = out["best"]["candidate"]
    assert (best["tp"], best["pp"], best["mbs"]) in measured_best(table)
    probes = [t for t in out["trials"] if t["outcome"] in ("ok", "oom")]
    assert len(probes) <= 4


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_every_trial_is_complete_or_failed_with_a_reason(tmp_path, capsys):
    out = run_json(capsys, replay_argv("v100-16gb-recompute", f"sqlite:///{tmp_path}/t.db", "--seed", "1"))
    for t in out["trials"]:
        assert t["state"] in ("COMPLETE", "FAIL")
        if t["state"] == "FAIL":
            assert t["outcome"] and t["reason"]
    assert out["best"]["n_measurements"] == 3          # confirmed: first probe + 2 repeats


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_rerun_continues_and_never_reprobes(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    first = run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--seed", "2", "--max-probes", "3",
                                         "--confirm-top", "0"))
    assert len(first["trials"]) == 3
    second = run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--seed", "2", "--confirm-top", "0"))
    configs = [t["config"] for t in second["trials"] if t["outcome"] == "ok"]
    assert len(configs) == len(set(configs)) > 3       # continued, each configuration probed once
    third = run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--seed", "2", "--confirm-top", "0"))
    assert len(third["trials"]) == len(second["trials"])


def test_duplicate_proposal_is_answered_from_the_stored_result(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    first = run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--max-probes", "2", "--confirm-top", "0"))
    done = next(t for t in first["trials"] if t["outcome"] == "ok")
    study = optuna.load_study(study_name="v100-32gb-recompute", storage=storage)
    original = study.trials[done["number"]]
    study.enqueue_trial(dict(original.params), user_attrs={"phase": "sampler"})
    second = run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--max-probes", "4", "--confirm-top", "0"))
    dup = [t for t in second["trials"] if t["outcome"] == "duplicate"]
    assert len(dup) == 1 and dup[0]["value"] == done["value"]
    trial = optuna.load_study(study_name="v100-32gb-recompute", storage=storage).trials[dup[0]["number"]]
    assert trial.user_attrs["duplicate_of"] == done["number"] and "probe_wall_s" not in trial.user_attrs


def test_oom_rules_out_larger_configurations_without_probing(tmp_path, capsys):
    csv_path = tmp_path / "oom.csv"
    header = ("table,tp,pp,dp,micro_batch,global_batch,seq_len,activation_recompute,seconds_per_iteration,"
              "memory_gb,status")
    rows = [header,
            "t,1,1,8,1,512,2048,full,30,16,ok", "t,1,1,8,2,512,2048,full,,,oom",
            "t,1,1,8,4,512,2048,full,20,20,ok", "t,1,1,8,8,512,2048,full,19,25,ok",
            "t,1,2,4,1,512,2048,full,31,10,ok"]
    csv_path.write_text("\n".join(rows) + "\n")
    out = run_json(capsys, replay_argv("t", f"sqlite:///{tmp_path}/t.db", "--top-k", "0", "--sampler", "grid",
                                       "--confirm-top", "0", results=csv_path))
    by = {(t["config"].split(",")[3]): t for t in out["trials"] if t["config"] and t["config"].startswith("tp=1,pp=1")}
    assert by["mbs=2"]["outcome"] == "oom"
    for mbs in ("mbs=4", "mbs=8"):
        assert by[mbs]["outcome"] == "implied_oom" and "ran out of memory" in by[mbs]["reason"]
    assert out["best"]["candidate"]["pp"] in (1, 2)


def test_replay_needs_a_table(tmp_path, capsys):
    argv = replay_argv("v100-32gb-recompute", f"sqlite:///{tmp_path}/t.db")
    i = argv.index("--results-table")
    assert main(argv[:i] + argv[i + 2:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--results-table" in err[0]


def test_other_inputs_refuse_the_study(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    run_json(capsys, replay_argv("v100-32gb-recompute", storage, "--max-probes", "1", "--confirm-top", "0"))
    argv = replay_argv("v100-32gb-recompute", storage)
    argv[argv.index("--recompute") + 1] = "full,none"
    assert main(argv) == 2
    assert "made for other inputs" in capsys.readouterr().err
