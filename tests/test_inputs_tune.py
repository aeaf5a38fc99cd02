"""`tune`'s own inputs (replay CSVs, tune calibrate's flags, report's --plots): one line on stderr and exit 2, never a
traceback (the contract `plan` keeps in tests/test_inputs.py).

    python -m pytest tests/test_inputs_tune.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from search.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "bigscience_1b3_v100.csv"
REPLAY = ["--model", "1B3", "--gpu", "V100-32GB", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "512",
          "--seq-len", "2048", "--precision", "fp16", "--recompute", "full", "--zero", "1", "--no-rampup",
          "--backend", "replay", "--results-table", "v100-32gb-recompute", "--no-progress", "--max-probes", "2"]
HEADER, ROW = DATA.read_text().splitlines()[:2]


def _one_line(code: int, err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def _replay_with(tmp_path, body: bytes) -> list[str]:
    path = tmp_path / "results.csv"
    path.write_bytes(body)
    return [*REPLAY, "--results", str(path), "--storage", f"sqlite:///{tmp_path}/t.db", "--workdir", str(tmp_path)]


@pytest.mark.parametrize("body, needle", [
    ((HEADER + "\n" + ROW.replace(",1,1,8,1,", ",inf,1,8,1,", 1) + "\n").encode(), "'inf' is not a finite integer"),
    ((HEADER + "\n" + ROW.replace(",1,1,8,1,", ",1,nan,8,1,", 1) + "\n").encode(), "'nan' is not a finite integer"),
    (b"\xff\xfe\x00\x01binary\x00\x80\x81" * 50, "is not a text CSV"),
    ((HEADER + "\n" + ROW + "," + "x" * (200 * 1024) + "\n").encode(), "not a readable CSV"),
])
def test_a_bad_replay_csv_is_one_line(tmp_path, capsys, body, needle):
    _one_line(main(_replay_with(tmp_path, body)), capsys.readouterr().err, needle)


@pytest.mark.parametrize("argv, needle", [
    (["--tokens", "-5"], "--tokens: -5 must be > 0"),
    (["--timeout-s", "-1"], "--timeout-s/--timeout_s: -1.0 must be > 0"),
    (["--nproc-per-node", "0"], "--nproc_per_node: 0 must be > 0"),
    (["--nproc-per-node", "two"], "'two' is not an integer"),
    (["--precision", "fp64"], "invalid choice: 'fp64'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([], "the following arguments are required: --out"),
])
def test_tune_calibrate_argument_errors_are_one_line(tmp_path, capsys, argv, needle):
    if argv:
        argv = [*argv, "--out", str(tmp_path / "cal.yaml")]
    _one_line(main(["calibrate", *argv]), capsys.readouterr().err, needle)


def test_tune_calibrate_out_where_it_cannot_write(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["calibrate", "--cpu", "--out", str(blocker / "cal.yaml")])
    _one_line(code, capsys.readouterr().err, "cannot write there")


def test_tune_report_plots_where_it_cannot_write(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/t.db"
    assert main([*_replay_with(tmp_path, DATA.read_bytes()), "--study", "r", "--storage", storage]) == 0
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["report", "--study", "r", "--storage", storage, "--plots", str(blocker / "plots")])
    _one_line(code, capsys.readouterr().err, "cannot write there")


@pytest.mark.slow
def test_tune_calibrate_with_a_relative_model_path(tmp_path, monkeypatch):
    """The workers run in --out's folder: a model file named relative to where the user stands must still be found."""
    pytest.importorskip("torch")
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "tiny.yaml").write_text("name: tiny\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\n"
                                                 "ffn_hidden: 128\nvocab: 128\nseq_len: 32\n")
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "elsewhere" / "cal.yaml"
    assert main(["calibrate", "--cpu", "--quiet", "--model", "tiny.yaml", "--out", str(out)]) == 0, sys.stderr
    assert "matmul_efficiency" in out.read_text()
