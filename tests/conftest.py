"""Shared pytest set-up: the repository root on sys.path, paths to the shared data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# One intra-op thread for torch in the test processes and every process they start, as the probes' own workers run
# (probes.launch.probe_env): with OpenMP's default of one thread per core, two xdist workers on 2 cores each spin two
# threads, and a tiny model's step costs ~10x the CPU (count_step_flops: 4.7 s against 0.5 s, measured 2026-11-28).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _caches_written() -> None:
    """The test processes, and every process they start, write Python's caches even where the environment says
    PYTHONDONTWRITEBYTECODE (set in some sandboxes, this machine's included): under it every one of the suite's
    several hundred processes (`plan`, `tune`, probe workers, SLURM steps) compiled planner/, search/ and probes/
    from source, `plan` re-read its YAML catalog and recompiled its dataclasses' methods (planner.files' caches
    beside the bytecode), and each xdist worker re-ran pytest's assertion rewriting of every test module. The caches
    are Python's own (`__pycache__`, checked against the source's mtime and size; written atomically, so the two
    workers can write the same one), and tests/bench/bench_plan.py already runs without the variable. The tests
    that check writing the caches or not set `sys.dont_write_bytecode` themselves (test_hardware, test_startup).
    Done here, while pytest loads this file, before pytest-xdist starts its workers with this environment."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_caches_written()


def _tmp_path_in_memory(root: str = "/dev/shm", min_free_bytes: int = 2 << 30) -> None:
    """pytest's temporary folders (tmp_path: the tests' SQLite studies, probe folders, logs) go under ``root``
    where it is a tmpfs with room to spare and allows executing files; elsewhere, as before, under the system's
    temporary directory. Every `tune` a test starts keeps SQLite's default (synchronous=FULL: an fsync per commit,
    one commit per trial attribute and per reported step); on this machine's disk those fsyncs held one tuner
    run of tests/test_tune_prune_local.py 7.7 s of 38.6 s idle (the same CPU), and the worker with it. On a tmpfs
    fsync returns at once; SQLite, Optuna and `tune` run unchanged. pytest keeps its numbered folders (the last 3)
    under the root it is given (PYTEST_DEBUG_TEMPROOT, read when the first temporary folder is made: here,
    before pytest-xdist hands the workers their folders); a --basetemp or PYTEST_DEBUG_TEMPROOT given wins."""
    if "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            tmpfs = any(f[1] == root and f[2] == "tmpfs" for f in (line.split() for line in mounts) if len(f) > 2)
        fs = os.statvfs(root)
    except OSError:
        return
    if tmpfs and not fs.f_flag & os.ST_NOEXEC and not fs.f_flag & os.ST_RDONLY and os.access(root, os.W_OK) \
            and fs.f_bavail * fs.f_frsize >= min_free_bytes:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = root


_tmp_path_in_memory()


def _sqlite_commits_without_fsync() -> None:
    """The studies the tests run in this process (SQLite files under tmp_path) commit without an fsync
    (``PRAGMA synchronous=OFF``): each commit still reaches the operating system before the call returns, so every
    reader, a later run and a test's Ctrl-C or crash see it, as they would with fsync; only an operating-system crash
    could lose it, which no test makes. Optuna commits once per trial attribute, and on this 2-core machine's disk the
    fsync took 3-20 ms of wall time each, the worker idle meanwhile (tests/bench/NOTES.md, "Suite time", round 13).
    `tune` itself, and every tuner a test starts as a process, keeps SQLite's default (synchronous=FULL)."""
    try:
        import sqlite3

        from sqlalchemy import event
        from sqlalchemy.engine import Engine
    except ImportError:
        return

    @event.listens_for(Engine, "connect")
    def _no_fsync(dbapi_connection, _record) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute("PRAGMA synchronous=OFF")


_sqlite_commits_without_fsync()

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = Path(__file__).resolve().parent / "data"
HANG_GUARD_S = 900
"""subprocess timeout in tests: only stops a hung command (what takes a second idle may take a minute on a loaded
2-core machine); never a speed limit"""


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: copies of ../shared/data (seed 003's V100 tables, published runs)."""
    return DATA


def skip_missing_server(reason: str) -> None:
    """Skip a test that needs a server this machine lacks (PostgreSQL, SLURM); under CI=true (.ci/run installs them)
    the same absence fails the test: a CI run never passes by skipping what it was set up to run."""
    import os

    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true and the server-backed test cannot run: {reason}")
    pytest.skip(reason)


def seed003_plan():
    """The plan the search tests replay against: BigScience's 1B3 on 8 V100-32GB (2 nodes of 4), GBS 512, fp16,
    full recompute, ZeRO-1 (seed 003's setting)."""
    from planner import TrainingSpec, load_model, make_cluster, plan

    return plan(load_model("1B3"), make_cluster(gpu="V100-32GB", gpus=8, gpus_per_node=4),
                TrainingSpec(global_batch=512, seq_len=2048, precision="fp16", recompute_options=("full",),
                             zero_options=(1,), flash_attention=False, max_mbs=8))


def study_trials(storage: str, study_name: str) -> list:
    """A study's trials as a poller beside a running tuner sees them: [] until the tuner has finished creating
    the storage. Optuna's RDBStorage writes its version rows on construction (even with skip_table_creation),
    which races the tuner's own first write ('UNIQUE constraint failed: alembic_version'), so the storage is
    opened only once its alembic revision is stamped, and then writes nothing."""
    import optuna
    import sqlalchemy

    engine = sqlalchemy.create_engine(storage)
    try:
        with engine.connect() as conn:
            stamped = conn.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).first()
    except sqlalchemy.exc.OperationalError:   # no file or no table yet
        stamped = None
    finally:
        engine.dispose()
    if stamped is None:
        return []
    try:
        reader = optuna.storages.RDBStorage(storage, skip_table_creation=True)
    except (sqlalchemy.exc.OperationalError, optuna.exceptions.StorageInternalError):   # locked by the tuner
        return []
    try:
        return optuna.load_study(study_name=study_name, storage=reader).trials
    except (KeyError, sqlalchemy.exc.OperationalError, optuna.exceptions.StorageInternalError):
        return []   # no study yet, or the database locked by the tuner's write: the poller asks again
    finally:
        reader.engine.dispose()


