"""CLI: exit codes, tables and JSON, the management verbs."""

from __future__ import annotations

import json

from click.testing import CliRunner
from test_store import H200, problem, results

from tunecache.cli import main
from tunecache.identity import Target
from tunecache.store import head_revision, open_store


def run(url, *args):
    return CliRunner().invoke(main, ["--url", url, *args])


def test_db_upgrade_and_current_on_a_new_database(store_url):
    r = run(store_url, "db", "current")
    if store_url.startswith("sqlite"):  # no file: there is no store, and looking does not create one
        assert r.exit_code == 1 and "no store at" in r.output
    else:  # an empty database: a store without a schema
        assert r.exit_code == 0 and r.output.startswith("none")
    r = run(store_url, "db", "upgrade")
    assert r.exit_code == 0, r.output
    r = run(store_url, "db", "current")
    assert r.output.strip() == f"{head_revision()} (head)"


def test_info_ls_show(store_url):
    s = open_store(store_url)
    p = problem(16)
    s.put(p, results())
    r = run(store_url, "info", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["counts"]["problems"] == 1 and info["schema_revision"] == head_revision()
    r = run(store_url, "ls")
    assert r.exit_code == 0 and p.digest[:12] in r.output and "BLOCK_T=32" in r.output
    r = run(store_url, "ls", "--json", "--arch", "sm80")
    assert json.loads(r.output) == []
    r = run(store_url, "show", p.digest[:10])
    assert r.exit_code == 0
    assert "out_of_resources" in r.output and "needs 786432, limit 232448" in r.output
    r = run(store_url, "show", "zz")
    assert r.exit_code == 1 and "not hexadecimal" in r.output
    r = run(store_url, "show", "abc123")
    assert r.exit_code == 1 and "no problem" in r.output
    r = run(store_url, "ls", "--limit", "0")
    assert r.exit_code == 2


def test_invalidate_and_gc(store_url):
    s = open_store(store_url)
    old = Target(**{**H200.as_dict(), "driver_version": "12080"})
    s.put(problem(1), results())
    s.put(problem(2, target=old), results())
    r = run(store_url, "invalidate")
    assert r.exit_code == 2  # a filter is required
    r = run(store_url, "invalidate", "--driver", "12080", "--dry-run")
    assert r.exit_code == 0 and "would delete" in r.output and s.counts()["problems"] == 2
    r = run(store_url, "invalidate", "--driver", "12080", "--json")
    assert json.loads(r.output)["count"] == 1 and s.counts()["problems"] == 1
    r = run(store_url, "gc", "--days", "1", "--json")
    assert json.loads(r.output)["count"] == 0
    r = run(store_url, "gc", "--days", "0", "--json")
    assert json.loads(r.output)["count"] == 1 and s.counts()["problems"] == 0
    r = run(store_url, "invalidate", "--older-than", "yesterday")
    assert r.exit_code in (1, 2) and "Traceback" not in r.output


def test_stats_and_misses_from_persisted_counters(sqlite_url, monkeypatch):
    import tinykernels

    import tunecache

    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)
    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)
    monkeypatch.setenv("TUNECACHE_MODE", "offline")
    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 999)
    tunecache.flush()
    r = run(sqlite_url, "stats", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert rows[0]["benchmarks"] == len(tinykernels.CONFIGS) and rows[0]["hits"] == 1
    r = run(sqlite_url, "misses", "--json")
    assert r.exit_code == 0, r.output
    misses = json.loads(r.output)
    assert misses[0]["reason"] == "offline" and misses[0]["key"][0] == ["N", 999]
