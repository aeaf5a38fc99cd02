"""`tune --framework fsdp` measures a TP x FSDP2 layout end to end on CPU: 4 gloo processes, a tiny model, TP 2 x
FSDP 2 (the 2D layout torchtitan runs), probed by probes/train.py on a DeviceMesh; the planner's fsdp rules let it
through (before issue 20 they refused every TP > 1 layout for fsdp)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from planner.fsdp_parallel import probe_schedule
from planner.space import TrainingSpec
from test_tune_local import HANG_S, TINY_YAML

ROOT = Path(__file__).resolve().parents[1]


def test_probe_schedule_of_torchtitan_schedules():
    def spec(name: str) -> TrainingSpec:
        return TrainingSpec(global_batch=8, seq_len=32, framework="fsdp", pp_schedule=name)
    assert probe_schedule(spec("")) == "1F1B" and probe_schedule(spec("GPipe")) == "GPipe"
    assert probe_schedule(spec("ZBVZeroBubble")) == probe_schedule(spec("Interleaved1F1B")) == "Interleaved1F1B"


@pytest.mark.slow
def test_tune_measures_tp_x_fsdp_on_cpu(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "4",
            "--gpus-per-node", "4", "--framework", "fsdp", "--global-batch", "8", "--seq-len", "32",
            "--precision", "fp32", "--recompute", "none", "--zero", "3", "--tp", "2", "--pp", "1", "--max-mbs", "2",
            "--no-rampup", "--probe-device", "cpu", "--probe-steps", "2", "--probe-warmup", "1",
            "--probe-timeout", "600", "--study", "fsdp2d", "--storage", f"sqlite:///{tmp_path}/tune.db",
            "--workdir", str(tmp_path / "runs"), "--seed", "0", "--max-probes", "1", "--confirm-top", "0",
            "--format", "json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = json.loads(proc.stdout)["best"]
    assert best["outcome"] == "ok" and best["tflops"][0] > 0
    c = best["candidate"]
    assert (c["tp"], c["dp"], c["zero"], c["sp"]) == (2, 2, 3, True)
    trials = optuna.load_study(study_name="fsdp2d", storage=f"sqlite:///{tmp_path}/tune.db").trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert done
    result = json.loads((tmp_path / "runs" / f"trial-{done[0].number:04d}" / "result.json").read_text())
    layout = result["extra"]["layout"]
    # FSDP2 over the data-parallel mesh dimension, TP (sequence-parallel) within: 4 ranks
    assert (layout["tp"], layout["dp_shard"], layout["dp_impl"], layout["sp"]) == (2, 2, "fsdp", True)
