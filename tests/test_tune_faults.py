"""A probe rank killed from outside (SIGKILL: the kernel OOM killer, a preemption) on real torchrun processes:
the root cause names the killed rank (not the rank torchrun then stopped), and the tuner retries it once.

    python -m pytest tests/test_tune_faults.py -q
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from conftest_probes import no_process_left, tiny_spec
from probes.launch import run_local

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

HANG_S = 1800
"""a probe that has not ended after this long hangs; no speed limit"""


@pytest.mark.slow
def test_sigkilled_rank_is_the_root_cause(tmp_path):
    out = {}
    probe = threading.Thread(target=lambda: out.setdefault("result", run_local(
        tiny_spec(dp=2, gas=1), nproc=2, workdir=tmp_path, timeout_s=HANG_S, env={"PLANTUNE_PROBE_FAULT": "hang:1"})))
    probe.start()
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and not (tmp_path / "pid-rank1").is_file():
        time.sleep(0.2)
    os.kill(int((tmp_path / "pid-rank1").read_text()), signal.SIGKILL)      # from outside, like the OOM killer
    probe.join(HANG_S)
    result = out["result"]
    assert result.status == "crash" and result.root_cause_rank == 1, (result.reason, result.extra)
    assert "SIGKILL" in result.reason and result.extra["killed_by"] == "SIGKILL"
    assert not no_process_left(result)
