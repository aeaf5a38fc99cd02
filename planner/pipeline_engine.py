"""What DeepSpeed's engine does per micro-batch and pipeline stage besides the layers (Megatron-DeepSpeed's runtime).

Small pure functions the cost model (planner.cost) calls; every constant in CONSTANTS with its value, unit, source
and what it was fitted on. Read from microsoft/DeepSpeed as BigScience ran it (2022: runtime/pipe/schedule.py,
p2p.py, engine.py at 97f8a9e / 56c5223, bf16_optimizer.py, zero/stage2.py, runtime/utils.py) and
bigscience-workshop/Megatron-DeepSpeed (megatron/model/gpt_model.py GPTModelPipe).

Per micro-batch and stage the pipeline engine (TrainSchedule: 2·(m + p - 1) lock-step steps, a forward or a backward
each) runs the exchanges of the step (forward step: RecvActivation, then SendGrad of the previous micro-batch; backward
step: SendActivation of the previous micro-batch, then RecvGrad), each a blocking ``dist.send``/``dist.recv`` (p2p.py
refuses ``async_op``), so a middle stage receives and sends every activation and every gradient one after the other;
LoadMicroBatch on the first and last stages; the forward, whose ``tput_timer.start()`` calls
``torch.cuda.synchronize()`` (utils/timer.py ThroughputTimer, every stage and micro-batch); with TP > 1 the partitioned
activation's meta (``PartitionedTensor.from_meta``: ``meta.tolist()``, a device-to-host sync) and its all-gather, in
the forward and again in RecvGrad; the backward; then the gradients are accumulated: under fp16, autograd adds each
micro-batch's weight gradients into ``param.grad`` (ZeRO-1 in zero/stage2.py registers no hooks); under bf16,
BF16_Optimizer.update_hp_grads casts them to fp32 and adds them into its fp32 gradients.

What this module charges (each checked on the dev tables, `python tests/bench/validate.py`):
- the blocking p2p: each message twice on a middle stage's timeline, once on the first and last stages
  (`p2p_serialization`);
- the schedule over unequal stages (`engine_stages`, `pipeline_bubble_slots`): the slowest kind of stage (first,
  middle or last, each with its layers and parameters; the LM head on the last) sets the slots, and the bubble is
  one pass of every stage, not (p - 1) slots of the slowest (tests/bench/ds_pipe_schedule.py simulates
  TrainSchedule step by step: within 1% of the step on BLOOM-176B, the tr11 and seed 003 pipelines, the p2p
  charged as above);
- the fp16 gradient accumulation, a pass over the stage's parameters per micro-batch (`grad_accumulation_s`): it
  grows with the parameters a GPU holds, so BLOOM-scale TP1-2 pipelines pay it and seed 003's 1.3B ones barely;
- BF16_Optimizer's fp32 reductions (`bf16_optimizer_dp_traffic`, `reduce_bytes`);
- DeepSpeed's layer partition (`deepspeed_stage_layers`).
What it does not charge, and why:
- the host-side work (synchronize, instruction dispatch, meta): seed 003's TP1 pipelines (PP 2-8, up to 519
  micro-batch slots a step) leave no room for it (with this module's terms the 16 GB table's TP1 PP8 MBS1 row is
  predicted at 0.99 of its measurement, the PP1 row at 1.00; without them 1.05 and 1.03: ~1 ms per slot), and host
  time does not grow with the model. The partitioned-activation path (TP > 1) is
  `planner.constants.DS_MICROBATCH_OVERHEAD_S`, fitted on the TP8 tr11 tables.
- BF16_Optimizer.update_hp_grads per micro-batch (cast 2 -> 4 bytes, then add 4 + 4 -> 4: 18 bytes per parameter):
  with it BLOOM's own run (TP4 PP12 MBS2, 104.7 s logged) is predicted 116.7 s, 11% slow, past the measured
  ranking error, and the bf16 sheets of Hagemann et al. (converted as Megatron-DeepSpeed, not run by DeepSpeed's
  engine) show no per-micro-batch gradient pass at all; no dev table has a bigscience-fork bf16 run to fit it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.space import TrainingSpec


@dataclass(frozen=True, slots=True)
class Constant:
    """A pipeline-engine cost constant, with the source it is read from."""

    value: float
    unit: str
    source: str
    fitted_on: str = "not fitted: read from the source"


CONSTANTS: dict[str, Constant] = {
    # torch AccumulateGrad adds each micro-batch's new gradient into param.grad in place (reads both, writes one);
    # the new gradient itself is the weight-gradient GEMM's output (its time). 2 bytes each under fp16.
    "fp16_accumulate_bytes_per_param": Constant(
        6.0, "bytes per parameter per micro-batch",
        "torch/csrc/autograd/functions/accumulate_grad.h (in-place add); DeepSpeed zero/stage2.py (ZeRO-1 without "
        "overlap_comm registers no gradient hooks: 16-bit gradients accumulate in param.grad)"),
    "bf16_fp32_grad_bytes_per_param": Constant(
        4.0, "bytes per parameter: fp32 gradients, kept whole on every GPU, all-reduced over DP and tied stages",
        "DeepSpeed runtime/pipe/engine.py _bf16_reduce_grads (buffered all-reduce of BF16_Optimizer's fp32 "
        "gradients) and _exec_reduce_tied_grads (weight._hp_grad under bf16)"),
    "bf16_gather_share": Constant(
        0.5, "of one 16-bit all-reduce's bytes",
        "DeepSpeed runtime/bf16_optimizer.py step: all_gather_dp_groups of the updated 16-bit weights"),
    # each activation and each gradient crosses a middle stage's timeline twice (received, then sent on); an end
    # stage (PP 2) sends or receives each once
    "blocking_transfers_middle_stage": Constant(
        2.0, "transfers per message per micro-batch",
        "DeepSpeed runtime/pipe/schedule.py TrainSchedule.steps (RecvActivation+SendGrad, SendActivation+RecvGrad) "
        "and p2p.py (blocking send/recv); a step-by-step simulation of that schedule "
        "(tests/bench/ds_pipe_schedule.py): a middle stage's micro-batch carries 4 transfers, the first and last "
        "stages' 2"),
}


@dataclass(frozen=True, slots=True)
class StageLayers:
    """Transformer layers per stage as DeepSpeed's PipelineModule partitions them under the bigscience fork's default
    ``partition_method='type:transformer'`` (the one `plan`'s command keeps): one unit per transformer layer; the
    embedding sits on the first stage, the final norm, LM head and loss on the last."""

    full: int
    """layers on every stage but the last"""
    last: int
    """layers on the last stage"""
    empty: int
    """stages left without a layer, which the fork cannot run (gpt_model.py: 'the current implementation of PP fails
    unless each stage has at least one transformer layer')"""


def deepspeed_stage_layers(layers: int, pp: int) -> StageLayers:
    """runtime/utils.py partition_balanced with unit weights: the binary search finds ceil(L/PP) as the heaviest
    stage, then _lprobe fills the stages up to it from the first, so the last gets the rest and trailing stages can
    get none (70 layers on PP 24: 23 x 3 + 1; 84 on PP 48: 42 x 2, 6 empty; checked against that function)."""
    full = -(-layers // pp)
    used = -(-layers // full)
    return StageLayers(full=full, last=layers - (used - 1) * full if used == pp else 0, empty=pp - used)


def stage_compute_s(layers: int, pp: int, layer_s: float, head_s: float) -> tuple[float, int]:
    """(slowest stage's compute per micro-batch, layers on the busiest stage) under DeepSpeed's partition: every
    stage but the last runs ``full`` layers, the last its layers plus the LM head (``head_s``)."""
    return (max(st.compute_s(layer_s, head_s) for st in engine_stages(layers, pp)),
            deepspeed_stage_layers(layers, pp).full)


def runs_bf16_optimizer(training: TrainingSpec) -> bool:
    """DeepSpeed's BF16_Optimizer runs the step: the bigscience fork under bf16 (its JSON says ZeRO stage 0 there:
    planner.emit.megatron_deepspeed.json_zero_stage, tr11-176B-ml.slurm; DeepSpeed 2022 then wraps the optimizer in
    the ZeRO-1-like BF16_Optimizer)."""
    return training.framework == "megatron-deepspeed" and training.flavor == "bigscience" \
        and training.precision == "bf16"


def reduce_bytes(training: TrainingSpec, half: int) -> float:
    """Bytes per parameter of a gradient all-reduce: fp32 under BF16_Optimizer, else the training's ``half``."""
    return CONSTANTS["bf16_fp32_grad_bytes_per_param"].value if runs_bf16_optimizer(training) else half


def bf16_optimizer_dp_traffic(training: TrainingSpec) -> float | None:
    """Data-parallel bytes relative to one 16-bit gradient all-reduce under BF16_Optimizer (fp32 all-reduce: 2x, then
    the 16-bit weights all-gathered: 0.5x), whatever ZeRO stage the candidate names; None for every other step."""
    if not runs_bf16_optimizer(training):
        return None
    return CONSTANTS["bf16_fp32_grad_bytes_per_param"].value / 2 + CONSTANTS["bf16_gather_share"].value


def grad_accumulation_s(params_on_gpu: float, precision: str, bytes_per_s: float) -> float:
    """One micro-batch's gradient accumulation on a stage holding ``params_on_gpu`` parameters (DeepSpeed's engine at
    ZeRO 0-1), memory-bound at ``bytes_per_s``; every micro-batch is charged (the first one's gradient is kept as
    is, a 1/GAS over-count). bf16: not charged (module docstring)."""
    if precision == "bf16":
        return 0.0
    per_param = CONSTANTS["fp16_accumulate_bytes_per_param"].value * (2 if precision == "fp32" else 1)
    return per_param * params_on_gpu / bytes_per_s


def p2p_serialization(pp: int, kind: str = "middle") -> float:
    """How many times a stage's timeline carries each p2p message under DeepSpeed's blocking schedule: twice on a
    middle stage (received, then sent on), once on the first and last stages (tests/bench/ds_pipe_schedule.py)."""
    return CONSTANTS["blocking_transfers_middle_stage"].value if pp > 2 and kind == "middle" else 1.0


@dataclass(frozen=True, slots=True)
class EngineStage:
    """A kind of stage of DeepSpeed's pipeline, with what differs between them per micro-batch."""

    kind: str
    """first (the embedding), middle, last (the final norm, LM head and loss)"""
    count: int
    """stages of this kind"""
    layers: int

    def compute_s(self, layer_s: float, head_s: float) -> float:
        """One micro-batch's compute on a stage of this kind: its layers, and the LM head and loss on the last."""
        return self.layers * layer_s + (head_s if self.kind == "last" else 0.0)


def engine_stages(layers: int, pp: int) -> tuple[EngineStage, ...]:
    """The first, middle and last stages under DeepSpeed's partition (`deepspeed_stage_layers`; stages it leaves
    empty, which `planner.rules` refuses, counted as middle ones)."""
    split = deepspeed_stage_layers(layers, pp)
    middle = (EngineStage("middle", pp - 2, split.full),) if pp > 2 else ()
    return (EngineStage("first", 1, split.full), *middle, EngineStage("last", 1, split.last))


def pipeline_bubble_slots(slots: list[tuple[int, float]]) -> float:
    """The bubble in slots of the slowest stage, from (stages, one micro-batch's seconds) per kind of stage.

    TrainSchedule's blocking exchanges run a step's m micro-batches through p stages in (m - 1) slots of the slowest
    stage plus one pass of every stage: the first micro-batch's forward down and backward up fill the pipeline
    stage by stage, the last one's drain it (Narayanan et al. 2021 Sec. 2.2's (p - 1) slots when the stages are
    equal). Checked against a step-by-step simulation of DeepSpeed's schedule, tests/bench/ds_pipe_schedule.py:
    within 1% of the step on BLOOM-176B, the tr11 and seed 003 pipelines."""
    slowest = max(s for _, s in slots)
    return sum(n * s for n, s in slots) / slowest - 1 if slowest > 0 else sum(n for n, _ in slots) - 1


__all__ = ["CONSTANTS", "Constant", "EngineStage", "StageLayers", "bf16_optimizer_dp_traffic",
           "deepspeed_stage_layers", "engine_stages", "grad_accumulation_s", "p2p_serialization",
           "pipeline_bubble_slots", "reduce_bytes", "runs_bf16_optimizer", "stage_compute_s"]
