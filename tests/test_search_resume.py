"""Resume, duplicate detection and Ctrl-C at the library level (fast; replay-like fake backends, SQLite).

    python -m pytest tests/test_search_resume.py -q
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from probes.backend import ProbeBackend
from planner import CostParams
from probes.result import ProbeResult
from search._base import BackendError
from search.objective import Ledger, Objective, ProbeFailed, ProbeSettings
from search.space import SearchSpace, config_key, params_of
from search.progress import Progress
from search.sampler import SurvivorSampler
from search.settings import TuneSettings
from search.storage import open_study
from search.study import confirmation_slots, run
from conftest import seed003_plan  # noqa: E402

INPUTS = {"test": 1}


class Fake(ProbeBackend):
    """Step time = 10 s x (1 + tp + pp) / mbs^0.1; counts calls; optional Ctrl-C at call N."""

    name = "fake"

    def __init__(self, interrupt_at: int | None = None, error_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.interrupt_at = interrupt_at
        self.error_at = error_at

    def run(self, spec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        c = spec.candidate
        self.calls.append(f"tp={c['tp']},pp={c['pp']},mbs={c['mbs']},{c['recompute']}")
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.error_at is not None and len(self.calls) == self.error_at:
            raise RuntimeError("salloc: error: no allocation")
        step = 10.0 * (1 + c["tp"] + c["pp"]) / c["mbs"] ** 0.1
        return ProbeResult(status="ok", step_time_median_s=step, step_times_s=[step], device="fake")


SPACE_SIZE = 12
"""configurations a study here searches: the plan's best 12 of its 36 (a whole study stays a few seconds; every
behaviour tested here shows on a dozen)"""


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    p = seed003_plan()
    return SearchSpace.from_plan(p, keep=set(SearchSpace.from_plan(p).keys[:SPACE_SIZE]))


def go(space, backend, storage, **kw) -> list:
    settings = TuneSettings(study_name="s", storage_url=storage, seed=0, **kw)
    study = open_study(settings, space, INPUTS)
    objective = Objective(space=space, backend=backend, settings=ProbeSettings())
    return run(study, objective, space, settings, Progress(total=len(space), budget_s=None, enabled=False))


@pytest.mark.slow   # a whole tuning study (a few seconds on 2 cores)
def test_whole_space_once_then_nothing(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    fake = Fake()
    records = go(space, fake, storage, confirm_top=0)
    search_calls = list(fake.calls)
    assert sorted(search_calls) == sorted(set(search_calls)) and len(search_calls) == len(space)
    assert all(r.state == "COMPLETE" for r in records)
    again = Fake()
    assert len(go(space, again, storage, confirm_top=0)) == len(records) and again.calls == []


@pytest.mark.slow   # a whole tuning study (a few seconds on 2 cores)
def test_confirmation_repeats_the_best_and_is_not_redone(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    fake = Fake()
    records = go(space, fake, storage, max_probes=8, confirm_top=2, repeats=2)
    confirms = [r for r in records if r.phase == "confirm"]
    assert len(confirms) == 4 and len({r.config for r in confirms}) == 2
    assert sum(r.counted for r in records) == 8           # --max-probes counts the confirmation re-probes too
    assert confirmation_slots(Ledger(records), 2, 2) == []
    again = Fake()
    go(space, again, storage, max_probes=8, confirm_top=2, repeats=2)
    assert again.calls == []


@pytest.mark.slow   # a whole tuning study (a few seconds on 2 cores)
def test_ctrl_c_records_interrupted_and_the_next_run_probes_it_first(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(KeyboardInterrupt):
        go(space, Fake(interrupt_at=3), storage, confirm_top=0)
    study = optuna.load_study(study_name="s", storage=storage)
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(failed) == 1 and failed[0].user_attrs["outcome"] == "interrupted"
    assert len([t for t in study.trials if t.state.name == "COMPLETE" and t.user_attrs.get("phase") != "pick"]) == 2
    assert [t.user_attrs.get("phase") for t in study.trials][-1] == "pick"   # the pick so far, recorded on Ctrl-C
    fake = Fake()
    records = go(space, fake, storage, confirm_top=0)
    retried = [r for r in records if r.phase == "retry"]
    assert len(retried) == 1 and retried[0].config == failed[0].user_attrs["config"]
    first_new = min((r for r in records if r.number > failed[0].number and r.phase != "pick"), key=lambda r: r.number)
    assert first_new.config == failed[0].user_attrs["config"]
    measured = [r.config for r in records if r.measured]
    assert len(measured) == len(set(measured)) == len(space)


@pytest.mark.slow   # a whole tuning study (a few seconds on 2 cores)
def test_backend_failure_stops_the_study_and_is_retried(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(BackendError, match="no allocation"):
        go(space, Fake(error_at=2), storage, confirm_top=0)
    study = optuna.load_study(study_name="s", storage=storage)
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(failed) == 1 and failed[0].user_attrs["outcome"] == "backend_error"
    records = go(space, Fake(), storage, confirm_top=0)
    retried = [r for r in records if r.phase == "retry"]
    assert len(retried) == 1 and retried[0].config == failed[0].user_attrs["config"] and retried[0].measured


def test_enqueued_ruled_out_configuration_is_never_probed(space, tmp_path):
    keep = set(space.keys[:4])
    small = SearchSpace.from_plan(space.plan, keep=keep)
    outside = next(e for e in space.survivors if config_key(e.candidate) not in keep)
    study = optuna.create_study(direction="maximize", sampler=SurvivorSampler(small, seed=0))
    study.enqueue_trial(params_of(outside.candidate))
    fake = Fake()
    study.optimize(Objective(space=small, backend=fake, settings=ProbeSettings()), n_trials=1,
                   catch=(ProbeFailed,))
    trial = study.trials[0]
    assert trial.state.name == "FAIL" and trial.user_attrs["outcome"] == "ruled_out" and fake.calls == []
    assert "not a survivor" in trial.user_attrs["reason"]


def test_sampler_never_proposes_outside_the_space(space, tmp_path):
    keep = set(space.keys[::3])
    small = SearchSpace.from_plan(space.plan, keep=keep)
    sampler = SurvivorSampler(small, strategy="tpe", seed=3, startup_trials=2)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    objective = Objective(space=small, backend=Fake(), settings=ProbeSettings())
    study.optimize(objective, n_trials=len(small), catch=())
    probed = [t.user_attrs["config"] for t in study.trials]
    assert set(probed) == keep and len(probed) == len(set(probed))
    assert all(config_key(e.candidate) in keep for e in small.survivors)


class Profiled(ProbeBackend):
    """A machine whose attention runs at half the planner's rate: each probe's step is the planner's under that
    class scale, and its profiled step by class the planner's with attention x2 (as probes.train reports it)."""

    name = "profiled"

    def __init__(self, space: SearchSpace) -> None:
        self.plan = space.plan
        self.truth = CostParams(class_scales=(("attention", 2.0),))

    def run(self, spec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        from planner import Candidate, estimate
        from search.calibration import probe_class_seconds

        p, cand = self.plan, Candidate(**spec.candidate)
        assert spec.profile                                   # tune asks every probe for its profiled step
        step = estimate(p.model, p.cluster, p.training, cand, params=self.truth).time.step_time_s
        pred = probe_class_seconds(p.model, p.cluster, p.training, cand, spec.layers_run)
        by_class = {**pred, "attention": 2.0 * pred["attention"], "optimizer": 0.01}
        return ProbeResult(status="ok", step_time_median_s=step, step_times_s=[step], device="fake",
                           timing_split={"compute_s_by_class": by_class})


def test_profiled_probes_refit_the_class_that_was_off(space, tmp_path):
    """Three probes: each trial records its measured and predicted seconds by class; the study's calibration scales
    attention by 2, GEMMs and element-wise by 1, and then needs no compute scale."""
    records = go(space, Profiled(space), f"sqlite:///{tmp_path}/s.db", max_probes=3, confirm_top=0)
    measured = [r for r in records if r.measured]
    assert len(measured) == 3
    for r in measured:
        assert r.attrs["measured_class_s"]["attention"] == pytest.approx(2 * r.attrs["pred_class_s"]["attention"])
    cal = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").user_attrs["calibration"]
    assert cal["class_scales"] == pytest.approx({"gemm": 1.0, "attention": 2.0, "elementwise": 1.0})
    assert cal["compute_scale"] == pytest.approx(1.0, abs=0.01) and cal["comm_scale"] == pytest.approx(1.0, abs=0.05)
    last = max(measured, key=lambda r: r.number)
    assert last.attrs["pred_after_step_s"] == pytest.approx(last.attrs["measured_step_s"], rel=0.01)
