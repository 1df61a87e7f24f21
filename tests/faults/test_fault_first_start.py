"""Scenario 4: eight processes open a store that does not exist yet, at the same moment."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from faultlib import check_ok, collect, fault_report_fixture, log_lines, reap, spawn, wait_until  # noqa: F401

from tunecache.store.migrate import head_revision
from tunecache.store.opening import connect
from tunecache.store.schema import SCHEMA_REVISIONS

N_PROCS = 8
ROUNDS = 3


def _open_at_once(url: str, status: Path) -> list[dict]:
    """N_PROCS processes, each past its imports, open ``url`` when the go file appears."""
    status.mkdir()
    go = status / "go"
    env = {"TUNECACHE_FAULTS_STATUS_DIR": str(status), "TUNECACHE_FAULTS_GO": str(go)}
    procs = [spawn("open", {"url": url, "start_at": 0}, env) for _ in range(N_PROCS)]
    try:
        wait_until(lambda: all((status / str(p.pid)).exists() for p in procs), 60, what="openers ready")
        go.touch()
        return [collect(p, 120) for p in procs]
    finally:
        reap(procs)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_eight_processes_create_a_fresh_store_at_once(backend, tmp_path, fault_report):
    from servers import make_database

    migrations = errors = 0
    seconds = []
    for rnd in range(ROUNDS):
        if backend == "sqlite":
            url, drop = f"sqlite:///{tmp_path / f'r{rnd}' / 'fresh.sqlite3'}", None  # not even the directory exists
        else:
            url, drop = make_database("postgresql")
        try:
            out = _open_at_once(url, tmp_path / f"status{rnd}-{uuid.uuid4().hex[:6]}")
            for r in out:
                check_ok(r)
                assert r["error"] is None, r["error"]
                assert r["revision"] == head_revision()
            migrated = [m for r in out for m in log_lines(r, "INFO") if m.startswith("tunecache: migrated")]
            upgrades = [
                m for r in out for m in log_lines(r, "INFO", "alembic.runtime.migration") if "Running upgrade" in m
            ]
            assert len(migrated) == 1, migrated  # exactly one process migrated
            assert len(upgrades) == len(SCHEMA_REVISIONS), upgrades  # through each revision, once each
            migrations += len(migrated)
            errors += sum(r["error"] is not None for r in out)
            seconds.append(max(r["seconds"] for r in out))
            s = connect(url)
            with s.engine.connect() as c:
                assert c.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == [head_revision()]
                names = set(sa.inspect(c).get_table_names())
                if backend == "sqlite":
                    assert c.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            s.close()
            assert {"problems", "configs", "leases", "misses", "kernel_stats", "alembic_version"} <= names
        finally:
            if drop is not None:
                from tunecache.store.opening import reset_shared_stores

                reset_shared_stores()
                drop()
    fault_report.update(
        backend=backend,
        processes=N_PROCS,
        rounds=ROUNDS,
        migrations=migrations,
        errors=errors,
        slowest_open_s=round(max(seconds), 2),
    )


@pytest.mark.slow
def test_threads_of_one_process_create_fresh_stores_at_once(tmp_path, fault_report):
    """A server whose kernels use different stores (or whose background open races an explicit
    open_store) migrates two stores at once in one process: each must end at head, none may crash."""
    from servers import make_database

    pg = [make_database("postgresql") for _ in range(2)]
    rounds, per_round = 4, 4
    try:
        for rnd in range(rounds):
            urls = [f"sqlite:///{tmp_path / f'r{rnd}' / f's{i}.sqlite3'}" for i in range(per_round)]
            if rnd == 0:
                urls[2:] = [url for url, _ in pg]  # SQLite and PostgreSQL together
            r = collect(spawn("open_threads", {"urls": urls}), 180)
            assert r["rc"] == 0, f"the process died ({r['rc']}):\n{r['stderr'][-2000:]}"  # -11: segfault
            check_ok(r)
            assert r["revisions"] == {u: head_revision() for u in urls}
    finally:
        from tunecache.store.opening import reset_shared_stores

        reset_shared_stores()
        for _, drop in pg:
            drop()
    fault_report.update(processes=1, threads=per_round, rounds=rounds, stores=rounds * per_round, crashes=0, errors=0)
