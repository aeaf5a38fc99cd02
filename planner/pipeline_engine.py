"""What DeepSpeed's engine does per micro-batch and pipeline stage besides the layers (Megatron-DeepSpeed's runtime).

Small pure functions the cost model (planner.cost) adds to a stage's micro-batch slot; every constant in CONSTANTS
with its unit, source and what (if anything) it was fitted on. Read from microsoft/DeepSpeed as BigScience ran it
(v0.5-0.6, 2022: runtime/pipe/schedule.py, p2p.py, engine.py, bf16_optimizer.py, zero/stage2.py) and
bigscience-workshop/Megatron-DeepSpeed (megatron/model/gpt_model.py GPTModelPipe).

Per micro-batch and stage the pipeline engine (TrainSchedule: 2·(m + p - 1) lock-step steps, a forward or a backward
each) runs: the exchanges of the step (forward step: SendGrad of the previous micro-batch, RecvActivation; backward
step: RecvGrad, SendActivation), each a blocking ``dist.send``/``dist.recv`` (p2p.py asserts ``async_op == False``),
so a middle stage sends and receives every activation and every gradient one after the other; LoadMicroBatch on the
first and last stages; the forward, whose ``tput_timer.start()`` calls ``torch.cuda.synchronize()`` (utils/timer.py
ThroughputTimer, every stage and micro-batch); with TP > 1 the partitioned activation's meta (``.tolist()``: a
device-to-host sync) and its all-gather, in the forward and again in RecvGrad; the backward; then the gradient
accumulation: autograd adds each micro-batch's 16-bit weight gradients into ``param.grad`` (fp16, ZeRO-1 in
zero/stage2.py: no hooks at stage 1), and under bf16 ``BF16_Optimizer.update_hp_grads`` (called by the pipe engine
after every backward) casts every bf16 gradient to fp32 and adds it into the fp32 gradient, a pass over all the
stage's parameters per micro-batch.

What the dev tables and seeds say of the host-side part (synchronize, instruction dispatch, meta): seed 003's TP1
pipelines (1.3B, PP 2-8, up to 519 micro-batch slots a step) leave under ~1-2 ms per micro-batch and stage to it
(their PP8 rows are predicted 1.5% further from the measurement than PP1 without it), and it does not grow with the
model: it is host time, not GPU work. The gradient accumulation does grow with the stage's parameters: it is the
part of the per-micro-batch cost a BLOOM-scale TP1-2 pipeline pays and seed 003 does not see.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Constant:
    value: float
    unit: str
    source: str
    fitted_on: str = "not fitted"


CONSTANTS: dict[str, Constant] = {
    # torch AccumulateGrad: `variable.grad += new_grad` in place for every micro-batch after the first (read the
    # 16-bit grad and the new one, write the sum); the new grad itself is the wgrad GEMM's output (its time)
    "fp16_accumulate_bytes_per_param": Constant(
        6.0, "bytes per parameter per micro-batch",
        "torch/csrc/autograd/functions/accumulate_grad.h (in-place add); DeepSpeed zero/stage2.py (ZeRO-1 without "
        "overlap_comm registers no gradient hooks, 16-bit grads accumulate in param.grad)"),
    # BF16_Optimizer.update_hp_grads: hp_grad.add_(lp.grad.to(fp32)): the cast reads 2 and writes 4, the add reads
    # 4 + 4 and writes 4 (two kernels); clear_lp_grads() before each backward, so it runs for every micro-batch
    "bf16_accumulate_bytes_per_param": Constant(
        0.0, "bytes per parameter per micro-batch",
        "DeepSpeed runtime/bf16_optimizer.py update_hp_grads; runtime/pipe/engine.py _exec_backward_pass "
        "(clear_lp_grads, then update_hp_grads(clear_lp_grads=False) after every backward; the last stage via "
        "BF16_Optimizer.backward)"),
    # a middle stage's blocking send and receive of the same message run one after the other: each activation and
    # each gradient crosses its link twice on the stage's timeline (received, then sent on), an end stage once
    "blocking_transfers_middle_stage": Constant(
        2.0, "transfers per message per micro-batch",
        "DeepSpeed runtime/pipe/schedule.py TrainSchedule.steps (SendGrad+RecvActivation, RecvGrad+SendActivation), "
        "p2p.py send/recv (blocking only); a step-by-step simulation of that schedule gives (m + p - 1) slots of "
        "F + B + 4 transfers for p > 2 and of F + B + 2 for p = 2"),
}


@dataclass(frozen=True, slots=True)
class StageLayers:
    """Transformer layers per pipeline stage as DeepSpeed's PipelineModule partitions them (the bigscience fork's
    default ``partition_method='type:transformer'``, which `plan`'s command keeps): ``partition_balanced`` over
    one unit per transformer layer fills each stage up to ceil(L/PP) from the first, so the last stage gets the
    rest and trailing stages can get none; the embedding sits on the first stage, the LM head on the last."""

    full: int
    """layers on every stage but the last"""
    last: int
    """layers on the last stage (it also runs the LM head and the loss)"""
    empty: int
    """stages left without a layer: the fork fails on them (gpt_model.py: 'the current implementation of PP fails
    unless each stage has at least one transformer layer')"""


def deepspeed_stage_layers(layers: int, pp: int) -> StageLayers:
    """DeepSpeed runtime/utils.py partition_balanced (binary search on the heaviest stage, then _lprobe's greedy
    fill) with unit weights: checked against that function for L 70-84 on PP 6-48 (70/24: 3 x 23 + 1; 84/48: 42
    stages of 2, 6 empty)."""
    full = -(-layers // pp)
    used = -(-layers // full)
    return StageLayers(full=full, last=layers - (used - 1) * full if used == pp else 0, empty=pp - used)


def stage_compute_s(layers: int, pp: int, layer_s: float, head_s: float) -> tuple[float, int]:
    """(slowest stage's compute per micro-batch, layers on the busiest stage) under DeepSpeed's partition."""
    split = deepspeed_stage_layers(layers, pp)
    return max(split.full * layer_s, split.last * layer_s + head_s), split.full


def grad_accumulation_s(params_on_gpu: float, precision: str, bytes_per_s: float) -> float:
    """One micro-batch's gradient accumulation on a stage holding ``params_on_gpu`` parameters (DeepSpeed's engine,
    ZeRO 0-1: ZeRO-2/3 reduce their gradients instead), memory-bound at ``bytes_per_s``."""
    if precision == "bf16":
        per_param = CONSTANTS["bf16_accumulate_bytes_per_param"].value
    elif precision == "fp16":
        per_param = CONSTANTS["fp16_accumulate_bytes_per_param"].value
    else:   # fp32 (and any other precision): autograd's in-place add of 4-byte grads
        per_param = 2 * CONSTANTS["fp16_accumulate_bytes_per_param"].value
    return per_param * params_on_gpu / bytes_per_s


def p2p_serialization(pp: int) -> float:
    """How many times a stage's timeline carries each p2p message under DeepSpeed's blocking schedule."""
    return CONSTANTS["blocking_transfers_middle_stage"].value if pp > 2 else 1.0


__all__ = ["CONSTANTS", "Constant", "StageLayers", "deepspeed_stage_layers", "grad_accumulation_s", "p2p_serialization",
           "stage_compute_s"]
