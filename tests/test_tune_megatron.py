"""`tune --probe megatron --command ...`: the user's training command as the probe (tests/fake_megatron.py).

    python -m pytest tests/test_tune_megatron.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_megatron.py"
TINY_TIED_YAML = "name: tinyt\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\nseq_len: 32\n"


@pytest.mark.slow
def test_tune_times_the_users_command(tmp_path):
    model = tmp_path / "tinyt.yaml"
    model.write_text(TINY_TIED_YAML)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "bf16",
            "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup", "--probe-device", "cpu",
            "--probe", "megatron",
            "--command", f"python -u {FAKE} {{args}} --data-path /nonexistent --fake-step-ms 50",
            "--probe-steps", "3", "--probe-warmup", "1", "--max-probes", "3", "--confirm-top", "0",
            "--study", "m", "--storage", f"sqlite:///{tmp_path}/tune.db", "--workdir", str(tmp_path / "runs"),
            "--no-progress", "--format", "json", "--emit", "megatron-deepspeed", "--out", str(tmp_path / "run")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)   # a hang guard
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    ok = [t for t in out["trials"] if t["outcome"] == "ok"]
    assert len(ok) == 3
    assert all(t["measured_step_s"] == pytest.approx(0.05, rel=0.2) for t in ok)
    assert (tmp_path / "run" / "ds_config.json").is_file()


@pytest.mark.slow
def test_tune_times_a_megatron_lm_command(tmp_path):
    """--framework megatron-lm: the command gets `plan --emit megatron-lm`'s arguments (what tests/bench/megatron_gpu.sh
    runs with NVIDIA's pretrain_gpt.py on a GPU), its log is read in Megatron-LM's format."""
    model = tmp_path / "tinyt.yaml"
    model.write_text(TINY_TIED_YAML)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "bf16",
            "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup", "--framework", "megatron-lm",
            "--probe-device", "cpu", "--probe", "megatron", "--command",
            f"python -u {FAKE} {{args}} --mock-data --fake-format megatron-lm --fake-step-ms 50",
            "--probe-steps", "3", "--probe-warmup", "1", "--max-probes", "2", "--confirm-top", "0",
            "--study", "m", "--storage", f"sqlite:///{tmp_path}/tune.db", "--workdir", str(tmp_path / "runs"),
            "--no-progress", "--format", "json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)   # a hang guard
    assert done.returncode == 0, done.stderr[-3000:]
    ok = [t for t in json.loads(done.stdout)["trials"] if t["outcome"] == "ok"]
    assert len(ok) == 2 and all(t["measured_step_s"] == pytest.approx(0.05, rel=0.2) for t in ok)
    args = [p.read_text() for p in (tmp_path / "runs").glob("trial-*/args.txt")]
    assert args and all("--use-mcore-models" in a and "--deepspeed" not in a for a in args)
    assert not list((tmp_path / "runs").glob("trial-*/ds_config.json"))
