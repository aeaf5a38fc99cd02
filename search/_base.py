"""What every part of `search` shares: the error type, trial outcomes, and the attribute names
under which a trial records its configuration and result in the Optuna storage.

Trial user attributes are the study's record (``tune report`` reads nothing else):

- ``config``: the candidate's label (``tp=1,pp=2,dp=4,mbs=4,gas=32,recompute=full,zero=1``),
  the key that duplicate detection and resume compare;
- ``slot``: ``config`` for a search probe, ``config#confirmN`` for the N-th confirmation repeat;
- ``outcome`` (one of `OUTCOMES`) and ``reason`` (one line, the root cause for a failure);
- ``phase``: ``analytic`` (enqueued top-k), ``sampler``, ``retry``, ``confirm``, ``implied``;
- measured and predicted numbers (``measured_tflops``, ``measured_step_s``, ``pred_*``).
"""

from __future__ import annotations

from planner.errors import InputError
from planner.space import RECOMPUTE

PROBED = ("ok", "oom", "timeout", "crash", "invalid", "pruned")
"""outcomes of a probe that ran (or was refused by the probe's own layout check): final for the configuration
(``pruned``: stopped early, clearly behind the best, while it stays so: search.pruning)"""
DERIVED = ("implied_oom", "not_measured", "ruled_out", "duplicate")
"""outcomes recorded without probing: final too (a duplicate carries the stored result of the original)"""
NOT_FINAL = ("interrupted", "backend_error")
"""outcomes that leave the configuration to be probed again by the next run (Ctrl-C; the backend itself
failed, e.g. no SLURM allocation: that says nothing about the configuration)"""
OUTCOMES = PROBED + DERIVED + NOT_FINAL

PHASES = ("analytic", "sampler", "retry", "confirm", "implied")
"""how a trial came to be; ``implied`` trials are recorded without a probe by an OOM's implication"""
PICK_PHASE = "pick"
"""the phase of a trial tune adds, not probes: its pick (`search.study.record_pick`), params of the chosen
configuration, value the median of its measurements"""
PICK_CONSTRAINT = "tune_pick"
"""the Optuna constraint every probe's trial carries at 1.0 (infeasible as an answer: one probe is a measurement,
not tune's pick); the pick's trial carries none, so `Study.best_trial` (best among feasible) is tune's pick"""

RECOMPUTE_MEMORY_ORDER = {"full": 0, "selective-op": 1, "selective": 2, "none": 3}
"""activation memory needed, least to most: full recompute keeps only layer inputs, op-level SAC those and four
projection outputs, selective all but the attention core, none everything (planner.memory.layer_activations;
measured on the probe: tests/test_probes_op_sac.py). A mode not listed (block-N, uniform-N, selective-layer-N) is
ordered against no other."""


def recompute_sort_key(mode: str) -> tuple[int, str]:
    """Search order of recompute modes: the classic three as `planner.space.RECOMPUTE` lists them, then the others."""
    return (RECOMPUTE.index(mode), "") if mode in RECOMPUTE else (len(RECOMPUTE), mode)


class TuneError(InputError):
    """A problem with the tune command's input that the user can fix (one line, exit 2)."""


class BackendError(RuntimeError):
    """The probe backend itself failed (not the configuration): the study stops, the trial is retried later."""


__all__ = ["BackendError", "DERIVED", "NOT_FINAL", "OUTCOMES", "PHASES", "PICK_CONSTRAINT", "PICK_PHASE", "PROBED", "RECOMPUTE_MEMORY_ORDER",
           "TuneError", "recompute_sort_key"]
