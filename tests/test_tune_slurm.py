"""`tune --backend slurm` on a throw-away one-node SLURM cluster (root, slurm-wlm and munge needed).

    python -m pytest tests/test_tune_slurm.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from probes.slurm_cluster import missing_binaries, start_local_cluster, stop_local_cluster

ROOT = Path(__file__).resolve().parents[1]
RESERVATION = "plantune_tune"
TINY_YAML = "name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\nseq_len: 32\n"


@pytest.mark.slow
def test_tune_probes_on_a_slurm_reservation(tmp_path):
    missing = missing_binaries()
    if missing:
        pytest.skip(f"SLURM/munge not installed ({', '.join(missing)}); apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a local SLURM cluster needs root (slurmd, munged as the munge user)")
    root = Path(tempfile.mkdtemp(prefix="plantune-tune-slurm-", dir="/tmp"))
    cluster = start_local_cluster(root, cpus=2, gpus=2)
    try:
        made = subprocess.run(["scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
                               f"Nodes={cluster.hostname}", "Users=root", "StartTime=now", "Duration=30"],
                              env=cluster.env(), capture_output=True, text=True, timeout=30, check=False)
        assert made.returncode == 0, made.stderr
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
                              timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
        probed = [t for t in out["trials"] if t["outcome"] == "ok"]
        assert len(probed) == 2
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True,
                               timeout=30).stdout.split()
        assert queue == []                                      # the probes' allocation was given back
    finally:
        subprocess.run(["scancel", "--user=root"], env=cluster.env(), capture_output=True, timeout=30, check=False)
        stop_local_cluster(cluster)
        shutil.rmtree(root, ignore_errors=True)
