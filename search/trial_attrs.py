"""What one tune trial stores, typed: `TrialAttrs`, the one list of its Optuna user attributes.

    >>> attrs = TrialAttrs.user_attrs(outcome="ok", measured_step_s=1.25)     # checked names, for set_user_attr
    >>> TrialAttrs.from_user_attrs(trial.user_attrs).measured_step_s
    1.25

The trial's user attributes are the study's record (`tune report` reads nothing else; search._base says what the
main ones mean). Writers go through `TrialAttrs.user_attrs` (a misspelt or new name is a TypeError at once, not a
silent new column); readers may take the typed view, `from_user_attrs`, which ignores names it does not know (a
study written by a newer tune).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialAttrs:
    """Every user attribute a tune trial may carry; None: not recorded."""

    # what the trial is
    worker: str | None = None
    """host:pid of the tuner running it (a dead tuner's RUNNING trial is known by it)"""
    config: str | None = None
    """the candidate's label, the key duplicate detection and resume compare"""
    slot: str | None = None
    """config, or config#confirmN for the N-th confirmation repeat"""
    phase: str | None = None
    """analytic | sampler | retry | confirm | implied (search._base.PHASES), or pick (search._base.PICK_PHASE)"""
    repeat: int | None = None
    """N of a confirmation repeat"""
    candidate: dict | None = None
    """planner.space.Candidate.to_dict()"""
    # how it ended
    outcome: str | None = None
    """search._base.OUTCOMES"""
    reason: str | None = None
    """one line; the root cause of a failure"""
    resources: str | None = None
    """the run's resources when the verdict was made (an invalid verdict under other resources is retried)"""
    root_cause_rank: int | None = None
    killed_by: str | None = None
    """the signal that killed a rank from outside"""
    implied_by: str | None = None
    """the OOM configuration that implies this one runs out of memory"""
    duplicate_of: int | None = None
    original_outcome: str | None = None
    cut_by_budget: bool | None = None
    # the planner's predictions
    pred_analytic_tflops: float | None = None
    pred_analytic_step_s: float | None = None
    pred_memory_gb: float | None = None
    pred_before_tflops: float | None = None
    """calibrated by the earlier probes, before this one"""
    pred_before_step_s: float | None = None
    calibration_before: dict | None = None
    pred_after_tflops: float | None = None
    """calibrated with this probe's measurement too"""
    pred_after_step_s: float | None = None
    calibration_after: dict | None = None
    # the probe
    probe_wall_s: float | None = None
    program: str | None = None
    """what measured: stand-in (plantune's torch GPT) | megatron-lm | megatron-deepspeed | torchtitan
    (search.probe_choice)"""
    program_reason: str | None = None
    """why that program measured (e.g. "torchtitan is not importable here")"""
    probe_gpus: int | None = None
    """processes (GPUs) the probe held: phase seconds x this = GPU-seconds (search.accounting)"""
    phases: dict | None = None
    """seconds of the probe by phase (probes.result.PHASES: queue, launch, rendezvous, build, warmup, steps,
    teardown), as far as it got"""
    device: str | None = None
    workdir: str | None = None
    layers_run: int | None = None
    measured_tflops: float | None = None
    measured_step_s: float | None = None
    measured_memory_gb: float | None = None
    memory_kind: str | None = None
    step_cv: float | None = None
    step_spread: float | None = None
    reduced: bool | None = None
    # tune's pick (a trial search.study.record_pick adds, phase "pick"; no probe)
    pick_config: str | None = None
    """the configuration tune picks (its table's row 1)"""
    median_tflops: float | None = None
    """the median of its measurements, the trial's value"""
    measurements: list | None = None
    """its measured model TFLOPs per GPU, every probe"""
    measured_in_trials: list | None = None
    """the trials that measured it"""
    confirmed: bool | None = None
    agreement: str | None = None
    """search.report.ConfigSummary.agreement, in words"""
    # a probe stopped early (search.pruning)
    pruned_steps: int | None = None
    """timed steps it ran before it was stopped"""
    pruned_step_s: float | None = None
    """its fastest timed step, seconds, as the full configuration's step"""
    pruned_tflops: float | None = None
    """what that fastest step means in model TFLOPs per GPU (a pruned configuration is probed again should the best
    fall to within the margin of it)"""
    pruned_margin: float | None = None
    """the margin it was behind by (relative): it stays pruned while its fastest step x (1 + this) is below the best"""
    measured_class_s: dict | None = None
    """the probe's profiled step on rank 0, compute seconds by op class (gemm, attention, elementwise, optimizer;
    probes.train.op_class)"""
    pred_class_s: dict | None = None
    """the planner's seconds of that step by op class (gemm, attention, elementwise: the op list's,
    search.calibration.probe_class_seconds), at the analytic calibration"""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def user_attrs(cls, **attrs: object) -> dict:
        """``attrs`` as user attributes to store, after checking every name is a `TrialAttrs` field (TypeError)."""
        cls(**attrs)          # unknown names raise here
        return dict(attrs)

    @classmethod
    def from_user_attrs(cls, ua: dict) -> "TrialAttrs":
        """The typed view of a stored trial's user attributes (names this tune does not know are left out)."""
        known = set(cls.names())
        return cls(**{k: v for k, v in ua.items() if k in known})


__all__ = ["TrialAttrs"]
