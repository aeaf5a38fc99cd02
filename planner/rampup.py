"""Batch-size rampup: Megatron's rules (megatron/microbatches.py) and the schedule a person follows.

Rules (../shared/MEGATRON_DEEPSPEED.md): final G > start S, increment I > 0, (G - S) % I == 0,
and every batch size reached, S + k·I, divisible by MBS·DP — asserted at every iteration, so a
plan that breaks it crashes mid-run. Seed 003: "starting from 32 ... max 32/1 = 32 gpus".
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.model import Rampup


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
