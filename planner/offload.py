"""Megatron-LM's CPU offloads, in memory and in time: a fraction of the optimizer on the host, and module inputs.

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
- Host memory bandwidth per GPU: the catalog's ``host_memory_gb_per_s`` of the usual node over its GPUs
  (`host_memory_bw_per_gpu`); a DGX H100 has 2 Intel Xeon Platinum 8480C (DGX H100 user guide), 8 DDR5-4800 channels
  each (Intel ARK: 307 GB/s a socket), 614 GB/s for the node's 8 GPUs: 76.8 GB/s a GPU, all 8 stepping at once.
- CPU Adam is memory-bound: per parameter the fp32 weight read and written (8 bytes), the fp32 gradient read (4), both
  moments read and written (16): 28 bytes (the same count as the GPU step's, `planner.cost.optimizer_s`). The design
  is ZeRO-Offload's (Ren et al. 2021, Sec. 4-5: the optimizer states and step on the CPU, gradients down and weights
  up over PCIe, a vectorised CPU Adam overlapped with the copies chunk by chunk; DeepSpeed's tutorial: its CPU Adam
  5-7x PyTorch's), which Megatron's HybridDeviceOptimizer runs with torch's fused CPU Adam.
- Host memory taken: `HOST_BYTES_PER_OFFLOADED_PARAM` a parameter (`planner.memory.host_offload_bytes`), against the
  node's (the catalog's ``host_memory_gib``: `planner.rules.host_memory_violations`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.space import OFFLOAD_MODULES
from planner.terms import COMMUNICATION, Overlap, Term

if TYPE_CHECKING:
    from planner.hardware import ClusterSpec
    from planner.model import ModelSpec
    from planner.space import Candidate, TrainingSpec
    from planner.step_context import StepContext

ASSUMED_HOST = "H100-SXM"
"""the catalog entry whose node (DGX H100) a GPU without ``host_memory_gb_per_s`` is taken to sit in
(`host_memory_bw_per_gpu`)"""
CPU_ADAM_BYTES_PER_PARAM = 28
"""fp32 weight r/w 8, fp32 grad read 4, Adam m and v r/w 16"""
GRAD_D2H_BYTES = 4
"""the fp32 main grad copied to the host per parameter (HybridDeviceOptimizer keeps fp32 host grads)"""
PARAM_H2D_BYTES = 4
"""the fp32 updated weight copied back (param_update_in_fp32=True in megatron/core/optimizer/__init__.py)"""


HOST_BYTES_PER_OFFLOADED_PARAM = 18
"""host memory an offloaded parameter takes: its pinned 16-bit copy 2 (hybrid_optimizer.py _get_sub_optimizer_param_
groups: param.detach().clone().cpu().pin_memory()), the fp32 copy CPU Adam updates 4 (param_update_in_fp32), Adam's
fp32 moments 8, the pinned fp32 grad the D2H lands in 4 (cpu_copy_map_grad, pin_cpu_grads)"""
OPTIMIZER_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
"""the --optimizer-offload-fraction values `plan` tries, in this order, on a layout memory rules out
(`optimizer_searched`): the first that fits moves the fewest bytes to the host and adds the least CPU-Adam time (both
linear in the fraction: `host_step_s`)"""


def optimizer_fraction(cand: "Candidate", training: "TrainingSpec") -> float:
    """The share of the optimizer on the host: the layout's own (plan's search, --explain opt_offload=...), else the
    training's --optimizer-offload."""
    return cand.opt_offload or training.optimizer_offload


