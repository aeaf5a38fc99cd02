"""`StepContext`: what the terms of one candidate's step share, computed once by `planner.cost.step_context` and read
by every term (planner.cost, and the feature modules' own terms: context_parallel, moe). A floor below the terms, so
that a feature module can name it without importing the cost code that builds it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from planner.framework import Framework
from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.recompute import Recomputed
from planner.space import Candidate, TrainingSpec
from planner.topology import Topology


@dataclass(slots=True, kw_only=True)   # not frozen: plan() builds one per candidate, and frozen init is slower
class StepContext:
    """What the terms of one candidate's step share, computed once (`step_context`); every term reads it (and none
    writes it)."""

    model: ModelSpec
    cand: Candidate
    cluster: ClusterSpec
    training: TrainingSpec
    topology: Topology
    fw: Framework
    tokens: int
    """tokens of one micro-batch on one CP rank"""
    half: int
    """bytes of a 16-bit (or fp32) activation / gradient value"""
    core_s: float
    """one layer's attention-core forward (one micro-batch, one CP rank)"""
    layer_s: float
    """one layer's forward + backward (+ recompute), with its host time"""
    rc: Recomputed
    """what the backward re-runs on the busiest rank (planner.recompute.recomputed_of)"""
    stage_layers: int
    """layers on the busiest stage"""
    stage_compute_s: float
    """one micro-batch's compute on the busiest stage (its layers, and the LM head on the last)"""
    head_s: float
    """one micro-batch's LM head and loss (forward + backward) on the last stage"""
    params_gpu: int
    """parameters on the GPU of the stage with the most"""
    shard: int
    """ZeRO-3/FSDP shard group"""
    overlaps: tuple[str, ...]
    """the communication the run overlaps (planner.framework.overlaps)"""
    dp_traffic_s: float
    """`dp_comm_s`: the step's data-parallel traffic, shared by the DP terms"""
    accumulated_params: int = 0
    """parameters whose gradients the stage accumulates per micro-batch (0: params_gpu; DeepSpeed's engine: each
    kind of stage's own, `deepspeed_engine_step`)"""
    stage_kind: str = "middle"
    """which stage the terms are of: first, middle or last (DeepSpeed's engine, `deepspeed_engine_step`; elsewhere the
    busiest, read as a middle one)"""
    memo: dict | None = None
    """plan()'s dict for one plan, where the terms declared with `memoized_term` keep their seconds by what they read
    (None: each computed every time; DeepSpeed's per-stage contexts pass None)"""


def memoized(memo: dict | None, key: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()``, once per ``key`` in ``memo`` (plan()'s dict for one plan) when given."""
    if memo is None:
        return compute()
    value = memo.get(key)
    if value is None:
        value = memo[key] = compute()
    return value


def memoized_term(reads: Callable[["StepContext"], tuple]) -> Callable:
    """A term's ``seconds(ctx)`` computed once per distinct ``reads(ctx)`` in ``ctx.memo`` (plan()'s dict): ``reads``
    returns every candidate field and context value the term reads (the model, cluster, training and topology are one
    plan's own)."""
    def wrap(seconds: Callable[["StepContext"], float]) -> Callable[["StepContext"], float]:
        name = seconds.__name__

        @functools.wraps(seconds)
        def term(ctx: "StepContext") -> float:
            memo = ctx.memo
            if memo is None:
                return seconds(ctx)
            key = (name, *reads(ctx))
            value = memo.get(key)
            if value is None:
                value = memo[key] = seconds(ctx)
            return value
        return term
    return wrap
