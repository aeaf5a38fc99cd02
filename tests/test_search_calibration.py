"""The refit of CostParams from measured step times (fast).

    python -m pytest tests/test_search_calibration.py -q
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from planner import Candidate, CostParams, TrainingSpec, load_model, make_cluster, plan
from search.calibration import Measurement, predicted_step_s, refit, rms_log_error

DATA = Path(__file__).resolve().parent / "data" / "bigscience_1b3_v100.csv"
MODEL = load_model("1B3")
CLUSTER = make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4)
TRAINING = TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", recompute_options=("full",),
                        zero_options=(1,), flash_attention=False)


def synthetic(params: CostParams, n: int) -> list[Measurement]:
    """Step times the planner predicts under ``params``, for the n most comm-varied survivors."""
    survivors = plan(MODEL, CLUSTER, TRAINING).candidates
    picked = sorted(survivors, key=lambda e: e.candidate.tp * 10 + e.candidate.pp)[::max(1, len(survivors) // n)][:n]
    return [Measurement(candidate=e.candidate,
                        step_time_s=predicted_step_s(MODEL, CLUSTER, TRAINING, e.candidate, params)) for e in picked]


def test_no_measurement_keeps_the_defaults():
    assert refit(MODEL, CLUSTER, TRAINING, []) == CostParams()


@pytest.mark.parametrize("compute, comm", [(1.7, 1.0), (0.6, 3.0), (1.3, 0.5)])
def test_recovers_known_scales(compute, comm):
    truth = CostParams(compute_scale=compute, comm_scale=comm)
    got = refit(MODEL, CLUSTER, TRAINING, synthetic(truth, 8), ridge=1e-6)
    assert got.compute_scale == pytest.approx(compute, rel=0.02)
    assert got.comm_scale == pytest.approx(comm, rel=0.15)


def test_one_compute_bound_probe_moves_compute_only():
    cand = Candidate(tp=1, pp=1, dp=8, mbs=4, gas=16, recompute="full", zero=1)
    step = predicted_step_s(MODEL, CLUSTER, TRAINING, cand, CostParams()) * 1.5
    got = refit(MODEL, CLUSTER, TRAINING, [Measurement(candidate=cand, step_time_s=step)])
    assert got.compute_scale == pytest.approx(1.5, rel=0.05)
    assert got.comm_scale == pytest.approx(1.0, rel=0.1)


def test_refit_explains_seed003_better_than_the_defaults():
    rows = [r for r in csv.DictReader(DATA.open()) if r["table"] == "v100-32gb-recompute" and r["status"] == "ok"]
    ms = [Measurement(candidate=Candidate(tp=int(r["tp"]), pp=int(r["pp"]), dp=int(r["dp"]), mbs=int(r["micro_batch"]),
                                          gas=512 // (int(r["micro_batch"]) * int(r["dp"])), recompute="full", zero=1),
                      step_time_s=float(r["seconds_per_iteration"])) for r in rows]
    before = rms_log_error(MODEL, CLUSTER, TRAINING, ms, CostParams())
    fitted = refit(MODEL, CLUSTER, TRAINING, ms)
    after = rms_log_error(MODEL, CLUSTER, TRAINING, ms, fitted)
    assert after < before / 2