def optimizer_searched(model: "ModelSpec", training: "TrainingSpec") -> tuple[float, ...]:
    """The `OPTIMIZER_FRACTIONS` plan tries on a layout memory rules out: on Megatron-LM runs of Adam (the
    HybridDeviceOptimizer has a CPU Adam and a CPU SGD; the precision-aware optimizer it needs is Adam-only:
    optimizer_config.py) of MoE models, whose expert states are most of a GPU's memory (issue 33: the savers MoE runs
    use), when the user gave no --optimizer-offload (then that is every layout's). Dense models are not searched: the
    CPU Adam rate is a datasheet bound no run here has measured, and on a dense plan it would reorder the top rows
    (GPT-3 175B FP8 on 512 H100: the best would offload a quarter to three quarters of it); --optimizer-offload
    still plans it there. Not under 16-bit moments: Megatron's HybridDeviceOptimizer keeps them fp32
    (`planner.space.offload_moments_conflict`). Nor under --no-offload-search."""
    from planner import moe

    if not training.offload_search or training.framework != "megatron-lm" or training.optimizer != "adamw" \
            or training.optimizer_offload \
            or training.optimizer_state_dtype != "fp32" or not moe.is_moe(model):
        return ()
    return OPTIMIZER_FRACTIONS


def optimizer_searched_on(zero: int) -> bool:
    """Whether plan tries `optimizer_searched` on a layout: one with Megatron's distributed optimizer (ZeRO >= 1;
    optimizer_config.py: '--use-precision-aware-optimizer only supported with distributed optimizer', which
    --optimizer-cpu-offload asserts, arguments.py)."""
    return zero >= 1


def optimizer_searched_where(cluster: "ClusterSpec") -> bool:
    """Whether plan tries `optimizer_searched` on this cluster: where the catalog knows the node's host (its memory,
    which the host-memory rule checks the offload against, and its bandwidth, which prices CPU Adam); a workstation
    GPU's (RTX-4090, L40S) is not, and --optimizer-offload still plans it there."""
    return cluster.host_memory_bytes is not None and cluster.gpu.host_memory_bw_bytes_per_s is not None


def host_link_bytes_per_s(cluster: "ClusterSpec") -> float:
    """The GPU's link to its host, one direction: the catalog's ``host_link_gb_per_s`` (PCIe, or NVLink-C2C)."""
    return cluster.gpu.host_link_bw_bytes_per_s


def host_memory_bw_per_gpu(cluster: "ClusterSpec") -> float:
    """One GPU's share of its node's host memory bandwidth, all GPUs stepping at once: the catalog's usual node's
    (``host_memory_gb_per_s``) over its GPUs, else the `ASSUMED_HOST`'s (DGX H100: 614.4 GB/s over 8)."""
    acc = cluster.gpu
    if acc.host_memory_bw_bytes_per_s is None:
        from planner.hardware import catalog

        acc = catalog()[ASSUMED_HOST]
    return acc.host_memory_bw_bytes_per_s / acc.gpus_per_node


def host_step_s(offloaded_params: float, cluster: "ClusterSpec") -> float:
    """Seconds of the offloaded share of the optimizer step: grads down, CPU Adam, weights up, pipelined (the slowest
    of the three)."""
    if offloaded_params <= 0:
        return 0.0
    link = host_link_bytes_per_s(cluster)
    return max(offloaded_params * GRAD_D2H_BYTES / link,
               offloaded_params * CPU_ADAM_BYTES_PER_PARAM / host_memory_bw_per_gpu(cluster),
               offloaded_params * PARAM_H2D_BYTES / link)


def megatron_lm_args(training: "TrainingSpec") -> list[tuple[str, ...]]:
    """The flags (arguments.py: --optimizer-cpu-offload, --optimizer-offload-fraction, the precision-aware optimizer it
    asserts, --overlap-cpu-optimizer-d2h-h2d which `host_step_s` assumes). A layout's own fraction is the setup's
    training's by then (`planner.emit.setup.RunSetup` folds it in)."""
    f = training.optimizer_offload
    if not f:
        return []
    return [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", f"{f:g}"),
            ("--use-precision-aware-optimizer",), ("--overlap-cpu-optimizer-d2h-h2d",)]


# -- activation offload ----------------------------------------------------------------------------------------
ACTIVATION_MODULES = OFFLOAD_MODULES
"""Megatron-LM's --offload-modules (planner.space.OFFLOAD_MODULES)"""
SEARCHED_SETS = ("moe_act", "expert_fc1+moe_act", "attn_norm+mlp_norm+expert_fc1+moe_act",
                 "attn_norm+qkv_linear+core_attn+attn_proj+mlp_norm+expert_fc1+moe_act")
