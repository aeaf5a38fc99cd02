"""Probes that are clearly behind stop early (search.pruning), and pruning never costs the study its best.

    python -m pytest tests/test_pruning.py -q          # fast: fake step-reporting backends, SQLite, one subprocess
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import optuna
import pytest

from conftest import seed003_plan  # noqa: E402
from probes.backend import ProbeBackend
from probes.launch import run_with_timeout
from probes.result import ProbeResult
from probes.steps import StepTail, StepWatch
from search import pruning
from search.objective import Ledger, Objective, ProbeSettings, TrialRecord
from search.progress import Progress
from search.report import best, summarize
from search.settings import TuneSettings
from search.space import SearchSpace
from search.storage import open_study
from search.study import run

INPUTS = {"test": "pruning"}


def record(number, config, *, outcome="ok", value=None, state=None, phase="sampler", **attrs) -> TrialRecord:
    state = state or ("COMPLETE" if outcome == "ok" else "PRUNED" if outcome == "pruned" else "FAIL")
    return TrialRecord(number=number, state=state, params={}, config=config, slot=config, phase=phase,
                       outcome=outcome, reason="", value=value,
                       attrs={"probe_wall_s": 1.0, **({"measured_step_s": 100.0 / value} if value else {}), **attrs})


def test_verdict_waits_for_min_steps_and_keeps_the_margin():
    ref = pruning.Reference(config="a", tflops=10.0, noise=0.01, margin=0.10)
    assert pruning.verdict(ref, [5.0], min_steps=2) is None                # one step is not enough
    assert pruning.verdict(None, [1.0, 1.0]) is None                       # nothing measured yet: no reference
    assert pruning.verdict(ref, [8.0, 9.2]) is None                        # 9.2 x 1.1 >= 10: within the margin
    why = pruning.verdict(ref, [8.0, 9.0])                                 # 9.0 x 1.1 < 10: clearly behind
    assert why and "after 2 timed steps" in why and "10%" in why and "(a," in why


def test_margin_is_the_measured_noise_and_never_below_the_confirm_spread():
    quiet = [record(0, "a", value=10.0, step_cv=0.001), record(1, "b", value=8.0, step_cv=0.002)]
    ref = pruning.reference(quiet)
    assert ref.config == "a" and ref.tflops == 10.0 and ref.margin == pruning.MIN_MARGIN
    noisy = [record(0, "a", value=10.0, step_cv=0.05), record(1, "b", value=8.0, step_cv=0.08),
             record(2, "c", value=7.0, step_cv=0.001)]
    assert pruning.reference(noisy).margin == pytest.approx(pruning.NOISE_Z * 0.05)      # the median CV
    # two measurements of one configuration 20% apart: noise at least half that spread (drift between probes)
    repeated = quiet + [record(3, "a", value=8.0, phase="confirm", step_cv=0.001)]
    assert pruning.noise(repeated) == pytest.approx((10.0 - 8.0) / 9.0 / 2)


def test_a_pruned_configuration_is_probed_again_when_the_best_falls():
    first = [record(0, "a", value=10.0, step_cv=0.001),
             record(1, "b", outcome="pruned", pruned_tflops=8.5, pruned_steps=2)]
    ledger = Ledger.reopen(first)
    assert not ledger.records[1].reopened and ledger.records[1].final          # 8.5 x 1.1 < 10
    # confirmation re-probes measure "a" at 8.0 and 8.2: its median falls to 8.2, within the margin of b's 8.5
    later = first + [record(2, "a", value=8.0, phase="confirm"), record(3, "a", value=8.2, phase="confirm")]
    ledger = Ledger.reopen(later)
    b = ledger.records[1]
    assert b.reopened and not b.final and "b" not in ledger.final_by_slot()
    # another worker's trial of b, answered from the pruned one while it was final, is reopened with it
    copy = record(4, "b", outcome="duplicate", duplicate_of=1)
    assert "b" not in Ledger.reopen(later + [copy]).final_by_slot()


class Steps(ProbeBackend):
    """A backend that reports steps: step time = 10 s x (1 + tp + pp) / mbs^0.1 (x ``slow`` for configurations
    listed there), ``fast_once`` makes a configuration's first probe that much faster (an optimistic outlier)."""

    name = "steps"
    reports_steps = True

    def __init__(self, slow: dict | None = None, fast_once: dict | None = None) -> None:
        self.slow = slow or {}
        self.fast_once = dict(fast_once or {})
        self.steps_run: dict[str, int] = {}
        self.calls: list[str] = []

    def run(self, spec, *, workdir: Path, timeout_s: float, on_step=None) -> ProbeResult:
        c = spec.candidate
        key = f"tp={c['tp']},pp={c['pp']},mbs={c['mbs']}"
        self.calls.append(key)
        step = 10.0 * (1 + c["tp"] + c["pp"]) / c["mbs"] ** 0.1 * self.slow.get(key, 1.0)
        step *= self.fast_once.pop(key, 1.0)
        times = []
        for i in range(spec.steps):
            times.append(step)
            self.steps_run[key] = self.steps_run.get(key, 0) + 1
            reason = on_step(i, step) if on_step else None
            if reason:
                return ProbeResult(status="pruned", reason=reason, step_times_s=times, device="fake",
                                   phases={"steps": sum(times)})
        return ProbeResult(status="ok", step_time_median_s=step, step_times_s=times, step_time_cv=0.0, device="fake",
                           phases={"steps": sum(times)})


