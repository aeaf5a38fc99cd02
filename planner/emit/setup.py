"""`RunSetup` (what an emitter renders) and the one list of rules an emitted config must obey.

Every rule here is one that would make the framework refuse the config at start-up or, worse,
crash hours into the run (a rampup batch size not divisible by MBS·DP is asserted at every
iteration). The rules themselves live in `planner.rules` (the one rulebook `plan` ranks with).

    >>> from planner.emit.setup import setup_problems      # [] when the setup can be emitted
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from planner.hardware import ClusterSpec
from planner.model import ModelSpec
from planner.rules import MEGATRON_OPTIMIZERS, Target, setup_violations
from planner.space import FLAVORS, FRAMEWORKS, Candidate, TrainingSpec

KINDS = FRAMEWORKS
"""an emitter per framework"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the planner predicted for the chosen layout (recorded in plan.yaml, never recomputed here)."""

    memory_gb_per_gpu: float
    """peak memory per GPU, GB = 1e9 bytes"""
    step_time_s: float
    """one optimizer step at the final global batch"""
    model_tflops_per_gpu: float
    """model FLOPs (no recompute) per second per GPU / 1e12"""
    hardware_tflops_per_gpu: float
    """hardware FLOPs (recompute included) per second per GPU / 1e12"""
    mfu: float
    """model FLOPs utilisation, a fraction of the GPU's dense peak"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSetup:
    """Everything an emitter needs: the model, the cluster, what is fixed, the chosen layout."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    candidate: Candidate
    prediction: Prediction | None = None

    def __post_init__(self) -> None:
        # a layout's own activation offload (plan's search) is emitted as the training's --activation-offload: the
        # same run (planner.offload.modules_of), one place every emitter and the plan file read it from
        if self.candidate.offload:
            object.__setattr__(self, "training", replace(self.training,
                                                         activation_offload=tuple(self.candidate.offload.split("+"))))
            object.__setattr__(self, "candidate", replace(self.candidate, offload=""))
        if self.candidate.opt_offload:   # and its CPU optimizer offload as the training's --optimizer-offload
            object.__setattr__(self, "training", replace(self.training, optimizer_offload=self.candidate.opt_offload))
            object.__setattr__(self, "candidate", replace(self.candidate, opt_offload=0.0))


def train_samples(training: TrainingSpec) -> int | None:
    """Megatron's ``--train-samples``: the token budget in whole sequences (rounded up); None when unknown."""
    if training.train_tokens is None:
        return None
    return math.ceil(training.train_tokens / training.seq_len)


NO_BUDGET = "plantune was given no token budget (plan --train-tokens N writes it)"
"""why every launcher stops when the run's length is unknown: it asks for it (TRAIN_SAMPLES, TRAIN_STEPS) rather
than run a length nobody chose"""


def one_line(text: str) -> str:
    """Text safe inside a one-line comment of a written file (control characters become spaces)."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


def setup_problems(setup: RunSetup, kind: str, flavor: str = "bigscience") -> list[str]:
    """Every rule of `planner.rules` the setup breaks for this emitter kind (and fork flavor); empty when
    it can be emitted. The emitters keep no rules of their own."""
    if kind not in KINDS:
        return [f"unknown emitter kind {kind!r}; use one of {', '.join(KINDS)}"]
    if kind == "megatron-deepspeed" and flavor not in FLAVORS:
        return [f"unknown Megatron-DeepSpeed flavor {flavor!r}; use one of {', '.join(FLAVORS)}"]
    s = setup
    return [v.detail for v in setup_violations(s.model, s.candidate, s.cluster, s.training, Target(kind, flavor))]


__all__ = ["FLAVORS", "KINDS", "MEGATRON_OPTIMIZERS", "NO_BUDGET", "Prediction", "RunSetup", "one_line", "setup_problems",
           "train_samples"]
