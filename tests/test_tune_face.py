"""Issue 32: what tune shows agrees with itself and with Optuna's tools (the pick in the study, the live line at 80
columns, the plots' data, the dashboard hint). Fast: records built by hand, or one replayed study."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("optuna")
pytest.importorskip("matplotlib")

from search.objective import TrialRecord  # noqa: E402
from search.report import (_plot_fastest, _plot_history, _plot_layout, best, dashboard_command,  # noqa: E402
                           history, layout_dims, short, summarize)


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
    assert any("tune's pick (confirmed)" in t.get_text() for t in fig.legends[0].get_texts())


def test_layout_plot_has_no_panel_for_a_dimension_with_one_value(tmp_path):
    records = noisy_study()           # TP and PP vary; MBS, CP, EP do not; DP follows TP x PP
    assert layout_dims(records) == ["tp", "pp"]
    fig = _plot_layout(records, tmp_path / "layout.png")
    assert [ax.get_xlabel() for ax in fig.axes] == ["TP", "PP"]
    one = _plot_layout(records[:1], tmp_path / "one.png")
    assert len(one.axes) == 1 and not one.axes[0].axison    # no panel: a line saying nothing varies
    assert "no parallel dimension varies" in one.axes[0].texts[0].get_text()


def _laid_out(fig) -> None:
    """Every title and legend inside the figure, no legend over an axes or its labels, each axes at least 0.4 of the
    figure wide (a legend right of the axes once squeezed a one-panel plot to a strip and cut its title)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else []) + fig.legends
    for t in texts:
        if t.get_visible() and (not hasattr(t, "get_text") or t.get_text()):
            e = t.get_window_extent(renderer)
            assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, t
    for ax in (a for a in fig.axes if a.axison):
        assert ax.get_position().width >= 0.4 / len([a for a in fig.axes if a.axison]), ax.get_position()
        for legend in fig.legends:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_tightbbox(renderer)), ax


def test_plots_keep_titles_and_legends_inside_and_the_axes_wide(tmp_path):
    records = noisy_study()
    long_pick = [rec(r.number, r.config + ",recompute=selective,zero=1,sp=1,vpp=4,cp=2,ep=8", r.value, phase=r.phase)
                 for r in records[:2]]
    for fig in (_plot_fastest(summarize(records), tmp_path / "f.png", "s"),
                _plot_fastest(summarize(long_pick), tmp_path / "f2.png", "a-study-with-a-long-name"),
                _plot_layout(records, tmp_path / "l.png"), _plot_layout(records[:2], tmp_path / "l1.png"),
                _plot_history(records, tmp_path / "h.png", "s"),
                _plot_history(long_pick, tmp_path / "h2.png", "a-study-with-a-long-name")):
        _laid_out(fig)
    assert _plot_history(records, tmp_path / "h.png", "s").axes[0].get_xticks().tolist() == \
        [t for t in _plot_history(records, tmp_path / "h.png", "s").axes[0].get_xticks().tolist() if t == int(t)]


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


# -- the live line and the result lines at 80 columns, under a real pseudo-terminal ----------------------------------

LAYOUT = "tp=8,pp=16,dp=2,mbs=1,gas=64,recompute=selective,zero=1,sp=1,vpp=4,cp=16,ep=8"
OOM = ("CUDA out of memory: tried to allocate 2.00 GiB with 1.50 GiB free of 79.15 GiB; lower --max-mbs, add "
       "recompute=full, or give the probe more processes with --local-procs")
CHILD = f"""
import sys
from pathlib import Path
from planner import plan
from planner.cli import build_parser, setup_from_args
from search.objective import Ledger, TrialRecord
from search.progress import Progress
from search.report import format_table, summarize
from search.cli import stdout_width
from search.space import SearchSpace

workdir = Path(sys.argv[1])
model, cluster, training = setup_from_args(build_parser().parse_args(["--model", "1B3", "--gpus", "8"]))
space = SearchSpace.from_plan(plan(model, cluster, training))
first, second = space.keys[0], space.keys[1]
ok = TrialRecord(number=0, state="COMPLETE", params={{}}, config=first, slot=first, phase="analytic", outcome="ok",
                 reason="", value=0.04123, attrs={{"candidate": {{}}, "probe_wall_s": 12.0, "measured_step_s": 0.5}})
oom = TrialRecord(number=1, state="FAIL", params={{}}, config=second, slot=second, phase="sampler", outcome="oom",
                  reason={OOM!r}, value=None, attrs={{"candidate": {{}}, "probe_wall_s": 30.0}})
log = workdir / "logs" / "run" / "attempt_0" / "0" / "stdout.log"
log.parent.mkdir(parents=True)
log.write_text("[probe] step 3 0.245000 s\\n")
p = Progress(total=len(space), budget_s=7200.0, max_probes=6, probe_timeout_s=600.0)
assert p.tty
p.probing(4, {LAYOUT!r}, timeout_s=600.0, workdir=workdir)
p.update(Ledger([ok]), space, ok)
p.probing(5, {LAYOUT!r}, timeout_s=600.0, workdir=workdir)
p.probe_ended()
p.update(Ledger([ok, oom]), space, oom)
p.close()
print(format_table(summarize([ok, oom]), title="tune: study 'face', 2 trials, calibration compute x0.224, comm x0.906",
                   width=stdout_width()))
print("END", stdout_width())
"""


