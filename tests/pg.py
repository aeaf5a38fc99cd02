"""A throw-away PostgreSQL server for tests: initdb in a temporary folder, a 127.0.0.1 port, stopped after.

    from pg import postgres_url
    with postgres_url() as url:          # postgresql+psycopg2://postgres@127.0.0.1:PORT/postgres
        ...

Uses Debian's binaries under /usr/lib/postgresql/<version>/bin; as root, the server runs as the
``postgres`` user (runuser), since PostgreSQL refuses to run as root. Raises `Unavailable` with the
reason when the binaries, the user or psycopg2 are missing (tests skip on it, fail under CI=true), and
`StartFailed` when they are there and the server still does not start (after a second try on another port: a
port another process took in between): that is a failure, never a skip. All commands are argument lists; the
server is stopped by ``pg_ctl stop`` (its own pid file), never by name.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

START_TIMEOUT_S = 60


class Unavailable(RuntimeError):
    """PostgreSQL is not installed here (binaries, user or driver missing); the message says which."""


class StartFailed(RuntimeError):
    """PostgreSQL is installed and did not start; the message has its error and log."""


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise Unavailable("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser") is None:
        raise Unavailable("running as root without runuser; cannot start PostgreSQL as the postgres user")
    return ["runuser", "-u", "postgres", "--", *argv]


@contextmanager
def postgres_url() -> Iterator[str]:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg2 is not installed (pip install psycopg2-binary)") from None
    bindir = _bin_dir()
    root = Path(tempfile.mkdtemp(prefix="plantune-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("no postgres user to run the server as") from None
        root.chmod(0o755)
        for path in (root, sock):
            os.chown(path, pw.pw_uid, pw.pw_gid)
    log = root / "server.log"
    ctl = str(bindir / "pg_ctl")
    try:
        subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                        "-N", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as err:
        shutil.rmtree(root, ignore_errors=True)
        raise StartFailed(f"initdb failed: {err.stderr.decode(errors='replace')[-500:]}") from None
    for attempt in (1, 2):
        port = _free_port()
        try:
            subprocess.run(_as_server_user([ctl, "-D", str(data), "-l", str(log), "-w", "-t", str(START_TIMEOUT_S),
                                            "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off",
                                            "start"]), check=True, capture_output=True, timeout=START_TIMEOUT_S + 10)
            break
        except subprocess.CalledProcessError as err:
            if attempt == 2:
                tail = log.read_text()[-2000:] if log.exists() else ""
                shutil.rmtree(root, ignore_errors=True)
                raise StartFailed(f"PostgreSQL did not start: {err.stderr.decode(errors='replace')[-500:]} {tail}"
                                  ) from None
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_server_user([ctl, "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True,
                       timeout=60)
        shutil.rmtree(root, ignore_errors=True)
