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
from realcli import one_line_error, tc

import tunecache
from tunecache.cli import main
from tunecache.errors import StoreError, TunecacheError
from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.store.engine import resolve_url
from tunecache.store.opening import connect, open_store
from tunecache.store.roles import grant

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
        {
            "role": roles["reader"],
            "kind": "reader",
            "created": True,
            "privileges": "SELECT",
            "read_only": True,
            "warnings": [],
        }
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


def sql(url: str, *stmts: str) -> list[list[tuple]]:
    """Run statements on ``url`` in autocommit; the rows of each (empty for a statement with none)."""
    engine = sa.create_engine(resolve_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            return [[tuple(r) for r in res] if (res := c.exec_driver_sql(s)).returns_rows else [] for s in stmts]
    finally:
        engine.dispose()


#: What ``db grant`` could change: the tables' privileges, the default privileges, the roles.
GRANT_STATE = (
    "SELECT c.relname, c.relacl::text FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1",
    "SELECT defaclrole::regrole::text, defaclobjtype, defaclacl::text FROM pg_default_acl ORDER BY 1, 2",
    "SELECT r.rolname, m.roleid::regrole::text FROM pg_roles r LEFT JOIN pg_auth_members m ON m.member = r.oid "
    "WHERE starts_with(r.rolname, 'tc_') ORDER BY 1, 2",
)


def grant_state(url: str, names: dict[str, str]) -> list:
    """GRANT_STATE, its role rows cut to this test's roles: every other test (another worker's,
    another run's on the same server) makes tc_ roles of its own meanwhile."""
    tables, defaults, members = sql(url, *GRANT_STATE)
    return [tables, defaults, [row for row in members if row[0] in names.values()]]


def upgraded(url: str) -> None:
    r = tc("--url", url, "db", "upgrade")
    assert r.returncode == 0, r.stderr[-3000:]


def test_grant_refuses_to_make_the_tables_owner_or_the_connected_role_a_reader_and_changes_nothing(pg_url, roles):
    owner, reader = roles["owner"], roles["reader"]
    sql(pg_url, f'CREATE ROLE "{owner}" LOGIN CREATEROLE', f'GRANT CREATE, USAGE ON SCHEMA public TO "{owner}"')
    as_owner = as_role(pg_url, owner)
    upgraded(as_owner)  # the tables belong to a plain (not superuser) role, as on a managed server
    (((admin,),),) = sql(pg_url, "SELECT current_user")
    before = grant_state(pg_url, roles)
    for url, args, named in (
        (as_owner, ["--reader", owner], owner),  # the connected role, which owns the tables
        (as_owner, ["--tuner", owner], owner),  # would revoke its TRUNCATE and its default privileges
        (pg_url, ["--reader", reader, "--reader", owner], owner),  # the tables' owner; the reader not created
        (pg_url, ["--tuner", admin], admin),  # the connected (super)user
    ):
        line = one_line_error(tc("--url", url, "db", "grant", *args))
        assert named in line and "nothing was changed" in line.lower(), line
    assert grant_state(pg_url, roles) == before
    (((can,),),) = sql(pg_url, f"SELECT has_table_privilege('{owner}', 'problems', 'INSERT, UPDATE, DELETE')")
    assert can is True
    # The owner still grants a reader of its own, which is then read-only.
    r = tc("--url", as_owner, "db", "grant", "--reader", reader, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    (got,) = json.loads(r.stdout)["roles"]
    assert got["role"] == reader and got["read_only"] is True and got["warnings"] == []
    assert open_store(as_role(pg_url, reader)).readonly


def test_a_reader_that_can_still_write_is_reported_with_each_cause(pg_url, roles):
    upgraded(pg_url)
    w, team, reader, nested, member, boss, plain = (
        roles[k] for k in ("writers", "team", "reader", "nested", "member", "boss", "tuner")
    )
    sql(
        pg_url,
        f'CREATE ROLE "{w}" NOLOGIN',
        f'GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{w}"',
        f'CREATE ROLE "{team}" NOLOGIN',
        f'GRANT "{w}" TO "{team}"',
        *(f'CREATE ROLE "{r}" LOGIN' for r in (reader, nested, member, plain)),
        f'CREATE ROLE "{boss}" LOGIN SUPERUSER',
        f'GRANT "{w}" TO "{reader}"',  # a writers group
        f'GRANT "{team}" TO "{nested}"',  # a writers group, through another group
        f'GRANT pg_write_all_data TO "{member}"',
    )
    args = [a for r in (reader, nested, member, boss, plain) for a in ("--reader", r)]
    r = tc("--url", pg_url, "db", "grant", "--no-create", *args, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    got = {x["role"]: x for x in json.loads(r.stdout)["roles"]}
    for role in (reader, nested, member, boss):
        assert got[role]["read_only"] is False, got[role]
    assert got[plain]["read_only"] is True and got[plain]["warnings"] == []
    (line,) = got[reader]["warnings"]
    assert w in line and f'REVOKE "{w}" FROM "{reader}"' in line, line
    (line,) = got[nested]["warnings"]  # one cause: writers' grants, reached through team
    assert w in line and team in line and f'REVOKE "{team}" FROM "{nested}"' in line, line
    (line,) = got[member]["warnings"]
    assert "pg_write_all_data" in line and f'REVOKE "pg_write_all_data" FROM "{member}"' in line, line
    (line,) = got[boss]["warnings"]
    assert "superuser" in line, line
    # The warnings say the truth: that reader writes, the one without a warning cannot.
    sql(as_role(pg_url, reader), "DELETE FROM problems")
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        sql(as_role(pg_url, plain), "DELETE FROM problems")

    # Text: the role's line says it, each cause is a warning line on stderr.
    r = tc("--url", pg_url, "db", "grant", "--no-create", "--reader", reader, "--reader", plain)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [f"{reader}: reader, but it can still write (see the warning)", f"{plain}: reader"]
    (warn,) = r.stderr.splitlines()
    assert warn.startswith(f"tunecache: warning: {reader} ") and w in warn, r.stderr

    # The cause removed, the same grant reports a reader; a grant to PUBLIC is named too.
    sql(pg_url, f'REVOKE "{w}" FROM "{reader}"', "GRANT INSERT ON configs TO PUBLIC")
    (got,) = grant(open_store(pg_url), readers=[reader], create=False)
    (line,) = got["warnings"]
    assert got["read_only"] is False and "PUBLIC" in line and "configs" in line and "INSERT" in line, line
    sql(pg_url, "REVOKE INSERT ON configs FROM PUBLIC")
    (got,) = grant(open_store(pg_url), readers=[reader], create=False)
    assert got["read_only"] is True and got["warnings"] == []


def test_grant_on_mysql_says_what_to_do_instead(mysql_url):
    open_store(mysql_url).close()
    line = one_line_error(tc("--url", mysql_url, "db", "grant", "--reader", "r"))
    assert "MySQL" in line and "GRANT SELECT" in line and "SQLite" not in line, line
