"""Least privilege on a shared PostgreSQL (issue 15): ``tunecache db grant`` against the real server,
with real roles that the tests log in as.

A serving worker logs in as a reader: it resolves every key from the store with no error and never
attempts a write; any write it does attempt is refused by the server. A tuner writes rows, never
the schema.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
import tinykernels
from click.testing import CliRunner
from processes import run_procs

import tunecache
from tunecache.cli import main
from tunecache.engine import resolve_url
from tunecache.errors import StoreError, TunecacheError
from tunecache.identity import problem_digest
from tunecache.model import ConfigResult, Problem
from tunecache.opening import connect, open_store
from tunecache.roles import grant
from tunecache.target import Target

SIZES = [64, 128, 256, 512]


def as_role(url: str, role: str) -> str:
    return resolve_url(url).set(username=role, password=None).render_as_string(hide_password=False)


def tuned_store(pg_url: str) -> None:
    """The store a tuning job leaves: every size tuned (as the owner)."""
    k = tinykernels.make_add(store=pg_url)
    for n in SIZES:
        tinykernels.launch(k, n)
    tunecache.flush()


def test_reader_resolves_every_key_with_no_error_and_every_write_is_refused_by_the_server(pg_url, roles):
    tuned_store(pg_url)
    res = CliRunner().invoke(main, ["--url", pg_url, "db", "grant", "--reader", roles["reader"], "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)["roles"]
    assert out == [
        {"role": roles["reader"], "kind": "reader", "created": True, "privileges": "SELECT", "warning": None}
    ]
    reader = as_role(pg_url, roles["reader"])
    for mode in ("readonly", "offline", "readwrite"):  # the serving modes, and a misconfigured worker
        (r,) = run_procs("warm", 1, env={"TUNECACHE_MODE": mode}, url=reader, sizes=SIZES)
        s = r["stats"]
        assert s["hits"] == len(SIZES) and s["misses"] == 0 and s["benchmarks"] == 0, (mode, s)
        assert s["store_errors"] == 0 and r["flushed"] is True, (mode, s, r["stderr"][-2000:])
        assert "permission denied" not in r["stderr"], r["stderr"][-2000:]
    store = open_store(reader)
    assert store.readonly  # a role that may only SELECT opens the store read-only: no write is attempted
    assert len(store.find_problems()) == len(SIZES)
    store.close()

    # Writes it attempts anyway (a store opened as writable, raw SQL): the server refuses each one.
    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    p = Problem(problem_digest("s" * 64, t, '[["N",1]]'), "m.k", "s" * 64, t, '[["N",1]]')
    forced = connect(reader, readonly=False)
    with pytest.raises(StoreError, match="permission denied"):
        forced.put(p, [ConfigResult("c" * 32, {"kwargs": {}}, median_ms=1.0)])
    with pytest.raises(StoreError, match="permission denied"):
        forced.delete(kernel=kernel_name(pg_url))
    with pytest.raises(StoreError, match="permission denied"):
        forced.record_hits({first(pg_url).digest: 1})
    forced.close()
    engine = sa.create_engine(resolve_url(reader))
    for stmt in (
        "UPDATE problems SET winner_config_hash = NULL",
        "DELETE FROM configs",
        "INSERT INTO binaries (triton_key) VALUES ('x')",
        "CREATE TABLE evil (x int)",
        "ALTER TABLE problems ADD COLUMN evil int",
    ):
        with engine.connect() as c, pytest.raises(sa.exc.ProgrammingError, match="permission denied|must be owner"):
            c.exec_driver_sql(stmt)
    engine.dispose()
    assert len(open_store(pg_url).find_problems()) == len(SIZES)  # nothing changed


def first(url: str) -> Problem:
    s = open_store(url)
    try:
        return s.find_problems()[0]
    finally:
        s.close()


def kernel_name(url: str) -> str:
    return first(url).kernel


def test_a_tuner_writes_rows_but_not_the_schema_and_a_regrant_demotes(pg_url, roles):
    tuned_store(pg_url)
    s = open_store(pg_url)
    done = grant(s, tuners=[roles["tuner"]])
    assert done[0]["kind"] == "tuner" and done[0]["created"]
    tuner = as_role(pg_url, roles["tuner"])
    (r,) = run_procs("warm", 1, url=tuner, sizes=[*SIZES, 1024])  # one new key: benchmarked and stored
    assert r["stats"]["benchmarks"] > 0 and r["stats"]["store_errors"] == 0 and r["flushed"], r
    assert len(s.find_problems()) == len(SIZES) + 1
    engine = sa.create_engine(resolve_url(tuner))
    with engine.connect() as c, pytest.raises(sa.exc.ProgrammingError, match="permission denied|must be owner"):
        c.exec_driver_sql("DROP TABLE problems")
    engine.dispose()
    # Granted as a reader now: its writes are gone, and a store it opens is read-only.
    assert grant(s, readers=[roles["tuner"]], create=False)[0]["created"] is False
    assert open_store(tuner).readonly
    with pytest.raises(TunecacheError, match="not a plain role name"):
        grant(s, readers=['x"; DROP TABLE problems; --'])
    s.close()


def test_grant_refuses_sqlite(sqlite_url):
    open_store(sqlite_url).close()
    res = CliRunner().invoke(main, ["--url", sqlite_url, "db", "grant", "--reader", "r"])
    assert res.exit_code == 1 and "PostgreSQL" in res.output
