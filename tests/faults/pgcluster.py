"""A private, throwaway PostgreSQL cluster for the fault tests that stop or re-address the server.

The shared server on 5432 is used by every other test (and by other people's runs on the same
machine): it is never stopped here. Instead ``pg_cluster()`` runs ``initdb`` into a fresh directory
under /tmp owned by the ``postgres`` user, starts it on a free port, and always stops and removes it
when the test ends. Stopping it with ``pg_ctl stop -m fast`` is what ``pg_ctlcluster ... stop``
does for a Debian cluster (it calls the same ``pg_ctl``), without touching the shared one.

Needs root (``runuser -u postgres``) and the PostgreSQL server binaries (Debian's
/usr/lib/postgresql/<version>/bin, or ``TUNECACHE_TEST_PG_BINDIR``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from debianpkg import free_port


def pg_bindir() -> Path | None:
    env = os.environ.get("TUNECACHE_TEST_PG_BINDIR")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


class PgCluster:
    """One private cluster: ``start()``, ``stop()``, ``url(db)``, ``create_database()``, ``destroy()``."""

    def __init__(self, listen: Sequence[str] = ("127.0.0.1",), trust: Sequence[str] = ("127.0.0.1/32",)) -> None:
        self.bindir = pg_bindir()
        self.listen = list(listen)
        self.trust = list(trust)
        self.port = free_port(self.listen[0])
        self.base = Path(tempfile.mkdtemp(prefix="tunecache-pg-", dir="/tmp"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.running = False
        shutil.chown(self.base, "postgres", "postgres")

    def init(self) -> None:
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(
                f"\nlisten_addresses = '{','.join(self.listen)}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.base}'\nmax_connections = 300\nshared_buffers = 32MB\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            )
        with open(self.data / "pg_hba.conf", "a") as f:
            for net in self.trust:
                f.write(f"host all all {net} trust\n")

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(self.base),
        )
        if r.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}\n{tail}")
        return r

    def start(self) -> float:
        """Start and wait until it accepts connections; returns the seconds it took."""
        t0 = time.monotonic()
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30", "start")
        self.running = True
        return time.monotonic() - t0

    def stop(self, mode: str = "fast") -> float:
        t0 = time.monotonic()
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")
        self.running = False
        return time.monotonic() - t0

    def url(self, database: str = "postgres", host: str | None = None) -> str:
        return f"postgresql+psycopg://postgres@{host or self.listen[0]}:{self.port}/{database}"

    def create_database(self, host: str | None = None) -> str:
        name = f"tc_{uuid.uuid4().hex[:12]}"
        admin = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.exec_driver_sql(f"CREATE DATABASE {name}")
        finally:
            admin.dispose()
        return self.url(name, host)

    def destroy(self) -> None:
        if self.running:
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pid_file = self.data / "postmaster.pid"
                if pid_file.exists():
                    try:
                        os.kill(int(pid_file.read_text().split()[0]), 9)
                    except (OSError, ValueError):
                        pass
        shutil.rmtree(self.base, ignore_errors=True)


def private_cluster_available() -> str | None:
    """None if a private cluster can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root to run initdb/pg_ctl as the postgres user"
    if pg_bindir() is None or not (pg_bindir() / "pg_ctl").exists():
        return "no PostgreSQL server binaries (set TUNECACHE_TEST_PG_BINDIR)"
    if shutil.which("runuser") is None:
        return "no runuser"
    return None


@pytest.fixture(name="pg_cluster")
def pg_cluster_fixture() -> Iterator:
    """``make(listen=..., trust=...) -> PgCluster``, started; every cluster is stopped and removed after."""
    why = private_cluster_available()
    if why:
        pytest.skip(f"private PostgreSQL cluster unavailable: {why}")
    made: list[PgCluster] = []

    def make(listen: Sequence[str] = ("127.0.0.1",), trust: Sequence[str] = ("127.0.0.1/32",)) -> PgCluster:
        c = PgCluster(listen, trust)
        made.append(c)  # removed at the end even if initdb or the start fails
        c.init()
        c.start()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.destroy()
