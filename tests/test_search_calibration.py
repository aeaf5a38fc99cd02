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


# -- per op class (issue 29 point 3): the class that was off is corrected, not every class alike ------------------
LLAMA = load_model("llama2-7b")
H100 = make_cluster(gpu="H100-SXM", gpus=16, gpus_per_node=8)
LLAMA_TRAINING = TrainingSpec(global_batch=64, seq_len=4096, precision="bf16")
ATTENTION_SLOW = CostParams(class_scales=(("attention", 2.0),))
"""a machine whose attention kernel runs at half the planner's rate; GEMMs and element-wise ops as planned"""
MIXED = [Candidate(tp=tp, pp=pp, dp=16 // (tp * pp), mbs=1, gas=64 // (16 // (tp * pp)), recompute=rc)
         for tp, pp, rc in ((2, 1, "none"), (4, 1, "selective"), (2, 2, "full"), (8, 1, "none"), (4, 2, "selective"))]
"""layouts whose attention shares of compute differ (selective recompute re-runs the core, the LM head's share)"""


def _profiled(cand: Candidate, truth: CostParams) -> tuple[dict, dict]:
    """(predicted, measured) seconds by class of a probe's profiled step on a machine that is ``truth``."""
    from search.calibration import probe_class_seconds

    pred = probe_class_seconds(LLAMA, H100, LLAMA_TRAINING, cand, layers_run=8)
    scales = dict(truth.class_scales)
    return pred, {c: v * scales.get(c, 1.0) for c, v in pred.items()}


def test_class_scales_are_measured_over_predicted_per_class():
    from search.calibration import class_scales

    pairs = [_profiled(c, ATTENTION_SLOW) for c in MIXED[:2]]
    assert dict(class_scales(pairs)) == pytest.approx({"gemm": 1.0, "attention": 2.0, "elementwise": 1.0})
    assert class_scales([({"gemm": 1.0, "attention": 0.0}, {"gemm": 3.0, "attention": 0.2})]) == (("gemm", 3.0),)
    assert class_scales([]) == ()


def test_the_probe_step_by_class_is_the_op_lists():
    """A one-stage probe's profiled step: gas micro-batches of its layers' op classes (x3, + recompute) + LM head;
    a two-stage probe's rank 0: half the layers, no head."""
    from planner import ops
    from planner.cost import class_seconds, layer_op_list
    from search.calibration import probe_class_seconds

    one = Candidate(tp=2, pp=1, dp=8, mbs=1, gas=8)
    lo = layer_op_list(LLAMA, one, H100, LLAMA_TRAINING)
    got = probe_class_seconds(LLAMA, H100, LLAMA_TRAINING, one, layers_run=4)
    assert got["attention"] == pytest.approx(8 * 4 * 3 * lo.seconds(ops.ATTENTION))
    assert got["gemm"] > 8 * 4 * 3 * lo.seconds(ops.GEMM)   # + the LM head
    two = Candidate(tp=2, pp=2, dp=4, mbs=1, gas=16)
    lo2 = layer_op_list(LLAMA, two, H100, LLAMA_TRAINING)
    assert probe_class_seconds(LLAMA, H100, LLAMA_TRAINING, two, layers_run=4)["gemm"] == pytest.approx(
        16 * 2 * 3 * lo2.seconds(ops.GEMM))
    assert class_seconds(LLAMA, one, H100, LLAMA_TRAINING, layers=1, head=False)["elementwise"] == pytest.approx(
        3 * lo.seconds(ops.ELEMENTWISE))


def test_the_cached_terms_scale_by_class_as_the_planner_does():
    from planner import estimate
    from search.calibration import Terms, candidate_classes

    params = CostParams(compute_scale=1.1, comm_scale=0.9, class_scales=(("attention", 2.0), ("gemm", 0.8)))
    for cand in MIXED:
        est = estimate(LLAMA, H100, LLAMA_TRAINING, cand)
        t = Terms.of(est.time, candidate_classes(LLAMA, H100, LLAMA_TRAINING, cand))
        assert t.step_s(params) == pytest.approx(estimate(LLAMA, H100, LLAMA_TRAINING, cand,
                                                          params=params).time.step_time_s, rel=1e-12)
        assert t.step_s(CostParams()) == est.time.step_time_s


def test_a_slow_attention_kernel_is_refitted_per_class_not_as_one_compute_scale():
    """Attention at half the planned rate: one compute scale fitted on two layouts mispredicts the others (their
    attention shares differ); the class scale from the profiles predicts every layout, compute_scale ~1."""
    from planner import estimate
    from search.calibration import class_scales

    truth = {c: estimate(LLAMA, H100, LLAMA_TRAINING, c, params=ATTENTION_SLOW).time.step_time_s for c in MIXED}
    probed, held_out = MIXED[:2], MIXED[2:]
    ms = [Measurement(candidate=c, step_time_s=truth[c]) for c in probed]
    one_scale = refit(LLAMA, H100, LLAMA_TRAINING, ms)
    scales = class_scales([_profiled(c, ATTENTION_SLOW) for c in probed])
    per_class = refit(LLAMA, H100, LLAMA_TRAINING, ms, class_scales=scales)
    assert per_class.compute_scale == pytest.approx(1.0, abs=0.01)

    def worst(params):
        return max(abs(estimate(LLAMA, H100, LLAMA_TRAINING, c, params=params).time.step_time_s / truth[c] - 1)
                   for c in held_out)
    assert worst(per_class) < 0.005 < worst(one_scale)
