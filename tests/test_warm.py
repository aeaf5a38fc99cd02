"""Warm workers (probes.warm): consecutive probes in the same torchrun workers, fresh ones after a failure, none
left behind a killed tuner.

    flock /tmp/plantune-slow.lock python3 -m pytest -q -m slow tests/test_warm.py     # ~1 minute on 2 busy cores

Real processes (torchrun, 2 gloo workers, the tiny GPT of conftest_probes); faults through probes.train's debug
variables, given per probe (a warm worker sets a job's environment for that job only). No speed limit: every wait
is for an event.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest_probes import PROBE_TIMEOUT_S, no_process_left, tiny_spec

ROOT = Path(__file__).resolve().parents[1]


def test_the_tuner_side_imports_no_torch_and_tune_has_no_warm():
    code = ("import sys; import probes.warm, probes.backend; "
            "assert 'torch' not in sys.modules, 'probes.warm imported torch'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from search.cli import build_run_parser

    assert build_run_parser().parse_args(["--model", "m.yaml", "--no-warm"]).no_warm
    assert not build_run_parser().parse_args(["--model", "m.yaml"]).no_warm


def test_a_rank_holding_memory_after_its_release_retires_the_pool():
    from probes.warm import RELEASE_SLACK_BYTES, not_released

    ok = {"rank": 0, "released": True, "held_bytes": 20 << 20, "kind": "rss"}
    assert not_released([ok, {**ok, "rank": 1}]) is None
    leak = {"rank": 1, "released": False, "held_bytes": RELEASE_SLACK_BYTES + (300 << 20), "kind": "cuda_allocated"}
    assert not_released([ok, leak]) == ("memory not released: rank 1 holds 556 MiB more than before the pool's "
                                        "first probe (cuda_allocated)")


def _pids(pool) -> set[int]:
    return {int(p.read_text()) for p in pool.folder.glob("pid-rank*")}


@pytest.mark.slow
def test_probes_reuse_the_workers_prune_keeps_them_oom_and_crash_retire_them(tmp_path):
    pytest.importorskip("torch")
    from probes.warm import WarmWorkers

    workers = WarmWorkers()
    try:
        first = workers.run(tiny_spec(dp=2, gas=1), nproc=2, workdir=tmp_path / "a", timeout_s=PROBE_TIMEOUT_S)
        assert first.status == "ok", first.reason
        pool = workers.pool
        pids = _pids(pool)
        assert len(pids) == 2 and first.extra["warm"]["reused"] is False
        assert {int(p.read_text()) for p in (tmp_path / "a").glob("pid-rank*")} == pids

        # another layout of the same world: the same processes, new process groups and model, memory released
        second = workers.run(tiny_spec(tp=2, gas=2), nproc=2, workdir=tmp_path / "b", timeout_s=PROBE_TIMEOUT_S)
        assert second.status == "ok" and second.step_time_median_s > 0, second.reason
        assert workers.pool is pool and _pids(pool) == pids and second.extra["warm"]["reused"] is True
        release = second.extra["warm"]["release"]
        assert [r["rank"] for r in release] == [0, 1] and all(r["released"] and r["after_bytes"] for r in release)
        assert set(second.phases) >= {"launch", "rendezvous", "build", "warmup", "steps", "teardown"}
        assert "[probe] step" in (tmp_path / "b" / "rank0.stdout").read_text()   # the job's own logs

        # pruned after its second timed step: every rank leaves the probe, the pool serves on
        seen: list[float] = []

        def prune(index: int, seconds: float) -> str | None:
            seen.append(seconds)
            return "clearly slower" if index >= 1 else None

        pruned = workers.run(tiny_spec(dp=2, gas=1, steps=40), nproc=2, workdir=tmp_path / "c",
                             timeout_s=PROBE_TIMEOUT_S, on_step=prune)
        assert pruned.status == "pruned" and pruned.reason == "clearly slower"
        assert len(pruned.step_times_s) >= 2 and len(seen) == len(pruned.step_times_s)
        assert workers.pool is pool and _pids(pool) == pids
        assert [r["status"] for r in pruned.extra["warm"]["release"]] == ["stopped", "stopped"]

        # an OOM ends the failing worker, torchrun the other: the pool is retired, its processes gone
        oom = workers.run(tiny_spec(dp=2, mbs=256, gas=1), nproc=2, workdir=tmp_path / "d", timeout_s=PROBE_TIMEOUT_S,
                          env={"PLANTUNE_PROBE_RLIMIT_AS_HEADROOM_BYTES": str(32 << 20)})
        # the allocation that meets the cap is torch's or oneDNN's, as timing falls: both are this rank's OOM
        assert oom.status == "oom" and any(m in oom.reason for m in ("can't allocate memory", "create a primitive")), \
            oom.reason
        assert oom.extra["warm"]["retired"] and workers.pool is None and not no_process_left(oom)

        # the next probe gets fresh workers; a crash there names its rank and retires them too
        crash = workers.run(tiny_spec(tp=2, gas=2), nproc=2, workdir=tmp_path / "e", timeout_s=PROBE_TIMEOUT_S,
                            env={"PLANTUNE_PROBE_FAULT": "raise:1"})
        assert crash.status == "crash" and crash.root_cause_rank == 1, crash.reason
        assert crash.extra["warm"]["reused"] is False and crash.extra["warm"]["pool"] != str(pool.folder)
        fresh = {int(p.read_text()) for p in (tmp_path / "e").glob("pid-rank*")}
        assert len(fresh) == 2 and not fresh & pids
        assert "injected fault" in crash.reason and workers.pool is None and not no_process_left(crash)
    finally:
        workers.close()


@pytest.mark.slow
def test_sigkilled_tuner_leaves_no_warm_worker_after_reusing_it(tmp_path):
    """The tuner killed in its second probe, which runs in the first one's workers: nothing outlives it (a third
    probe keeps the tuner busy whatever moment the kill lands at)."""
    from probe_kills import KILL_MOMENTS, kill_tuner_at
    from test_tune_local import tiny_argv

    runs = tmp_path / "runs"

    def second_probe_stepping() -> bool:
        logs = list((runs / "trial-0001").rglob("0/stdout.log"))
        return bool(logs) and "[probe] step" in logs[0].read_text(errors="replace")

    argv = tiny_argv(tmp_path, "--confirm-top", "0", "--max-probes", "3", "--top-k", "3", "--no-prune",
                     "--probe-timeout", "3600", "--no-progress")
    left = kill_tuner_at(KILL_MOMENTS["steps"], argv, folder=tmp_path, reached=second_probe_stepping)
    assert not left, f"warm workers outlived the killed tuner: {left}"
    first, second = ({int(p.read_text()) for p in (runs / t).glob("pid-rank*")} for t in ("trial-0000", "trial-0001"))
    assert len(first) == 2 and first == second            # the second probe did run in the first one's workers