SLURM_RESERVATION = "plantune_test"


def _uses_slurm_cluster(item: pytest.Item) -> bool:
    """Whether a test needs the session's SLURM cluster: by fixture name, or test_backend_contract's `slurm` case
    (which asks for the fixture at run time, request.getfixturevalue)."""
    if "slurm_cluster" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and getattr(callspec.params.get("backend_and_specs"), "__name__", "") == "_slurm"


SHARED_PROCESSES = {"warm_run", "reference", "dense_reference", "moe_reference", "loaded"}
"""fixtures that start processes (warm probe workers, a reference probe, torchtitan's import): a module's tests that
use one run in one worker, which starts them once"""
WARM_GROUP = "warm"
"""the xdist group of every module whose tests use `warm_run`: its pools (a fork server and its workers per world
size) are started once for all of them, not once per module"""


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's own hook, which turns the marker into the '@slurm' scope
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n N --dist loadgroup`, the README's test command), every test of the one-node SLURM
    cluster runs in one worker, so the session starts one cluster (its node is this host's name: two clusters
    would declare the same node) and its tests share it; a module's tests that share processes through a
    module-scoped fixture (`SHARED_PROCESSES`) run in one worker too, which starts them once (a worker switching
    modules would tear them down and start them again), and the modules that use the warm pools (`warm_run`) share one
    worker and its pools (`WARM_GROUP`); every other test goes to whichever worker is free.
    Slow tests are handed out first (stable order otherwise), so the last minutes are not one long test alone."""
    warm_modules = {item.module.__name__ for item in items if "warm_run" in getattr(item, "fixturenames", ())}
    for item in items:
        if _uses_slurm_cluster(item):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif SHARED_PROCESSES & set(getattr(item, "fixturenames", ())):
            module = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(WARM_GROUP if module in warm_modules else module))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node SLURM cluster (probes/slurm_cluster.py) with reservation SLURM_RESERVATION, for the session."""
    import os
    import shutil
    import subprocess
    import tempfile

    from probes.slurm_cluster import missing_binaries, start_local_cluster, stop_local_cluster

    missing = missing_binaries()
    if missing:
        skip_missing_server(f"SLURM/munge not installed ({', '.join(missing)}); apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        skip_missing_server("a local SLURM cluster needs root (slurmd, munged as the munge user)")
    root = Path(tempfile.mkdtemp(prefix="plantune-slurm-", dir="/tmp"))
    cluster = start_local_cluster(root, cpus=2, gpus=2)
    try:
        made = subprocess.run(["scontrol", "create", "reservation", f"ReservationName={SLURM_RESERVATION}",
                               f"Nodes={cluster.hostname}", "Users=root", "StartTime=now", "Duration=120"],
                              env=cluster.env(), capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
        assert made.returncode == 0, made.stderr
        yield cluster
    finally:
        subprocess.run(["scancel", "--user=root"], env=cluster.env(), capture_output=True, timeout=HANG_GUARD_S,
                       check=False)
        stop_local_cluster(cluster)
        shutil.rmtree(root, ignore_errors=True)


WARM_POOLS = pytest.StashKey[dict]()
"""the session's warm pools by world size (`warm_run`), kept in the config's stash, where the hook below ends them"""


def _close_warm_pools(config: pytest.Config) -> None:
    """End the warm pools and check that none of their processes is left."""
    import psutil

    pools = config.stash.get(WARM_POOLS, {})
    pids = sorted({p for w in pools.values() if w.pool is not None for p in w.pool.tracker.seen})
    for w in pools.values():
        w.close()
    pools.clear()
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"warm workers left running: {left}"


def _in_warm_group(item: pytest.Item | None) -> bool:
    return item is not None and any(m.args == (WARM_GROUP,) for m in item.iter_markers("xdist_group"))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The warm pools end with the last test of their group in this process (the group's tests run one after
    another in one worker), so their idle processes do not stay for the rest of the session."""
    if WARM_POOLS in item.config.stash and item.config.stash[WARM_POOLS] and not _in_warm_group(nextitem):
        _close_warm_pools(item.config)


@pytest.fixture(scope="session")
def warm_run(request, tmp_path_factory):
    """``warm_run(spec, nproc, workdir)``: a probe on warm workers (`probes.warm.WarmWorkers`, tune's default local
    path), one pool per world size that the tests of every module using it share (a fork server per world size, not
    per test or module: they run in one worker, `WARM_GROUP`). After the group's last test the pools are closed and none
    of their processes is left (checked again at the session's end)."""
    pytest.importorskip("torch")
    from probes.warm import WarmWorkers

    pools = request.config.stash.setdefault(WARM_POOLS, {})
    root = tmp_path_factory.mktemp("warm")
    started = {"n": 0}

    def run(spec, nproc: int, workdir: Path, timeout_s: float = 300.0):
        if nproc not in pools:
            started["n"] += 1
            pools[nproc] = WarmWorkers(root / f"world{nproc}-{started['n']}")
        return pools[nproc].run(spec, nproc=nproc, workdir=workdir, timeout_s=timeout_s)

    yield run
    _close_warm_pools(request.config)
