"""The cluster as a graph, where each TP/PP/DP group lands, and the bandwidth its collectives see.

Rank order is Megatron's (megatron/mpu/initialize.py): TP innermost, then DP, then PP, so a
TP group is consecutive ranks (inside a node when TP <= GPUs per node), a DP group strides by
TP, a PP group strides by TP·DP. A group's collective is limited by its bottleneck edge: the
GPU's NVLink/PCIe port inside a node, or the node's NIC shared by every group that crosses it
at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from planner.hardware import ClusterSpec

# Achievable fraction of link bandwidth for NCCL collectives at large message sizes: nccl-tests
# all_reduce busbw on DGX A100 reaches ~230 of 300 GB/s NVLink (NVIDIA nccl-tests PERFORMANCE.md).
LINK_EFFICIENCY = 0.75
# Message size at which a ring collective reaches half its asymptotic bus bandwidth (nccl-tests
# all_reduce curves on NVLink and InfiniBand reach half their plateau around 4-8 MB): the
# pipelining term of an alpha-beta model. Point-to-point sends have no ring to fill.
HALF_BANDWIDTH_BYTES = {"intra": 8e6, "inter": 8e6}
COLLECTIVE_LATENCY_S = {"intra": 20e-6, "inter": 40e-6}


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    kind: str
    """intra | inter"""
    bus_bw_bytes_per_s: float
    """asymptotic per-GPU bus bandwidth this group's collective sees"""


class Topology:
    """Hosts with GPUs behind an NVSwitch-like fabric, hosts joined by one non-blocking switch."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        g = nx.Graph()
        g.add_node("switch")
        for node in range(cluster.nodes):
            host = ("host", node)
            g.add_edge(host, "switch", capacity=cluster.inter_node_bw_bytes_per_s)
            for local in range(cluster.gpus_per_node):
                g.add_edge(("gpu", node * cluster.gpus_per_node + local), host,
                           capacity=cluster.intra_node_bw_bytes_per_s)
        self.graph = g
        self._cache = lru_cache(maxsize=4096)(self._group_link)

    def host_of(self, rank: int) -> int:
        return rank // self.cluster.gpus_per_node

    def group_link(self, ranks: tuple[int, ...], concurrent_groups_per_host: int) -> Link:
        return self._cache(ranks, concurrent_groups_per_host)

    def _group_link(self, ranks: tuple[int, ...], concurrent_groups_per_host: int) -> Link:
        hosts = {self.host_of(r) for r in ranks}
        gpu_edge = self.graph.edges[("gpu", ranks[0]), ("host", self.host_of(ranks[0]))]["capacity"]
        if len(hosts) == 1:
            return Link(kind="intra", bus_bw_bytes_per_s=gpu_edge * LINK_EFFICIENCY)
        # a ring leaves and enters each host once; every concurrent group crossing the host shares its NIC
        nic = min(self.graph.edges[("host", h), "switch"]["capacity"] for h in hosts)
        share = nic / max(1, concurrent_groups_per_host)
        return Link(kind="inter", bus_bw_bytes_per_s=min(gpu_edge, share) * LINK_EFFICIENCY)

    # -- Megatron's groups for a layout ------------------------------------------------------------
    def tp_link(self, tp: int) -> Link:
        return self.group_link(tuple(range(tp)), 1)

    def dp_link(self, tp: int, dp: int) -> Link:
        ranks = tuple(d * tp for d in range(dp))
        members_per_host = sum(1 for r in ranks if self.host_of(r) == 0)
        concurrent = max(1, self.cluster.gpus_per_node // max(1, members_per_host))
        return self.group_link(ranks, concurrent)

    def pp_link(self, tp: int, dp: int, pp: int) -> Link:
        """The link between consecutive stages; every GPU of a stage sends at once."""
        ranks = (0, tp * dp) if pp > 1 else (0,)
        concurrent = min(self.cluster.gpus_per_node, tp * dp)
        return self.group_link(ranks, concurrent)


def collective_time_s(link: Link, *, kind: str, message_bytes: float, group: int) -> float:
    """Ring collective time, alpha-beta: latency + traffic / effective bus bandwidth.

    Traffic per GPU as nccl-tests defines bus bandwidth (PERFORMANCE.md): all_reduce
    2(n-1)/n · S, all_gather / reduce_scatter (n-1)/n · S, p2p send S.
    """
    if group <= 1 or message_bytes <= 0:
        return 0.0
    factor = {"all_reduce": 2 * (group - 1) / group, "all_gather": (group - 1) / group,
              "reduce_scatter": (group - 1) / group, "send": 1.0}[kind]
    half = 0.0 if kind == "send" else HALF_BANDWIDTH_BYTES[link.kind]
    bw = link.bus_bw_bytes_per_s * message_bytes / (message_bytes + half)
    return COLLECTIVE_LATENCY_S[link.kind] + factor * message_bytes / bw
