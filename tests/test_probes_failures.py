"""Failed probes are classified (oom, timeout, crash with its rank, invalid) and leave no process.

    python -m pytest tests/test_probes_failures.py -q

Faults are injected through probes.train's debug environment variables:
PLANTUNE_PROBE_FAULT (hang | raise | exit on one rank) and PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES
(an address-space cap just above the rank's size before its first step).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_spec
from probes.launch import run_local
from probes.result import ProbeResult

pytest.importorskip("torch")
pytest.importorskip("psutil")


def test_invalid_config_is_refused_before_launch(tmp_path):
    result = run_local(tiny_spec(pp=2, gas=1), nproc=2, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "invalid"
    assert "1F1B needs micro-batches (gas) 1 >= pipeline stages (pp) 2" in result.reason
    assert not (tmp_path / "command.json").exists()          # nothing was started
    assert ProbeResult.read(tmp_path / "result.json").status == "invalid"


def test_world_size_mismatch_is_invalid(tmp_path):
    result = run_local(tiny_spec(dp=2), nproc=3, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "invalid" and "world size 3" in result.reason


@pytest.mark.slow
def test_memory_cap_is_oom(tmp_path):
    spec = tiny_spec(dp=2, mbs=64, gas=1)
    result = run_local(spec, nproc=2, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S,
                       env={"PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES": str(1 << 20)})
    assert result.status == "oom", result.reason
    assert any(m in result.reason for m in ("can't allocate memory", "create a primitive")), result.reason
    assert result.root_cause_rank in (0, 1) and not no_process_left(result)


def test_onednn_setup_failure_is_oom_only_under_an_address_space_cap():
    """Under a cap the first allocation to fail may be oneDNN's (CI saw it); without one that error is a crash."""
    pytest.importorskip("torch")
    import resource

    from probes.train import _is_oom

    err = RuntimeError("could not create a primitive")
    limit = resource.getrlimit(resource.RLIMIT_AS)
    assert limit[0] == resource.RLIM_INFINITY and not _is_oom(err)
    resource.setrlimit(resource.RLIMIT_AS, (1 << 47, limit[1]))   # x86-64's whole user space: a cap that caps nothing
    try:
        assert _is_oom(err) and not _is_oom(RuntimeError("bad shape"))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limit)


@pytest.mark.slow
def test_hang_is_timeout_and_every_process_is_killed(tmp_path):
    result = run_local(tiny_spec(dp=2, gas=1), nproc=2, workdir=tmp_path, timeout_s=12,
                       env={"PLANTUNE_PROBE_FAULT": "hang:1"})
    assert result.status == "timeout", result.reason
    assert len(result.extra["pids"]) >= 3                      # torchrun + 2 workers
    assert not no_process_left(result)                     # killed, not left to run: no process of it is left


@pytest.mark.slow
@pytest.mark.parametrize("fault, message", [("raise:1", "RuntimeError: injected fault"),
                                            ("exit:1:3", "exited with code 3")])
def test_dying_rank_is_crash_naming_it(fault, message, tmp_path):
    result = run_local(tiny_spec(tp=2, gas=2), nproc=2, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S,
                       env={"PLANTUNE_PROBE_FAULT": fault})
    assert result.status == "crash", result.reason
    assert result.root_cause_rank == 1
    assert result.reason.startswith("rank 1: ") and message in result.reason
    assert not no_process_left(result)
    command = json.loads((tmp_path / "command.json").read_text())
    assert command["argv"][1:3] == ["-m", "torch.distributed.run"] and command["returncode"] != 0
    assert (tmp_path / "rank1.stderr").is_file()


@pytest.mark.slow
def test_killed_launcher_takes_torchrun_and_workers_with_it(tmp_path):
    """SIGKILL the process that launched a probe (a tuner): torchrun and every worker die too."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(tiny_spec(dp=2, gas=1).to_dict()))
    code = ("import json, sys; from pathlib import Path; from probes.launch import run_local; "
            "from probes.result import ProbeSpec; "
            "run_local(ProbeSpec.from_dict(json.loads(Path(sys.argv[1]).read_text())), nproc=2, "
            "workdir=Path(sys.argv[2]), timeout_s=300)")
    env = {**os.environ, "PLANTUNE_PROBE_FAULT": "hang:1"}
    launcher = subprocess.Popen([sys.executable, "-c", code, str(spec_path), str(tmp_path / "probe")],
                                cwd=str(Path(__file__).resolve().parents[1]), env=env)
    probe = tmp_path / "probe"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(probe.glob("pid-rank*"))) < 2:
        time.sleep(0.5)
    workers = [int(p.read_text()) for p in probe.glob("pid-rank*")]
    assert len(workers) == 2, "the probe did not start"
    torchrun = [c.pid for c in psutil.Process(launcher.pid).children()]
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    left = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [pid for pid in workers + torchrun if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.5)
    for pid in left:     # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the launcher died: {left}"
