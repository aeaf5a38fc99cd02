"""The profiled step's compute / communication split (torch.profiler), for tune to refit terms.

    python -m pytest tests/test_probes_profile.py -q
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from conftest_probes import PROBE_TIMEOUT_S, tiny_spec
from probes.extent import ProbeExtent, resolve_probe

torch = pytest.importorskip("torch")
from probes.train import _comm_kind, attribute_comm, run_probe  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("gloo:all_reduce", "all_reduce"), ("gloo:all_gather", "all_gather"), ("gloo:reduce_scatter", "reduce_scatter"),
    ("gloo:send", "send_recv"), ("gloo:recv", "send_recv"), ("gloo:all_to_all", "all_to_all"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"), ("ncclDevKernel_SendRecv", "send_recv"),
    ("aten::mm", None), ("sm90_xmma_gemm_bf16bf16_bf16f32", None),
])
def test_events_are_named_by_collective(name, kind):
    assert _comm_kind(name) == kind


def test_collectives_are_given_to_the_only_dimension_that_runs_them():
    tp2, _ = resolve_probe(tiny_spec(tp=2), world=2)
    assert attribute_comm({"all_reduce": 1.0, "send_recv": 0.5}, tp2, ProbeExtent()) == {"tp": 1.0, "pp": 0.5}
    tp2dp2, _ = resolve_probe(tiny_spec(tp=2, dp=2, zero=3), world=4)
    assert attribute_comm({"all_gather": 2.0}, tp2dp2, ProbeExtent()) == {"tp_dp_cp": 2.0}
    cp2, ext = resolve_probe(replace(tiny_spec(), cp=2), world=2)
    assert attribute_comm({"all_gather": 1.0, "all_to_all": 3.0}, cp2, ext) == {"cp": 1.0, "ep": 3.0}


def test_one_process_profile_is_all_compute():
    spec = replace(tiny_spec(), profile=True)
    layout, ext = resolve_probe(spec, world=1)
    r = run_probe(spec, layout, 0, 1, torch.device("cpu"), time.time(), ext)
    split = r.timing_split
    assert split["step_s"] > 0 and 0 < split["compute_s"]
    assert split["comm_s_by_collective"] == {} and split["comm_s_by_dim"] == {}


@pytest.mark.slow
def test_tensor_parallel_profile_shows_tp_communication(tmp_path):
    from probes.launch import run_local

    spec = replace(tiny_spec(tp=2), profile=True)
    r = run_local(spec, nproc=2, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert r.status == "ok", r.reason
    split = r.timing_split
    assert split["comm_s_by_dim"].get("tp", 0) > 0, split
    assert split["compute_s"] > 0
