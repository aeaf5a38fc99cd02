"""What one tune run is asked to do: `TuneSettings` (study, storage, limits, sampler, confirmation).
"""

from __future__ import annotations

from dataclasses import dataclass


SAMPLERS = ("ei", "tpe", "random", "grid", "analytic", "planner")


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneSettings:
    study_name: str
    storage_url: str = "sqlite:///tune.db"
    budget_s: float | None = None
    budget_gpuh: float | None = None
    """--budget NNgpuh: GPU-hours the probes of this run may hold (phase seconds x their GPUs, search.accounting)"""
    max_probes: int | None = None
    """search-phase probes in the study, all runs together (None: until the space is exhausted)"""
    top_k: int | None = None
    """the plan's best K probed first; None: `default_top_k` of the sampler"""
    sampler: str = "ei"
    seed: int | None = None
    startup_trials: int = 4
    """measurements before TPE models the space (the analytic top-k count); random survivors until then"""
    confirm_top: int = 3
    repeats: int = 2
    heartbeat_s: int = 60
    grace_s: int = 120
    max_retry: int = 3


def default_top_k(sampler: str) -> int:
    """--top-k when not given: 1 for ei (measured on tests/bench/bench_search.py: top-1 needs the fewest probes to
    the best, dev tables and robustness benchmark alike; --loto chooses it on every held-out table), 3 for the
    others (TPE models after a few measurements)."""
    return 1 if sampler == "ei" else 3


__all__ = ["SAMPLERS", "TuneSettings", "default_top_k"]
