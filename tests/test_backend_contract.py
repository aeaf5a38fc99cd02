"""One contract over every probe backend (probes.backend.ProbeBackend): the local torchrun backend, SLURM, the replay
of a results table, the user's Megatron command (tests/fake_megatron.py) and torchtitan's trainer
(tests/fake_torchtitan), as Optuna runs one test suite over
all its storages.

    python -m pytest tests/test_backend_contract.py -q          # the replay case fast; the others are slow
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from planner.model import load_model
from probes.backend import LocalBackend, ProbeBackend
from probes.result import STATUSES, ProbeResult, ProbeSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_model, tiny_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_megatron.py"
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"


def _replay(request) -> tuple[ProbeBackend, ProbeSpec, ProbeSpec]:
    from conftest import seed003_plan
    from search.replay import ReplayBackend, ReplayTable, candidate_of

    table = ReplayTable.read(str(DATA), "v100-32gb-recompute")
    row = next(r for r in table.rows if r.status == "ok")
    model = load_model("1B3").to_dict()
    cand = candidate_of(row, seed003_plan())
    ok = ProbeSpec(model=model, candidate=cand.to_dict(), precision="fp16")
    absent = ProbeSpec(model=model, candidate={**cand.to_dict(), "tp": 3}, precision="fp16")
    return ReplayBackend(table), ok, absent


def _local(request):
    return LocalBackend(), tiny_spec(dp=2), tiny_spec(tp=3)


def _megatron(request):
    from probes.megatron import MegatronProbe

    probe = MegatronProbe(f"python -u {FAKE} {{args}} --data-path /nonexistent --fake-format microsoft "
                          "--fake-step-ms 50", LocalBackend(nproc=2), "microsoft")
    model = tiny_model(tied_embeddings=True)
    return (probe, tiny_spec(model=model, dp=2, precision="bf16"),
            tiny_spec(model=model, tp=3, precision="bf16"))


def _torchtitan(request):
    """torchtitan's trainer on the emitted config: tests/fake_torchtitan stands in for it (no CUDA needed)."""
    import os

    from planner import make_cluster
    from planner.space import TrainingSpec
    from probes.torchtitan import TorchtitanProbe

    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "fake_torchtitan")]),
           "FAKE_TORCHTITAN_STEP_MS": "50"}
    probe = TorchtitanProbe(LocalBackend(nproc=2), cluster=make_cluster(gpu="CPU", gpus=2, gpus_per_node=2),
                            training=TrainingSpec(global_batch=8, seq_len=32, precision="fp32", framework="fsdp"),
                            env=env)
    model = tiny_model(norm="rmsnorm", position="rope", bias=False, glu=True)
    return probe, tiny_spec(model=model, dp=2), tiny_spec(model=model, tp=3)


def _slurm(request):
    from test_slurm import _backend

    cluster = request.getfixturevalue("slurm_cluster")
    backend = _backend(cluster, gres=None)
    request.addfinalizer(backend.close)
    return backend, tiny_spec(dp=2), tiny_spec(tp=3)


BACKENDS = [pytest.param(_replay, id="replay"),
            pytest.param(_local, id="local", marks=pytest.mark.slow),
            pytest.param(_megatron, id="megatron", marks=pytest.mark.slow),
            pytest.param(_torchtitan, id="torchtitan", marks=pytest.mark.slow),
            pytest.param(_slurm, id="slurm", marks=pytest.mark.slow)]


@pytest.fixture(params=BACKENDS)
def backend_and_specs(request):
    if request.param is not _replay:      # the others start processes that import torch
        pytest.importorskip("torch")
    return request.param(request)


def test_the_interface_is_abstract():
    with pytest.raises(TypeError):
        ProbeBackend()          # a backend must say how it runs a probe


def test_a_probe_that_runs_is_ok_with_its_figures(backend_and_specs, tmp_path):
    backend, ok, _ = backend_and_specs
    assert isinstance(backend, ProbeBackend)
    r = backend.run(ok, workdir=tmp_path / "ok", timeout_s=PROBE_TIMEOUT_S)
    assert isinstance(r, ProbeResult) and r.status == "ok", r.reason
    assert r.step_time_median_s is not None and math.isfinite(r.step_time_median_s) and r.step_time_median_s > 0
    assert r.samples_per_s and r.samples_per_s > 0
    assert r.world_size >= 1 and r.wall_s is not None and r.device
    assert no_process_left(r) == []


def test_a_configuration_that_cannot_run_is_a_result_not_an_exception(backend_and_specs, tmp_path):
    backend, _, bad = backend_and_specs
    r = backend.run(bad, workdir=tmp_path / "bad", timeout_s=PROBE_TIMEOUT_S)
    assert r.status in STATUSES and r.status != "ok"
    assert r.reason and "\n" not in r.reason.strip()
    assert no_process_left(r) == []
