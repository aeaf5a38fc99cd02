"""Batch-size rampup: Megatron's rules (megatron/microbatches.py) and the schedule a person follows.

Rules (../shared/MEGATRON_DEEPSPEED.md): final G > start S, increment I > 0, (G - S) % I == 0,
and every batch size reached, S + k·I, divisible by MBS·DP — asserted at every iteration, so a
plan that breaks it crashes mid-run. Seed 003: "starting from 32 ... max 32/1 = 32 gpus".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.model import Rampup

if TYPE_CHECKING:
    from planner.rank import Plan


def rampup_problems(rampup: Rampup, global_batch: int, mbs: int, dp: int) -> list[str]:
    """Every way this rampup breaks megatron/microbatches.py for MBS·DP; empty when it is safe."""
    problems = []
    if global_batch <= rampup.start:
        problems.append(f"global batch {global_batch} must exceed rampup start {rampup.start}")
        return problems
    if (global_batch - rampup.start) % rampup.increment:
        problems.append(f"(global batch {global_batch} - start {rampup.start}) is not divisible by "
                        f"increment {rampup.increment}")
    unit = mbs * dp
    bad = [b for b in rampup.batch_sizes(global_batch) if b % unit]
    if bad:
        problems.append(f"batch size {bad[0]} of the rampup is not divisible by MBS*DP = {mbs}*{dp} = {unit}"
                        + (f" ({len(bad)} rampup sizes fail)" if len(bad) > 1 else ""))
    return problems


@dataclass(frozen=True, slots=True, kw_only=True)
class RampupPhase:
    """One row of seed 003's NNODES / BS / MBS table."""

    batch_size: int
    nodes: int
    dp: int
    mbs: int
    gas: int


def largest_dp_for(batch_size: int, mbs: int, max_dp: int) -> int:
    """The largest DP <= max_dp with batch_size % (mbs·dp) == 0 (seed 003: 32/1 = 32 replicas)."""
    for dp in range(min(max_dp, batch_size // mbs), 0, -1):
        if batch_size % (mbs * dp) == 0:
            return dp
    return 0


STICKY = 0.97
"""keep the running phase's layout while it trains at >= 97% of the best layout's speed"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """Batch sizes ``first_batch``..``last_batch`` of the rampup run best with this layout."""

    first_batch: int
    last_batch: int
    gpus: int
    nodes: int
    tp: int
    pp: int
    dp: int
    mbs: int
    recompute: str
    zero: int
    samples_per_s: float

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def rampup_schedule(plan: Plan, rampup: Rampup, *, layouts: int = 8) -> list[ScheduleRow]:
    """Seed 003's NNODES / BS / MBS table: for each rampup batch size, the layout and GPU count
    that train fastest, among the plan's best ``layouts`` distinct layouts (TP, PP, MBS, recompute,
    ZeRO). A phase may use fewer nodes than the cluster when the batch is too small to feed every
    replica ("starting from 32 ... max 32/1 = 32 gpus"). A relaunch costs time, so the previous
    phase's layout is kept while it is within ``STICKY`` of the best; consecutive sizes with the same
    choice are merged into one row.
    """
    from dataclasses import replace

    from planner.constraints import memory_violations
    from planner.cost import estimate_time
    from planner.memory import memory_breakdown
    from planner.topology import Topology

    cluster, training, model = plan.cluster, plan.training, plan.model
    seen, chosen = set(), []
    for est in plan.candidates:
        c = est.candidate
        key = (c.tp, c.pp, c.mbs, c.recompute, c.zero, c.sp, c.vpp, c.hybrid)
        if key not in seen:
            seen.add(key)
            chosen.append(c)
        if len(chosen) >= layouts:
            break
    topology = Topology(cluster)
    rows: list[ScheduleRow] = []
    for batch in rampup.batch_sizes(training.global_batch):
        best: ScheduleRow | None = None
        previous: ScheduleRow | None = None
        last = rows[-1] if rows else None
        for c in chosen:
            max_dp = cluster.world_size // (c.tp * c.pp)
            dp = largest_dp_for(batch, c.mbs, max_dp)
            if dp == 0:
                continue
            cand = replace(c, dp=dp, gas=batch // (c.mbs * dp))
            if cand.pp > 1 and cand.gas < cand.pp:
                continue
            phase_training = replace(training, global_batch=batch, rampup=None)
            if memory_violations(memory_breakdown(model, cand, cluster, phase_training), cluster, phase_training):
                continue
            step = estimate_time(model, cand, cluster, phase_training, topology).step_time_s
            gpus = cand.world
            row = ScheduleRow(first_batch=batch, last_batch=batch, gpus=gpus,
                              nodes=-(-gpus // cluster.gpus_per_node), tp=c.tp, pp=c.pp, dp=dp, mbs=c.mbs,
                              recompute=c.recompute, zero=c.zero, samples_per_s=batch / step)
            if best is None or (row.samples_per_s, -row.gpus) > (best.samples_per_s, -best.gpus):
                best = row
            if last and (last.tp, last.pp, last.mbs, last.recompute, last.zero) == (c.tp, c.pp, c.mbs, c.recompute,
                                                                                     c.zero):
                previous = row
        if best is None:
            continue
        if previous is not None and previous.samples_per_s >= STICKY * best.samples_per_s:
            best = previous
        if last and (last.gpus, last.tp, last.pp, last.dp, last.mbs, last.recompute, last.zero) == \
                (best.gpus, best.tp, best.pp, best.dp, best.mbs, best.recompute, best.zero):
            rows[-1] = replace(last, last_batch=batch, samples_per_s=best.samples_per_s)
        else:
            rows.append(best)
    return rows
