"""The probe's measurement logic in one process (no torchrun): windows, stability, projection.

    python -m pytest tests/test_probes_timing.py -q
"""

from __future__ import annotations

import time

import pytest

from conftest_probes import tiny_spec
from probes.layout import resolve_layout

torch = pytest.importorskip("torch")
from probes.train import MAX_MEASURE_ROUNDS, run_probe, synthetic_batch  # noqa: E402


def _run(spec):
    return run_probe(spec, resolve_layout(spec, world=1), 0, 1, torch.device("cpu"), time.time())


def test_unstable_timing_is_remeasured_a_bounded_number_of_times():
    r = _run(tiny_spec(steps=3, max_cv=1e-12))
    assert r.extra["measure_rounds"] == MAX_MEASURE_ROUNDS
    assert len(r.step_times_s) == 3 * MAX_MEASURE_ROUNDS
    assert r.stable is False and r.step_time_cv > 1e-12
    assert r.step_time_median_s == pytest.approx(sorted(r.step_times_s[-3:])[1])
    assert len(r.losses) == 1 + 3 * MAX_MEASURE_ROUNDS


def test_stable_timing_measures_one_window_and_reports_rates():
    r = _run(tiny_spec(steps=3, max_cv=100.0, mbs=2, gas=2))
    assert r.status == "ok" and r.stable is True and r.extra["measure_rounds"] == 1
    assert r.samples_per_s == pytest.approx(4 / r.step_time_median_s)
    assert r.memory_kind == "rss" and r.peak_memory_bytes_per_rank[0] > 1e6
    assert r.reduced is False and r.projected == {}


def test_fewer_layers_are_projected_to_the_full_model():
    r = _run(tiny_spec(layers_run=1))
    assert r.reduced is True
    assert r.projected["step_time_s"] == pytest.approx(4 * r.step_time_median_s)
    assert r.projected["model_tflops_per_device"] > 0


def test_synthetic_data_is_seeded_and_sliced_from_one_global_batch():
    spec = tiny_spec()
    x, y = synthetic_batch(spec, 128, 32, 8, step=3, rows=slice(0, 8))
    x2, _ = synthetic_batch(spec, 128, 32, 8, step=3, rows=slice(4, 8))
    assert torch.equal(x[4:], x2)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, synthetic_batch(spec, 128, 32, 8, step=4, rows=slice(0, 8))[0])