"""the module sets `plan` tries, in this order, on a MoE layout that does not fit without (`searched_sets`): each
offloads what the one before does and more, so the first that fits copies the fewest bytes over PCIe. The first two
are the expert inputs NVIDIA's Megatron-Core docs offload for MoE (fine_grained_activation_offload.md: expert_fc1,
moe_act), the third adds the two norms' inputs, the last every module Megatron offloads."""


def modules_of(cand: "Candidate", training: "TrainingSpec") -> tuple[str, ...]:
    """The modules whose inputs go to the host: the layout's own (plan's search, --explain offload=...), else the
    training's --activation-offload."""
    return tuple(cand.offload.split("+")) if cand.offload else training.activation_offload


def searched_sets(model: "ModelSpec", training: "TrainingSpec") -> tuple[str, ...]:
    """The `SEARCHED_SETS` plan tries on a layout memory rules out: on Megatron-LM MoE runs (whose expert inputs are
    most of a layer's activations) when the user gave no --activation-offload (then that is every layout's) nor
    --no-offload-search."""
    from planner import moe

    if not training.offload_search or training.framework != "megatron-lm" or training.activation_offload \
            or not moe.is_moe(model):
        return ()
    return SEARCHED_SETS


def searched_on(recompute: str, ep: int, etp: int, gpus_per_node: int) -> bool:
    """Whether plan tries `searched_sets` on a layout memory rules out: one that recomputes nothing (offload in place
    of recompute) and whose expert all-to-all stays inside a node (ETP x EP <= GPUs a node). Across nodes the
    all-to-all's GPUDirect RDMA crosses the same PCIe x16 link of the GPU as the copies (DGX H100: each GPU and its
    ConnectX-7 behind one PCIe switch, 50 of the link's 64 GB/s a direction at the NIC's line rate), which the
    copies' term does not count: not searched there, --activation-offload still plans it."""
    return recompute == "none" and etp * ep <= gpus_per_node
FP8_SAVED_INPUTS = ("qkv_linear", "attn_proj", "expert_fc1")
"""the linear layers whose saved input Transformer Engine keeps as its FP8 cast under FP8 (1 byte an element)"""


def activation_offload_bytes(model: "ModelSpec", cand: "Candidate", training: "TrainingSpec",
                             tokens: float) -> float:
    """Bytes of one mean layer's offloaded module inputs for ``tokens`` tokens on one GPU, 16-bit (the linear inputs
    FP8 under FP8): attn_norm and mlp_norm the layer's and the attention's residual output (h, split by SP),
    qkv_linear the norm output (h, by SP), core_attn Q, K and V (q + 2 kv widths, by TP), attn_proj the attention
    output (q width, by TP), expert_fc1 the permuted tokens (top-k x capacity copies of h, by SP), moe_act the
    experts' FC1 output (top-k x capacity x expert width, twice with SwiGLU, by TP), the last two on the MoE layers'
    share (planner.memory's own terms for these tensors)."""
    from planner import moe

    mods = modules_of(cand, training)
    if not mods:
        return 0.0
    h, t = model.hidden, cand.tp
    sp = t if cand.sp else 1
    width = {"attn_norm": h / sp, "qkv_linear": h / sp, "core_attn": (model.q_dim + 2 * model.kv_dim) / t,
             "attn_proj": model.q_dim / t, "mlp_norm": h / sp}
    if moe.is_moe(model):
        share, kc = moe.moe_layer_count(model) / model.layers, model.moe_topk * moe.capacity(training)
        width["expert_fc1"] = share * kc * h / sp
        width["moe_act"] = share * kc * (2 if model.glu else 1) * moe.expert_ffn(model) / t
    return sum(tokens * width.get(name, 0.0) * (1 if training.precision == "fp8" and name in FP8_SAVED_INPUTS else 2)
               for name in mods)


