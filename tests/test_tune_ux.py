"""`tune` as people run it: help, one-line refusals, the work folder, limits that count what they say,
confirmation that means agreement, progress, and the faults a killed tuner or probe leaves (fast, no torch).

    python -m pytest tests/test_tune_ux.py -q
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from probes.backend import ProbeBackend
from probes.outcome import classify, parse_first_observed
from probes.result import ProbeResult
from search.cli import build_report_parser, build_run_parser, main, write_files
from search.objective import Ledger, Objective, ProbeSettings
from search.report import ConfigSummary, best, best_line, format_table, rank_key
from search.space import SearchSpace, config_key, params_of
from search.progress import Progress, last_step_time
from search.settings import TuneSettings
from search.storage import open_study, reap, storage_url
from search.study import run
from conftest import seed003_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
REPLAY = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
          "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
          "--backend", "replay", "--results", str(DATA), "--results-table", "v100-32gb-recompute", "--no-progress"]
LOCAL_A100 = ["--model", "1B3", "--gpus", "8"]


# -- help and one-line refusals ----------------------------------------------------------------------

def test_help_lists_the_subcommands_and_every_option_has_help(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "tune report" in text and "tune calibrate" in text
    assert "seed 00" not in text and "../shared" not in text
    for parser in (build_run_parser(), build_report_parser()):
        missing = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        assert not missing, f"options without help: {missing}"
    assert main(["calibrate", "--help"]) == 0
    assert "--out" in capsys.readouterr().out


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("argv, needle", [
    ([*REPLAY, "--study", "../../x"], "not a study name"),
    ([*REPLAY, "--study", "a/b"], "not a study name"),
    ([*REPLAY, "--storage", "sqlite://"], "in-memory"),
    ([*REPLAY, "--storage", "sqlite:///:memory:"], "in-memory"),
    ([*LOCAL_A100, "--probe-device", "cpu"], "CPU"),
    (["report", "--study", "../x"], "not a study name"),
])
def test_refused_in_one_line_with_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert needle in _one_line(capsys)
    assert not list(tmp_path.iterdir())                       # refused before writing anything


def test_report_plots_pointing_at_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*REPLAY, "--study", "p", "--max-probes", "1", "--confirm-top", "0"]) == 0
    capsys.readouterr()
    (tmp_path / "afile").write_text("mine\n")
    assert main(["report", "--study", "p", "--plots", str(tmp_path / "afile")]) == 2
    assert "is a file" in _one_line(capsys)
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_calibration_measured_on_cpu_is_refused_for_a_gpu_plan(tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    cal.write_text("device: cpu (gloo), 2 processes, 1 node(s)\nmatmul_efficiency: 0.5\n")
    code = main([*REPLAY, "--calibration", str(cal), "--storage", f"sqlite:///{tmp_path}/t.db"])
    assert code == 2 and "measured on a CPU" in _one_line(capsys)


def test_calibrate_never_replaces_a_file_without_force(tmp_path, capsys):
    mine = tmp_path / "cal.yaml"
    mine.write_text("mine\n")
    assert main(["calibrate", "--out", str(mine)]) == 2
    assert "--force" in _one_line(capsys) and mine.read_text() == "mine\n"
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "elsewhere.yaml")
    assert main(["calibrate", "--out", str(link), "--force"]) == 2 and "link" in _one_line(capsys)


def test_calibrate_with_an_unknown_model_is_one_line(tmp_path, capsys):
    assert main(["calibrate", "--model", "nosuch", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "nosuch" in _one_line(capsys)
    assert not (tmp_path / "c.yaml").exists()


def test_missing_optuna_names_the_extra():
    code = ("import sys; sys.modules['optuna'] = None; from search.cli import main; "
            f"sys.exit(main({[*REPLAY, '--storage', 'sqlite:///x.db']!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'plantune[tune]'" in lines[0]


def test_postgresql_urls_name_the_installed_driver():
    assert storage_url("postgresql://u@h:5432/db") == "postgresql+psycopg2://u@h:5432/db"
    assert storage_url("postgres://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert storage_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert storage_url("sqlite:///a/b.db") == "sqlite:///a/b.db"


# -- the work folder and --out -------------------------------------------------------------------------

def test_one_work_folder_per_study_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*REPLAY, "--study", "w", "--max-probes", "2", "--confirm-top", "0"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tune-w"]
    assert (tmp_path / "tune-w" / "tune.db").is_file()
    capsys.readouterr()
    assert main(["report", "--study", "w"]) == 0                 # found in its folder, plots beside it
    assert (tmp_path / "tune-w" / "report" / "history.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tune-w"]


def test_out_never_overwrites_without_force_nor_follows_links(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "plan.yaml").write_text("mine\n")
    storage = f"sqlite:///{tmp_path}/t.db"
    argv = [*REPLAY, "--storage", storage, "--max-probes", "1", "--confirm-top", "0", "--emit", "megatron-deepspeed",
            "--out", str(out)]
    assert main(argv) == 2 and "--force" in _one_line(capsys)
    assert (out / "plan.yaml").read_text() == "mine\n"
    link = tmp_path / "linked"
    link.symlink_to(out)
    assert main([*argv[:-1], str(link)]) == 2 and "link" in _one_line(capsys)

    victim = tmp_path / "victim.txt"                          # a link inside --out is replaced, never followed
    victim.write_text("precious\n")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "args.txt").symlink_to(victim)
    written = write_files(fresh, {"args.txt": "new\n"}, force=True)
    assert victim.read_text() == "precious\n"
    assert not written[0].is_symlink() and written[0].read_text() == "new\n"


# -- limits --------------------------------------------------------------------------------------------

def test_max_probes_counts_every_probe(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    assert main([*REPLAY, "--storage", storage, "--study", "m", "--max-probes", "1", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    probed = [t for t in d["trials"] if t["outcome"] in ("ok", "oom", "timeout", "crash")]
    assert len(probed) == 1


class Fake(ProbeBackend):
    """Step time from (tp, pp, mbs); counts calls. ``need_s``: a probe needs that long, so a shorter timeout
    ends it ``timeout`` (no sleeping); ``invalid_below``: processes the resources must give (else ``invalid``);
    ``kill``: configurations whose rank 1 is SIGKILLed (``times`` times)."""

    name = "fake"

    def __init__(self, *, need_s: float = 0.0, invalid: bool = False, kill: dict | None = None,
                 values: list[float] | None = None) -> None:
        self.calls: list[tuple[str, float]] = []
        self.need_s, self.invalid, self.kill = need_s, invalid, dict(kill or {})
        self.values = list(values or [])

    def run(self, spec, *, workdir: Path, timeout_s: float) -> ProbeResult:
        c = spec.candidate
        key = f"tp={c['tp']},pp={c['pp']},mbs={c['mbs']}"
        self.calls.append((key, timeout_s))
        if self.invalid:
            return ProbeResult(status="invalid", reason="needs 8 processes, this node runs 4 (--local-procs)")
        if timeout_s < self.need_s:
            return ProbeResult(status="timeout", reason=f"no result within {timeout_s:g} s")
        if self.kill.get(key, 0) > 0:
            self.kill[key] -= 1
            return ProbeResult(status="crash", reason="rank 1: killed by SIGKILL", root_cause_rank=1,
                               extra={"killed_by": "SIGKILL"})
        step = self.values.pop(0) if self.values else 10.0 * (1 + c["tp"] + c["pp"]) / c["mbs"] ** 0.1
        return ProbeResult(status="ok", step_time_median_s=step, step_times_s=[step], device="fake")


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    p = seed003_plan()
    keep = {config_key(e.candidate) for e in p.candidates[:4]}
    return SearchSpace.from_plan(p, keep=keep)


def go(space, backend, storage, *, resources="", budget_s=None, timeout_s=600.0, **kw):
    settings = TuneSettings(study_name="s", storage_url=storage, seed=0, sampler="analytic", budget_s=budget_s, **kw)
    study = open_study(settings, space, {"test": 1})
    objective = Objective(space=space, backend=backend,
                          settings=ProbeSettings(resources=resources, timeout_s=timeout_s))
    return run(study, objective, space, settings, Progress(total=len(space), budget_s=budget_s, enabled=False))


def test_a_probe_running_at_the_end_of_the_budget_is_stopped_and_probed_again(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    fake = Fake(need_s=3600.0)                   # longer than the budget: cut by it
    records = go(space, fake, storage, budget_s=120.0, confirm_top=0)
    assert len(fake.calls) == 1 and fake.calls[0][1] <= 120.0
    cut = records[0]
    assert cut.outcome == "interrupted" and cut.attrs.get("cut_by_budget") and "--budget" in cut.reason
    again = Fake()
    records = go(space, again, storage, confirm_top=0)
    assert len(again.calls) == len(space)                # the cut one too, once
    assert {r.config for r in records if r.measured} == set(space.keys)


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_invalid_is_probed_again_when_the_resources_change(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    records = go(space, Fake(invalid=True), storage, resources="local:4:auto", confirm_top=0)
    assert {r.outcome for r in records} == {"invalid"}
    same = Fake()
    go(space, same, storage, resources="local:4:auto", confirm_top=0)
    assert same.calls == []                      # the same resources: the verdict stands
    more = Fake()
    records = go(space, more, storage, resources="local:8:auto", confirm_top=0)
    assert len(more.calls) == len(space) and {r.config for r in records if r.measured} == set(space.keys)


# -- confirmation --------------------------------------------------------------------------------------

def _summary(tflops, reprobed=True) -> ConfigSummary:
    return ConfigSummary(config="tp=1,pp=1,dp=8,mbs=1,gas=1,recompute=full,zero=1", candidate={}, outcome="ok",
                         reason="", tflops=tuple(tflops), step_s=1.0, memory_gb=None, pred_analytic_tflops=None,
                         pred_before_tflops=None, pred_after_tflops=None, trials=(0,), reprobed=reprobed)


def test_confirmed_only_when_the_repeats_agree():
    assert _summary([100.0, 104.0, 102.0]).confirmed
    noisy = _summary([100.0, 153.0, 120.0])
    assert not noisy.confirmed and "NOT confirmed" in noisy.agreement
    assert not _summary([100.0], reprobed=False).confirmed
    table = format_table([noisy, _summary([90.0, 91.0])])
    assert " ?" in table and "✓" in table
    assert best([noisy, _summary([90.0, 91.0])]).median_tflops == 90.5     # a confirmed one before a noisy one


def test_the_table_the_final_line_and_the_best_follow_one_ranking():
    """A once-measured row above a confirmed one: the table's row 1 is the best tune names (rank_key)."""
    once, confirmed = _summary([120.0], reprobed=False), _summary([90.0, 91.0])
    once = replace(once, config="tp=1,pp=1,dp=8,mbs=4,gas=1")
    ranked = sorted([once, confirmed], key=rank_key)
    assert ranked[0] is confirmed and best([once, confirmed]) is confirmed
    rows = [line for line in format_table(ranked).splitlines() if line[:1].isdigit()]
    assert rows[0].startswith("1 ") and "tp=1,pp=1,dp=8,mbs=4" not in rows[0] and "tp=1,pp=1,dp=8,mbs=4" in rows[1]
    assert best_line([once, confirmed]).startswith(f"best {confirmed.config}: 90.5 model TFLOPs/GPU")


