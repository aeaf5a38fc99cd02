"""DeepSeek's DualPipe pipeline schedule and its V-shaped half, DualPipeV: bubble, memory and what of the expert
all-to-all hides, as arithmetic over PP, VPP and the micro-batch count (no planner imports: a ground-floor module).

Sources:
- DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437) Sec. 3.2.1 and Table 2: DualPipe feeds
  micro-batches from both ends of the pipeline, each rank holding stage i and stage PP-1-i (2x the parameters), and
  runs the forward chunk of one micro-batch beside the backward chunk of another so that the expert all-to-all
  (dispatch and combine) and the PP sends of each hide under the other's compute. Table 2, with F a forward chunk,
  B a full backward chunk, W its weight-gradient part and F&B two mutually overlapped chunks:
      1F1B      bubble (PP-1)(F+B)            parameters 1x   activations PP
      ZB1P      bubble (PP-1)(F+B-2W)         parameters 1x   activations PP
      DualPipe  bubble (PP/2-1)(F&B+B-3W)     parameters 2x   activations PP+1
  PP and the micro-batch count even (deepseek-ai/DualPipe 3da1bbe, dualpipe/dualpipe.py DualPipe.step: "assert
  num_ranks % 2 == 0", "num_chunks % 2 == 0 and num_chunks >= num_ranks * 2").
- deepseek-ai/DualPipe README (same commit): DualPipeV, the "cut-in-half" V-shaped DualPipe (Sea AI Lab), runs the
  same PP stages on PP/2 devices, two a device (parameters 1x of a device's two stages, no copy), with the same bubble
  in stage units; torch.distributed.pipelining ScheduleDualPipeV (torch 2.9+, "exactly 2 stages per rank", "at least
  as many microbatches as stages"), which torchtitan runs as ``pipeline_parallel_schedule = "DualPipeV"`` and, with
  EP, overlaps the expert all-to-all (``pipeline_parallel_expert_parallel_overlap``, torchtitan
  distributed/dual_pipe_v.py; no activation checkpointing with it).

plantune's units: a *slot* is one micro-batch's forward and full backward on one rank (F + B of a rank's layers). The
chunk times are the planner's ratios (planner.fsdp_parallel.bubble_slots): the backward twice the forward and split
evenly between input and weight gradients (F = 1, B = 2, W = 1; B = 3 under full recompute, its re-run forward on
the input side); F&B = F + B, since the two overlapped chunks share the SMs (what F&B hides is their communication).
"""

from __future__ import annotations

DUALPIPE = "DualPipe"
"""DeepSeek's bidirectional schedule (its own HAI-LLM framework): PP ranks, one model chunk each (VPP 1)"""
DUALPIPE_V = "DualPipeV"
"""the V-shaped half: two stages a rank (VPP 2), torch.distributed.pipelining ScheduleDualPipeV (torchtitan)"""
SCHEDULES = (DUALPIPE, DUALPIPE_V)
EQUIVALENT = ("Megatron-LM's equivalent, with which NVIDIA runs DeepSeek-V3, is the EP all-to-all overlap of interleaved "
              "1F1B (--overlap ep-a2a with vpp > 1: --overlap-moe-expert-parallel-comm; Megatron-Bridge's recipes add "
              "--delay-wgrad-compute); torchtitan runs DualPipeV (--framework fsdp --pp-schedule DualPipeV)")
NOT_EMITTED = ("Megatron-LM cannot run DualPipe (DeepSeek-V3's own schedule, DeepSeek-V3 report Sec. 3.2.1, in their "
               "HAI-LLM framework; Megatron-LM has 1F1B and interleaved 1F1B only): plan without --emit, or emit the "
               "equivalent. " + EQUIVALENT)
"""why --emit megatron-lm refuses --pp-schedule DualPipe (planner.rules.model_violations), one line"""


COMMUNICATION_SMS = 20
"""SMs DeepSeek's all-to-all kernels take while a merged chunk pair computes (DeepSeek-V3 report Sec. 3.2.2: "only 20
SMs are sufficient to fully utilize the bandwidths of IB and NVLink", warp-specialised into 10 channels)"""


