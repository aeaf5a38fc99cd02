"""`tune`: search the planner's surviving configurations with measured probes (Optuna).

    tune --model 176B --gpus 384 --study bloom --storage sqlite:///tune.db --budget 2h

Modules: `search.space` (survivors as structured parameters, the OOM implication rule),
`search.objective` (one trial: probe, record, refit), `search.trial_attrs` (what a trial stores, typed),
`search.settings` (TuneSettings), `search.sampler` (which survivor next), `search.storage` (the study in its
storage, recovery of killed tuners' trials), `search.progress` (what a running tune says), `search.study` (the
run: search, then confirmation), `search.calibration` (refit CostParams), `search.replay` (probes answered from
a table), `search.published_tables` (published tables as replay tables), `search.report` (tables and plots),
`search.cli` (the ``tune`` command).

Importing `search` imports neither optuna nor torch; `search.study`, `search.storage`, `search.sampler` and
`search.objective` import optuna.
"""

from search._base import OUTCOMES, TuneError

__all__ = ["OUTCOMES", "TuneError"]
