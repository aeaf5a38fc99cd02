"""Issue 32: what tune shows agrees with itself and with Optuna's tools (the pick in the study, the live line at 80
columns, the plots' data, the dashboard hint). Fast: records built by hand, or one replayed study."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("optuna")
pytest.importorskip("matplotlib")

from search.objective import TrialRecord  # noqa: E402
from search.report import (_plot_fastest, _plot_layout, best, dashboard_command, history, layout_dims,  # noqa: E402
                           short, summarize)


def rec(n: int, config: str, value: float, *, phase: str = "sampler", **cand) -> TrialRecord:
    c = {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "recompute": "none", "zero": 0, **cand}
    return TrialRecord(number=n, state="COMPLETE", params={}, config=config, slot=config, phase=phase, outcome="ok",
                       reason="", value=value, attrs={"candidate": c, "outcome": "ok", "measured_step_s": 1.0 / value})


A, B, C = "tp=1,pp=1,dp=8,mbs=1,gas=1", "tp=1,pp=2,dp=4,mbs=1,gas=2", "tp=2,pp=1,dp=4,mbs=1,gas=2"


def noisy_study() -> list[TrialRecord]:
    """The issue's study: A's one probe is high and its re-probes disagree (not confirmed); B is confirmed lower; then
    C is confirmed at 9.0 and a last re-probe of C (5.0) unconfirms it, so tune's pick falls back to B."""
    return [rec(0, A, 10.0), rec(1, B, 8.0, pp=2, dp=4), rec(2, A, 6.0, phase="confirm"),
            rec(3, A, 6.2, phase="confirm"), rec(4, B, 8.1, phase="confirm", pp=2, dp=4),
            rec(5, B, 7.9, phase="confirm", pp=2, dp=4), rec(6, C, 9.0, tp=2, dp=4),
            rec(7, C, 9.1, phase="confirm", tp=2, dp=4), rec(8, C, 9.05, phase="confirm", tp=2, dp=4),
            rec(9, C, 5.0, phase="confirm", tp=2, dp=4)]


def test_history_best_so_far_never_falls_and_the_pick_is_tunes():
    records = noisy_study()
    h = history(records)
    assert h.trials == tuple(range(10))
    confirmed = [v for v in h.confirmed if v is not None]
    assert confirmed == sorted(confirmed) and h.single == tuple(sorted(h.single))      # both only rise
    assert h.confirmed[:4] == (None,) * 4              # nothing confirmed before B's first re-probe agrees
    assert h.confirmed[4] == pytest.approx(8.05)       # B: 8.0 and 8.1 agree
    assert h.confirmed[5] == pytest.approx(8.05)       # B's median is 8.0 now: the record of 8.05 stays
    assert h.confirmed[8] == pytest.approx(9.05)       # C confirmed at trial 8 ...
    assert h.confirmed[9] == pytest.approx(9.05)       # ... and stays on the record when trial 9 unconfirms it
    assert h.single[-1] == 10.0                        # A's lone high probe: the best single probe, not the pick
    assert h.pick is not None and h.pick.config == B == best(summarize(records)).config
    # what the old line drew (tune's pick after each trial) falls: 10 -> 8 at trial 5 and 9.05 -> 8 at trial 9
    old = [best(summarize(records[:i + 1])).median_tflops for i in range(10)]
    assert old != sorted(old)


def test_fastest_marks_the_pick(tmp_path):
    summaries = summarize(noisy_study())
    fig = _plot_fastest(summaries, tmp_path / "fastest.png", "s")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert [x for x in labels if x.startswith("★ ")] == ["★ " + short(B)]
    assert labels[-1] == "★ " + short(B)               # row 1 of the ranking is at the top
    assert any("tune's pick (confirmed)" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_layout_plot_has_no_panel_for_a_dimension_with_one_value(tmp_path):
    records = noisy_study()           # TP and PP vary; MBS, CP, EP do not; DP follows TP x PP
    assert layout_dims(records) == ["tp", "pp"]
    fig = _plot_layout(records, tmp_path / "layout.png")
    assert [ax.get_xlabel() for ax in fig.axes] == ["TP", "PP"]
    one = _plot_layout(records[:1], tmp_path / "one.png")
    assert len(one.axes) == 1 and not one.axes[0].axison    # no panel: a line saying nothing varies
    assert "no parallel dimension varies" in one.axes[0].texts[0].get_text()


def test_dashboard_hint_works_from_any_folder(tmp_path, monkeypatch):
    """tune report's hint names the database by its absolute path: opened from another folder, it is the study."""
    import shlex

    import optuna

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tune-x").mkdir()
    relative = "sqlite:///tune-x/tune.db"
    optuna.create_study(study_name="x", storage=relative, direction="maximize")
    command = dashboard_command(relative)
    assert command == f"optuna-dashboard {shlex.quote(f'sqlite:///{tmp_path}/tune-x/tune.db')}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    url = shlex.split(command)[1]
    assert optuna.get_all_study_names(url) == ["x"]
    assert dashboard_command(url) == command                           # already absolute: unchanged
    assert dashboard_command("postgresql://u@h/db") == "optuna-dashboard postgresql://u@h/db"
    assert os.path.isabs(url.removeprefix("sqlite:///"))