# -- faults --------------------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_tuners_running_trial_is_probed_again_at_once(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    go(space, Fake(), storage, confirm_top=0, max_probes=3)
    study = optuna.load_study(study_name="s", storage=storage)
    last = next(e for e in space.survivors if config_key(e.candidate) not in
                {r.config for r in Ledger.of(study).records})
    study.enqueue_trial(params_of(last.candidate))
    trial = study.ask()                          # what a tuner killed during the last configuration leaves
    for k, v in {"worker": f"{socket.gethostname()}:{_dead_pid()}", "config": config_key(last.candidate),
                 "slot": config_key(last.candidate), "phase": "sampler"}.items():
        trial.set_user_attr(k, v)
    fake = Fake()
    records = go(space, fake, storage, confirm_top=0, grace_s=3600)   # a long grace: not waited for
    assert records[trial.number].state == "FAIL" and records[trial.number].outcome == "interrupted"
    assert len(fake.calls) == 1
    assert {r.config for r in records if r.measured} == set(space.keys)


def test_a_trial_killed_before_it_recorded_its_worker_is_failed_after_the_grace(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage)
    orphan = study.ask()                         # killed between ask() and anything else
    assert reap(study, grace_s=3600) == []       # within the grace: may be alive
    assert reap(study, grace_s=0) == [orphan.number]
    t = optuna.load_study(study_name="s", storage=storage).trials[orphan.number]
    assert t.state.name == "FAIL" and t.user_attrs["outcome"] == "interrupted"


