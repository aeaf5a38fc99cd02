"""Every parallel layout trains the tiny GPT to the single-process losses (CPU, gloo, torchrun).

    python -m pytest tests/test_probes_parallel.py -q

Same seed, same global batch, same weights (each layer seeded by its index), fp32: a layout
whose losses match the one-process run to float tolerance really splits the model and the
batch (a layout that only replicated work would still match, so each test also checks the
layout that ran). The layouts run on warm workers (tune's default: one torchrun per world size,
shared with the other modules that use `warm_run`; a fresh model and process groups per probe), so
matching losses also show that nothing of one probe leaks into the next (nor of another module's).
All tests start processes: marked slow.
"""

from __future__ import annotations

import pytest

from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_spec
from planner.flops import hardware_flops_per_iteration, model_flops_per_iteration, tflops_per_gpu
from probes.layout import model_run, resolve_layout

pytest.importorskip("torch")
from probes.train import probe_recomputed  # noqa: E402  (needs torch)

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-5
STEPS = 4
"""warm-up 1 + timed 3: the loss series compared step by step"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm_run):
    """The one-process run: mbs 2, gas 4 (global batch 8), no recompute (on the warm pool of one process)."""
    result = warm_run(tiny_spec(mbs=2, gas=4), 1, tmp_path_factory.mktemp("ref"), PROBE_TIMEOUT_S)
    assert result.status == "ok", result.reason
    return result


LAYOUTS_2 = {
    "tp2": dict(tp=2, gas=4),
    "tp2-sp-selective": dict(tp=2, gas=4, sp=True, recompute="selective"),
    "tp2-sp-selective-op": dict(tp=2, gas=4, sp=True, recompute="selective-op"),
    "pp2-1f1b": dict(pp=2, gas=4),
    "pp2-gpipe-full": dict(pp=2, gas=4, recompute="full", pp_schedule="GPipe"),
    "pp2-interleaved": dict(pp=2, vpp=2, gas=4),
    "pp2-block1": dict(pp=2, gas=4, recompute="block-1"),   # Megatron's block method: 1 layer per stage re-run
    "pp2-selective-op": dict(pp=2, gas=4, recompute="selective-op"),   # torchtitan op-level SAC on every layer
    "dp2-ddp-gas2": dict(dp=2, gas=2, zero=0),
    "dp2-fsdp-zero3": dict(dp=2, gas=2, zero=3),
    "dp2-fsdp-zero1-full": dict(dp=2, gas=2, zero=1, recompute="full"),
    "dp2-fsdp-zero3-selective-op": dict(dp=2, gas=2, zero=3, recompute="selective-op"),
}
LAYOUTS_4 = {
    "tp2-dp2-fsdp-sp": dict(tp=2, dp=2, gas=2, zero=3, sp=True),
    "pp2-dp2": dict(pp=2, dp=2, gas=2, zero=0),
    "pp2-tp2": dict(pp=2, tp=2, gas=4),
}


def _check_against_reference(result, reference, spec, nproc):
    assert result.status == "ok", f"{result.status}: {result.reason}"
    assert result.world_size == nproc
    assert len(result.losses) >= STEPS
    assert result.losses[STEPS - 1] < result.losses[0], result.losses            # it learns
    assert result.losses[:STEPS] == pytest.approx(reference.losses[:STEPS], rel=LOSS_RTOL)
    if not result.extra.get("warm"):                  # warm workers end with their group (conftest.warm_run)
        assert not no_process_left(result)
    layout = resolve_layout(spec, world=nproc)
    assert result.extra["layout"]["dp_impl"] == layout.dp_impl
    m = model_run(spec, layout)
    gbs = layout.global_batch_run
    assert gbs == 8
    assert result.extra["model_flops_per_step"] == model_flops_per_iteration(m, gbs)
    assert result.extra["hardware_flops_per_step"] == hardware_flops_per_iteration(m, gbs, probe_recomputed(m, layout))
    assert result.model_tflops_per_device == pytest.approx(
        tflops_per_gpu(model_flops_per_iteration(m, gbs), result.step_time_median_s, nproc))
    assert len(result.peak_memory_bytes_per_rank) == nproc and min(result.peak_memory_bytes_per_rank) > 0
    assert result.memory_kind == "rss"


def test_reference_learns(reference):
    assert reference.losses[STEPS - 1] < reference.losses[0]
    assert reference.stable is True and reference.step_time_median_s > 0
    assert reference.samples_per_s == pytest.approx(8 / reference.step_time_median_s)
    assert reference.tokens_per_s == pytest.approx(8 * 32 / reference.step_time_median_s)


@pytest.mark.parametrize("name", list(LAYOUTS_2))
def test_two_process_layout_matches_single_process(name, reference, tmp_path, warm_run):
    kw = dict(LAYOUTS_2[name])
    schedule = kw.pop("pp_schedule", "1F1B")
    spec = tiny_spec(pp_schedule=schedule, **kw)
    result = warm_run(spec, 2, tmp_path, PROBE_TIMEOUT_S)     # the layouts share 2 warm workers (conftest.warm_run)
    _check_against_reference(result, reference, spec, 2)
    for f in ("command.json", "spec.json", "result.json", "rank0.stderr", "rank1.stdout"):
        assert (tmp_path / f).is_file(), f


@pytest.mark.parametrize("name", list(LAYOUTS_4))
def test_four_process_layout_matches_single_process(name, reference, tmp_path, warm_run):
    spec = tiny_spec(**LAYOUTS_4[name])
    result = warm_run(spec, 4, tmp_path, PROBE_TIMEOUT_S)
    _check_against_reference(result, reference, spec, 4)


def test_single_replica_is_reduced_and_projected(tmp_path, warm_run):
    """dp=4 probed as one TP=2 replica with half the layers: reduced, with a projection."""
    spec = tiny_spec(tp=2, dp=4, gas=2, layers_run=2)
    result = warm_run(spec, 2, tmp_path, PROBE_TIMEOUT_S)
    assert result.status == "ok", result.reason
    assert result.reduced is True
    p = result.projected
    assert p["step_time_s"] == pytest.approx(result.step_time_median_s * 4 / 2)
    assert p["world_size"] == 8 and p["global_batch"] == 2 * 4 * 2
    assert "layers" in p["note"]
