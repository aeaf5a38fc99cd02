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


def test_multi_node_needs_an_endpoint(tmp_path, capsys):
    assert main(["--nproc-per-node", "2", "--nnodes", "2", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err
