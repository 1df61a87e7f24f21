"""Fleet scale (issue 18): connection hygiene, and every path through PgBouncer in transaction mode.

PgBouncer (tests/pgbouncer.py, a pool of 10 server connections per database) stands in front of the
real PostgreSQL. A worker that finished its start must hold no server connection, none may be held
across a benchmark, and nothing may depend on session state between transactions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from conftest import HERE, PG_URL

from tunecache.store import open_store, resolve_url

SCRIPTS = HERE.parent / "scripts"


def server_connections(direct_url: str) -> int:
    """Server connections to the database of ``direct_url`` (pg_stat_activity), not counting ours:
    asked from the server's ``postgres`` database."""
    db = resolve_url(direct_url).database
    admin = sa.create_engine(resolve_url(PG_URL).set(database="postgres"), poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as c:
            return c.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": db}).scalar()
    finally:
        admin.dispose()


def test_prepared_statements_never_outlive_a_pooled_transaction(pgbouncer, pg_url, monkeypatch):
    """psycopg prepares a query server-side once it ran 5 times on a connection (a ROLLBACK resets
    that count, a COMMIT does not); through a transaction pooler the next transaction may run on
    another server connection, where the prepared statement does not exist.

    The store keeps a pooled connection here (TUNECACHE_POOL_SIZE=1) and takes and releases the
    benchmark lease of 8 keys, as a worker tuning 8 buckets does (committed writes). Then another
    client takes the server connection those ran on (PgBouncer hands out the most recently used
    one), so the next lease is taken on another server connection."""
    monkeypatch.setenv("TUNECACHE_POOL_SIZE", "1")
    store = open_store(pgbouncer.through(pg_url))
    for i in range(8):
        assert store.try_lease(f"{i:064x}", "me", 30.0)
        store.release_lease(f"{i:064x}", "me")
    with psycopg.connect(host="127.0.0.1", port=pgbouncer.port, user="postgres", dbname=store.url.database) as other:
        other.execute("SELECT 1")  # a transaction left open: holds that server connection
        for i in range(8, 11):  # before the fix: prepared statement "_pg3_0" does not exist
            assert store.try_lease(f"{i:064x}", "me", 30.0)
            assert store.renew_lease(f"{i:064x}", "me", 30.0)
            store.release_lease(f"{i:064x}", "me")
        other.rollback()
    store.close()


WORKER = """
import json, os, sys, time, tinykernels, tunecache
def bench(call, quantiles):
    if not bench.told:
        bench.told = True
        print("BENCHING", flush=True); sys.stdin.readline()
    call(); return [1.0, 1.0, 1.0]
bench.told = False
k = tinykernels.make_add(configs=tinykernels.CONFIGS[:2])
k._do_bench = bench
tinykernels.launch(k, 100)   # a miss: lease, benchmark, put
k2 = tinykernels.make_add(configs=tinykernels.CONFIGS[:2])
tinykernels.launch(k2, 100)  # a fresh kernel object: prefetch, then a hit
tunecache.flush()            # the deferred hit counts and per-kernel counters
print("READY " + json.dumps(tunecache.stats()), flush=True); sys.stdin.readline()
"""


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_a_worker_holds_no_server_connection_across_a_benchmark_nor_after_its_start(
    request, pg_url, tmp_path, through
):
    url = pg_url if through == "direct" else request.getfixturevalue("pgbouncer").through(pg_url)
    open_store(url).close()
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    env = {**os.environ, "TUNECACHE_URL": url, "PYTHONPATH": str(HERE)}
    p = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "BENCHING"
        during = [server_connections(pg_url) for _ in range(5)]
        p.stdin.write("\n")
        p.stdin.flush()
        line = p.stdout.readline().strip()
        assert line.startswith("READY "), line
        stats = json.loads(line[6:])
        assert stats["store_errors"] == 0 and stats["hits"] == 1 and stats["benchmarks"] == 2, stats
        after = [server_connections(pg_url) for _ in range(5)]
        if through == "direct":
            assert during == [0] * 5, f"connections held during the benchmark: {during}"
            assert after == [0] * 5, f"connections held by a worker that finished its start: {after}"
        else:  # the server connections are PgBouncer's: at most its pool; the worker holds no client one
            assert max(during + after) <= pgbouncer_pool(request)
            clients = [c for c in request.getfixturevalue("pgbouncer").show("CLIENTS") if c["database"] != "pgbouncer"]
            assert clients == [], clients
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def pgbouncer_pool(request) -> int:
    return request.getfixturevalue("pgbouncer").pool_size
