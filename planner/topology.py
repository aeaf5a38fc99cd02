"""Where each TP/PP/DP group lands on the cluster, and the bandwidth its collectives see.

Rank order is Megatron's (megatron/mpu/initialize.py): TP innermost, then DP, then PP, so a
TP group is consecutive ranks (inside a node when TP <= GPUs per node), a DP group strides by
TP, a PP group strides by TP·DP. A group's collective is limited by its bottleneck: the GPU's
NVLink/PCIe port inside a node, or the node's NICs (all rails together) shared by every group
that crosses the node at the same time. Closed forms in the group's stride and size, so the
cost of a plan does not grow with the number of GPUs.

An NVLink domain larger than the node (GB200 NVL72: 72 GPUs over 18 trays of 4, joined by NVLink switch trays;
`ClusterSpec.nvlink_domain`) carries a group's collectives at the GPU's NVLink bandwidth even across trays, when the
group and its siblings lie inside domains: the whole job in one domain, or the block of consecutive ranks they fill
(stride x size) dividing the domain, so that no block straddles two racks. A group that leaves its domain is
priced as between nodes (the tray's NICs).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.constants import COLLECTIVE_LATENCY_S, HALF_BANDWIDTH_BYTES, LINK_EFFICIENCY
from planner.hardware import ClusterSpec

# Achievable link efficiency, the alpha-beta model's half-bandwidth message size and per-collective latency:
# fitted constants, in planner.constants (value, source, fitted on, checked on).


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """The link a communication group's collectives run over."""

    kind: str
    """intra | inter"""
    bus_bw_bytes_per_s: float
    """asymptotic per-GPU bus bandwidth this group's collective sees"""


class Topology:
    """Hosts of ``gpus_per_node`` GPUs behind an NVSwitch-like fabric, joined by a non-blocking network."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        intra_eff = 1.0 if cluster.intra_node_bw_measured else LINK_EFFICIENCY
        inter_eff = 1.0 if cluster.inter_node_bw_measured else LINK_EFFICIENCY
        self._intra = cluster.intra_node_bw_bytes_per_s * intra_eff
        self._gpu_port_inter = cluster.intra_node_bw_bytes_per_s * inter_eff
        self._nic = cluster.inter_node_bw_bytes_per_s * inter_eff
        self.domain = cluster.domain_gpus
        """GPUs on one NVLink fabric: the node, or the NVLink domain spanning nodes (GB200 NVL72)"""
        self._strided: dict[tuple[int, int], Link] = {}
        """`strided_link` by (stride, size): a plan asks for a few dozen, tens of thousands of times"""

    def strided_link(self, stride: int, size: int) -> Link:
        """The link of the group of ranks {0, stride, 2·stride, ...} (``size`` of them), while every
        GPU of a node is in some such group and communicates at the same time."""
        link = self._strided.get((stride, size))
        if link is None:
            link = self._strided[stride, size] = self._strided_link(stride, size)
        return link

    def in_domain(self, stride: int, size: int) -> bool:
        """Whether the group {0, stride, ..., (size-1)·stride} and its siblings each lie inside one NVLink domain
        that spans nodes (GB200 NVL72): the job fits one domain, or their block of stride·size consecutive ranks
        divides the domain (Megatron's rank order places blocks back to back; a block that does not divide 72 would
        straddle two racks somewhere). False where the node is the domain (the node rule applies)."""
        if self.domain <= self.cluster.gpus_per_node:
            return False
        if size <= 1 or self.cluster.world_size <= self.domain:
            return True
        block = stride * size
        return block <= self.domain and self.domain % block == 0

    def _strided_link(self, stride: int, size: int) -> Link:
        gpn = self.cluster.gpus_per_node
        if size <= 1 or (size - 1) * stride < gpn or self.in_domain(stride, size):
            return Link(kind="intra", bus_bw_bytes_per_s=self._intra)
        # members of this group on one node; the node's GPUs form gpn / members such groups, each
        # crossing the node's NICs once in a ring (a group leaving its NVLink domain: as between nodes, each tray's
        # ring crossing on that tray's NICs; NCCL's rings across racks are not credited with the rack's NICs)
        members = min(size, -(-gpn // stride)) if stride < gpn else 1
        concurrent = max(1, gpn // members)
        return Link(kind="inter", bus_bw_bytes_per_s=min(self._gpu_port_inter, self._nic / concurrent))

    # -- Megatron's groups for a layout ------------------------------------------------------------
    def tp_link(self, tp: int) -> Link:
        """TP groups are consecutive ranks: inside a node when TP divides the node's GPUs; otherwise (TP 3, 6 on
        8-GPU nodes) some groups straddle two nodes, and every layer waits for their all-reduces on the network."""
        gpn = self.cluster.gpus_per_node
        if tp <= 1 or (tp <= gpn and gpn % tp == 0) or self.in_domain(1, tp):   # NVL72: TP across trays on NVLink
            return Link(kind="intra", bus_bw_bytes_per_s=self._intra)
        return Link(kind="inter", bus_bw_bytes_per_s=min(self._gpu_port_inter, self._nic))

    def dp_link(self, tp: int, dp: int) -> Link:
        return self.strided_link(tp, dp)

    def pp_link(self, tp: int, dp: int, pp: int) -> Link:
        """The link between consecutive stages; every GPU of a stage sends at once."""
        gpn = self.cluster.gpus_per_node
        if pp <= 1 or tp * dp < gpn or self.in_domain(tp * dp, pp):
            return Link(kind="intra", bus_bw_bytes_per_s=self._intra)
        concurrent = min(gpn, tp * dp)
        return Link(kind="inter", bus_bw_bytes_per_s=min(self._gpu_port_inter, self._nic / concurrent))

    def rail_link(self, link: Link) -> Link:
        """``link`` limited to one GPU's share of the node's NICs (every GPU on its own rail)."""
        share = self._nic / self.cluster.gpus_per_node
        return Link(kind=link.kind, bus_bw_bytes_per_s=min(link.bus_bw_bytes_per_s, share))


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
