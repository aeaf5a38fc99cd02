"""The SLURM backend: slice logic on fake node lists, then real probes on a one-node SLURM cluster.

    python -m pytest tests/test_slurm.py -q            # the real-cluster tests need root + slurm-wlm + munge

The session fixture starts munged, slurmctld and slurmd under a fresh /tmp folder
(probes/slurm_cluster.py), waits for the node to be idle, creates reservation ``plantune_test``
and stops the daemons by their pid files at the end. Tests skip, saying why, only when the
programs are missing or the user is not root.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from planner.hardware import make_cluster
from planner.space import Candidate, TrainingSpec
from probes.result import ProbeResult
from probes.slurm import (SlicePool, Slice, SlurmBackend, SlurmError, expand_nodelist, find_slice, plan_slices,
                          slice_shape, torchrun_task_argv)
from probes.slurm_cluster import LocalSlurmCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_probes import PROBE_TIMEOUT_S, tiny_model, tiny_spec  # noqa: E402

FAKE = Path(__file__).resolve().parent / "fake_megatron.py"
from conftest import HANG_GUARD_S, SLURM_RESERVATION as RESERVATION  # noqa: E402


# -- slices on fake node lists (no SLURM needed) --------------------------------------------------------

def _nodes(n: int) -> list[str]:
    return [f"node{i:03d}" for i in range(n)]


def test_48_nodes_give_6_one_replica_slices_of_8_nodes():
    slices = plan_slices(_nodes(48), procs=64, gpus_per_node=8)
    assert len(slices) == 6
    assert all(s.nnodes == 8 and s.procs_per_node == 8 and s.world == 64 for s in slices)
    used = [h for s in slices for h in s.hosts]
    assert len(used) == len(set(used)) == 48
    assert slices[1].master == "node008"
    assert len({s.port for s in slices}) == 6


def test_sub_node_probes_pack_a_node_with_distinct_ports():
    slices = plan_slices(_nodes(2), procs=2, gpus_per_node=8)
    assert len(slices) == 8
    assert [s.hosts for s in slices[:4]] == [("node000",)] * 4  # packs node000 before touching node001
    assert len({s.port for s in slices}) == 8


def test_slice_shape_refuses_ragged_multi_node():
    assert slice_shape(16, 8) == (2, 8)
    assert slice_shape(3, 8) == (1, 3)
    with pytest.raises(ValueError, match="whole number"):
        slice_shape(12, 8)


def test_find_slice_needs_wholly_free_nodes_for_multi_node():
    free = {"a": 8, "b": 4, "c": 8}
    s = find_slice(free, ["a", "b", "c"], procs=16, gpus_per_node=8)
    assert s is not None and s.hosts == ("a", "c")
    assert find_slice({"a": 8, "b": 4}, ["a", "b"], procs=16, gpus_per_node=8) is None
    partial = find_slice(free, ["a", "b", "c"], procs=4, gpus_per_node=8)
    assert partial is not None and partial.hosts == ("b",)


def test_pool_blocks_until_release_and_sets_failing_nodes_aside():
    pool = SlicePool(_nodes(2), gpus_per_node=8)
    a = pool.acquire(8)
    b = pool.acquire(8)
    assert a is not None and b is not None and a.hosts != b.hosts
    assert pool.acquire(8, timeout_s=0.05) is None  # everything busy
    pool.release(a)
    again = pool.acquire(8, timeout_s=1)
    assert again is not None and again.hosts == a.hosts
    pool.release(again)
    pool.release(b)
    crash = ProbeResult(status="crash", reason="rank 9: killed by SIGBUS", root_cause_rank=9)
    two_nodes = Slice(hosts=("node000", "node001"), procs_per_node=8)
    assert pool.record(two_nodes, crash) == []
    assert pool.record(two_nodes, crash) == ["node001"]  # rank 9 is on the second node
    assert "node001" in pool.set_aside and "SIGBUS" in pool.set_aside["node001"]
    assert pool.acquire(16) is None  # can never fit on the one node left
    assert pool.record(two_nodes, ProbeResult(status="oom", reason="CUDA out of memory")) == []


def test_step_and_task_commands_are_argument_lists():
    backend = SlurmBackend(reservation="bigscience", gpus_per_node=8, time_limit_s=600)
    backend.job_id = "4242"
    s = Slice(hosts=("jean-zay-iam01", "jean-zay-iam02"), procs_per_node=8, port=29601)
    task = backend.task_argv(s, worker=["-m", "probes.train", "--spec", "a b.json"], rdzv_id="x", log_dir=None,
                             tee=True)
    argv = backend.srun_argv(s, step_name="plantune-x", time_limit_s=600, task_argv=task)
    assert argv[:2] == ["srun", "--jobid=4242"]
    assert task[1:4] == ["-m", "probes.slurm_task", "task"] and "--forkserver" not in task   # a light module per node
    for flag in ("--nodes=2", "--ntasks-per-node=1", "--nodelist=jean-zay-iam01,jean-zay-iam02",
                 "--kill-on-bad-exit=1", "--time=10", "--gres=gpu:8"):
        assert flag in argv
    assert "--exact" not in argv  # whole nodes: the step gets every CPU of them
    backend.cpus_per_node = 64
    quarter = backend.srun_argv(Slice(hosts=("n1",), procs_per_node=2), step_name="s", time_limit_s=60, task_argv=[])
    assert {"--exact", "--gres=gpu:2", "--cpus-per-task=16"} <= set(quarter)  # 2 of 8 GPUs, 16 of 64 CPUs
    assert argv[-1] == "a b.json"  # one argument, spaces and all
    node = torchrun_task_argv(nproc_per_node=8, nnodes=2, master="jean-zay-iam01", port=6000, node_rank=1,
                              rdzv_id="x", worker=["pretrain_gpt.py", "--bf16"], tee=True)
    joined = " ".join(node)
    assert "-u -m torch.distributed.run --nproc_per_node 8 --nnodes 2 --rdzv_endpoint jean-zay-iam01:6000" in joined
    assert "--rdzv_backend c10d" in joined and "--max_restarts 0" in joined and "--node_rank 1" in joined
    assert node[-2:] == ["pretrain_gpt.py", "--bf16"]


def test_nodes_per_probe_cuts_dp_to_whole_replicas():
    backend = SlurmBackend(gpus_per_node=8, nodes_per_probe=8)
    full = Candidate(tp=4, pp=12, dp=8, mbs=2, gas=128).to_dict()  # BLOOM-176B's layout on 384 GPUs
    assert backend.procs_for_candidate(full) == 48  # one replica (TP*PP): 6 nodes
    small = Candidate(tp=2, pp=2, dp=2, mbs=1, gas=8).to_dict()
    assert backend.procs_for_candidate(small) == 8  # the full layout fits: not reduced
    assert SlurmBackend(gpus_per_node=8).procs_for_candidate(full) == 384


def test_reservation_names_are_checked():
    with pytest.raises(ValueError, match="not a SLURM name"):
        SlurmBackend(reservation="x; rm -rf /")


# -- a real one-node SLURM cluster ---------------------------------------------------------------------

def _backend(cluster: LocalSlurmCluster, **kw: object) -> SlurmBackend:
    """A backend that sallocs the test node on the reservation: 2 (fake) GPUs per node unless told."""
    settings = {"gpus_per_node": 2, "time_limit_s": 300, "alloc_timeout_s": 60, "inside_allocation": False, **kw}
    return SlurmBackend(reservation=RESERVATION, env={"SLURM_CONF": str(cluster.conf_path)}, **settings)


def _squeue(cluster: LocalSlurmCluster, *args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], env=cluster.env(), capture_output=True, text=True,
                          timeout=HANG_GUARD_S,
                          check=False).stdout


CLOSED_STATES = {"CANCELLED", "COMPLETED", "COMPLETING", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
"""job states after which SLURM holds none of the job's resources (COMPLETING: being released now)"""


