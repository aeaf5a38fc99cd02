"""probes.lifeline: a process started behind a lifeline runs its command only while its parent lives.

    python -m pytest tests/test_lifeline.py -q

The kills of a whole tuner at each moment of a probe's life are in tests/test_tune_local.py and
tests/test_tune_slurm.py (slow); these check the wrapper itself, one short process each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from probes import lifeline
from probes.launch import torchrun_argv
from probes.slurm import torchrun_task_argv

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_runs_its_command_when_the_parent_is_the_one_named():
    code = "import os; print(os.environ['PLANTUNE_LIFELINE_PARENT'] == str(os.getpid()))"
    done = _run(lifeline.wrap("worker", [sys.executable, "-c", code]), lifeline.parent_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"          # it names itself the parent of what its command starts


def test_kills_itself_when_the_parent_named_is_already_gone():
    # as if the process that started it had died before the prctl: its pid is not our parent's
    done = _run(lifeline.wrap("torchrun", [sys.executable, "-c", "print('ran')"]),
                {lifeline.PARENT_ENV: str(os.getpid() + 1_000_000)})
    assert done.returncode == -signal.SIGKILL and "ran" not in done.stdout


def test_bad_use_is_one_line_and_exit_2():
    done = _run([sys.executable, "-m", "probes.lifeline", "nobody", "true"], {})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage" in done.stderr
    missing = _run(lifeline.wrap("srun", ["/nonexistent/srun"]), lifeline.parent_env())
    assert missing.returncode == 127 and "cannot run /nonexistent/srun" in missing.stderr
    with pytest.raises(ValueError, match="role"):
        lifeline.wrap("mpirun", ["true"])


def test_torchrun_starts_every_worker_behind_a_lifeline():
    local = torchrun_argv(spec_path=Path("s.json"), out_dir=Path("o"), nproc=2)
    assert local[local.index("-m", 3):] == ["-m", "probes.lifeline", "worker", sys.executable, "-u", "-m",
                                           "probes.train", "--spec", "s.json", "--out", "o"]
    node = torchrun_task_argv(nproc_per_node=2, nnodes=1, master="n1", port=1, node_rank=0, rdzv_id="x",
                              worker=["pretrain_gpt.py", "--bf16"])
    assert node[-7:] == ["-m", "probes.lifeline", "worker", sys.executable, "-u", "pretrain_gpt.py", "--bf16"]
