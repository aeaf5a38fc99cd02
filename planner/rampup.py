"""Batch-size rampup: Megatron's rules (megatron/microbatches.py); the schedule a person follows is
`planner.rampup_schedule`.

Rules (../shared/MEGATRON_DEEPSPEED.md): final G > start S, increment I > 0, (G - S) % I == 0,
and every batch size reached, S + k·I, divisible by MBS·DP — asserted at every iteration, so a
plan that breaks it crashes mid-run. Seed 003: "starting from 32 ... max 32/1 = 32 gpus".
"""

from __future__ import annotations

import math

from planner.model import Rampup


def rampup_sizes_count(rampup: Rampup, global_batch: int) -> int:
    """How many batch sizes the ramp goes through before the final one: start, start + I, ... < G."""
    return max(0, -(-(global_batch - rampup.start) // rampup.increment))


def _undivisible(rampup: Rampup, n: int, unit: int) -> tuple[int, int | None]:
    """(how many of start + k·I, k < n, are not multiples of ``unit``; the first such size), in closed form.

    start + k·I ≡ 0 (mod u) has solutions iff g = gcd(I, u) divides start; they are k ≡ k0 (mod u/g).
    """
    if n <= 0:
        return 0, None
    g = math.gcd(rampup.increment, unit)
    period = unit // g
    if rampup.start % g:
        return n, rampup.start
    k0 = (-(rampup.start // g) * pow(rampup.increment // g, -1, period)) % period if period > 1 else 0
    good = 0 if k0 >= n else (n - 1 - k0) // period + 1
    # k = 0 and k = 1 are different residues when period > 1, so one of them is the first failure
    first_bad = 0 if k0 != 0 else (1 if n > 1 and period > 1 else None)
    return n - good, None if first_bad is None else rampup.start + first_bad * rampup.increment


def rampup_problems(rampup: Rampup, global_batch: int, mbs: int, dp: int) -> list[str]:
    """Every way this rampup breaks megatron/microbatches.py for MBS·DP; empty when it is safe.

    Closed form in the number of rampup sizes (a ramp of 10**12 sizes is checked as fast as one of 10).
    """
    problems = []
    if global_batch <= rampup.start:
        problems.append(f"global batch {global_batch} must exceed rampup start {rampup.start}")
        return problems
    if (global_batch - rampup.start) % rampup.increment:
        problems.append(f"(global batch {global_batch} - start {rampup.start}) is not divisible by "
                        f"increment {rampup.increment}")
    unit = mbs * dp
    bad, first = _undivisible(rampup, rampup_sizes_count(rampup, global_batch), unit)
    if global_batch % unit:
        bad += 1
        first = first if first is not None else global_batch
    if bad:
        problems.append(f"batch size {first} of the rampup is not divisible by MBS*DP = {mbs}*{dp} = {unit}"
                        + (f" ({bad} rampup sizes fail)" if bad > 1 else ""))
    return problems


def largest_dp_for(batch_size: int, mbs: int, max_dp: int) -> int:
    """The largest DP <= max_dp with batch_size % (mbs·dp) == 0 (seed 003: 32/1 = 32 replicas)."""
    for dp in range(min(max_dp, batch_size // mbs), 0, -1):
        if batch_size % (mbs * dp) == 0:
            return dp
    return 0
