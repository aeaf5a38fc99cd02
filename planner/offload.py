"""Megatron-LM's CPU optimizer offload: a fraction of the optimizer on the host, in memory and in time.

``--optimizer-cpu-offload --optimizer-offload-fraction f`` (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py
``HybridDeviceOptimizer``; arguments.py asks ``--use-precision-aware-optimizer`` with it): the fp32 master weights and
Adam moments of a fraction f of the GPU's optimizer shard live in host memory; each step the main grads of that
fraction go to the host (D2H), a CPU Adam updates them, the updated weights come back (H2D), and
``--overlap-cpu-optimizer-d2h-h2d`` pipelines the three over the parameter groups, so the slowest of them sets the
time. What stays on the GPU is 1 - f of the optimizer bytes (`planner.memory.stage_states`) and of its HBM-bound step
(`planner.cost.optimizer_s`).

Datasheet facts (no fitted value):
- PCIe 5.0 x16 between a Hopper/Blackwell GPU and its host, 64 GB/s per direction (NVIDIA H100 datasheet: "PCIe Gen5
  128 GB/s" bidirectional; PCI-SIG 5.0: 32 GT/s x 16 lanes); PCIe 4.0 (A100, 64 GB/s bidirectional) half of it.
- Host memory per GPU: a DGX H100 has 2 Intel Xeon Platinum 8480C (DGX H100 user guide), 8 DDR5-4800 channels each
  (Intel ARK: 307 GB/s a socket), 614 GB/s for the node's 8 GPUs: 76.8 GB/s a GPU, all 8 stepping at once.
- CPU Adam is memory-bound: per parameter the fp32 weight read and written (8 bytes), the fp32 gradient read (4), both
  moments read and written (16): 28 bytes (the same count as the GPU step's, `planner.cost.optimizer_s`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.space import TrainingSpec

PCIE5_BYTES_PER_S = 64e9
"""one direction of PCIe 5.0 x16 (NVIDIA H100 datasheet: 128 GB/s bidirectional)"""
PCIE4_BYTES_PER_S = 32e9
"""one direction of PCIe 4.0 x16 (NVIDIA A100 datasheet: 64 GB/s bidirectional)"""
HOST_MEMORY_BYTES_PER_S_PER_GPU = 2 * 8 * 38.4e9 / 8
"""DGX H100: 2 sockets x 8 DDR5-4800 channels x 38.4 GB/s over 8 GPUs (76.8 GB/s a GPU)"""
CPU_ADAM_BYTES_PER_PARAM = 28
"""fp32 weight r/w 8, fp32 grad read 4, Adam m and v r/w 16"""
GRAD_D2H_BYTES = 4
"""the fp32 main grad copied to the host per parameter (HybridDeviceOptimizer keeps fp32 host grads)"""
PARAM_H2D_BYTES = 4
"""the fp32 updated weight copied back (param_update_in_fp32=True in megatron/core/optimizer/__init__.py)"""


def host_link_bytes_per_s(cluster: "ClusterSpec") -> float:
    """The GPU's PCIe link to its host, one direction: PCIe 4.0 on Ampere and older, else 5.0."""
    gen4 = ("A100", "A10", "A40", "V100", "T4", "L4", "RTX")
    return PCIE4_BYTES_PER_S if cluster.gpu.id.startswith(gen4) else PCIE5_BYTES_PER_S


def host_step_s(offloaded_params: float, cluster: "ClusterSpec") -> float:
    """Seconds of the offloaded share of the optimizer step: grads down, CPU Adam, weights up, pipelined (the slowest
    of the three)."""
    if offloaded_params <= 0:
        return 0.0
    link = host_link_bytes_per_s(cluster)
    return max(offloaded_params * GRAD_D2H_BYTES / link,
               offloaded_params * CPU_ADAM_BYTES_PER_PARAM / HOST_MEMORY_BYTES_PER_S_PER_GPU,
               offloaded_params * PARAM_H2D_BYTES / link)


def megatron_lm_args(training: "TrainingSpec") -> list[tuple[str, ...]]:
    """The flags (arguments.py: --optimizer-cpu-offload, --optimizer-offload-fraction, the precision-aware optimizer it
    asserts, --overlap-cpu-optimizer-d2h-h2d which `host_step_s` assumes)."""
    f = training.optimizer_offload
    if not f:
        return []
    return [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", f"{f:g}"),
            ("--use-precision-aware-optimizer",), ("--overlap-cpu-optimizer-d2h-h2d",)]


__all__ = ["host_link_bytes_per_s", "host_step_s", "megatron_lm_args"]