def _job_state(cluster: LocalSlurmCluster, job: str) -> str | None:
    """The job's JobState; None once slurmctld no longer knows it."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=cluster.env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S, check=False).stdout
    return next((f.split("=", 1)[1] for f in shown.split() if f.startswith("JobState=")), None)


def _given_back(cluster: LocalSlurmCluster, job: str) -> bool:
    """The job has ended or is releasing its nodes; a job slurmctld no longer knows has ended too."""
    state = _job_state(cluster, job)
    return state is None or state in CLOSED_STATES


def _wait_until_ended(cluster: LocalSlurmCluster, job: str, time_limit_min: int) -> bool:
    """Wait for a running job to end, its nodes released too (past COMPLETING, which a loaded machine can show for
    seconds after the script's exit: its final state, COMPLETED or another, is what the caller checks). The bound
    is the job's own --time: SLURM ends it then (plus its KillWait), so the wait does not depend on how fast this
    machine runs the job."""
    deadline = time.monotonic() + time_limit_min * 60 + 60
    while (state := _job_state(cluster, job)) is not None and (state not in CLOSED_STATES or state == "COMPLETING"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.mark.slow
def test_probe_on_the_reservation(slurm_cluster, tmp_path):
    with _backend(slurm_cluster) as backend:
        job = backend.job_id
        shown = subprocess.run(["scontrol", "show", "job", str(job)], env=slurm_cluster.env(), capture_output=True,
                               text=True, timeout=HANG_GUARD_S, check=False).stdout
        assert f"Reservation={RESERVATION}" in shown
        result = backend.run(tiny_spec(dp=2), workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
        assert result.status == "ok", result.reason
        assert result.world_size == 2 and result.step_time_median_s > 0
        assert result.extra["hosts"] == [slurm_cluster.hostname]
        assert (tmp_path / "rank0.stdout").exists() and (tmp_path / "rank1.stdout").exists()
        argv = json.loads((tmp_path / "command.json").read_text())["argv"]
        task = argv[argv.index("-m") + 1:]
        assert task[:2] == ["probes.slurm_task", "task"] and "--forkserver" in task   # the ranks forked, not torchrun's
    assert _given_back(slurm_cluster, str(job))  # the allocation was given back


@pytest.mark.slow
def test_inside_an_existing_allocation(slurm_cluster, tmp_path):
    """As under an sbatch script: SLURM_JOB_ID/SLURM_JOB_NODELIST given, the job is used, not cancelled."""
    env = slurm_cluster.env()
    granted = subprocess.run(["salloc", "--no-shell", "--nodes=1", "--exclusive", "--time=5",
                              f"--reservation={RESERVATION}"], env=env, capture_output=True, text=True,
                             timeout=HANG_GUARD_S,
                             check=False)
    job = granted.stderr.split("Granted job allocation")[-1].split()[0]
    try:
        nodelist = _squeue(slurm_cluster, "-j", job, "-o", "%N").strip()
        assert expand_nodelist("jean-zay-iam[01-03],gpu7", env=env) == [
            "jean-zay-iam01", "jean-zay-iam02", "jean-zay-iam03", "gpu7"]
        backend = SlurmBackend(gpus_per_node=2, env={"SLURM_CONF": str(slurm_cluster.conf_path),
                                                     "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist})
        with backend:
            assert backend.job_id == job and not backend.owns_allocation
            assert backend.pool.order == [slurm_cluster.hostname]
            result = backend.run(tiny_spec(), workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
        assert result.status == "ok", result.reason
        assert job in _squeue(slurm_cluster, "-o", "%i").split()  # not ours to give back
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=HANG_GUARD_S, check=False)


@pytest.mark.slow
def test_run_many_runs_probes_side_by_side(slurm_cluster, tmp_path):
    """Both probes are in their set-up at once (each waits there, probes.lifeline.hold, until both have arrived):
    an event, not file times or a wall-clock ratio, which a loaded machine can break."""
    hold = tmp_path / "hold"
    hold.mkdir()
    both = threading.Event()

    def release_when_both_held() -> None:
        deadline = time.monotonic() + HANG_GUARD_S   # a hang guard only: run one after another, the second never comes
        while time.monotonic() < deadline and not both.is_set():
            if len(list(hold.glob("held-setup-*"))) >= 2:
                both.set()
            time.sleep(0.2)
        (hold / "release").write_text("")

    releaser = threading.Thread(target=release_when_both_held, daemon=True)
    releaser.start()
    with _backend(slurm_cluster, gres=None) as backend:  # CPU slots: steps ask --cpus-per-task, not GPUs
        backend.env.update(PLANTUNE_PROBE_HOLD="setup", PLANTUNE_PROBE_HOLD_DIR=str(hold))
        results = backend.run_many([tiny_spec(), tiny_spec(mbs=1, gas=4)], workdir=tmp_path, timeout_s=HANG_GUARD_S)
    releaser.join()
    assert both.is_set(), "the two probes were never in set-up at the same time: run_many ran them one after another"
    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    assert all(r.world_size == 1 for r in results)


@pytest.mark.slow
def test_cpu_slots_overcommitted_like_srun_n4_on_2_cpus(slurm_cluster, tmp_path):
    """4 slots on the 2-CPU node (CPU_PROBES.md: srun -n4 on 2 CPUs needs --overcommit): two 2-rank probes."""
    with _backend(slurm_cluster, gres=None, overcommit=True, gpus_per_node=4) as backend:
        results = backend.run_many([tiny_spec(dp=2), tiny_spec(dp=2, mbs=1, gas=4)], workdir=tmp_path,
                                   timeout_s=PROBE_TIMEOUT_S)
    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    argv = (tmp_path / "probe-0000" / "command.json").read_text()
    assert "--overcommit" in argv and "--cpus-per-task=2" in argv


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["one-step", "warm"])
def test_hung_probe_is_cancelled_and_its_slice_reused(slurm_cluster, tmp_path, warm):
    with _backend(slurm_cluster, warm=warm) as backend:
        backend.env["PLANTUNE_PROBE_FAULT"] = "hang:1"
        hung = backend.run(tiny_spec(dp=2), workdir=tmp_path / "hung", timeout_s=8)
        assert hung.status == "timeout", hung.reason
        assert hung.extra["cancelled_step"].startswith(f"{backend.job_id}.")
        assert hung.extra["step_name"] not in _squeue(slurm_cluster, "-s", "-o", "%j").split()  # scancel'ed
        assert ("warm" in hung.extra) is warm and (not warm or hung.extra["warm"]["retired"] == "timeout")
        del backend.env["PLANTUNE_PROBE_FAULT"]
        again = backend.run(tiny_spec(dp=2), workdir=tmp_path / "again", timeout_s=PROBE_TIMEOUT_S)
        assert again.status == "ok", again.reason
        assert again.extra["hosts"] == hung.extra["hosts"]          # the slice went back to the pool
        assert again.extra["step_name"] != hung.extra["step_name"]  # a fresh step (fresh workers when warm)
        assert backend.set_aside == {}  # one timeout is not enough to set a node aside


def _steps(cluster: LocalSlurmCluster) -> list[str]:
    """Names of the steps running now."""
    return [n for n in _squeue(cluster, "-s", "-o", "%j").split() if n.startswith("plantune-")]


def _worker_pids(result: ProbeResult) -> set[int]:
    return {int(p.read_text()) for p in Path(result.workdir).glob("pid-rank*")}


@pytest.mark.slow
def test_warm_probes_share_one_step_until_world_or_failure_retires_it(slurm_cluster, tmp_path):
    """Warm workers on SLURM: two probes of 2 ranks in one step (the same worker processes, new process groups and
    model, memory released), then a third pruned after two steps in it; a probe of 1 rank retires it for a step of its own; a crash retires that one, its
    step ends and the next probe gets a fresh step on the slice given back."""
    import psutil

    with _backend(slurm_cluster, warm=True) as backend:
        first = backend.run(tiny_spec(dp=2, gas=1), workdir=tmp_path / "a", timeout_s=PROBE_TIMEOUT_S)
        assert first.status == "ok", first.reason
        second = backend.run(tiny_spec(tp=2, gas=2), workdir=tmp_path / "b", timeout_s=PROBE_TIMEOUT_S)
        assert second.status == "ok" and second.step_time_median_s > 0, second.reason
        assert second.extra["step_name"] == first.extra["step_name"] and second.extra["warm"]["reused"] is True
        pids = _worker_pids(first)
        assert len(pids) == 2 and _worker_pids(second) == pids
        assert all(r["released"] for r in second.extra["warm"]["release"])
        assert "[probe] step" in (tmp_path / "b" / "rank0.stdout").read_text()     # the job's own logs
        assert (tmp_path / "b" / "rank1.stderr").is_file()
        assert _steps(slurm_cluster) == [first.extra["step_name"]]                 # one step serves them

        # warm workers report each timed step: a probe pruned after its second leaves the step serving
        assert backend.reports_steps
        pruned = backend.run(tiny_spec(dp=2, gas=1, steps=40), workdir=tmp_path / "p", timeout_s=PROBE_TIMEOUT_S,
                             on_step=lambda index, seconds: "clearly slower" if index >= 1 else None)
        assert pruned.status == "pruned" and pruned.reason == "clearly slower" and len(pruned.step_times_s) >= 2
        assert pruned.extra["step_name"] == first.extra["step_name"] and _worker_pids(pruned) == pids

        one = backend.run(tiny_spec(), workdir=tmp_path / "c", timeout_s=PROBE_TIMEOUT_S)
        assert one.status == "ok" and one.world_size == 1, one.reason
        assert one.extra["step_name"] != first.extra["step_name"] and one.extra["warm"]["reused"] is False
        assert _steps(slurm_cluster) == [one.extra["step_name"]]                   # the 2-rank step was ended
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

        backend.env["PLANTUNE_PROBE_FAULT"] = "raise:1"   # another environment: new workers, which crash
        crash = backend.run(tiny_spec(dp=2, gas=1), workdir=tmp_path / "d", timeout_s=PROBE_TIMEOUT_S)
        assert crash.status == "crash" and crash.root_cause_rank == 1 and "injected fault" in crash.reason
        assert crash.extra["warm"]["retired"] and crash.extra["step_name"] not in _steps(slurm_cluster)
        del backend.env["PLANTUNE_PROBE_FAULT"]
        fresh = backend.run(tiny_spec(dp=2, gas=1), workdir=tmp_path / "e", timeout_s=PROBE_TIMEOUT_S)
        assert fresh.status == "ok" and fresh.extra["warm"]["reused"] is False, fresh.reason
        assert not _worker_pids(fresh) & (pids | _worker_pids(crash))
    assert _steps(slurm_cluster) == []                                             # close ended the last step


@pytest.mark.slow
def test_node_failing_twice_is_set_aside(slurm_cluster, tmp_path):
    with _backend(slurm_cluster) as backend:
        backend.env["PLANTUNE_PROBE_FAULT"] = "exit:0:3"
        first = backend.run(tiny_spec(dp=2), workdir=tmp_path / "1", timeout_s=PROBE_TIMEOUT_S)
        second = backend.run(tiny_spec(dp=2), workdir=tmp_path / "2", timeout_s=PROBE_TIMEOUT_S)
        assert (first.status, second.status) == ("crash", "crash"), (first.reason, second.reason)
        assert list(backend.set_aside) == [slurm_cluster.hostname]
        assert second.extra["set_aside"] == [slurm_cluster.hostname]
        third = backend.run(tiny_spec(), workdir=tmp_path / "3", timeout_s=PROBE_TIMEOUT_S)
        assert third.status == "invalid" and "set aside" in third.reason


@pytest.mark.slow
def test_allocation_slurm_refuses_is_an_error_naming_the_command(slurm_cluster):
    backend = _backend(slurm_cluster, gpus_per_node=4)  # the node has 2 GPUs: salloc --gres=gpu:4 is refused
    with pytest.raises(SlurmError, match="salloc"):
        backend.allocate()


@pytest.mark.slow
def test_megatron_probe_through_slurm(slurm_cluster, tmp_path):
    from probes.megatron import MegatronProbe

    with _backend(slurm_cluster) as backend:
        probe = MegatronProbe(f"python -u {FAKE} {{args}} --data-path /nonexistent --fake-format microsoft "
                              "--fake-step-ms 100", backend, "microsoft")
        spec = tiny_spec(model=tiny_model(tied_embeddings=True), tp=1, pp=2, dp=1, mbs=2, gas=2, precision="bf16",
                         warmup_steps=1, steps=3)
        result = probe.run(spec, workdir=tmp_path, timeout_s=PROBE_TIMEOUT_S)
    assert result.status == "ok", result.reason
    assert result.extra["log_format"] == "microsoft" and result.extra["hosts"] == [slurm_cluster.hostname]
    assert len(result.step_times_s) == 3 and result.step_time_median_s == pytest.approx(0.1, rel=0.05)


@pytest.mark.slow
def test_emitted_sbatch_script_runs_under_slurm(slurm_cluster, tmp_path):
    from planner.emit import RunSetup, emit
    from probes.megatron import parse_log

    model = tiny_model(tied_embeddings=True)
    setup = RunSetup(model=model, cluster=make_cluster(gpu="CPU", gpus_per_node=2, nodes=1),
                     training=TrainingSpec(global_batch=4, seq_len=model.seq_len, precision="bf16",
                                           flash_attention=False, train_tokens=12 * model.seq_len),
                     candidate=Candidate(tp=1, pp=2, dp=1, mbs=2, gas=2))
    emit(setup, "megatron-deepspeed", tmp_path, flavor="bigscience", reservation=RESERVATION)
    repo = Path(__file__).resolve().parents[1]
    # the script checks the DeepSpeed the bigscience fork needs (< 0.9) before starting: a stand-in package
    fake_ds = tmp_path / "site" / "deepspeed"
    fake_ds.mkdir(parents=True)
    (fake_ds / "__init__.py").write_text('__version__ = "0.8.3"\n')
    env = {**slurm_cluster.env(), "DATA_PATH": "/nonexistent/data", "TOKENIZER": "gpt2",
           "CHECKPOINT_PATH": str(tmp_path / "ckpt"), "PRETRAIN_SCRIPT": str(FAKE), "PYTHON": sys.executable,
           "PYTHONPATH": f"{repo}:{fake_ds.parent}", "OMP_NUM_THREADS": "1", "FAKE_MEGATRON_MAX_ITERS": "3"}
    # the command line overrides the script's --time and --cpus-per-task (8 per GPU: this test node has 2 CPUs)
    submitted = subprocess.run(["sbatch", "--parsable", "--time=5", "--cpus-per-task=1", "launch.sbatch"],
                               cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    assert _wait_until_ended(slurm_cluster, job, time_limit_min=5)  # sbatch --time=5 above
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True,
                           timeout=HANG_GUARD_S,
                           check=False).stdout
    outputs = list(tmp_path.glob("plantune-*.out"))
    text = outputs[0].read_text() if outputs else ""
    assert "JobState=COMPLETED" in shown and "ExitCode=0:0" in shown, shown + text
    log = parse_log(text)
    assert [it.iteration for it in log.iterations] == [1, 2, 3], text
    assert all(it.format == "bigscience" and it.global_batch == 4 for it in log.iterations)
    assert "[default1]:" in text  # torchrun --tee 3 from the script's srun line
