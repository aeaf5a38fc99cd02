"""The rampup schedule a person follows with a plan's best layout (seed 003's NNODES / BS / MBS table): where to
relaunch, on how many whole nodes, at which DP and MBS, and the throughput predicted at each launch. The rules every
rampup batch size must obey are `planner.rampup`'s (the rules use them; this module ranks, above them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planner.cost import estimate_time
from planner.memory import memory_breakdown, verdict
from planner.model import Rampup
from planner.topology import Topology

if TYPE_CHECKING:
    from planner.rank import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One launch of seed 003's NNODES / BS / MBS table: batch sizes ``first_batch``..``last_batch`` run on
    ``nodes`` whole nodes with the plan's layout and this DP and MBS."""

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
    """predicted at ``first_batch``"""
    batch_multiple: int
    """MBS·DP: megatron/microbatches.py asserts every batch size of this launch is a multiple of it, so the
    launch's --rampup-batch-size must step in multiples of it"""

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """A relaunch point of the ramp: from ``batch`` on, ``dp`` replicas of MBS ``mbs``."""

    batch: int
    dp: int
    mbs: int


def relaunch_batches(rampup: Rampup, global_batch: int) -> list[int]:
    """Where a person relaunches: the ramp's start, then each time the batch has doubled (the largest size of the
    ramp at most twice the last one), then the final batch (seed 003: 32, 64, 128, 256, 512). O(log(G/start))."""
    out = [rampup.start]
    while out[-1] < global_batch:
        b = out[-1]
        doubled = rampup.start + (2 * b - rampup.start) // rampup.increment * rampup.increment
        nxt = max(doubled, b + rampup.increment)
        out.append(global_batch if nxt >= global_batch else nxt)
    return out


def plan_launches(rampup: Rampup, global_batch: int, *, replica_gpus: int, best_mbs: int, gpus_per_node: int,
                  max_gpus: int) -> list[Launch]:
    """Seed 003's schedule for one layout (TP·PP = ``replica_gpus`` GPUs per replica, best MBS ``best_mbs``).

    The first launch feeds as many replicas as the start batch allows at MBS 1 ("starting from 32 ... max 32/1 =
    32 gpus"); later launches keep that GPU count, raising MBS up to the best one, and add nodes only once the batch
    feeds more replicas at the best MBS ("16 nodes 32/1, 16 nodes 64/2, 16 nodes 128/4, 32 nodes 256/4"). GPU counts
    are whole nodes and never fall; a launch that changes neither DP nor MBS is no relaunch and is merged.
    """
    node_dp = gpus_per_node // math.gcd(gpus_per_node, replica_gpus)   # DP step that fills whole nodes
    max_dp = max_gpus // replica_gpus // node_dp * node_dp or max_gpus // replica_gpus
    launches: list[Launch] = []
    for batch in relaunch_batches(rampup, global_batch):
        want = batch if not launches else max(launches[-1].dp, batch // best_mbs)
        floor = launches[-1].dp if launches else 1
        dp = _whole_node_dp(batch, min(want, max_dp), floor, node_dp)
        if dp == 0:
            continue
        mbs = max(m for m in range(1, best_mbs + 1) if batch % (m * dp) == 0)
        if launches and (launches[-1].dp, launches[-1].mbs) == (dp, mbs):
            continue
        launches.append(Launch(batch=batch, dp=dp, mbs=mbs))
    return launches


def _whole_node_dp(batch: int, want: int, floor: int, node_dp: int) -> int:
    """The largest DP in [floor, want] that divides the batch, preferring whole nodes; 0 if none."""
    for step in (node_dp, 1):
        top = want // step * step
        for dp in range(top, max(floor, 1) - 1, -step):
            if dp > 0 and batch % dp == 0:
                return dp
    return 0


def rampup_schedule(plan: Plan, rampup: Rampup) -> list[ScheduleRow]:
    """The rampup launches a person follows with the plan's best layout (seed 003's NNODES / BS / MBS table):
    few relaunches, whole nodes, never fewer GPUs later, one layout throughout (TP, PP, recompute, ZeRO fixed).
    A launch whose MBS would not fit in memory falls back to a smaller MBS. Each row's ``batch_multiple`` (MBS·DP)
    is the step its own --rampup-batch-size must take (seed 003: "will require manual adjustments of the slurm
    file"): Megatron asserts every batch size of a launch is a multiple of it."""
    cluster, training, model = plan.cluster, plan.training, plan.model
    if not plan.candidates:
        return []
    best = plan.candidates[0].candidate
    replica = best.tp * best.pp
    launches = plan_launches(rampup, training.global_batch, replica_gpus=replica, best_mbs=best.mbs,
                             gpus_per_node=cluster.gpus_per_node, max_gpus=cluster.world_size)
    topology = Topology(cluster)
    rows: list[ScheduleRow] = []
    ends = [launch.batch for launch in launches[1:]]
    for launch, nxt in zip(launches, ends + [None]):
        phase_training = replace(training, global_batch=launch.batch, rampup=None)
        fitting = [replace(best, dp=launch.dp, mbs=m, gas=launch.batch // (m * launch.dp))
                   for m in range(launch.mbs, 0, -1) if launch.batch % (m * launch.dp) == 0]
        fitting = [c for c in fitting
                   if verdict(memory_breakdown(model, c, cluster, phase_training), cluster, phase_training).fits]
        if not fitting:
            continue
        cand = fitting[0]
        step = estimate_time(model, cand, cluster, phase_training, topology).step_time_s
        gpus = cand.world
        last = training.global_batch if nxt is None else _last_size_before(rampup, nxt)
        if rows and (rows[-1].dp, rows[-1].mbs) == (launch.dp, cand.mbs):   # the memory fallback made it no relaunch
            rows[-1] = replace(rows[-1], last_batch=last)
            continue
        rows.append(ScheduleRow(first_batch=launch.batch, last_batch=last, gpus=gpus,
                                nodes=-(-gpus // cluster.gpus_per_node), tp=best.tp, pp=best.pp, dp=launch.dp,
                                mbs=cand.mbs, recompute=best.recompute, zero=best.zero,
                                samples_per_s=launch.batch / step, batch_multiple=cand.mbs * launch.dp))
    return rows


def _last_size_before(rampup: Rampup, batch: int) -> int:
    """The largest batch size of the ramp below ``batch``."""
    return rampup.start + (batch - 1 - rampup.start) // rampup.increment * rampup.increment
