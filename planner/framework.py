"""One home for what each training framework does differently at run time (the cost model reads it).

Frameworks (the `--framework` names): Megatron-LM (and Hagemann et al.'s Megatron-style trainer),
Megatron-DeepSpeed (Megatron layers under DeepSpeed's pipeline engine and ZeRO, BigScience), and
PyTorch FSDP (torchtitan, fms-fsdp, an eager Hugging Face model). DeepSpeed ZeRO-3 without model
parallelism is Megatron-DeepSpeed at zero=3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    name: str
    elementwise_traffic: float
    """element-wise HBM traffic relative to Megatron's fused kernels"""
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
    deepspeed_engine: bool = False
    """DeepSpeed's engine runs the step: blocking pipeline p2p and per-micro-batch gradient accumulation
    (planner.pipeline_engine)"""


# Megatron-DeepSpeed's pipeline engine (DeepSpeed runtime/pipe/engine.py, 2022) with TP > 1 sends activations
# partitioned over TP (is_pipe_partitioned = is_model_parallel: a meta tensor, the slice, an all-gather on the
# receiver, PartitionedTensor.from_meta's meta.tolist() device-to-host sync in the forward and in RecvGrad) but
# gradients whole (is_grad_partitioned = False). What the engine does at every TP (blocking p2p, gradient
# accumulation, BF16_Optimizer) is planner.pipeline_engine's.
DS_MICROBATCH_OVERHEAD_S = 0.0425
"""FITTED on the BLOOM tr11 dev tables (chronicles-prequel 02-20..24, all TP8: MBS sweeps at fixed PP/DP and the
PP 4-12 sweep), after planner.pipeline_engine's blocking p2p and fp16 gradient accumulation: the tr11 throughput
error is flat and lowest from 0.035 to 0.045 s (6.6-6.7%), every model shape's pick within 1% there, the spread of
predicted/measured inside a table 0.094-0.096 (it was 0.05 s before those terms). Inside that plateau 0.0425 s is
where tests/test_search_ei.py's property (ei never needs more probes than the plan's order on the dev tables and
their perturbed replays) also holds: at 0.035, 0.045 and 0.0475 s one replay of the hundred is one probe behind.
Only with TP > 1: seed 003's TP1 pipelines (1.3B, PP 2-8, up to 519 micro-batch slots a step) leave no room for a
per-micro-batch cost at TP1 (planner.pipeline_engine), and the partitioned-activation path exists only with TP > 1"""

# Host time per layer forward. Eager Hugging Face blocks launch ~40 small kernels per layer forward
# (reshapes, splits, dropout, masks, adds), ~100 us each with Python and autograd: FITTED on the DeepSpeed
# autotuning HF GPT-2 dev tables (0.12B-1.5B on 16 V100, step times nearly flat in the micro-batch).
EAGER_HOST_S = 4e-3
# Megatron's fused layer launches a third as many: a third of the eager figure (by the same count).
MEGATRON_HOST_S = EAGER_HOST_S / 3

# DeepSpeed ZeRO-1/2 under its pipeline engine (runtime/zero/stage_1_and_2.py, 2022): the gradients
# are all-reduced in buckets (reduce_gradients(pipeline_parallel=True) -> buffered all-reduce), then
# the updated 16-bit parameters all-gathered (all_gather_dp_groups): 1.5x one all-reduce's bytes.
DS_ZERO12_TRAFFIC = 1.5
DS_DP_INTER_NODE_EFFICIENCY = 0.5
"""FITTED on the BLOOM tr11 dev tables (the PP 4-12 sweep at TP8: shallow pipelines, larger DP
reductions across nodes, measured slower than predicted; the issue saw 5-15x the predicted DP time),
bucket-by-bucket synchronous reductions over 48 nodes; with it all 9 tr11 model shapes pick within 1%"""

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework(name="megatron-lm", elementwise_traffic=1.0, p2p_activation_split=True, p2p_grad_split=True,
              microbatch_overhead_s=0.0, host_s_per_layer_forward=MEGATRON_HOST_S, pads_vocab=True,
              zero12_traffic=1.0, dp_inter_node_efficiency=1.0, balances_stages=False, sharded_gather_per_rail=False, source="Narayanan et al. 2021 Sec. 4.1 (scatter/gather p2p), megatron/tokenizer "
                     "_vocab_size_with_padding (--make-vocab-size-divisible-by 128, times TP)"),
    Framework(name="megatron-deepspeed", elementwise_traffic=1.0, p2p_activation_split=True, p2p_grad_split=False,
              microbatch_overhead_s=DS_MICROBATCH_OVERHEAD_S, host_s_per_layer_forward=MEGATRON_HOST_S,
              pads_vocab=True, zero12_traffic=DS_ZERO12_TRAFFIC, dp_inter_node_efficiency=DS_DP_INTER_NODE_EFFICIENCY,
              balances_stages=True, sharded_gather_per_rail=True, deepspeed_engine=True,
              source="DeepSpeed runtime/pipe/engine.py (is_grad_partitioned = False); PipelineModule "
                     "partition_method 'type:transformer' (the fork's default, which plan's command keeps; BLOOM's "
                     "run set 'type:transformer|embedding'); Megatron vocab padding; "
                     "ZeRO-3 gathers per rail FITTED on Narayanan 2021 Table 2 ZeRO-3 rows"),
    # an eager PyTorch model (seed 002 trains a Hugging Face Llama under FSDP) runs RMSNorm, RoPE and
    # SwiGLU as several unfused kernels each, reading and writing the activations about twice as often as
    # Megatron's fused kernels: elementwise_traffic 2.0 set by hand, checked on the torchtitan, fms-fsdp
    # and DeepSpeed autotuning HF GPT-2 dev tables (tests/bench/validate.py)
    Framework(name="fsdp", elementwise_traffic=2.0, p2p_activation_split=False, p2p_grad_split=False,
              microbatch_overhead_s=0.0, host_s_per_layer_forward=EAGER_HOST_S, pads_vocab=False,
              zero12_traffic=1.0, dp_inter_node_efficiency=1.0, balances_stages=False, sharded_gather_per_rail=False, source="PyTorch FSDP / torchtitan / Hugging Face eager modules (seed 002)"),
)}


def get_framework(name: str) -> Framework:
    return FRAMEWORKS[name]


# Megatron's --make-vocab-size-divisible-by default (megatron/arguments.py), multiplied by TP.
VOCAB_DIVISOR = 128


def padded_vocab(vocab: int, tp: int, fw: Framework) -> int:
    """The vocabulary the LM head computes: Megatron pads to a multiple of 128·TP."""
    if not fw.pads_vocab:
        return vocab
    step = VOCAB_DIVISOR * tp
    return math.ceil(vocab / step) * step
