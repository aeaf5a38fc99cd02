"""Context parallel and expert parallel probes train to the single-process losses (CPU, gloo, torchrun).

    python -m pytest tests/test_probes_cpep.py -q

CP: each rank holds two of 2·CP sequence chunks and all-gathers K/V (probes.gpt.ContextParallel);
the dense single-process run is the reference. EP: a 4-expert top-2 MoE in every layer, experts
split over the EP ranks with two all-to-alls per layer; the same MoE in one process is the
reference. fp32, same seed and global batch: the loss series must agree to float tolerance.
Start processes: marked slow. The rules (no processes) are in the fast tests at the end.
"""

from __future__ import annotations

import pytest

from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_spec
from probes.extent import probe_world, resolve_probe
from probes.layout import LayoutError

LOSS_RTOL = 1e-5
STEPS = 4
MOE = dict(num_experts=4, moe_top_k=2)


def _spec(cp=1, ep=1, num_experts=0, moe_top_k=2, **kw):
    spec = tiny_spec(**kw)
    from dataclasses import replace
    return replace(spec, cp=cp, ep=ep, num_experts=num_experts, moe_top_k=moe_top_k)


def _check(result, reference, nproc):
    assert result.status == "ok", f"{result.status}: {result.reason}"
    assert result.world_size == nproc
    assert result.losses[STEPS - 1] < result.losses[0], result.losses
    assert result.losses[:STEPS] == pytest.approx(reference.losses[:STEPS], rel=LOSS_RTOL)
    if not result.extra.get("warm"):                  # warm workers end with their group (conftest.warm_run)
        assert not no_process_left(result)


@pytest.fixture(scope="module")
def dense_reference(tmp_path_factory, warm_run):
    """The dense one-process run (on the warm pool of one process, as the MoE one)."""
    r = warm_run(_spec(mbs=2, gas=4), 1, tmp_path_factory.mktemp("dense"), PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    return r


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory, warm_run):
    r = warm_run(_spec(mbs=2, gas=4, **MOE), 1, tmp_path_factory.mktemp("moe"), PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    return r


CP_LAYOUTS = {
    "cp2-ddp": (dict(cp=2, gas=4), 2),
    "cp2-selective": (dict(cp=2, gas=4, recompute="selective"), 2),
    "cp2-dp2-fsdp-zero3": (dict(cp=2, dp=2, gas=2, zero=3), 4),
}
EP_LAYOUTS = {
    "ep2-dp2": (dict(ep=2, dp=2, gas=2, zero=0, **MOE), 2),
    "ep1-dp2-fsdp-zero3": (dict(ep=1, dp=2, gas=2, zero=3, **MOE), 2),
    "ep2-dp4": (dict(ep=2, dp=4, gas=1, zero=0, **MOE), 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CP_LAYOUTS))
def test_context_parallel_matches_single_process(name, dense_reference, tmp_path, warm_run):
    kw, nproc = CP_LAYOUTS[name]
    spec = _spec(**kw)
    assert probe_world(spec) == nproc
    result = warm_run(spec, nproc, tmp_path, PROBE_TIMEOUT_S)
    _check(result, dense_reference, nproc)
    assert result.extra["extent"]["cp"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EP_LAYOUTS))
def test_expert_parallel_matches_single_process(name, moe_reference, tmp_path, warm_run):
    kw, nproc = EP_LAYOUTS[name]
    spec = _spec(**kw)
    result = warm_run(spec, nproc, tmp_path, PROBE_TIMEOUT_S)
    _check(result, moe_reference, nproc)
    ep = kw["ep"]
    # each rank holds num_experts / ep experts: fewer parameters than the single process under EP
    ref_params = moe_reference.memory_per_rank[0]["params_on_gpu"]
    mine = result.memory_per_rank[0]["params_on_gpu"]
    if ep > 1:
        assert mine < ref_params
    assert result.extra["extent"]["ep"] == ep


@pytest.mark.slow
@pytest.mark.parametrize("kw, nproc", [
    (dict(tp=2, sp=True), 2), (dict(cp=2), 2), (dict(ep=2, dp=2, zero=0, **MOE), 2),
], ids=["tp2-sp", "cp2", "ep2-dp2"])
def test_bf16_layouts_train_and_report_their_recipe(kw, nproc, tmp_path, warm_run):
    """bf16 under autocast through the vocab-parallel loss, the CP gather and the EP all-to-all."""
    spec = _spec(precision="bf16", **kw)
    r = warm_run(spec, nproc, tmp_path, PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    assert r.losses[STEPS - 1] < r.losses[0], r.losses
    assert r.precision_recipe["bytes_per_param"] == 18 and r.precision_recipe["master_weights"] is True


@pytest.mark.slow
def test_moe_differs_from_dense(dense_reference, moe_reference):
    """The MoE really replaced the MLPs (otherwise the EP tests would compare dense with dense)."""
    assert moe_reference.losses[:STEPS] != pytest.approx(dense_reference.losses[:STEPS], rel=10 * LOSS_RTOL)
    assert moe_reference.memory_per_rank[0]["params_on_gpu"] > dense_reference.memory_per_rank[0]["params_on_gpu"]


@pytest.mark.parametrize("kw, world, fragment", [
    (dict(cp=2, tp=2), 4, "tp = pp = 1"),
    (dict(cp=3), 3, "divisible by 2 * cp"),
    (dict(cp=2), 3, "not divisible by cp"),
    (dict(ep=2, dp=2, zero=0), 2, "needs num_experts"),
    (dict(ep=2, dp=2, zero=3, **MOE), 2, "zero = 0"),
    (dict(ep=4, dp=2, zero=0, **MOE), 2, "must divide"),
    (dict(tp=2, **MOE), 2, "tp = 1"),
    (dict(num_experts=2, moe_top_k=3), 1, "moe_top_k"),
    (dict(recompute="selective-op", **MOE), 1, "covers dense layers only"),
])
def test_cp_ep_rules_name_the_problem(kw, world, fragment):
    with pytest.raises(LayoutError, match=fragment.replace("*", r"\*").replace("(", r"\(")):
        resolve_probe(_spec(**kw), world=world)


def test_defaults_are_the_dense_layout():
    layout, extent = resolve_probe(tiny_spec(tp=2), world=2)
    assert (extent.cp, extent.ep, extent.num_experts) == (1, 1, 0)
    assert extent.dp_impl(layout) == layout.dp_impl
    layout, extent = resolve_probe(_spec(cp=2, dp=2, zero=0), world=4)
    assert layout.dp_run == 2 and extent.dp_impl(layout) == "ddp"
    layout, extent = resolve_probe(_spec(cp=2), world=2)
    assert layout.dp_run == 1 and extent.dp_impl(layout) == "ddp"     # CP ranks still average gradients


def test_old_spec_dicts_still_load():
    from probes.result import ProbeSpec

    d = tiny_spec().to_dict()
    for k in ("cp", "ep", "num_experts", "moe_top_k", "profile"):
        d.pop(k)
    spec = ProbeSpec.from_dict(d)
    assert (spec.cp, spec.ep, spec.num_experts) == (1, 1, 0)
