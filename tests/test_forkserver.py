"""probes.forkserver: a node's ranks forked from one process that imported torch, as torchrun would start them.

    python -m pytest tests/test_forkserver.py -q          # the slow ones: real ranks (gloo, the tiny GPT)

The warm pools run on it (tests/test_warm.py, tests/test_tune_local.py's kills at every moment, the SLURM tests'
warm steps); these check what it promises torchrun's readers: the ranks' environment, the failure summary
`probes.outcome` parses, a failing rank ending the others, and ranks of two nodes meeting at ``--master``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest_probes import PROBE_TIMEOUT_S, tiny_spec
from probes import lifeline
from probes.forkserver import LOG_RUN, RDZV_FILE_ENV, _summary, rank_env
from probes.outcome import classify, parse_first_observed, parse_torchrun_failures

ROOT = Path(__file__).resolve().parents[1]


def test_ranks_are_numbered_as_torchrun_numbers_them():
    one = rank_env(1, 2, rdzv_file=Path("/x/rdzv"))
    assert one == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                   "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", RDZV_FILE_ENV: "/x/rdzv"}
    two = rank_env(3, 4, nnodes=2, node_rank=1, master="n1:6000", rdzv_file=Path("/x/rdzv"))
    assert (two["RANK"], two["LOCAL_RANK"], two["WORLD_SIZE"], two["GROUP_RANK"]) == ("7", "3", "8", "1")
    assert (two["MASTER_ADDR"], two["MASTER_PORT"]) == ("n1", "6000") and RDZV_FILE_ENV not in two


def test_the_failure_summary_reads_as_torchruns():
    # node 1 of 2 nodes of 2 ranks: local rank 1 (global 3) failed first, the server stopped local rank 0
    text = _summary({1: 1, 0: -15}, 1, {0: 100, 1: 101}, offset=2)
    assert parse_torchrun_failures(text) == {2: -15, 3: 1}
    assert parse_first_observed(text) == 3


def test_a_slurm_warm_step_runs_a_fork_server_per_node():
    from probes.slurm_task import forkserver_task_argv, main

    argv = forkserver_task_argv(nproc_per_node=8, nnodes=2, master="n1", port=6000, node_rank=1,
                                log_dir=Path("/p/logs/node1"), train_args=["--serve", "/p"])
    assert argv[1:] == ["-u", "-m", "probes.forkserver", "--nproc", "8", "--nnodes", "2", "--node-rank", "1",
                        "--master", "n1:6000", "--log-dir", "/p/logs/node1", "--", "--serve", "/p"]
    # what it forks is probes.train: any other worker is refused in one line
    assert main(["task", "--nproc-per-node", "1", "--nnodes", "1", "--master", "n1", "--port", "1", "--rdzv-id",
                 "x", "--log-dir", "/p/logs", "--forkserver", "--", "script.py"]) == 2


def _probe_files(tmp_path: Path, spec) -> tuple[Path, Path]:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    return spec_path, tmp_path / "out"


def _server(args: list[str]) -> list[str]:
    return lifeline.wrap("forkserver", [sys.executable, "-u", "-m", "probes.forkserver", *args])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return lifeline.parent_env({**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(extra or {})})


@pytest.mark.slow
def test_a_failing_rank_ends_the_others_and_the_server(tmp_path):
    pytest.importorskip("torch")
    spec_path, out = _probe_files(tmp_path, tiny_spec(dp=2, gas=1, steps=40))
    done = subprocess.run(_server(["--nproc", "2", "--log-dir", str(tmp_path / "logs"), "--", "--spec",
                                   str(spec_path), "--out", str(out)]),
                          cwd=ROOT, env=_env({"PLANTUNE_PROBE_FAULT": "raise:1"}), capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    assert done.returncode == 1, done.stderr
    codes = parse_torchrun_failures(done.stderr)
    assert codes[1] == 1 and parse_first_observed(done.stderr) == 1, done.stderr
    pids = [int(p.read_text()) for p in out.glob("pid-rank*")]
    assert len(pids) == 2 and not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    logs = {r: (tmp_path / "logs" / LOG_RUN / "attempt_0" / str(r) / "stderr.log").read_text() for r in (0, 1)}
    assert "injected fault" in logs[1]
    result = classify(out, returncode=done.returncode, timed_out=False, timeout_s=PROBE_TIMEOUT_S,
                      torchrun_stderr=done.stderr, rank_logs=logs, world_size=2)
    assert result.status == "crash" and result.root_cause_rank == 1, result.reason


@pytest.mark.slow
def test_a_terminated_server_stops_and_reaps_its_ranks(tmp_path):
    """As a pool is stopped (`probes.launch.stop_processes` signals the server first): it stops its ranks and
    waits for them before it exits (143), so no rank outlives it."""
    pytest.importorskip("torch")
    pool = tmp_path / "pool"
    pool.mkdir()
    server = subprocess.Popen(_server(["--nproc", "2", "--log-dir", str(pool / "logs"), "--", "--serve", str(pool)]),
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while len(list(pool.glob("pid-rank*"))) < 2 and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)                              # the ranks are up once each has written its pid
        ranks = [int(p.read_text()) for p in pool.glob("pid-rank*")]
        assert len(ranks) == 2, server.communicate()[1][-2000:]
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=PROBE_TIMEOUT_S)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 128 + signal.SIGTERM
    assert not any(os.path.exists(f"/proc/{pid}") for pid in ranks)


@pytest.mark.slow
def test_ranks_of_two_servers_meet_at_the_master(tmp_path):
    """Two fork servers as the two nodes of a SLURM step would run them (`probes.slurm_task` task --forkserver)."""
    pytest.importorskip("torch")
    spec_path, out = _probe_files(tmp_path, tiny_spec(dp=2, gas=1))
    with socket.socket() as s:          # a port for rank 0's store (the SLURM backend reserves one per slice)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(_server(["--nproc", "1", "--nnodes", "2", "--node-rank", str(node), "--master",
                                       f"127.0.0.1:{port}", "--log-dir", str(tmp_path / "logs" / f"node{node}"),
                                       "--", "--spec", str(spec_path), "--out", str(out)]),
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    try:
        ends = [p.communicate(timeout=PROBE_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e[1][-2000:] for e in ends]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["world_size"] == 2
    assert sorted(p.name for p in out.glob("pid-rank*")) == ["pid-rank0", "pid-rank1"]
    assert "[probe] step" in (tmp_path / "logs" / "node0" / LOG_RUN / "attempt_0" / "0" / "stdout.log").read_text()
