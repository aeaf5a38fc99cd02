"""One home for what each training framework does differently at run time (the cost model reads it).

Frameworks (the `--framework` names): Megatron-LM (and Hagemann et al.'s Megatron-style trainer),
Megatron-DeepSpeed (Megatron layers under DeepSpeed's pipeline engine and ZeRO, BigScience), and
PyTorch FSDP (torchtitan, fms-fsdp, an eager Hugging Face model). DeepSpeed ZeRO-3 without model
parallelism is Megatron-DeepSpeed at zero=3 (the microsoft fork, whose PP=1 runs DeepSpeed's plain engine); an eager
(Hugging Face) model under DeepSpeed's engine is `deepspeed`, a framework published runs are read as (`plan` does
not offer it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.constants import DS_DP_INTER_NODE_EFFICIENCY, DS_MICROBATCH_OVERHEAD_S, EAGER_HOST_S, MEGATRON_HOST_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    """What a framework does that its costs depend on: kernel fusion, pipeline sends, host launch time, ZeRO."""

    name: str
    eager: bool
    """element-wise work as PyTorch ops, one kernel each (planner.ops.eager_elementwise_ops); False: Megatron's /
    Transformer Engine's fused kernels, or Inductor's (torch.compile)"""
    p2p_activation_split: bool
    """pipeline activations sent as 1/TP slices and all-gathered on the receiver"""
    p2p_grad_split: bool
    """pipeline activation gradients sent as 1/TP slices"""
    microbatch_overhead_s: float
    """cost per micro-batch and pipeline stage of the pipeline engine when activations are partitioned over TP"""
    host_s_per_layer_forward: float
    """host time to launch one layer's forward kernels (Python, autograd, launches); a layer's pass is
    host-bound when its GPU work is shorter"""
    pads_vocab: bool
    """the embedding is padded to a multiple of 128·TP"""
    zero12_traffic: float
    """ZeRO-1/2 data-parallel bytes relative to one gradient all-reduce"""
    dp_inter_node_efficiency: float
    """the data-parallel reduction's rate across nodes relative to the ring model"""
    balances_stages: bool
    """pipeline stages as DeepSpeed's PipelineModule partitions them: ceil(L/PP) layers each from the first, the
    last stage the rest plus the LM head (planner.pipeline_engine.deepspeed_stage_layers)"""
    sharded_gather_per_rail: bool
    """ZeRO-3 gathers reach one NIC's rate per GPU, not the node's aggregate"""
    source: str
    default_overlaps: tuple[str, ...] = ()
    """the `OVERLAPS` a run of this framework has unless told otherwise (what plantune's emitted run sets)"""
    deepspeed_engine: bool = False
    """DeepSpeed's engine runs the step: blocking pipeline p2p and per-micro-batch gradient accumulation
    (planner.pipeline_engine)"""
    foreach_optimizer: bool = False
    """the step is eager PyTorch's: torch.optim.AdamW's foreach kernels (one pass over the states an op) after
    clip_grad_norm_ (planner.cost.FOREACH_ADAMW_BYTES); False: a fused optimizer kernel (apex / Transformer Engine /
    DeepSpeed FusedAdam)"""


# Megatron-DeepSpeed's pipeline engine (DeepSpeed runtime/pipe/engine.py, 2022) with TP > 1 sends activations and
# their gradients partitioned over TP (is_pipe_partitioned = is_grad_partitioned = is_model_parallel: a meta tensor,
# the slice, an all-gather on the receiver, PartitionedTensor.from_meta's meta.tolist() device-to-host sync in the
# forward and in RecvGrad). Gradients went whole (is_grad_partitioned = False) until DeepSpeed e2fdd25 "Big science
# related changes (#1407)", 2021-09-29, first in v0.5.4: what BLOOM's tr11 (2022) and every later run have. What
# the engine does at every TP (blocking p2p, gradient accumulation, BF16_Optimizer) is planner.pipeline_engine's; its
# fixed cost per micro-batch and stage with TP > 1: DS_MICROBATCH_OVERHEAD_S (planner.constants).

# Host time per layer forward, eager (EAGER_HOST_S) and Megatron's fused layer (MEGATRON_HOST_S): planner.constants.

# DeepSpeed ZeRO-1/2 under its pipeline engine (runtime/zero/stage_1_and_2.py, 2022): the gradients
# are all-reduced in buckets (reduce_gradients(pipeline_parallel=True) -> buffered all-reduce), then
# the updated 16-bit parameters all-gathered (all_gather_dp_groups): 1.5x one all-reduce's bytes.
DS_ZERO12_TRAFFIC = 1.5
# its cross-node reduction rate: DS_DP_INTER_NODE_EFFICIENCY (planner.constants)

# Communication a run can overlap with compute (planner.cost's terms hide under compute when on), with the
# Megatron-LM flag that turns each on (megatron/training/arguments.py; --tp-comm-overlap is ModelParallelConfig's
# tp_comm_overlap, which needs --sequence-parallel). Megatron-Core / NeMo / Megatron-Bridge recipes run the first
# two and overlapped p2p (Megatron's default for the interleaved schedule); TP comm overlap needs Transformer
# Engine's userbuffers and is off unless asked for.
OVERLAPS = {"grad-reduce": "--overlap-grad-reduce", "param-gather": "--overlap-param-gather",
            "tp-comm": "--tp-comm-overlap", "p2p": "overlap_p2p_comm (default; --no-overlap-p2p-communication: off)",
            "ep-a2a": "--overlap-moe-expert-parallel-comm", "shared-expert": "--moe-shared-expert-overlap"}
