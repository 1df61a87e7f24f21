"""Scenario 6: a store from an older revision is upgraded with nothing lost; a store from a newer
tunecache is refused, clearly, and left exactly as it was (never downgraded)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import sqlalchemy as sa
from faultlib import check_ok, collect, fault_report_fixture, log_lines, spawn  # noqa: F401

from tunecache.errors import SchemaError
from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem, new_config_row, new_problem_row, utcnow
from tunecache.problem.target import Target
from tunecache.store.migrate import head_revision
from tunecache.store.opening import connect, open_store
from tunecache.store.schema import configs, leases, problems

OLD = "0001"
N_PROBLEMS = 36
SIZES = [64, 100, 200]
N_CONFIGS = 6


def _rows(n: int) -> tuple[list[dict], list[dict]]:
    """n problems as the 0001 code stored them: 4 timed configs and one that ran out of resources each."""
    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    now = utcnow()
    ps, cs = [], []
    for i in range(n):
        key = json.dumps([["B", i], ["q.dtype", "torch.bfloat16"]])
        p = Problem(problem_digest("old-src", t, key), "old.kernel", "old-src", t, key, batch_bucket=i)
        res = [ConfigResult(f"c{j}", {"kwargs": {"BLOCK": 16 << j}}, median_ms=1.0 + j, samples=50) for j in range(4)]
        res.append(
            ConfigResult("oor", {"kwargs": {"BLOCK": 4096}}, status="out_of_resources", failure={"required": 1 << 20})
        )
        pv = new_problem_row(p, "old-host", now)
        pv.update(winner_config_hash="c0", winner_ms=1.0, hit_count=i)
        ps.append(pv)
        cs += [new_config_row(p.digest, r, "old-host", now) for r in res]
    return ps, cs


def _dump(url: str) -> dict[str, list[tuple]]:
    """Every row of every table that revision 0001 has, plus the stamped revision."""
    e = sa.create_engine(connect(url).url)
    try:
        with e.connect() as c:
            out = {
                t.name: sorted(tuple(r) for r in c.execute(sa.select(*[t.c[col.name] for col in t.columns])))
                for t in (problems, configs, leases)
            }
            out["alembic_version"] = c.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    finally:
        e.dispose()
    return out


def _cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "--url", url, *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_store_at_previous_revision_is_upgraded_with_nothing_lost(store_url, fault_report):
    s = connect(store_url)
    s.upgrade(OLD)
    assert s.revision() == OLD
    ps, cs = _rows(N_PROBLEMS)
    with s.engine.begin() as c:  # write as the 0001 code did
        c.execute(sa.insert(problems), ps)
        c.execute(sa.insert(configs), cs)
        c.execute(
            sa.insert(leases), [{"digest": "f" * 64, "holder": "old:1:x", "host": "old", "pid": 1, "expires_at": 1.0}]
        )
    s.close()
    before = _dump(store_url)
    # A server with the new tunecache starts on it: it migrates and tunes its own keys.
    r = collect(spawn("kernel", {"url": store_url, "sizes": SIZES}), 240)
    check_ok(r)
    assert r["stats"]["benchmarks"] == len(SIZES) * N_CONFIGS and r["stats"]["store_errors"] == 0
    assert not log_lines(r)  # no warning
    assert len([m for m in log_lines(r, "INFO") if m.startswith("tunecache: migrated")]) == 1
    after = _dump(store_url)
    assert after["alembic_version"] == [head_revision()]
    for table in ("problems", "configs", "leases"):  # every old row, every column, unchanged
        assert set(before[table]) <= set(after[table]), table
    assert len(after["problems"]) == N_PROBLEMS + len(SIZES)
    s = open_store(store_url)
    old = s.get_many("old-src")
    assert len(old) == N_PROBLEMS and all(len(p.configs) == 5 and p.winner_config_hash == "c0" for p in old)
    s.record_miss(old[0], "capture")  # the tables the migration added work
    s.bump_stats({"old.kernel": {"hits": 1}})
    assert s.list_misses()[0]["digest"] == old[0].digest
    s.close()
    fault_report.update(
        backend=s.dialect,
        from_revision=OLD,
        to_revision=head_revision(),
        problems_before=N_PROBLEMS,
        config_rows_before=len(cs),
        rows_checked=sum(len(v) for v in before.values()) + sum(len(v) for v in after.values()),
        lost=0,
    )


@pytest.mark.slow
def test_store_from_a_newer_tunecache_is_refused_and_left_alone(store_url, fault_report):
    s = open_store(store_url)
    ps, cs = _rows(4)
    with s.engine.begin() as c:
        c.execute(sa.insert(problems), ps)
        c.execute(sa.insert(configs), cs)
        c.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")  # written by a newer release
    s.close()
    before = _dump(store_url)
    newer = r"revision 0099, newer than this tunecache"
    # The library refuses with a clear message ...
    with pytest.raises(SchemaError, match=newer):
        open_store(store_url)
    with pytest.raises(SchemaError, match="newer than this tunecache"):
        connect(store_url).upgrade()
    # ... the CLI too, in one line, also when asked to migrate explicitly ...
    for args in (["db", "upgrade"], ["db", "upgrade", "--revision", OLD], ["ls"], ["info", "--json"]):
        res = _cli(store_url, *args)
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "newer than this tunecache" in res.stderr, res.stderr
    # ... and a server on it still runs its kernels (tuned in the process), with one warning.
    r = collect(spawn("kernel", {"url": store_url, "sizes": SIZES}), 240)
    check_ok(r)
    assert r["stats"]["benchmarks"] == len(SIZES) * N_CONFIGS
    warnings = log_lines(r)
    assert len(warnings) == 1 and re.search(newer, warnings[0]), warnings
    assert _dump(store_url) == before  # not migrated, not downgraded, nothing written
    fault_report.update(
        backend=store_url.split(":", 1)[0].split("+", 1)[0],
        stored_revision="0099",
        refused_by=["open_store", "Store.upgrade", "db upgrade", "db upgrade --revision 0001", "ls", "info", "kernel"],
        rows_checked=2 * sum(len(v) for v in before.values()),
        changed=0,
    )
