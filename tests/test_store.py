"""The store: schema, upserts, bulk fetch, concurrency, read-only files, errors without passwords."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from builders import H200, problem, results
from click.testing import CliRunner
from processes import run_procs
from realcli import cli_process, one_line_error

from tunecache.cli import main
from tunecache.errors import SchemaError, StoreError, StoreReadOnlyError
from tunecache.problem.model import ConfigResult, pick_winner
from tunecache.problem.target import Target
from tunecache.store.migrate import head_revision
from tunecache.store.opening import open_store


def test_put_get_roundtrip_keeps_every_config_and_failure(store_url):
    s = open_store(store_url)
    p = problem(8)
    stored = s.put(p, results())
    assert stored.winner_config_hash == "c1"
    got = s.get(p.digest)
    assert got is not None and got.target == H200 and got.batch_bucket == 8
    rows = got.config_map()
    assert set(rows) == {"c0", "c1", "c2", "oor"}
    assert rows["oor"].status == "out_of_resources"
    assert rows["oor"].failure == {"resource": "shared", "required": 786432, "limit": 232448}
    assert rows["c1"].median_ms == 1.0 and rows["c1"].p20_ms == pytest.approx(0.9) and rows["c1"].samples == 100
    assert got.winner_ms == 1.0 and got.tuning_seconds == 1.5
    assert s.get("0" * 64) is None
    s.close()


def test_first_complete_winner_stays_unless_replaced(store_url):
    s = open_store(store_url)
    p = problem(1)
    s.put(p, results(fast=1))
    # A slower-to-arrive racer measured c2 fastest: the stored winner does not flip.
    again = s.put(p, [ConfigResult("c2", {"kwargs": {}}, median_ms=0.1)])
    assert again.winner_config_hash == "c1"
    assert again.config_map()["c2"].median_ms == 3.0 - 1.0  # existing row kept, not overwritten
    replaced = s.put(p, [ConfigResult("c2", {"kwargs": {}}, median_ms=0.1)], replace=True)
    assert replaced.winner_config_hash == "c2" and replaced.config_map()["c2"].median_ms == 0.1
    s.close()


def test_pick_winner_prefers_a_listed_config_only_within_tolerance():
    rows = [
        ConfigResult("a", {}, median_ms=1.00),
        ConfigResult("b", {}, median_ms=1.015),
        ConfigResult("c", {}, median_ms=1.10),
        ConfigResult("x", {}, status="out_of_resources", failure={}),
    ]
    assert pick_winner(rows).config_hash == "a"
    assert pick_winner(rows, prefer=["b"], tolerance=0.02).config_hash == "b"  # 1.5% off: noise
    assert pick_winner(rows, prefer=["c", "b"], tolerance=0.02).config_hash == "b"  # c is 10% off
    assert pick_winner(rows, prefer=["c"], tolerance=0.02).config_hash == "a"
    assert pick_winner(rows, prefer=["b"], tolerance=0.0).config_hash == "a"
    assert pick_winner(rows, prefer=["x"], tolerance=0.5).config_hash == "a"  # a failed config never wins
    assert pick_winner(rows[3:]) is None


def test_put_takes_the_proposed_winner_when_it_is_a_stored_ok_config(store_url):
    s = open_store(store_url)
    p = problem(2)
    p.winner_config_hash = "c2"  # slower than c1, but the tuner chose it (within its tolerance)
    assert s.put(p, results(fast=1)).winner_config_hash == "c2"
    for bad in ("oor", "nope"):  # a failed or unknown proposal falls back to the fastest
        q = problem(3 if bad == "oor" else 4)
        q.winner_config_hash = bad
        stored = s.put(q, results(fast=1))
        assert stored.winner_config_hash == "c1" and stored.winner_ms == 1.0
    s.close()


def test_bulk_fetch_is_one_query_and_scoped_to_kernel_and_target(store_url):
    import sqlalchemy as sa

    s = open_store(store_url)
    other = Target(**{**H200.as_dict(), "driver_version": "12080"})
    for i in range(36):
        s.put(problem(i), results(12))
    s.put(problem(0, target=other), results())
    s.put(problem(0, source="src2"), results())
    statements = []
    sa.event.listen(s.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    many = s.get_many("src1", H200.digest)
    assert len(statements) == 1
    assert len(many) == 36 and all(len(p.configs) == 13 for p in many)
    assert {p.batch_bucket for p in many} == set(range(36))
    s.close()


def test_list_filters_delete_and_counts(store_url):
    s = open_store(store_url)
    old = Target(**{**H200.as_dict(), "driver_version": "12080", "driver_release": "550.1"})
    for i in range(3):
        s.put(problem(i), results())
    s.put(problem(9, target=old, kernel="other.kern"), results())
    assert s.counts()["problems"] == 4 and s.counts()["failed_configs"] == 4
    assert len(s.find_problems(kernel="kern")) == 4  # last component matches
    assert len(s.find_problems(kernel="other.kern")) == 1
    assert len(s.find_problems(driver="12080")) == 1 and len(s.find_problems(driver="550.1")) == 1
    assert len(s.find_problems(arch="sm80")) == 0
    dry = s.delete(dry_run=True, not_driver="13000")
    assert len(dry) == 1 and s.counts()["problems"] == 4
    gone = s.delete(not_driver="13000")
    assert [p.batch_bucket for p in gone] == [9]
    assert s.counts() == {"problems": 3, "configs": 12, "failed_configs": 3, "open_misses": 0}
    with pytest.raises(ValueError):
        s.delete()
    s.close()


def test_hostile_filter_values_are_plain_values(store_url):
    s = open_store(store_url)
    s.put(problem(1), results())
    for evil in ["x' OR '1'='1", "%", "_", "kern'; DROP TABLE problems; --", '"', "\\"]:
        assert s.find_problems(kernel=evil) == []
        assert s.find_problems(arch=evil, device=evil, driver=evil) == []
    assert s.counts()["problems"] == 1
    s.close()


def test_leases_are_exclusive_and_expire(store_url):
    s = open_store(store_url)
    d = problem(1).digest
    assert s.try_lease(d, "a", ttl=60)
    assert not s.try_lease(d, "b", ttl=60)
    assert s.renew_lease(d, "a", ttl=-1)  # now expired
    assert s.try_lease(d, "b", ttl=60)
    assert not s.renew_lease(d, "a", ttl=60)
    s.release_lease(d, "b")
    assert s.try_lease(d, "c", ttl=60)
    s.close()


def test_lease_of_a_dead_local_process_is_taken_over(store_url):
    s = open_store(store_url)
    d = problem(2).digest
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import sqlalchemy as sa

    from tunecache.store.leases import lease_host
    from tunecache.store.schema import leases

    # As a process of this host and PID namespace writes it (see test_leases.py for the others).
    with s.engine.begin() as c:
        c.execute(sa.insert(leases).values(digest=d, holder="ghost", host=lease_host(), pid=dead.pid, expires_at=1e12))
    assert s.try_lease(d, "me", ttl=60)
    s.close()


def test_eight_processes_put_the_same_50_digests(store_url):
    open_store(store_url).close()
    run_procs("put", 8, url=store_url, n=50)
    s = open_store(store_url)
    assert s.counts()["problems"] == 50
    assert s.counts()["configs"] == 150
    assert all(p.winner_config_hash == "c0" for p in s.find_problems(with_configs=True))
    s.close()


def test_two_processes_open_a_fresh_sqlite_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh' / 'new.sqlite3'}"
    out = run_procs("open", 2, url=url)
    assert [r["revision"] for r in out] == [head_revision()] * 2


def test_fresh_sqlite_opens_while_another_connection_holds_the_write_lock(tmp_path):
    # Switching a new file to WAL while another connection writes: SQLite says "database is locked"
    # at once, skipping its busy handler. The store retries up to the busy timeout instead of failing
    # (this made concurrent first starts fail now and then).
    import sqlite3
    import threading
    import time

    path = tmp_path / "new.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE someone_else(x)")
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    t0 = time.monotonic()
    s = open_store(f"sqlite:///{path}")
    assert time.monotonic() - t0 >= 0.4  # it waited for the other writer
    assert s.revision() == head_revision()
    s.close()
    release.join()
    other.close()


def test_read_only_copy_serves_get_and_ls(tmp_path, make_readonly):
    src = tmp_path / "rw" / "s.sqlite3"
    s = open_store(f"sqlite:///{src}")
    p = problem(4)
    s.put(p, results())
    s.close()  # checkpoints the WAL into the file
    ro_dir = make_readonly([src])
    url = f"sqlite:///{ro_dir / 's.sqlite3'}"
    ro = open_store(url)
    assert ro.readonly
    assert ro.get(p.digest).winner_config_hash == "c1"
    with pytest.raises(StoreReadOnlyError):
        ro.put(p, results())
    res = CliRunner().invoke(main, ["--url", url, "ls", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["digest"] == p.digest
    assert sorted(os.listdir(ro_dir)) == ["s.sqlite3"]  # no -wal/-shm/lock files created


def test_read_only_flag(tmp_path):
    """Root can write anywhere, so also check the explicit read-only open used for baked images."""
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    s = open_store(url)
    s.put(problem(4), results())
    s.close()
    ro = open_store(url, readonly=True)
    assert ro.get(problem(4).digest) is not None
    with pytest.raises(StoreReadOnlyError):
        ro.record_hits({problem(4).digest: 1})


def test_newer_schema_is_refused_and_not_downgraded(sqlite_url):
    s = open_store(sqlite_url)
    with s.engine.begin() as c:
        c.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    s.close()
    with pytest.raises(SchemaError, match="newer than this tunecache"):
        open_store(sqlite_url)
    from tunecache.store.opening import connect

    assert connect(sqlite_url).revision() == "9999"


def test_upgrade_from_previous_revision_keeps_data(store_url):
    from tunecache.store.opening import connect

    s = connect(store_url)
    s.upgrade("0001")
    assert s.revision() == "0001"
    import sqlalchemy as sa

    from tunecache.store.schema import configs, problems

    p = problem(3)
    from tunecache.problem.model import new_config_row, new_problem_row, utcnow

    with s.engine.begin() as c:  # write as the 0001 code would have
        c.execute(sa.insert(problems), [new_problem_row(p, "old-host", utcnow())])
        c.execute(sa.insert(configs), [new_config_row(p.digest, r, "old-host", utcnow()) for r in results()])
    s.close()
    s = open_store(store_url)  # auto-migrates to head
    assert s.revision() == head_revision()
    got = s.get(p.digest)
    assert got is not None and len(got.configs) == 4 and got.host == "old-host"
    s.record_miss(p, "capture")  # a 0002 table works
    assert s.list_misses()[0]["digest"] == p.digest
    s.close()


def test_unreachable_server_names_host_not_password():
    url = "postgresql://alice:hunter2-secret@127.0.0.1:1/tc"
    with pytest.raises(StoreError) as e:
        open_store(url)
    assert "127.0.0.1" in str(e.value) and "hunter2-secret" not in str(e.value)
    res = cli_process("--url", url, "info")  # a real process: a traceback would be on its stderr
    err = one_line_error(res)
    assert "127.0.0.1" in err and "hunter2-secret" not in res.stderr + res.stdout


def test_malformed_url_is_one_line_exit_1():
    for url in ["not a url", "postgresql://u:pw@host:notaport/db"]:
        res = cli_process("--url", url, "ls")
        assert "malformed store URL" in one_line_error(res)
        assert "pw@" not in res.stderr + res.stdout


def test_mysql_store_works(mysql_url):
    s = open_store(mysql_url)
    p = problem(5)
    assert s.put(p, results()).winner_config_hash == "c1"
    assert len(s.get_many("src1", H200.digest)) == 1
    assert s.try_lease(p.digest, "a", 60) and not s.try_lease(p.digest, "b", 60)
    s.close()


def test_schema_constants_match_alembic_scripts():
    from alembic.script import ScriptDirectory

    from tunecache.store.migrate import alembic_config
    from tunecache.store.schema import SCHEMA_HEAD, SCHEMA_REVISIONS

    sd = ScriptDirectory.from_config(alembic_config())
    assert sd.get_current_head() == SCHEMA_HEAD
    assert [s.revision for s in reversed(list(sd.walk_revisions()))] == list(SCHEMA_REVISIONS)


def test_counters_from_racing_processes_are_all_kept(store_url):
    """misses and kernel_stats add up increments, also when the row is created concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    s = open_store(store_url)
    p = problem(7)

    def one(_):
        s.record_miss(p, "capture")
        s.bump_stats({"mod.kern": {"hits": 1, "saved_seconds": 0.5}})

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(40)))
    assert s.list_misses()[0]["count"] == 40
    (row,) = s.kernel_counters()
    assert row["hits"] == 40 and row["saved_seconds"] == pytest.approx(20.0)
    s.close()
