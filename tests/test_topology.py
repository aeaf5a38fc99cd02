"""Where groups land and the bandwidth they see: closed forms, the network as given, measurements as measured."""

from __future__ import annotations

import pytest

from planner.hardware import make_cluster, preset_cluster
from planner.topology import LINK_EFFICIENCY, Topology


def test_jean_zay_tp8_dp_groups_share_the_nodes_four_100g_nics():
    topo = Topology(preset_cluster("jean-zay-a100", gpus=384))
    assert topo.tp_link(8).kind == "intra"
    assert topo.tp_link(8).bus_bw_bytes_per_s == pytest.approx(300e9 * LINK_EFFICIENCY)
    # TP=8: a DP group has one GPU per node, and the node's 8 GPUs are in 8 DP groups at once
    dp = topo.dp_link(8, 4)
    assert dp.kind == "inter" and dp.bus_bw_bytes_per_s == pytest.approx(400e9 / 8 / 8 * LINK_EFFICIENCY)
    # TP=1: one DP ring holds all 8 GPUs of a node and crosses its NICs once
    assert topo.dp_link(1, 384).bus_bw_bytes_per_s == pytest.approx(400e9 / 8 * LINK_EFFICIENCY)
    # consecutive stages at TP8 x DP4 = 32 GPUs sit on different nodes; 8 GPUs of a node send at once
    assert topo.pp_link(8, 4, 12).bus_bw_bytes_per_s == pytest.approx(400e9 / 8 / 8 * LINK_EFFICIENCY)
    assert topo.pp_link(2, 2, 2).kind == "intra"


def test_the_largest_cluster_accepted_is_as_cheap_as_a_node():
    """10^6 GPUs (planner.schema.MAX_GPUS, the input bound): placement is closed-form, no graph of the cluster."""
    topo = Topology(make_cluster(gpu="H100-SXM", gpus=10**6))
    assert topo.dp_link(8, 10**6 // 8).kind == "inter"
    assert topo.strided_link(1, 4).kind == "intra"


def test_measured_bus_bandwidth_is_used_as_measured(tmp_path):
    from planner.calibration import apply_calibration

    cal = tmp_path / "cal.yaml"
    cal.write_text("intra_node_busbw_gbps: 1600\ninter_node_busbw_gbps: 160\n")
    cluster = apply_calibration(make_cluster(gpu="A100-80GB", gpus=64), str(cal))
    topo = Topology(cluster)
    assert topo.tp_link(8).bus_bw_bytes_per_s == pytest.approx(200e9)       # no second derate
    assert topo.dp_link(8, 8).bus_bw_bytes_per_s == pytest.approx(20e9)     # 160 Gb/s per GPU, measured
    assert "measured" in cluster.network_line()


def test_plan_prints_the_network_it_assumed_and_marks_ties(capsys):
    from planner.cli import main

    assert main(["--model", "176B", "--gpus", "384", "--cluster", "jean-zay-a100", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "network: 4 x 100 Gb/s NICs per node = 400 Gb/s" in out and "preset jean-zay-a100" in out
    table = out[out.index("Top 5"):out.index("~ : within")]
    ranks = [line.split()[0] for line in table.splitlines() if line[:1].isdigit()]
    assert ranks[0] == "1" and any(r.endswith("~") for r in ranks[1:])
    assert "~ : within 10% of the best" in out
