"""Scenario 7: hostile input.

* CLI filter values with quotes and SQL fragments are plain values: they match nothing, delete
  nothing, and every table is still there.
* Tuning-key values that cannot be stored raise TypeError before anything is benchmarked or written.
* A password in the store URL appears in no log line (DEBUG included), exception, or CLI output.

Hostile import files (huge lines, deep nesting, NaN/Infinity, unknown fields) are the exchange
suite's: tests/test_exchange.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
from decimal import Decimal

import pytest
import sqlalchemy as sa
import tinykernels
import warmpool
from click.testing import CliRunner
from faultlib import WORKER, check_ok, collect, fault_report_fixture, log_lines  # noqa: F401
from realcli import cli_process

import tunecache
from tunecache.cli import main
from tunecache.errors import StoreError
from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.store.opening import open_store
from tunecache.store.schema import metadata

EVIL = [
    "x' OR 1=1 --",
    "x' OR '1'='1",
    "'; DROP TABLE problems; --",
    "kern'; DELETE FROM configs; --",
    '" OR ""="',
    "') OR ('a'='a",
    "1 UNION SELECT digest FROM problems",
    "%",
    "_",
    "%kern%",
    "\\",
    "*",
    "mod.kern' --",
    "ker\u2019n",
]
SECRET = "Sup3r-S3cret-pw"


def _seed(url: str) -> None:
    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    s = open_store(url)
    for i, kernel in enumerate(["mod.kern", "other.kern2", "x"]):
        key = json.dumps([["B", i]])
        p = Problem(problem_digest(kernel, t, key), kernel, kernel, t, key, batch_bucket=i)
        s.put(p, [ConfigResult(f"c{j}", {"kwargs": {"X": j}}, median_ms=1.0 + j) for j in range(3)])
    s.close()


def _dump(url: str) -> dict:
    s = open_store(url)
    with s.engine.connect() as c:
        names = set(sa.inspect(c).get_table_names())
        rows = {t: sorted(map(tuple, c.execute(sa.select(metadata.tables[t])))) for t in ("problems", "configs")}
    s.close()
    return {"tables": names, **rows}


def test_cli_filters_with_sql_fragments_are_plain_values(store_url, fault_report):
    _seed(store_url)
    before = _dump(store_url)
    runner = CliRunner()
    calls = 0

    def cli(*args: str) -> tuple[int, str]:
        nonlocal calls
        calls += 1
        r = runner.invoke(main, ["--url", store_url, *args])
        # CliRunner swallows a crash (exit 1, no traceback in the output): it leaves the exception here.
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        return r.exit_code, r.output

    for evil in EVIL:
        for flag in ("--kernel", "--arch", "--device", "--driver"):
            code, out = cli("ls", flag, evil, "--json")
            assert code == 0 and json.loads(out) == [], (flag, evil, out)
            code, out = cli("invalidate", flag, evil, "--json")
            assert code == 0 and json.loads(out)["count"] == 0, (flag, evil, out)
        code, out = cli("invalidate", "--kernel", evil, "--arch", evil, "--dry-run", "--json")
        assert code == 0 and json.loads(out)["count"] == 0
        code, out = cli("show", evil)
        assert code == 1 and len(out.strip().splitlines()) == 1, out  # not a digest prefix: one line
        calls += 1  # a real process: a traceback would be on its stderr
        r = cli_process("--url", store_url, "invalidate", "--older-than", evil)
        assert "Traceback" not in r.stderr and r.returncode == 2 and "is not a duration" in r.stderr, r.stderr
    # The real command line, through a shell-free argv, on the two examples of the issue.
    for evil in ("x' OR 1=1 --", "'; DROP TABLE problems; --"):
        r = subprocess.run(
            [sys.executable, "-m", "tunecache.cli", "--url", store_url, "invalidate", "--kernel", evil, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and json.loads(r.stdout)["count"] == 0, r.stderr
        calls += 1
    # A legitimate filter still matches: the values were compared, not ignored.
    code, out = cli("ls", "--kernel", "kern", "--json")
    assert [p["kernel"] for p in json.loads(out)] == ["mod.kern"]
    after = _dump(store_url)
    assert after == before  # nothing deleted, no table dropped
    fault_report.update(
        backend=store_url.split(":", 1)[0].split("+", 1)[0],
        hostile_values=len(EVIL),
        cli_calls=calls,
        rows_checked=len(after["problems"]) + len(after["configs"]),
        deleted=0,
    )


class _NotAScalar:
    pass


BAD_KEYS = {
    "object": _NotAScalar(),
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "complex": 1 + 2j,
    "decimal": Decimal("1.5"),
    "bytes": b"64",
    "tuple": (64,),
    "frozenset": frozenset({64}),
}


def test_unserialisable_key_values_raise_type_error_before_any_benchmark(sqlite_url, fault_report):
    import torch

    checked = []
    unhashable = {"list": [64], "dict": {"n": 64}}  # Triton's own cache lookup refuses these first
    for name, value in {**BAD_KEYS, "tensor": torch.tensor(64), **unhashable}.items():
        k = tinykernels.make_add(store=sqlite_url)
        x = torch.ones(64)
        with pytest.raises(TypeError) as e:
            k[lambda m: (1,)](x, x, torch.empty(64), value)
        if name in unhashable:
            assert "unhashable" in str(e.value)
        else:
            assert "tuning key argument 'N'" in str(e.value), str(e.value)  # names the argument
        checked.append(name)
        assert tunecache.stats()["benchmarks"] == 0, name
    s = open_store(sqlite_url)
    assert s.counts()["problems"] == 0 and s.list_misses() == []
    with s.engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM leases")).scalar() == 0
    s.close()
    fault_report.update(values=checked, benchmarks=0, rows_written=0)


def _no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t and SECRET.replace("-", "%2D") not in t, t[-2000:]


def test_url_password_never_appears(pg_url, tmp_path, caplog, fault_report):
    down = f"postgresql://u:{SECRET}@127.0.0.1:1/x"
    encoded = f"postgresql://u:{SECRET}%40%3A%2F@127.0.0.1:1/x"  # '@', ':' and '/' in the password
    up = pg_url.replace("postgres@", f"postgres:{SECRET}@")  # trust auth: the password is ignored, kept in the URL
    checked = 0
    # 1. The CLI, as a real process: errors, and successful --json output.
    # db upgrade first: the commands that only read never create the store (issue 16)
    commands = [["db", "upgrade"], ["info", "--json"], ["ls", "--json"], ["stats", "--json"], ["db", "current"]]
    commands.append(["invalidate", "--kernel", "k", "--json"])
    for url in (down, encoded, up):
        for args in commands:
            r = subprocess.run(
                [sys.executable, "-m", "tunecache.cli", "--url", url, *args], capture_output=True, text=True, timeout=60
            )
            _no_secret(r.stdout, r.stderr)
            assert "Traceback" not in r.stderr
            assert (r.returncode == 0) == (url == up), (url, args, r.stderr)
            checked += 1
    r = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "--url", up, "info", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(r.stdout)["store"].startswith("postgresql+psycopg://postgres:***@")
    # 2. Exceptions, with everything chained to them.
    for url in (down, encoded):
        with pytest.raises(StoreError) as e:
            open_store(url)
        chain, exc = [], e.value
        while exc is not None:
            chain.append(f"{exc!s} {exc!r}")
            exc = exc.__cause__ or exc.__context__
        _no_secret("".join(traceback.format_exception(e.value)), *chain)
        checked += 1
    # 3. Logs at DEBUG, every logger (SQLAlchemy's and psycopg's too), in this process...
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")  # SQLAlchemy sets itself to WARN on import
    with caplog.at_level(logging.DEBUG):
        for url in (down, up):
            k = tinykernels.make_add(store=url)
            tinykernels.launch(k, 100)
            tunecache.flush()
    _no_secret(*(r.getMessage() for r in caplog.records), caplog.text)
    assert any("store unavailable" in r.getMessage() for r in caplog.records)
    assert any(r.name.startswith("sqlalchemy") for r in caplog.records)
    checked += len(caplog.records)
    # ... and in a new process (a restart, from the warm pool) whose stderr gets everything at DEBUG.
    for url in (down, up):
        w = collect(
            warmpool.popen(
                [str(WORKER), "kernel", json.dumps({"url": url, "sizes": [64]})],
                {**os.environ, "TUNECACHE_FAULTS_LOG": "DEBUG"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            240,
        )
        check_ok(w)
        _no_secret(w["stderr"], w["stdout"])
        checked += len(w["stderr"].splitlines())
    assert log_lines(w, "DEBUG", "sqlalchemy.engine.Engine") or log_lines(w, "INFO", "sqlalchemy.engine.Engine")
    fault_report.update(cli_runs=len(commands) * 3 + 1, lines_and_messages_checked=checked, leaks=0)