def test_an_old_trial_that_never_recorded_its_worker_neither_blocks_nor_delays_the_run(space, tmp_path):
    from datetime import datetime, timedelta

    from optuna.trial import FrozenTrial, TrialState

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    old = FrozenTrial(number=0, state=TrialState.RUNNING, value=None, datetime_start=datetime.now() - timedelta(hours=1),
                      datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
                      intermediate_values={}, trial_id=0)
    study._storage.create_new_trial(study._study_id, template_trial=old)
    waits = []
    import search.study as study_module

    real_sleep = study_module.time.sleep
    def sleep(seconds):                          # count the waits instead of waiting; fail rather than hang
        waits.append(seconds)
        if len(waits) > 20:
            raise AssertionError(f"the run keeps waiting for a dead trial ({len(waits)} waits)")

    study_module.time.sleep = sleep
    try:
        records = go(space, Fake(), storage, confirm_top=0, grace_s=7200)     # an old orphan: not the grace
    finally:
        study_module.time.sleep = real_sleep
    assert records[0].state == "FAIL" and records[0].outcome == "interrupted"
    assert {r.config for r in records if r.measured} == set(space.keys)
    assert waits == []


@pytest.mark.slow   # a whole tuning study (10-40 s on 2 cores)
def test_an_external_kill_is_retried_once_then_final(space, tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    first = space.survivors[0].candidate
    key = f"tp={first.tp},pp={first.pp},mbs={first.mbs}"
    records = go(space, Fake(kill={key: 1}), storage, confirm_top=0)
    mine = [r for r in records if r.config == config_key(first)]
    assert [r.outcome for r in mine] == ["interrupted", "ok"] and "probed once more" in mine[0].reason
    storage2 = f"sqlite:///{tmp_path}/s2.db"
    records = go(space, Fake(kill={key: 2}), storage2, confirm_top=0)
    mine = [r for r in records if r.config == config_key(first)]
    assert [r.outcome for r in mine] == ["interrupted", "crash"] and "again" in mine[1].reason


TORCHRUN_SIGKILL = """
Failures:
[1]:
  time      : 2026-11-22_10:00:01
  host      : node
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 101)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 101
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:00:00
  host      : node
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 102)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 102
"""


def test_a_sigkilled_worker_is_the_root_cause(tmp_path):
    assert parse_first_observed(TORCHRUN_SIGKILL) == 1
    r = classify(tmp_path, returncode=1, timed_out=False, timeout_s=60, torchrun_stderr=TORCHRUN_SIGKILL)
    assert (r.status, r.root_cause_rank) == ("crash", 1)
    assert "SIGKILL" in r.reason and r.extra["killed_by"] == "SIGKILL"


# -- progress ------------------------------------------------------------------------------------------

def test_progress_in_a_log_is_sparse_and_says_probe_n_of_n_and_the_step_time(tmp_path):
    log = tmp_path / "trial-0001" / "logs" / "run" / "attempt_0" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("warming up\n[probe] step 2 0.250000 s\n[probe] step 3 0.245000 s\n")
    assert last_step_time(tmp_path / "trial-0001") == (3, 0.245)
    out = io.StringIO()
    p = Progress(total=10, budget_s=3600.0, stream=out, max_probes=4, log_every_s=3600.0)
    p.probing(1, "tp=1,pp=2,dp=4,mbs=1,gas=8,recompute=full,zero=1", timeout_s=600.0, workdir=tmp_path / "trial-0001")
    p.probe_ended()
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in out.getvalue()
    assert "probe 1 of 4" in lines[0] and "of 0:10:00" in lines[0] and "step 3: 0.245 s" in lines[0]
    assert "tp=1,pp=2,dp=4,mbs=1" in lines[0] and "budget left" in lines[0]


@pytest.mark.parametrize("cell", ["inf", "nan", "fast", "-3", ""])
def test_replay_csv_with_a_bad_number_is_refused_before_any_trial(cell, tmp_path, capsys):
    lines = DATA.read_text().splitlines()
    header = lines[0].split(",")
    col = header.index("seconds_per_iteration")
    status = header.index("status")
    rows = [line.split(",") for line in lines[1:]]
    row = next(r for r in rows if r[status] == "ok" and "v100-32gb-recompute" in r)
    row[col] = cell
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
    storage = f"sqlite:///{tmp_path}/t.db"
    argv = [a if a != str(DATA) else str(bad) for a in REPLAY]
    assert main([*argv, "--storage", storage]) == 2
    assert "seconds_per_iteration" in _one_line(capsys)
    assert not (tmp_path / "t.db").exists()                  # nothing stored: fixing the CSV is enough


@pytest.mark.slow
def test_tune_calibrate_shows_its_progress(tmp_path):
    out = tmp_path / "cal.yaml"
    done = subprocess.run([sys.executable, "-m", "search.cli", "calibrate", "--nproc-per-node", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)   # a hang guard, no speed limit
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("calibrate: ")]
    assert "2 process(es) per node" in lines[0] and "at most 600 s" in lines[0]
    assert any("GEMM 3/3" in line for line in lines) and any("collectives 7/7" in line for line in lines)
    assert lines[-1].startswith("calibrate: done in") and out.is_file()
    assert len(lines) < 20                                   # one line per measurement, not per call


def test_progress_on_a_terminal_is_one_live_line(tmp_path):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = Progress(total=10, budget_s=None, stream=out, planned=13)
    p.probing(4, "tp=2,pp=1,dp=4,mbs=2,gas=8,recompute=none,zero=0", timeout_s=600.0, workdir=tmp_path)
    assert not out.getvalue().endswith("\n") and "probe 1 of at most 13" in out.getvalue()
    p.probe_ended()
    p.note("trial 4 done")
    p.close()
    assert "\r\x1b[2K[tune] trial 4 done\n" in out.getvalue()     # the live line is replaced, not scrolled


def test_the_live_line_fits_the_terminal(tmp_path, monkeypatch):
    """On a 100-column terminal a 150-character line wraps, and each redraw leaves a row behind: the live line is made
    to fit 99 columns (changing fields first, the layout cut last); the start line above it is folded, never cut
    (tests/test_tune_face.py checks 80 columns under a real pseudo-terminal)."""
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "100")
    out = Tty()
    p = Progress(total=10, budget_s=7200.0, stream=out, planned=13)
    p.probing(4, "tp=2,pp=1,dp=4,mbs=2,gas=8,recompute=selective,zero=1,sp=1,vpp=2,cp=2,ep=4", timeout_s=600.0,
              workdir=tmp_path)
    p.probing(5, "tp=2,pp=1,dp=4,mbs=2,gas=8,recompute=selective,zero=1,sp=1,vpp=2,cp=2,ep=4", timeout_s=600.0,
              workdir=tmp_path)
    p.probe_ended()
    p.close()
    drawn = [part for part in out.getvalue().replace("\n", "\r\x1b[2K").split("\r\x1b[2K") if part]
    live = [d for d in drawn if d.startswith("[tune] 0:0")]
    assert len(live) == 2 and all(len(d) <= 99 for d in drawn) and live[0].endswith("…"), drawn
    assert all(d.startswith("[tune] 0:00/10:00 | no step yet | no best yet | 1:59:") for d in live), live
    starts = [d for d in drawn if d.startswith("[tune] probe ")]
    assert len(starts) == 2 and "tp=2,pp=1,cp=2,ep=4,vpp=2,dp=4,mbs=2,recompute=selective," in starts[0]