def overlapped_compute_factor(name: str, pp: int, gas: int, sm_count: int) -> float:
    """How much longer a DualPipe rank's compute runs beside its all-to-all: the merged chunks (1 - `unmerged_share`)
    on the SMs the communication kernels leave (`COMMUNICATION_SMS` of ``sm_count``); 1 for DualPipeV (torchtitan's
    overlap runs on NCCL's own channels, not counted) and without a pipeline."""
    if name != DUALPIPE or pp <= 1 or sm_count <= COMMUNICATION_SMS:
        return 1.0
    merged = 1.0 - unmerged_share(name, pp, gas)
    return 1.0 + merged * COMMUNICATION_SMS / (sm_count - COMMUNICATION_SMS)


def chunk_times(recompute: str = "none") -> tuple[float, float, float]:
    """(F, B, W) of a chunk in units of its forward (module docstring): the backward 2F, half of it W; a full recompute
    re-runs the forward inside B."""
    return 1.0, 2.0 + (1.0 if recompute == "full" else 0.0), 1.0


def bubble_1f1b(pp: int, f: float, b: float) -> float:
    """DeepSeek-V3 report Table 2, 1F1B: (PP-1)(F+B)."""
    return (pp - 1) * (f + b)


def bubble_zb1p(pp: int, f: float, b: float, w: float) -> float:
    """DeepSeek-V3 report Table 2, ZB1P (Qi et al. 2024): (PP-1)(F+B-2W)."""
    return (pp - 1) * (f + b - 2 * w)


def bubble_dualpipe(pp: int, fb: float, b: float, w: float) -> float:
    """DeepSeek-V3 report Table 2, DualPipe: (PP/2-1)(F&B+B-3W), PP the number of pipeline stages (even)."""
    return (pp / 2 - 1) * (fb + b - 3 * w)


def bubble_slots(name: str, pp: int, recompute: str = "none") -> float:
    """The schedule's bubble in plantune's slots (a rank's F + B for one micro-batch). DualPipe on PP ranks: Table 2
    over PP stages, a rank's chunk a stage. DualPipeV on PP ranks of two stages each: Table 2 over 2·PP stages of half
    a rank's layers, so (PP-1)(F&B+B-3W) of half-size chunks, over a slot of two of them."""
    if pp <= 1:
        return 0.0
    f, b, w = chunk_times(recompute)
    if name == DUALPIPE:
        return bubble_dualpipe(pp, f + b, b, w) / (f + b)
    if name == DUALPIPE_V:
        return bubble_dualpipe(2 * pp, f + b, b, w) / (2 * (f + b))
    raise ValueError(f"not a DualPipe schedule: {name!r}")


def parameter_copies(name: str, pp: int) -> int:
    """Stages' parameters a rank holds (Table 2's "Parameter"): DualPipe keeps stage i and stage PP-1-i on rank i, 2;
    DualPipeV's two stages are the rank's own half-size ones, and every other schedule one stage: 1."""
    return 2 if name == DUALPIPE and pp > 1 else 1


END = "end"
"""the memory entry of DualPipe's rank 0 (and PP-1): the first and the last stage (planner.memory)"""
MIDDLE = "middle"
"""the memory entry of a DualPipe rank 1..PP-2: two middle stages"""


def ranks(pp: int) -> tuple[str, ...]:
    """The DualPipe ranks memory charges: an end rank and, from PP 4 on, a middle one (PP 2 has only end ranks)."""
    return (END, MIDDLE) if pp >= 4 else (END,)


def peak_chunks(pp: int, gas: int, rank: int = 0) -> tuple[int, int]:
    """(chunks of its shallower stage, chunks of its deeper stage) whose activations DualPipe rank ``rank`` holds at
    its peak. dualpipe.py DualPipe.step on half-rank r = min(rank, PP-1-rank), phase 0 the shallower stage (rank r
    holds stage r and PP-1-r; ``is_in_second_half`` swaps the phases): steps 1-2 run 2(PP/2-r-1) + r + 1 phase-0 and
    r + 1 phase-1 forward chunks, step 3 (B1 W F1) keeps the count, step 4's first pair adds a phase-0 forward beside
    the phase-1 backward: PP - r and r + 1, PP + 1 in all (Table 2's "PP+1"); rank 0: PP chunks of the first stage
    and one of the last. Never more than the step's micro-batches (GAS), half of which run each direction."""
    r = min(rank, pp - 1 - rank)
    shallow = min(pp - r, gas)
    return shallow, max(0, min(r + 1, gas - shallow))


