"""Calibration writes the YAML the planner reads (CPU, gloo, 2 processes).

    python -m pytest tests/test_probes_calibrate.py -q
"""

from __future__ import annotations

import pytest
import yaml

from planner.calibration import HOST_REFERENCE_S, apply_calibration, gemm_base_efficiency
from planner.hardware import make_cluster
from probes.calibrate import _bus_factor, main

pytest.importorskip("torch")


def test_bus_factors_are_nccl_tests():
    assert _bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert _bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert _bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)


@pytest.mark.slow
def test_calibrate_two_processes(tmp_path):
    out = tmp_path / "cal.yaml"
    assert main(["--nproc-per-node", "2", "--nnodes", "1", "--out", str(out)]) == 0
    d = yaml.safe_load(out.read_text())
    assert 0 < d["matmul_efficiency"] <= 1
    assert d["intra_node_busbw_gbps"] > 0 and d["cuda_context_bytes"] == 0
    assert "inter_node_busbw_gbps" not in d
    assert d["device"].startswith("cpu") and any("best measured" in n for n in d["notes"])
    ops = {r["op"] for r in d["measurements"]["collectives"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter"}
    for r in d["measurements"]["collectives"]:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _bus_factor(r["op"], 2))
    host = d["measurements"]["host_launch"]
    assert d["host_s_per_layer_forward"] > 0
    assert d["host_s_per_layer_forward"] == pytest.approx(host["forward_backward_s"] / host["layers"] / 3)
    cluster = apply_calibration(make_cluster(gpu="CPU", gpus=2, gpus_per_node=2), str(out))
    assert cluster.matmul_efficiency == pytest.approx(min(1.0, gemm_base_efficiency(cluster.gpu,
                                                                                     d["measurements"]["matmul"])))
    assert cluster.host_scale == pytest.approx(d["host_s_per_layer_forward"] / HOST_REFERENCE_S)
    assert cluster.intra_node_bw_bytes_per_s == pytest.approx(d["intra_node_busbw_gbps"] * 1e9 / 8)
    ew, att = d["measurements"]["elementwise"], d["measurements"]["attention"]
    assert ew["bytes_per_s"] > 0 and 0 < att["forward_s"] < att["forward_backward_s"]
    assert "elementwise_efficiency" not in d     # no catalog bandwidth on the CPU: the plan's is used when applied
    assert cluster.elementwise_efficiency == pytest.approx(min(1.0, ew["bytes_per_s"]
                                                               / cluster.gpu.memory_bw_bytes_per_s))
    assert cluster.attention_efficiency > 0


def test_multi_node_needs_an_endpoint(tmp_path, capsys):
    assert main(["--nproc-per-node", "2", "--nnodes", "2", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_elementwise_and_attention_timings_calibrate_the_op_classes(tmp_path):
    """In this process: the add's bytes/s and SDPA's forward + backward time, written as tune calibrate writes them,
    give the CPU plan's element-wise fraction (bytes/s over the catalog's 10 GB/s, at most 1) and attention rate
    (the op list's FLOPs / seconds / the fp32 peak)."""
    import torch

    from planner.calibration import attention_flops
    from probes.calibrate import _attention_shape, _measure_attention, _measure_elementwise

    cpu = torch.device("cpu")
    ew = _measure_elementwise(torch, cpu, torch.float32)
    assert ew["bytes"] == 3 * 4 * ew["elements"] and ew["bytes_per_s"] == pytest.approx(ew["bytes"] / ew["seconds"])
    shape = _attention_shape("llama2-7b", None, "cpu")
    assert shape == {"heads": 4, "kv_heads": 4, "head_dim": 128, "seq_len": 512}
    gqa = _attention_shape("llama3-8b", 256, "cpu")
    assert gqa["heads"] == 4 and gqa["kv_heads"] == 1 and gqa["seq_len"] == 256
    att = _measure_attention(torch, cpu, torch.float32, gqa)
    assert 0 < att["forward_s"] < att["forward_backward_s"]
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"measurements": {"elementwise": ew, "attention": att}}))
    cluster = make_cluster(gpu="CPU", gpus=1, gpus_per_node=1)
    cal = apply_calibration(cluster, str(path))
    assert cal.elementwise_efficiency == pytest.approx(min(1.0, ew["bytes_per_s"] / cluster.gpu.memory_bw_bytes_per_s))
    assert cal.attention_efficiency == pytest.approx(
        attention_flops(1, 4, 256, gqa["head_dim"]) / att["forward_backward_s"] / cluster.gpu.peak_flops("fp32"))