def test_a_trial_on_another_host_that_never_beat_is_failed_after_the_grace(tmp_path):
    """A RUNNING trial whose tuner on another host recorded its worker but never a heartbeat: Optuna's stale rule
    skips it (no heartbeat row), so `reap` fails it once --grace-s has passed since it started; one that beat
    recently is left to the heartbeat rule."""
    from datetime import datetime, timedelta

    from optuna.trial import FrozenTrial, TrialState

    from search.settings import TuneSettings
    from search.storage import heartbeat_recorded, open_storage

    settings = TuneSettings(study_name="s", storage_url=f"sqlite:///{tmp_path}/s.db", heartbeat_s=60, grace_s=120)
    study = optuna.create_study(study_name="s", storage=open_storage(settings), direction="maximize")

    def running(minutes_ago: float) -> FrozenTrial:
        t = FrozenTrial(number=0, state=TrialState.RUNNING, value=None,
                        datetime_start=datetime.now() - timedelta(minutes=minutes_ago), datetime_complete=None,
                        params={}, distributions={}, user_attrs={"worker": "elsewhere.example:4242"},
                        system_attrs={}, intermediate_values={}, trial_id=0)
        return study._storage.get_trial(study._storage.create_new_trial(study._study_id, template_trial=t))

    silent_old, silent_new, beating = running(180), running(0), running(180)
    study._storage.record_heartbeat(beating._trial_id)
    assert heartbeat_recorded(study, silent_old._trial_id) is False
    assert heartbeat_recorded(study, beating._trial_id) is True
    assert reap(study, grace_s=3600) == [silent_old.number]       # 3 h > the 1 h grace, no heartbeat ever
    after = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert after[silent_old.number].state.name == "FAIL"
    assert "no heartbeat" in after[silent_old.number].user_attrs["reason"]
    assert after[silent_new.number].state.name == "RUNNING"        # within the grace: may be alive
    assert after[beating.number].state.name == "RUNNING"           # the heartbeat rule decides for this one