def in_flight_microbatches(name: str, pp: int, gas: int) -> float:
    """Micro-batches' activations of a rank's layers an end rank holds at the peak (Table 2's "Activation", in units
    of one micro-batch on one stage): PP + 1 under DualPipe (each of its chunks a rank's layers); DualPipeV's 2·PP + 1
    half-size chunks, PP + 1/2 in a rank's units; never more than the step's micro-batches, each of which passes a
    rank once (DualPipe: through one of its two stages)."""
    return min(pp + (1.0 if name == DUALPIPE else 0.5), float(gas))


def unmerged_share(name: str, pp: int, gas: int) -> float:
    """Share of an end rank's forward and backward chunks that run alone, their all-to-all exposed: the chunks outside
    DualPipe.step's merged steps (deepseek-ai/DualPipe dualpipe.py: step 4 runs 2 x (gas/2 - PP + 1) forward-backward
    pairs, step 5 PP/2 - 1 on rank 0 and PP-1, so 3PP/2 - 1 of its gas forwards and as many backwards run alone;
    dualpipev.py on PP ranks: 2 x (gas - 2·PP + 1) + PP - 1 merged of 2·gas chunks, 3PP - 1 alone)."""
    if pp <= 1:
        return 1.0
    if name == DUALPIPE:
        return min(1.0, (1.5 * pp - 1) / gas)
    return min(1.0, (3 * pp - 1) / (2 * gas))


def problems(name: str, pp: int, vpp: int, gas: int) -> list[tuple[str, str]]:
    """(reason value, detail) for each constraint the schedule's implementations assert (deepseek-ai/DualPipe
    dualpipe.py / dualpipev.py step(); torch ScheduleDualPipeV.__init__)."""
    if name not in SCHEDULES:
        return []
    out = []
    stages = pp if name == DUALPIPE else 2 * pp
    if pp < 2:   # no pipeline: the schedule has nothing to run (as torchtitan ignores its schedule without PP)
        return out
    if name == DUALPIPE and pp % 2:
        out.append(("pipeline_schedule", f"DualPipe needs an even PP (dualpipe.py: 'num_ranks % 2 == 0'), got {pp}"))
    if name == DUALPIPE and vpp != 1:
        out.append(("virtual_pipeline", f"DualPipe runs one model chunk per direction on each rank (its two stages are "
                                        f"the schedule's own), got VPP {vpp}; use vpp=1"))
    if name == DUALPIPE_V and vpp != 2:
        out.append(("virtual_pipeline", f"DualPipeV needs exactly 2 stages per rank (torch ScheduleDualPipeV), got "
                                        f"VPP {vpp}; use vpp=2"))
    if name == DUALPIPE and gas % 2:
        out.append(("microbatches_lt_stages", f"DualPipe splits the micro-batches over its two directions: GAS {gas} "
                                              "must be even (dualpipe.py: 'num_chunks % 2 == 0')"))
    least = 2 * pp if name == DUALPIPE else stages
    if gas < least:
        out.append(("microbatches_lt_stages", f"{name} needs at least {least} micro-batches on PP {pp} (dualpipe"
                                              f"{'' if name == DUALPIPE else 'v'}.py: num_chunks >= 2 x ranks), got "
                                              f"GAS {gas}"))
    return out


__all__ = ["COMMUNICATION_SMS", "DUALPIPE", "DUALPIPE_V", "END", "MIDDLE", "SCHEDULES", "bubble_1f1b", "bubble_dualpipe", "bubble_slots", "bubble_zb1p",
           "chunk_times", "in_flight_microbatches", "overlapped_compute_factor", "parameter_copies", "peak_chunks", "problems", "ranks",
           "unmerged_share"]