MEGATRON_OVERLAPS = ("grad-reduce", "param-gather", "p2p")

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework(name="megatron-lm", eager=False, p2p_activation_split=True, p2p_grad_split=True,
              microbatch_overhead_s=0.0, host_s_per_layer_forward=MEGATRON_HOST_S, pads_vocab=True,
              zero12_traffic=1.0, dp_inter_node_efficiency=1.0, balances_stages=False, sharded_gather_per_rail=False,
              source="Narayanan et al. 2021 Sec. 4.1 (scatter/gather p2p), megatron/tokenizer "
                     "_vocab_size_with_padding (--make-vocab-size-divisible-by 128, times TP)",
              default_overlaps=MEGATRON_OVERLAPS),
    Framework(name="megatron-deepspeed", eager=False, p2p_activation_split=True, p2p_grad_split=True,
              microbatch_overhead_s=DS_MICROBATCH_OVERHEAD_S, host_s_per_layer_forward=MEGATRON_HOST_S,
              pads_vocab=True, zero12_traffic=DS_ZERO12_TRAFFIC, dp_inter_node_efficiency=DS_DP_INTER_NODE_EFFICIENCY,
              balances_stages=True, sharded_gather_per_rail=True, deepspeed_engine=True,
              source="DeepSpeed runtime/pipe/engine.py (is_pipe_partitioned, is_grad_partitioned: v0.5.4+); "
                     "PipelineModule "
                     "partition_method 'type:transformer' (the fork's default, which plan's command keeps; BLOOM's "
                     "run set 'type:transformer|embedding'); Megatron vocab padding; "
                     "ZeRO-3 gathers per rail: a FITTED choice on Narayanan 2021 Table 2 ZeRO-3 rows"),
    # DeepSpeed's own engine (deepspeed.initialize, ZeRO 0-3, no pipeline) on an eager PyTorch model: a Hugging Face
    # model under the Trainer's --deepspeed (DeepSpeedExamples autotuning/hf, transformers 4.12), data-parallel only.
    # The engine's traits are DeepSpeed's (gradient accumulation into the 16-bit grads at ZeRO 0-1; without the
    # pipeline engine ZeRO-1/2 reduce each gradient bucket to its partition's owner, then all-gather the updated
    # parameters: a reduce-scatter and an all-gather, one all-reduce's bytes, runtime/zero/stage_1_and_2.py
    # average_tensor), the model's are the eager model's (unfused element-wise ops, eager host launches, the vocabulary
    # unpadded). Read for published runs; plan neither offers nor emits it (planner.space.REPLAYED_FRAMEWORKS)
    Framework(name="deepspeed", eager=True, p2p_activation_split=False, p2p_grad_split=False,
              microbatch_overhead_s=0.0, host_s_per_layer_forward=EAGER_HOST_S, pads_vocab=False,
              zero12_traffic=1.0, dp_inter_node_efficiency=DS_DP_INTER_NODE_EFFICIENCY,
              balances_stages=False, sharded_gather_per_rail=True, deepspeed_engine=True,
              source="DeepSpeed runtime/engine.py (fp16 optimizer, ZeRO 1-3 without a PipelineModule); Hugging Face "
                     "transformers' eager modules (no vocabulary padding)"),
    # an eager PyTorch model (seed 002 trains a Hugging Face Llama under FSDP) runs RMSNorm, RoPE and
    # SwiGLU as several unfused kernels each (planner.ops.eager_elementwise_ops counts them)
    Framework(name="fsdp", eager=True, p2p_activation_split=False,
              p2p_grad_split=False,
              microbatch_overhead_s=0.0, host_s_per_layer_forward=EAGER_HOST_S, pads_vocab=False,
              zero12_traffic=1.0, dp_inter_node_efficiency=1.0, balances_stages=False, sharded_gather_per_rail=False,
              foreach_optimizer=True,   # torchtitan build_optimizers fused=False; fms-fsdp and HF's AdamW alike
              source="PyTorch FSDP / torchtitan / Hugging Face eager modules (seed 002)"),
)}


def get_framework(name: str) -> Framework:
    return FRAMEWORKS[name]


def overlaps(training: object) -> tuple[str, ...]:
    """The overlaps the training runs with: its own ``overlap`` list, else its framework's defaults."""
    chosen = getattr(training, "overlap", None)
    return chosen if chosen is not None else FRAMEWORKS[training.framework].default_overlaps  # type: ignore


TORCHTITAN_VERSIONS = ("0.3.0", "0.2.2")
"""the torchtitan releases `plan --emit fsdp` writes for: 0.3.0 (PyPI's current, a Python config module,
planner.emit.torchtitan_py; the default) or 0.2.2 (the last with TOML configs, planner.emit.fsdp). Here, not in
planner.emit, so that `plan`'s parser names them without importing the emitters."""


# Megatron's --make-vocab-size-divisible-by default (megatron/arguments.py), multiplied by TP.
VOCAB_DIVISOR = 128


def padded_vocab(vocab: int, tp: int, fw: Framework) -> int:
    """The vocabulary the LM head computes: Megatron pads to a multiple of 128·TP."""
    if not fw.pads_vocab:
        return vocab
    step = VOCAB_DIVISOR * tp
    return math.ceil(vocab / step) * step
