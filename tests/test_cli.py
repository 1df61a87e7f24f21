"""CLI: exit codes, tables and JSON, the management verbs."""

from __future__ import annotations

import json
import logging

import pytest
from builders import H200, problem, results
from click.testing import CliRunner
from realcli import cli_process, one_line_error

from tunecache.cli import main
from tunecache.problem.target import Target
from tunecache.store.migrate import head_revision
from tunecache.store.opening import open_store


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
    err = one_line_error(cli_process("--url", store_url, "invalidate", "--older-than", "yesterday"), code=2)
    assert "'yesterday' is not a duration" in err
    assert s.counts()["problems"] == 0


def test_gc_drops_the_launch_specs_another_text_superseded(store_url):
    """Heal adds a spec of another text's binary beside the stored one (issue 35, item 8): ``gc`` is
    what drops the older of the two, then the binaries no spec or winner references."""
    from tunecache.binaries.preload import for_binary
    from tunecache.problem.model import LaunchSpec

    s = open_store(store_url)
    old = LaunchSpec("1" * 64, "c1", "a" * 64, '{"key": "k"}', "3.9.0")
    s.put_specs("k", "src", "t", [for_binary(old)])
    s.put_specs("k", "src", "t", [for_binary(LaunchSpec(old.spec_hash, "c1", "b" * 64, old.spec_json, "3.9.0"))])
    r = run(store_url, "gc", "--days", "0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["launch_specs"]["count"] == 1
    assert [x.kernel_hash for x in s.get_specs("src")["t"]] == ["b" * 64]
    r = run(store_url, "gc", "--days", "0")
    assert "0 superseded launch specs dropped" in r.output
    s.close()


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


# ---- no fragment of a password, however it is spelled (issue 13, item 11) --------------------

# As written in the URL. Every alphanumeric run is a fragment that must never be printed.
NASTY_PASSWORDS = [
    "Zq7x@Wp4y",
    "Zq7x:Wp4y@Kr2v",
    "Zq7x/Wp4y@Kr2v",
    "Zq7x%40Wp4y",
    "Zq7x#Wp4y",
    "Zq7x?Wp4y@Kr2v",
    "Zq7x@Wp4y/Kr2v",
    "Zq7x@Wp4y?Kr2v",
]
FRAGMENTS = ("Zq7x", "Wp4y", "Kr2v")


def _no_fragment(*texts: str) -> None:
    for t in texts:
        leaked = [f for f in FRAGMENTS if f in t]
        assert not leaked, f"password fragments {leaked} in: {t[-2000:]}"


@pytest.mark.parametrize("password", NASTY_PASSWORDS)
def test_no_fragment_of_a_nasty_password_is_printed(password, pg_url, caplog):
    import traceback

    import tinykernels

    from tunecache.errors import StoreError
    from tunecache.store.engine import mask_raw, mask_url, resolve_url

    down = f"postgresql://tc:{password}@127.0.0.1:1/db"
    up = pg_url.replace("postgres@", f"postgres:{password}@")  # trust auth: the password is ignored
    assert up != pg_url
    # Parsed with the whole password, whatever it holds: the host and database are the real ones.
    u = resolve_url(down)
    assert (u.host, u.port, u.database) == ("127.0.0.1", 1, "db")
    assert u.password == password.replace("%40", "@")
    _no_fragment(mask_url(down), mask_url(u), mask_raw(down), mask_raw(f"can't reach {down} (x)"), repr(u))
    # 1. info, as a real process: the unreachable store's error, and a reachable store's output.
    r = cli_process("--url", down, "info")
    assert r.returncode == 1 and "127.0.0.1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    _no_fragment(r.stdout, r.stderr)
    r = cli_process("--url", up, "db", "upgrade")  # read-only commands never create a store
    assert r.returncode == 0, r.stderr
    _no_fragment(r.stdout, r.stderr)
    r = cli_process("--url", up, "info", "--json")
    assert r.returncode == 0, r.stderr
    _no_fragment(r.stdout, r.stderr)
    assert json.loads(r.stdout)["store"].startswith("postgresql+psycopg://postgres:***@127.0.0.1:5432/")
    # 2. The StoreError, with everything chained to it.
    with pytest.raises(StoreError) as e:
        open_store(down)
    _no_fragment("".join(traceback.format_exception(e.value)), repr(e.value))
    # 3. The autotuner's unreachable-store warning, and every log line (DEBUG, all loggers).
    caplog.set_level(logging.DEBUG)
    tinykernels.launch(tinykernels.make_add(store=down), 64)
    assert any("store unavailable" in r.getMessage() for r in caplog.records)
    _no_fragment(caplog.text, *(r.getMessage() for r in caplog.records))
