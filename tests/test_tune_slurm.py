"""`tune --backend slurm` on a throw-away one-node SLURM cluster (root, slurm-wlm and munge needed).

    python -m pytest tests/test_tune_slurm.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S, SLURM_RESERVATION as RESERVATION
from probe_kills import CASCADE_S, KILL_MOMENTS, kill_tuner_at

ROOT = Path(__file__).resolve().parents[1]
TINY_YAML = "name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 256\nvocab: 128\nseq_len: 32\n"


def _command(tmp_path: Path, trial: str) -> dict:
    return json.loads((tmp_path / "runs" / trial / "command.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "no-warm"])
def test_tune_probes_on_a_slurm_reservation(slurm_cluster, tmp_path, warm):
    """Both probes have 2 ranks: warm, the second runs in the first one's step and workers; --no-warm, each
    has a step of its own."""
    cluster = slurm_cluster
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    argv = [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "fp32",
            "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup", "--probe-device", "cpu",
            "--probe-steps", "2", "--probe-warmup", "1", "--probe-timeout", "120", "--backend", "slurm",
            "--reservation", RESERVATION, "--max-probes", "2", "--confirm-top", "0", "--no-prune", "--study", "slurm",
            "--storage", f"sqlite:///{tmp_path}/tune.db", "--workdir", str(tmp_path / "runs"),
            "--no-progress", "--format", "json", *([] if warm else ["--no-warm"])]
    done = subprocess.run(argv, cwd=ROOT, env=cluster.env(dict(os.environ)), capture_output=True, text=True,
                          timeout=1800)   # a hang guard, no speed limit
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    probed = [t for t in out["trials"] if t["outcome"] == "ok"]
    assert len(probed) == 2, [(t["outcome"], t.get("reason")) for t in out["trials"]]
    first, second = _command(tmp_path, "trial-0000"), _command(tmp_path, "trial-0001")
    pids = [{int(p.read_text()) for p in (tmp_path / "runs" / t).glob("pid-rank*")}
            for t in ("trial-0000", "trial-0001")]
    if warm:
        assert first["warm_pool"] == second["warm_pool"] and (first["job"], second["job"]) == (0, 1)
        assert "srun" in first["argv"] and "--serve" in first["argv"]    # the workers' step
        assert len(pids[0]) == 2 and pids[0] == pids[1]
    else:
        assert "warm_pool" not in first and first["step_name"] != second["step_name"]
        assert len(pids[0]) == 2 and not pids[0] & pids[1]
    # the probes' allocation was given back: gone, or scancel'ed and still COMPLETING while slurmd cleans up (scancel
    # returns before that ends; a loaded machine shows it)
    queue = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=cluster.env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S).stdout.splitlines()
    assert all(line.split()[1] in ("COMPLETING", "CANCELLED") for line in queue), queue


def _tuner_jobs(cluster) -> list[str]:
    """Jobs a tuner's SlurmBackend asked for (salloc --job-name=plantune-probes-...), pending or running."""
    listed = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], env=cluster.env(), capture_output=True, text=True,
                            timeout=60).stdout
    return [line for line in listed.splitlines() if " plantune-probes-" in line]


def _kill_argv(model: Path, runs: Path, tmp_path: Path, study: str, *extra: str) -> list[str]:
    """A tiny CPU tune on the reservation, for the kill tests (``extra``: how many probes, how long)."""
    return [sys.executable, "-m", "search.cli", "--model", str(model), "--gpu", "CPU", "--gpus", "2",
            "--gpus-per-node", "2", "--global-batch", "8", "--seq-len", "32", "--precision", "fp32",
            "--recompute", "none", "--zero", "0", "--max-mbs", "2", "--no-rampup", "--probe-device", "cpu",
            "--probe-warmup", "1", "--probe-timeout", "3600", "--backend", "slurm", "--reservation", RESERVATION,
            "--study", study, "--storage", f"sqlite:///{tmp_path}/tune.db", "--workdir", str(runs), "--no-progress",
            *extra]


def _jobs_left(cluster) -> list[str]:
    """The killed tuner's jobs still queued once its guard has had time to scancel them; then every job is
    cancelled, whatever the test finds."""
    try:
        deadline = time.monotonic() + CASCADE_S    # a hang guard: the guard's scancel takes a second
        while _tuner_jobs(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        return _tuner_jobs(cluster)
    finally:
        subprocess.run(["scancel", "--user=root"], env=cluster.env(), capture_output=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["salloc", "srun", "worker", "import", "setup", "steps", "teardown"])
def test_sigkilled_tuner_leaves_no_probe_process_nor_job(slurm_cluster, tmp_path, moment):
    """Issue 24 on SLURM: the tuner SIGKILLed while salloc or srun starts (before their lifelines arm), while a
    worker starts, in the set-up, the steps, the teardown: no process of the probe is left and the guard has
    scancel'ed the allocation."""
    cluster = slurm_cluster
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    endless = [] if moment == "teardown" else ["--probe-steps", "100000"]   # a missed process never ends by itself
    argv = _kill_argv(model, tmp_path / "runs", tmp_path, "slurm-kill", "--max-probes", "1", "--top-k", "1",
                      "--confirm-top", "0", *endless)
    left = kill_tuner_at(KILL_MOMENTS[moment], argv, folder=tmp_path, env=cluster.env(dict(os.environ)))
    jobs = _jobs_left(cluster)
    assert not left, f"probe processes outlived the tuner killed at '{moment}': {left}"
    assert not jobs, f"the killed tuner's allocation is still there: {jobs}"


@pytest.mark.slow
def test_sigkilled_tuner_leaves_no_warm_step_after_reusing_it(slurm_cluster, tmp_path):
    """The tuner killed in its second probe, which runs in the first one's step: no worker, srun or torchrun is
    left and the allocation is cancelled (a third probe keeps the tuner busy whatever moment the kill lands at)."""
    cluster = slurm_cluster
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_YAML)
    runs = tmp_path / "runs"

    def second_probe_stepping() -> bool:
        logs = list((runs / "trial-0001").rglob("0/stdout.log"))
        return bool(logs) and "[probe] step" in logs[0].read_text(errors="replace")

    argv = _kill_argv(model, runs, tmp_path, "slurm-warm-kill", "--max-probes", "3", "--top-k", "3", "--confirm-top",
                      "0", "--no-prune")
    left = kill_tuner_at(KILL_MOMENTS["steps"], argv, folder=tmp_path, env=cluster.env(dict(os.environ)),
                         reached=second_probe_stepping)
    jobs = _jobs_left(cluster)
    assert not left, f"warm workers outlived the killed tuner: {left}"
    assert not jobs, f"the killed tuner's allocation is still there: {jobs}"
    first, second = ({int(p.read_text()) for p in (runs / t).glob("pid-rank*")} for t in ("trial-0000", "trial-0001"))
    assert len(first) == 2 and first == second            # the second probe did run in the first one's step