SPACE_SIZE = 12
"""configurations a study here searches: the plan's best 12 of its 36 (its slow ones as far behind as any)"""


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    p = seed003_plan()
    return SearchSpace.from_plan(p, keep=set(SearchSpace.from_plan(p).keys[:SPACE_SIZE]))


def go(space, backend, storage, *, prune: bool, **kw):
    settings = TuneSettings(study_name="s", storage_url=storage, seed=0, **kw)
    study = open_study(settings, space, INPUTS)
    objective = Objective(space=space, backend=backend, settings=ProbeSettings(steps=5, prune=prune))
    records = run(study, objective, space, settings, Progress(total=len(space), budget_s=None, enabled=False))
    return study, records


def test_slow_probes_stop_early_and_the_best_is_the_same(space, tmp_path):
    off, on = Steps(), Steps()
    _, rec_off = go(space, off, f"sqlite:///{tmp_path}/off.db", prune=False)
    study, rec_on = go(space, on, f"sqlite:///{tmp_path}/on.db", prune=True)
    b_off, b_on = best(summarize(rec_off)), best(summarize(rec_on))
    assert b_on.config == b_off.config and b_on.median_tflops == pytest.approx(b_off.median_tflops)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "no probe was pruned although most configurations are far behind the best"
    for t in pruned:
        ua = t.user_attrs
        assert ua["outcome"] == "pruned" and "behind the best so far" in ua["reason"]
        assert ua["pruned_steps"] == 2 and ua["pruned_tflops"] > 0
        assert sorted(t.intermediate_values) == [0, 1]                       # each timed step reported to Optuna
        assert ua["pruned_tflops"] * (1 + pruning.MIN_MARGIN) < b_on.median_tflops
        if ua.get("phase") == "confirm":
            assert ua["config"] != b_on.config                                # the best's re-probes run in full
    assert sum(on.steps_run.values()) < sum(off.steps_run.values())
    # every configuration probed once by the search: a pruned one is not probed again (the best did not fall);
    # confirmation re-probes only the measured ones, and is never pruned
    search_on = [r for r in rec_on if r.counted and r.phase != "confirm"]
    assert len(search_on) == len(space) == len([r for r in rec_off if r.counted and r.phase != "confirm"])
    confirms = [r for r in rec_on if r.phase == "confirm" and r.counted and r.config == b_on.config]
    assert confirms and all(r.outcome == "ok" for r in confirms)


def test_an_optimistic_first_probe_does_not_cost_the_best(space, tmp_path):
    """The plan's first configuration is slow (x1.5) but its first probe measures it twice too fast: it prunes the
    true best. Its confirmation re-probes measure it slow, its median falls, and the configurations no longer
    clearly behind (the true best among them) are probed again: the same best as without pruning."""
    first = space.survivors[0].candidate
    key = f"tp={first.tp},pp={first.pp},mbs={first.mbs}"
    _, rec_off = go(space, Steps(slow={key: 1.5}), f"sqlite:///{tmp_path}/off.db", prune=False)
    study, rec_on = go(space, Steps(slow={key: 1.5}, fast_once={key: 0.5}), f"sqlite:///{tmp_path}/on.db",
                       prune=True)
    target = best(summarize(rec_off)).config
    assert target != first.label()
    assert best(summarize(rec_on)).config == target
    pruned = [r for r in rec_on if r.config == target and r.outcome == "pruned"]
    again = [r for r in rec_on if r.config == target and r.outcome == "ok" and r.phase != "confirm"]
    assert pruned and again and pruned[0].number < again[0].number     # pruned by the outlier, probed again


def test_the_launcher_stops_a_probe_when_on_step_says_so(tmp_path):
    log = tmp_path / "logs" / "run" / "attempt_0" / "0" / "stdout.log"
    script = textwrap.dedent(f"""
        import pathlib, time
        p = pathlib.Path({str(log)!r}); p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w") as f:
            for i in range(3):
                f.write(f"[probe] step {{i + 2}} 0.5{{i}} s\\n"); f.flush()
            f.write("[probe] step 5 0.")            # a line not complete yet
            f.flush()
            while True:
                time.sleep(1)
    """)
    seen = []

    def on_step(index, seconds):
        seen.append((index, seconds))
        return "enough" if index == 1 else None

    watch = StepWatch(on_step, StepTail(tmp_path))
    code, timed_out, tracker = run_with_timeout([sys.executable, "-c", script], env={}, timeout_s=600,
                                                workdir=tmp_path, watch=watch)
    assert watch.stop_reason == "enough" and not timed_out and code is not None
    assert seen == [(0, 0.50), (1, 0.51)] and watch.steps == [0.50, 0.51]
    assert not tracker.alive()