def _terminal(text: str, columns: int) -> tuple[list[str], int]:
    """What a terminal of ``columns`` shows for ``text``: the rows as finally drawn ("\\r" returns to column 0,
    ESC[2K clears the row, "\\n" starts the next), and the rightmost column any character was written to."""
    rows, row, col, widest = [], [], 0, 0
    i = 0
    while i < len(text):
        if text.startswith("\x1b[2K", i):
            row, i = [" "] * col, i + 4
            continue
        ch = text[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            rows.append("".join(row).rstrip())
            row, col = [], 0
        else:
            row[col:col + 1] = [ch] if col < len(row) else [*([" "] * (col - len(row))), ch]
            col += 1
            widest = max(widest, col)
    if row:
        rows.append("".join(row).rstrip())
    return rows, widest


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")
def test_live_line_result_lines_and_table_fit_80_columns_under_a_pty(tmp_path):
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    root = Path(__file__).resolve().parents[1]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdin=slave, stdout=slave, stderr=slave,
                             cwd=root, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert child.wait() == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    text = b"".join(chunks).decode()
    rows, widest = _terminal(text, 80)
    assert widest <= 79, [r for r in rows if len(r) > 79]            # nothing reached the last column: no wrap
    assert "END 79" in rows                                          # the table was formed for 80 columns
    # the live line: its changing fields come first and all of them are there, redrawn in place
    frames = [f for f in text.replace("\r\n", "\n").replace("\n", "\r\x1b[2K").split("\r\x1b[2K")
              if f.startswith("[tune] 0:0")]
    assert len(frames) >= 2, text
    for frame in frames:
        assert len(frame) <= 79 and frame.startswith("[tune] 0:0") and "/10:00 | step 3 0.245s | " in frame, frame
        assert " left | " in frame and "trial" in frame, frame
    assert any("best 0.04123 TF/GPU" in f for f in frames)          # after trial 0's result
    # the probe's layout, in full on the start line (folded after a comma), degrees first
    starts = [i for i, r in enumerate(rows) if r.startswith("[tune] probe ")]
    assert len(starts) == 2
    started = " ".join(r.strip() for r in rows[starts[0]:starts[0] + 2])
    assert "trial 4 tp=8,pp=16,cp=16,ep=8,vpp=4," in rows[starts[0]] and "sp=1" in started
    # the per-trial result lines: the trial, then the study's status, each within the width, the reason whole
    oom_rows = [i for i, r in enumerate(rows) if r.startswith("[tune] trial 1 sampler ")]
    assert oom_rows, rows
    block = []
    for r in rows[oom_rows[0]:]:
        if block and not r.startswith(" "):
            break
        block.append(r.strip())
    assert " ".join(block).count("--local-procs") == 1 and "configs | best" in " ".join(block), block
    assert "elapsed" in block[-1] and "2/" in " ".join(block), block
    # the table's narrow form: a header row, and the wide table's ~170 columns nowhere
    header = next(r for r in rows if r.startswith("#") and "configuration" in r)
    assert "pred before" not in header and "TFLOPs" in header


# -- Optuna's best is tune's best ------------------------------------------------------------------------------------

def test_optunas_best_trial_is_tunes_pick_on_a_real_study(tmp_path):
    """The issue's study, probed by tune into SQLite: one configuration's first probe reads high and its re-probes
    do not confirm it; another is confirmed lower. Through Optuna's own API (load_study, best_trial, best_value,
    best_params, user_attrs) the study says what tune's table says."""
    import optuna

    from search.sampler import _measurements_only
    from search.space import params_of
    from search.study import PICK_ATTR, pick_line
    from test_tune_ux import Fake, go, seed003_plan, SearchSpace, config_key

    p = seed003_plan()
    space = SearchSpace.from_plan(p, keep={config_key(e.candidate) for e in p.candidates[:4]})
    storage = f"sqlite:///{tmp_path}/s.db"
    # step times in probe order: 4 search probes (the first fast: a noisy reading), then 2 re-probes of the best two
    steps = [5.0, 10.0, 20.0, 20.0, 12.0, 12.0, 10.0, 10.1]
    records = go(space, Fake(values=steps), storage, confirm_top=2, repeats=2)
    pick = best(summarize(records))
    assert pick.confirmed and len(pick.tflops) == 3
    assert pick_line(optuna.load_study(study_name="s", storage=storage)).startswith("the study records this pick as")

    study = optuna.load_study(study_name="s", storage=storage)
    probes = [t for t in study.trials if t.user_attrs.get("phase") != "pick"]
    highest = max((t for t in probes if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert highest.user_attrs["config"] != pick.config            # the highest single probe is not tune's pick
    assert all(t.constraints == {"tune_pick": 1.0} for t in probes if t.state.name == "COMPLETE")
    b = study.best_trial
    assert b.user_attrs["phase"] == "pick" and b.user_attrs["pick_config"] == pick.config
    assert study.best_value == pytest.approx(pick.median_tflops) and study.best_params == params_of(
        space.by_key(pick.config).candidate)
    assert sorted(b.user_attrs["measured_in_trials"]) == sorted(pick.trials) and b.user_attrs["confirmed"] is True
    assert study.user_attrs[PICK_ATTR]["pick_config"] == pick.config
    # every probe is 'infeasible' as an answer; TPE (Optuna 5 ranks constrained trials by violation, not value) is
    # given the measured values alone, without constraints or the pick trial
    shadow = _measurements_only(study)
    assert [t.value for t in shadow.trials] == [t.value for t in probes if t.state.name == "COMPLETE"]
    assert [t.params for t in shadow.trials] == [t.params for t in probes if t.state.name == "COMPLETE"]
    assert len(shadow.trials) == 8 and all(t.constraints == {} for t in shadow.trials)
    # the same command again finds nothing to probe: the pick is unchanged, and no second pick trial is added
    go(space, Fake(), storage, confirm_top=2, repeats=2)
    again = optuna.load_study(study_name="s", storage=storage)
    assert [t.number for t in again.trials if t.user_attrs.get("phase") == "pick"] == [b.number]
    assert again.best_trial.number == b.number


def test_a_pick_that_falls_later_is_said_not_hidden(tmp_path):
    """Run 1 stops before any re-probe: its pick is one fast probe. Run 2 re-probes it slower and confirms another,
    lower: the new pick trial cannot outrank the earlier one in Optuna (finished trials are frozen), and tune says
    so instead of letting best_trial speak for it."""
    import optuna

    from search.study import pick_line
    from test_tune_ux import Fake, go, seed003_plan, SearchSpace, config_key

    p = seed003_plan()
    space = SearchSpace.from_plan(p, keep={config_key(e.candidate) for e in p.candidates[:4]})
    storage = f"sqlite:///{tmp_path}/s.db"
    first = best(summarize(go(space, Fake(values=[5.0, 10.0, 20.0, 20.0]), storage, confirm_top=0)))
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.best_trial.user_attrs["pick_config"] == first.config and "Optuna's best_trial" in pick_line(study)
    then = best(summarize(go(space, Fake(values=[12.0, 12.0, 10.0, 10.1]), storage, confirm_top=2, repeats=2)))
    assert then.config != first.config and then.confirmed
    study = optuna.load_study(study_name="s", storage=storage)
    picks = [t for t in study.trials if t.user_attrs.get("phase") == "pick"]
    assert [t.user_attrs["pick_config"] for t in picks] == [first.config, then.config]
    assert study.best_trial.number == picks[0].number                   # frozen: the earlier, higher pick
    assert study.user_attrs["tune_pick"]["pick_config"] == then.config  # the study attribute is always the latest
    assert f"trial {picks[1].number}, but Optuna's best_trial is trial {picks[0].number}" in pick_line(study)


@pytest.mark.parametrize("width", [1, 8, 30, 79])
def test_fold_ends_and_keeps_every_character(width):
    """Folding never loops on a tiny terminal, never drops a character, breaks after ',' or ' ' where it can."""
    from search.progress import INDENT, fold

    line = "[tune] trial 1 sampler tp=8,pp=16,cp=16,ep=8,vpp=4,dp=2,mbs=1: oom " + "x" * 90 + " lower --max-mbs"
    rows = fold(line, width).split("\n")
    assert all(len(r) <= max(width, len(INDENT) + 20) for r in rows)
    assert "".join(r.removeprefix(INDENT) for r in rows).replace(" ", "") == line.replace(" ", "")


def test_a_pruned_trial_says_pruned_once():
    """The result line and the table's reasons said "pruned pruned after 1 timed step" (the outcome, then a reason
    that starts with it)."""
    from search.progress import Progress

    why = "pruned after 1 timed step: its fastest step means 0.006438 TFLOPs/GPU, 28% behind the best so far"
    pruned = TrialRecord(number=1, state="PRUNED", params={}, config=B, slot=B, phase="sampler", outcome="pruned",
                         reason=why, value=0.0064, attrs={"candidate": {}})
    oom = TrialRecord(number=2, state="FAIL", params={}, config=C, slot=C, phase="sampler", outcome="oom",
                      reason="CUDA out of memory", value=None, attrs={"candidate": {}})
    p = Progress(total=3, budget_s=None, max_probes=6, probe_timeout_s=600.0)
    for width in (None, 80):
        assert "pruned pruned" not in p.result_line(pruned, width).replace("\n", " ")
        assert f": {why[:30]}" in " ".join(p.result_line(pruned, width).split())
        assert ": oom CUDA out of memory" in " ".join(p.result_line(oom, width).split())
    from search.report import format_table
    table = format_table(summarize([rec(0, A, 10.0), pruned, oom]), title="t", width=200)
    assert "pruned: pruned" not in table and f": {why[:30]}" in table and "oom: CUDA out of memory" in table
