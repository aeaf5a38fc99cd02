"""The probe's FLOPs per step: what torch executes equals planner.flops for the model run.

    python -m pytest tests/test_probes_flops.py -q
"""

from __future__ import annotations

import pytest

from conftest_probes import tiny_model, tiny_spec
from planner.flops import hardware_flops_per_iteration, model_flops_per_iteration
from probes.layout import model_run, resolve_layout

torch = pytest.importorskip("torch")
from probes.train import count_step_flops, probe_recomputed  # noqa: E402  (needs torch)


@pytest.mark.parametrize("recompute", ["none", "selective", "full", "block-1", "block-3", "selective-op"])
@pytest.mark.parametrize("model", [tiny_model(), tiny_model(kv_heads=2, glu=True, ffn_hidden=128, position="rope",
                                                            norm="rmsnorm", bias=False)],
                         ids=["gpt", "llama-gqa"])
def test_counted_flops_equal_planner(recompute, model):
    spec = tiny_spec(model=model, mbs=2, gas=3, recompute=recompute)
    counted = count_step_flops(spec)
    m = model_run(spec, resolve_layout(spec, world=1))
    layout = resolve_layout(spec, world=1)
    assert counted == pytest.approx(hardware_flops_per_iteration(m, 2 * 3, probe_recomputed(m, layout)), rel=1e-9)
    if recompute.startswith("block") or recompute == "selective-op":   # part of the forward re-run
        assert hardware_flops_per_iteration(m, 6, "none") < counted < hardware_flops_per_iteration(m, 6, "full")
    if recompute == "none":
        assert counted == pytest.approx(model_flops_per_iteration(m, 6), rel=1e-9)


def test_reduced_model_counts_only_layers_run():
    spec = tiny_spec(layers_run=2)
    m = model_run(spec, resolve_layout(spec, world=1))
    assert m.layers == 2
    assert count_step_flops(spec) == pytest.approx(model_flops_per_iteration(m, 4), rel=1e-9)
