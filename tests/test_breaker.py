"""A database that accepts connections and never answers costs a process one connect timeout in
all, not one per kernel, per background prefetch and per write, and never holds up its exit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CONNECT_TIMEOUT = 2  # libpq waits at least 2 s whatever it is given


class HungServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    @property
    def accepted(self) -> int:
        return len(self.held)

    def url(self) -> str:
        return f"postgresql+psycopg://u@127.0.0.1:{self.port}/db"

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def hung_server() -> Iterator[HungServer]:
    s = HungServer()
    yield s
    s.close()


def _library(url: str, n: int, m: int, timeout: float) -> tuple[dict, float]:
    """Run tests/manykernels.py N M on ``url``; its result and how long its exit took."""
    env = {**os.environ, "TUNECACHE_URL": url, "TUNECACHE_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)}
    r = subprocess.run(
        [sys.executable, str(HERE / "manykernels.py"), str(n), str(m)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    ended = time.time()
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out, ended - out["done_at"]


def test_store_that_never_answers_costs_one_connect_timeout(hung_server, tmp_path):
    """200 kernels defined and 4 launched against a server that accepts and never answers: one
    connection attempt in all, the kernels tuned in the process, and an exit in under 3 s (or, on a
    machine so loaded that the interpreter's own exit takes that long, within 1 s of the same
    program's exit on a store that answers)."""
    # The same work on a store that answers at once (and stores the results): what it costs without a stall.
    base, base_exit = _library(f"sqlite:///{tmp_path / 's.sqlite3'}", 200, 4, timeout=120)
    hung, exit_s = _library(hung_server.url(), 200, 4, timeout=60)  # without the breaker: minutes
    assert hung["stats"]["benchmarks"] == base["stats"]["benchmarks"] == 4 * 2
    assert hung["stats"]["store_errors"] >= 1
    assert hung_server.accepted == 1, "the store was tried again before its back-off ended"
    stall = hung["define_s"] + hung["launch_s"] - (base["define_s"] + base["launch_s"])
    assert stall <= 1.5 * CONNECT_TIMEOUT, (stall, hung, base)
    assert exit_s < max(3.0, base_exit + 1.0), (exit_s, base_exit)
