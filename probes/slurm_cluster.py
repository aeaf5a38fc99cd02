"""A throw-away one-node SLURM cluster (munged + slurmctld + slurmd on localhost) for tests.

    python -m probes.slurm_cluster start /tmp/plantune-slurm --gpus 2   # prints: export SLURM_CONF=...
    SLURM_CONF=/tmp/plantune-slurm/slurm.conf sinfo
    python -m probes.slurm_cluster stop /tmp/plantune-slurm

Needs root and Debian's ``slurm-wlm`` + ``munge`` packages (slurmctld, slurmd, munged, mungekey;
runuser from util-linux). Everything lives under the given folder: a private munge key and socket
(so a system munged, if any, is left alone), slurm.conf, state, spool, pid and log files. Ports
are picked free at start. ``--gpus N`` declares N count-only ``gpu`` GRES backed by empty files, so
that ``--gres=gpu:N`` (emitted sbatch scripts, SlurmBackend's steps) is accepted on a CPU machine.
The shape follows the team's CPU_PROBES.md: the node is the short hostname at 127.0.0.1,
proctrack/linuxproc, task/none, select/cons_tres with CR_CPU, no accounting, one default
partition with OverSubscribe=FORCE:4. Daemons are stopped by the pids in their pid files.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "mungekey", "runuser", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "scontrol",
            "sinfo", "scancel", "squeue")
PARTITION = "debug"
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def which(name: str) -> str | None:
    """``shutil.which`` that also looks in the sbin folders a non-login PATH may lack."""
    found = shutil.which(name)
    if found:
        return found
    for folder in _SBIN:
        path = Path(folder) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def missing_binaries() -> list[str]:
    """Names of the SLURM/munge programs this machine lacks (empty when a cluster can start)."""
    return [name for name in BINARIES if which(name) is None]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalSlurmCluster:
    """Paths and names of a started one-node cluster; ``env()`` is what a client needs."""

    root: Path
    hostname: str
    cpus: int
    gpus: int = 0
    """count-only gpu GRES declared on the node (no devices)"""
    partition: str = PARTITION

    @property
    def conf_path(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default os.environ) with SLURM_CONF pointing at this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf_path)
        for key in [k for k in env if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_NODELIST"))]:
            del env[key]
        return env

    def pid_files(self) -> list[Path]:
        return [self.root / "run" / "slurmd.pid", self.root / "run" / "slurmctld.pid",
                self.root / "munge" / "munged.pid"]


def slurm_conf_text(*, root: Path, hostname: str, cpus: int, ctld_port: int, slurmd_port: int,
                    partition: str = PARTITION, gpus: int = 0) -> str:
    """The slurm.conf of the one-node cluster (CPU_PROBES.md's recipe); ``gpus`` > 0 declares that many
    count-only ``gpu`` GRES (no device files) so that ``--gres=gpu:N`` scripts are accepted."""
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    lines = [
        "ClusterName=plantune",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "KillWait=2",
        "MinJobAge=60",
        "InactiveLimit=0",
        "MessageTimeout=20",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *(["GresTypes=gpu"] if gpus else []),
        f"NodeName={hostname} NodeAddr=127.0.0.1 CPUs={cpus}{gres} State=UNKNOWN",
        f"PartitionName={partition} Nodes={hostname} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
    ]
    return "\n".join(lines) + "\n"


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def _start_munged(root: Path) -> None:
    munge_dir = root / "munge"
    munge_dir.mkdir(exist_ok=True)
    munge_dir.chmod(0o755)  # clients (srun as any user) must reach the socket
    user = pwd.getpwnam("munge")
    key = munge_dir / "munge.key"
    if not key.exists():
        made = _run([which("mungekey") or "mungekey", "--create", "--keyfile", str(key)])
        if made.returncode != 0:
            raise RuntimeError(f"mungekey failed: {made.stderr.strip()}")
    for path in (munge_dir, key):
        os.chown(path, user.pw_uid, user.pw_gid)
    key.chmod(0o600)
    argv = [which("runuser") or "runuser", "-u", "munge", "--", which("munged") or "munged", "--force",
            f"--socket={munge_dir / 'munge.socket'}", f"--key-file={key}",
            f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
            f"--seed-file={munge_dir / 'munged.seed'}"]
    started = _run(argv)
    if started.returncode != 0:
        raise RuntimeError(f"munged failed to start ({' '.join(argv)}): {started.stderr.strip()}")


def _wait_for(predicate, *, timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise TimeoutError(f"{what} not reached within {timeout_s:.0f} s{tail}")


def node_state(cluster: LocalSlurmCluster) -> str:
    """The node's state as sinfo prints it (``idle``, ``mixed``, ``down*`` ...); empty when unreachable."""
    try:
        out = _run([which("sinfo") or "sinfo", "-h", "-N", "-o", "%T"], env=cluster.env(), timeout_s=10)
    except subprocess.TimeoutExpired:
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def start_local_cluster(root: str | Path, *, cpus: int | None = None, gpus: int = 0,
                        timeout_s: float = 30) -> LocalSlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; return once the node is idle.

    ``root`` must be traversable by the munge user (it is chmod 0755 here): use a folder directly
    under /tmp, not pytest's 0700 tmp_path.
    """
    if os.geteuid() != 0:
        raise PermissionError("a local SLURM cluster needs root (slurmd runs jobs as their users)")
    missing = missing_binaries()
    if missing:
        raise FileNotFoundError(f"SLURM/munge programs not installed: {', '.join(missing)} "
                                "(apt-get install slurm-wlm munge)")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for sub in ("state", "spool", "run", "log"):
        (root / sub).mkdir(exist_ok=True)
    cluster = LocalSlurmCluster(root=root, hostname=socket.gethostname().split(".")[0],
                                cpus=cpus or os.cpu_count() or 1, gpus=gpus)
    cluster.conf_path.write_text(slurm_conf_text(root=root, hostname=cluster.hostname, cpus=cluster.cpus,
                                                 ctld_port=_free_port(), slurmd_port=_free_port(), gpus=gpus))
    if gpus:
        # slurmd counts a gpu GRES only with device files; empty regular files stand in (task/none never
        # constrains devices, and nothing opens them)
        (root / "dev").mkdir(exist_ok=True)
        for i in range(gpus):
            (root / "dev" / f"fakegpu{i}").touch()
        files = f"{root / 'dev'}/fakegpu[0-{gpus - 1}]"
        (root / "gres.conf").write_text(f"NodeName={cluster.hostname} Name=gpu File={files}\n")
    try:
        _start_munged(root)
        _wait_for(cluster.munge_socket.exists, timeout_s=timeout_s, what="munged socket",
                  log=root / "munge" / "munged.log")
        env = cluster.env()
        for daemon in ("slurmctld", "slurmd"):
            argv = [which(daemon) or daemon, "-f", str(cluster.conf_path)]
            if daemon == "slurmd":
                argv += ["-N", cluster.hostname]
            started = _run(argv, env=env)
            if started.returncode != 0:
                raise RuntimeError(f"{daemon} failed to start: {started.stderr.strip()}")
        _wait_for(lambda: node_state(cluster).startswith("idle"), timeout_s=timeout_s, what="node idle",
                  log=root / "log" / "slurmctld.log")
    except BaseException:
        stop_local_cluster(cluster)
        raise
    return cluster


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_local_cluster(cluster: LocalSlurmCluster, *, timeout_s: float = 15) -> None:
    """SIGTERM each daemon by its pid file (slurmd, slurmctld, munged), SIGKILL if it lingers."""
    for pid_file in cluster.pid_files():
        try:
            pid = int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            continue
        if not _pid_alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def cluster_at(root: str | Path) -> LocalSlurmCluster:
    """The cluster description of an already started ``root`` (read back from its slurm.conf)."""
    root = Path(root).resolve()
    text = (root / "slurm.conf").read_text()
    hostname, cpus, gpus = socket.gethostname().split(".")[0], 1, 0
    for line in text.splitlines():
        if line.startswith("NodeName="):
            fields = dict(part.split("=", 1) for part in line.split())
            hostname, cpus = fields["NodeName"], int(fields["CPUs"])
            gpus = int(fields.get("Gres", "gpu:0").split(":")[-1])
    return LocalSlurmCluster(root=root, hostname=hostname, cpus=cpus, gpus=gpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probes.slurm_cluster", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("root", help="folder for conf, state, logs (directly under /tmp)")
    parser.add_argument("--cpus", type=int, default=None)
    parser.add_argument("--gpus", type=int, default=0, help="count-only gpu GRES to declare (no devices)")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            cluster = start_local_cluster(args.root, cpus=args.cpus, gpus=args.gpus)
            print(f"export SLURM_CONF={cluster.conf_path}")
        elif args.action == "stop":
            stop_local_cluster(cluster_at(args.root))
        else:
            print(node_state(cluster_at(args.root)) or "unreachable")
    except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired) as err:
        print(f"slurm_cluster {args.action}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
