"""A private PgBouncer in transaction pooling mode, in front of a PostgreSQL on loopback.

Used by the fleet tests (tests/test_fleet.py, through the ``pgbouncer`` fixture of conftest) and by
scripts/bench_fleet.py. ``PgBouncer(...).start()`` writes a generated ini into a fresh directory
under /tmp, starts Debian's ``pgbouncer`` as a subprocess on a free loopback port (as the
``postgres`` user: PgBouncer refuses to run as root) and ``stop()`` ends that one process and
removes the directory. Every database of the upstream server is reachable through it (``* =``), so
the fresh database of each test works unchanged. ``ensure_installed()`` installs the package when it
is missing (``apt-get``, as root), as CI runs on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import debianpkg
from debianpkg import free_port


def ensure_installed() -> str:
    """The pgbouncer binary; installs Debian's package when it is missing. Raises RuntimeError."""
    return debianpkg.ensure_installed("pgbouncer")


class PgBouncer:
    """One private PgBouncer: transaction pooling, ``pool_size`` server connections per database."""

    def __init__(
        self,
        upstream_host: str = "127.0.0.1",
        upstream_port: int = 5432,
        pool_size: int = 10,
        max_client_conn: int = 2000,
        user: str = "postgres",
    ) -> None:
        self.binary = ensure_installed()
        self.upstream = (upstream_host, upstream_port)
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.user = user
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="tunecache-pgbouncer-", dir="/tmp"))
        self.log = self.base / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None

    def _write_config(self) -> Path:
        host, port = self.upstream
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base / "userlist.txt"}
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {self.max_client_conn}
max_db_connections = {self.pool_size}
server_reset_query =
server_check_delay = 30
ignore_startup_parameters = extra_float_digits
logfile = {self.log}
pidfile = {self.base / "pgbouncer.pid"}
log_connections = 0
log_disconnections = 0
"""
        )
        (self.base / "userlist.txt").write_text(f'"{self.user}" ""\n')
        if os.geteuid() == 0:
            for p in (self.base, ini, self.base / "userlist.txt"):
                shutil.chown(p, "postgres", "postgres")
        return ini

    def start(self, timeout: float = 20.0) -> PgBouncer:
        ini = self._write_config()
        cmd = [self.binary, str(ini)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # A file limit that covers max_client_conn (each client is a socket).
        self.proc = subprocess.Popen(
            ["bash", "-c", f'ulimit -n {self.max_client_conn + 200} 2>/dev/null; exec "$@"', "pgbouncer", *cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}): {err[-2000:]}\n{self._log_tail()}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on 127.0.0.1:{self.port} within {timeout}s\n{self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log.exists() else ""

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def through(self, direct_url: str) -> str:
        """The URL of the same database, through this PgBouncer."""
        from sqlalchemy.engine import make_url

        return self.url(make_url(direct_url).database or "postgres")

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (STATS, POOLS, CLIENTS, SERVERS...)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer", autocommit=True
        ) as c:
            cur = c.execute(f"SHOW {what}", prepare=False)
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGTERM is PgBouncer's immediate shutdown (1.18); its own pid, from its pidfile, as
            # runuser may sit in between.
            try:
                os.kill(int((self.base / "pgbouncer.pid").read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