def offloaded_layers(lps: int, cand: "Candidate") -> int:
    """Layers of a rank whose offloaded inputs leave the GPU for one micro-batch: all but the last of each model chunk
    (megatron/core/pipeline_parallel/fine_grained_activation_offload.py: the last group of each name in a chunk is
    marked not offloadable, so its reload cannot stall the backward that needs it first)."""
    return max(0, lps - max(1, cand.vpp))


def activation_copy_s(nbytes: float, cluster: "ClusterSpec") -> float:
    """Seconds of ``nbytes`` to the host in the forward and back in the backward, each over the GPU's PCIe link
    (`host_link_bytes_per_s`, its own D2H / H2D stream); the terms machinery hides them under the compute."""
    return 2 * nbytes / host_link_bytes_per_s(cluster)


def activation_offload_term_s(ctx: "StepContext") -> float:
    """The term: one micro-batch's offloaded inputs on the busiest stage, to the host and back (`activation_copy_s`)."""
    t = ctx.training
    if not (ctx.cand.offload or t.activation_offload):
        return 0.0
    layers = offloaded_layers(ctx.stage_layers, ctx.cand)
    return layers * activation_copy_s(activation_offload_bytes(ctx.model, ctx.cand, t, ctx.tokens), ctx.cluster)


def activation_offload_overlap(ctx: "StepContext") -> Overlap | None:
    """The copies run on their own D2H / H2D streams beside the micro-batch's forward and backward (fine_grained_
    activation_offload.py PipelineOffloadManager: _d2h_stream, _h2d_stream; each reload launched a layer ahead):
    hidden up to that compute, only the excess exposed."""
    return Overlap(under="compute", window=1.0) if ctx.cand.offload or ctx.training.activation_offload else None


def optimizer_host_bytes(optimizer_bytes: float, fraction: float, pb_master_and_states: float) -> float:
    """Host bytes of a GPU's offloaded optimizer: ``optimizer_bytes`` (its shard's fp32 master weights and Adam
    moments on the GPU without the offload, ``pb_master_and_states`` bytes a parameter) times ``fraction``, as
    parameters, at `HOST_BYTES_PER_OFFLOADED_PARAM` each (the pinned copies and grads too)."""
    if fraction <= 0 or pb_master_and_states <= 0:
        return 0.0
    return fraction * optimizer_bytes / pb_master_and_states * HOST_BYTES_PER_OFFLOADED_PARAM


ACTIVATION_OFFLOAD = Term(name="activation_offload", kind=COMMUNICATION, group="compute_s", per_microbatch=True,
                          seconds=activation_offload_term_s, overlap=activation_offload_overlap,
                          hides_under="the micro-batch's forward and backward (own D2H / H2D streams)",
                          flag="Megatron --fine-grained-activation-offloading --offload-modules (--activation-offload, "
                               "or plan's offload=... on a MoE layout that fits only with it)",
                          source="Megatron-Core fine_grained_activation_offload.py: module inputs to pinned host "
                                 "memory and back over PCIe (datasheet rates)")


def activation_offload_args(training: "TrainingSpec") -> list[tuple[str, ...]]:
    """The flags (TransformerConfig fine_grained_activation_offloading, offload_modules). A layout's own offload is
    the setup's training's by then (`planner.emit.setup.RunSetup` folds it in)."""
    if not training.activation_offload:
        return []
    return [("--fine-grained-activation-offloading",), ("--offload-modules", *training.activation_offload)]


__all__ = ["ACTIVATION_MODULES", "ACTIVATION_OFFLOAD", "ASSUMED_HOST", "HOST_BYTES_PER_OFFLOADED_PARAM",
           "OPTIMIZER_FRACTIONS", "SEARCHED_SETS", "activation_copy_s", "activation_offload_args",
           "activation_offload_bytes", "host_link_bytes_per_s", "host_memory_bw_per_gpu", "host_step_s", "megatron_lm_args", "modules_of",
           "offloaded_layers", "optimizer_fraction", "optimizer_host_bytes", "optimizer_searched",
           "optimizer_searched_on", "optimizer_searched_where", "searched_on", "searched_sets"]