def test_the_by_layout_plot_has_a_panel_only_for_dimensions_the_study_varies(tmp_path):
    from search.objective import TrialRecord
    from search.report import layout_dims, write_plots

    def rec(n: int, value: float, **c) -> TrialRecord:
        cand = {"tp": 2, "pp": 1, "dp": 4, "mbs": 1, "recompute": "none", "zero": 1, **c}
        return TrialRecord(number=n, state="COMPLETE", params={}, config=f"c{n}", slot=f"c{n}", phase="sampler",
                           outcome="ok", reason="", value=value,
                           attrs={"candidate": cand, "outcome": "ok", "measured_step_s": 1.0})

    dense = [rec(0, 100.0), rec(1, 90.0, tp=4, dp=2)]
    assert layout_dims(dense) == ["tp"]          # PP and MBS one value each: no panel; DP follows TP x PP: none
    assert layout_dims(dense + [rec(2, 80.0, pp=2, dp=2, mbs=2)]) == ["tp", "pp", "mbs"]
    moe = [rec(0, 100.0, ep=1), rec(1, 110.0, ep=2), rec(2, 95.0, cp=2, dp=2)]
    assert layout_dims(moe) == ["cp", "ep"]
    assert layout_dims(dense[:1]) == []          # one layout measured: nothing varies (the plot says so)
    assert all(p.is_file() for p in write_plots(dense[:1], tmp_path / "one"))
    old = [rec(0, 100.0), rec(1, 90.0, ep=4)]                        # a record without cp/ep reads as 1
    del old[0].attrs["candidate"]["dp"]
    assert "ep" in layout_dims(old) and "cp" not in layout_dims(old)
    paths = write_plots(moe, tmp_path)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
