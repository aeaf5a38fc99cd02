"""`tune --backend slurm` on a throw-away one-node SLURM cluster (root, slurm-wlm and munge needed).

    python -m pytest tests/test_tune_slurm.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S, SLURM_RESERVATION as RESERVATION

ROOT = Path(__file__).resolve().parents[1]
TINY_YAML = "name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\nseq_len: 32\n"


@pytest.mark.slow
def test_tune_probes_on_a_slurm_reservation(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "fp32",
            "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup", "--probe-device", "cpu",
            "--probe-steps", "2", "--probe-warmup", "1", "--probe-timeout", "120", "--backend", "slurm",
            "--reservation", RESERVATION, "--max-probes", "2", "--confirm-top", "0", "--study", "slurm",
            "--storage", f"sqlite:///{tmp_path}/tune.db", "--workdir", str(tmp_path / "runs"),
            "--no-progress", "--format", "json"]
    done = subprocess.run(argv, cwd=ROOT, env=cluster.env(dict(os.environ)), capture_output=True, text=True,
                          timeout=1800)   # a hang guard, no speed limit
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    probed = [t for t in out["trials"] if t["outcome"] == "ok"]
    assert len(probed) == 2
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S).stdout.split()
    assert queue == []                                      # the probes' allocation was given back
