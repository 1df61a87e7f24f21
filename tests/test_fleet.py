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
import warmpool
from processes import run_procs
from servers import PG_URL

from tunecache.store.engine import resolve_url
from tunecache.store.migrate import head_revision
from tunecache.store.opening import open_store

HERE = Path(__file__).parent

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
def test_a_worker_holds_no_server_connection_across_a_benchmark_nor_after_its_start(request, pg_url, tmp_path, through):
    url = pg_url if through == "direct" else request.getfixturevalue("pgbouncer").through(pg_url)
    open_store(url).close()
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    env = {**os.environ, "TUNECACHE_URL": url, "PYTHONPATH": str(HERE)}
    # A worker's start (a restart: no tunecache state), from the warm pool.
    p = warmpool.popen([str(script)], env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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


def test_every_command_works_through_pgbouncer(pgbouncer, pg_url, tmp_path, roles):
    """Every leaf command of the CLI, in a real process, with TUNECACHE_URL at PgBouncer: exit 0."""
    from builders import fill, write_warm_module
    from realcli import leaf_commands, tc

    url = pgbouncer.through(pg_url)
    env = {"TUNECACHE_URL": url, "PYTHONPATH": str(tmp_path)}
    write_warm_module(tmp_path)
    export = tmp_path / "all.jsonl"
    steps: list[tuple[str, ...]] = [
        ("db", "upgrade"),
        ("db", "current"),
        ("info",),
        ("warm", "mywarm"),  # tunes 3 keys through PgBouncer: leases, puts, specs
        ("ls",),
        ("stats",),
        ("misses",),
        ("export", str(export)),
        ("import", str(export), "--on-conflict", "replace", "--launch-specs", "--trust-unsigned"),
        ("invalidate", "--kernel", "tests.add", "--dry-run"),
        ("invalidate", "--kernel", "tests.add"),
        ("gc", "--days", "3650"),
        ("demo", "--url", url, "--buckets", "1", "--json"),  # the bundled kernel, twice, in fresh processes
        ("report", "-o", str(tmp_path / "report.html")),
        ("hosts", "--json"),
        ("db", "grant", "--reader", roles["reader"], "--tuner", roles["tuner"]),
        ("keygen", str(tmp_path / "signing-key")),
    ]
    # show: below, with a digest; db seal: SQLite files only (its one line for a server: test_sqlite_file.py)
    assert {" ".join(s[:2]) if s[0] == "db" else s[0] for s in steps} | {"show", "db seal"} == set(leaf_commands())
    done: dict[str, subprocess.CompletedProcess] = {}
    for i, step in enumerate(steps):
        if step[0] == "ls":
            fill(url, 4)
        r = tc(*step, env=env, pool=step[0] == "warm")  # the one that imports torch: from the warm pool
        assert r.returncode == 0 and "error" not in r.stderr.lower(), (step, r.stdout[-2000:], r.stderr[-2000:])
        done[" ".join(step[:2])] = r
        if step[0] == "ls":
            digest = next(p.digest for p in open_store(url).find_problems())
            r = tc("show", digest[:12], env=env)
            assert r.returncode == 0 and digest[:12] in r.stdout, r.stderr[-2000:]
        assert i < 1 or open_store(url).revision() is not None
    assert len(export.read_text().splitlines()) > 1  # a header and the problems
    demo = json.loads(done["demo --url"].stdout)
    assert demo["runs"][0]["benchmarks"] > 0 and demo["runs"][1]["benchmarks"] == 0, demo
    assert demo["runs"][1]["hits"] > 0 and demo["winners_differ"] == 0, demo


def test_200_concurrent_simulated_starts_through_pgbouncer_pool_10(pgbouncer, pg_url):
    """200 worker starts at the same moment (scripts/bench_fleet.py's simulated start: a start's
    store calls, replayed) through PgBouncer with a pool of 10: all complete, 0 errors, and the
    server never sees more than the pool's 10 connections to the database."""
    sys.path.insert(0, str(SCRIPTS))
    import bench_fleet
    from builders import fill

    fill(pg_url, 4)
    s = open_store(pg_url)
    p = s.find_problems()[0]
    s.close()
    plan = [
        ["get_kernel_problems", [p.kernel]],
        ["get_many", [p.source_hash]],
        ["get_specs", [p.source_hash]],
        ["record_hits", [{p.digest: 1}]],
        ["bump_stats", [{p.kernel: {"hits": 1, "saved_seconds": 2.5}}]],
    ]
    args = {"mode": "start", "url": pgbouncer.through(pg_url), "plan": plan, "starts": 200, "threads": 200}
    admin = resolve_url(PG_URL).set(database="postgres").render_as_string(hide_password=False)
    with bench_fleet.Monitor(admin, resolve_url(pg_url).database) as mon:
        outs = bench_fleet.run_children({**args, "start_at": time.time() + 5, "max_seconds": 120}, 4, 240)
    errors = [e for o in outs for e in o["errors"]]
    assert errors == [], errors[:3]
    assert sum(len(o["times"]) for o in outs) == 200
    assert 1 <= mon.peak <= pgbouncer.pool_size, mon.peak
    assert open_store(pg_url).get(p.digest).hit_count == 200


def test_eight_processes_migrate_a_fresh_database_through_pgbouncer_once(pgbouncer, pg_url):
    """The migration lock is pg_advisory_xact_lock inside the migration's transaction: it holds
    through a transaction pooler, where a session-level lock would be taken on one server connection
    and released (or leaked) on another."""
    out = run_procs("open", 8, url=pgbouncer.through(pg_url))
    assert [r["revision"] for r in out] == [head_revision()] * 8
    with sa.create_engine(resolve_url(pg_url), poolclass=sa.pool.NullPool).connect() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 1
