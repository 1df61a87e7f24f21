"""A SQLite store as one file (issue 44, item 1): a read-only open reads the rows still in the
write-ahead log, a main file copied without its log says how to fix that, ``tunecache db seal``
folds the log in, and a writer's close never waits for another process."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from builders import problem, results
from realcli import one_line_error, tc

from tunecache.errors import SchemaError, StoreNotFoundError
from tunecache.store.opening import open_store

N = 3


def log_bytes(path: Path) -> int:
    """The size of the write-ahead log beside the store file ``path`` (0: none)."""
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


@pytest.fixture
def writer(tmp_path: Path):
    """A store whose rows are all in its log: its writer has not closed yet (its connection open)."""
    path = tmp_path / "w" / "store.sqlite3"
    store = open_store(f"sqlite:///{path}")
    for i in range(N):
        store.put(problem(i), results())
    assert log_bytes(path) > 0 and path.stat().st_size <= 4096, (log_bytes(path), path.stat().st_size)
    yield store
    store.engine.dispose()


def _path(store) -> Path:
    return Path(store.url.database)


def _copy(files: list[Path], d: Path) -> Path:
    d.mkdir()
    for f in files:
        shutil.copy(f, d / f.name)
    return d


@pytest.mark.parametrize("form", ["file 444", "directory 555", "read-only mount", "read-only mount with its index"])
def test_a_read_only_open_reads_the_rows_still_in_the_log(form, writer, tmp_path, make_readonly, caplog):
    path = _path(writer)
    files = [path, Path(f"{path}-wal")]
    if form.startswith("read-only mount"):
        d = make_readonly(files + ([Path(f"{path}-shm")] if form.endswith("index") else []))
    else:
        d = _copy(files, tmp_path / "copy")
        (d / path.name).chmod(0o444)
        if form == "directory 555":
            d.chmod(0o555)
    before = sorted(os.listdir(d))
    try:
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            ro = open_store(f"sqlite:///{d / path.name}", create=False)
            assert ro.readonly
            assert sorted(p.digest for p in ro.find_problems()) == sorted(problem(i).digest for i in range(N))
            ro.close()
        assert sorted(os.listdir(d)) == before  # nothing written beside it
        if not form.endswith("index"):  # the log read into memory: said once, with the fix
            said = [r.getMessage() for r in caplog.records if "-wal" in r.getMessage()]
            assert len(said) == 1 and "db seal" in said[0], said
    finally:
        if not form.startswith("read-only mount"):
            d.chmod(0o755)


def test_a_main_file_copied_without_its_log_says_how_to_fix_it(writer, make_readonly):
    d = make_readonly([_path(writer)])
    url = f"sqlite:///{d / 'store.sqlite3'}"
    line = one_line_error(tc("--url", url, "ls"))
    assert "db seal" in line and "db upgrade" not in line and "store.sqlite3-wal" in line, line
    with pytest.raises(StoreNotFoundError, match="db seal"):
        open_store(url, create=False)
    with pytest.raises(SchemaError, match="db seal"):  # a worker's open (the autotuner's)
        open_store(url)


def test_db_seal_makes_the_one_file_whole_while_a_writer_still_has_it_open(writer, make_readonly):
    path = _path(writer)
    url = f"sqlite:///{path}"
    r = tc("--url", url, "db", "seal", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["problems"] == N and out["log_bytes_folded"] > 0, out
    assert out["journal_mode"] == "wal" and log_bytes(path) == 0, out  # the writer's connection is still open
    alone = make_readonly([path])
    ro = open_store(f"sqlite:///{alone / path.name}", create=False)
    assert len(ro.find_problems()) == N
    ro.close()
    writer.put(problem(N), results())  # the writer goes on, then ends
    writer.close()
    r = tc("--url", url, "db", "seal")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sealed {path}: {N + 1} problems"), r.stdout
    assert sorted(os.listdir(path.parent)) == ["store.sqlite3"]  # no .migrate.lock either (issue 44.5)


def test_an_export_leaves_the_store_it_read_whole_in_its_one_file(writer, tmp_path, make_readonly):
    """Any command that opens a writable store folds its log in as it closes: an export (the other
    way to ship a store as one file) too, while the writer still has it open."""
    path = _path(writer)
    r = tc("--url", f"sqlite:///{path}", "export", str(tmp_path / "e.jsonl"))
    assert r.returncode == 0, r.stderr
    assert log_bytes(path) == 0
    ro = open_store(f"sqlite:///{make_readonly([path]) / path.name}", create=False)
    assert len(ro.find_problems()) == N
    ro.close()


def test_db_seal_refuses_in_one_line_what_it_cannot_seal(tmp_path, pg_url, writer):
    line = one_line_error(tc("--url", f"sqlite:///{tmp_path / 'none.sqlite3'}", "db", "seal"))
    assert "no store" in line, line
    assert not (tmp_path / "none.sqlite3").exists()
    other = tmp_path / "other.sqlite3"  # a SQLite file, not a store: left as it is
    conn = sqlite3.connect(other)
    conn.executescript("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
    conn.close()
    before = other.read_bytes()
    line = one_line_error(tc("--url", f"sqlite:///{other}", "db", "seal"))
    assert "no tunecache schema" in line and "nothing was sealed" in line, line
    assert other.read_bytes() == before
    line = one_line_error(tc("--url", pg_url, "db", "seal"))
    assert "not a SQLite file" in line and "export" in line, line
    path = _path(writer)
    path.chmod(0o444)
    try:
        line = one_line_error(tc("--url", f"sqlite:///{path}", "db", "seal"))
    finally:
        path.chmod(0o644)
    assert "read-only" in line and "where it is writable" in line, line


def test_a_writers_close_never_waits_for_another_processs_reader(tmp_path, monkeypatch):
    """A reader that holds a snapshot (an export) keeps the log from being truncated: the writer's
    close does what it can and returns at once, not after the busy timeout; the reader's view holds."""
    monkeypatch.setenv("TUNECACHE_SQLITE_BUSY_MS", "20000")
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    first = open_store(url)
    first.put(problem(0), results())
    first.close()
    reader = open_store(url)
    w = open_store(url)
    with reader.snapshot("a long read") as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM problems").scalar() == 1
        w.put(problem(1), results())
        t0 = time.monotonic()
        w.close()
        took = time.monotonic() - t0
        assert conn.exec_driver_sql("SELECT count(*) FROM problems").scalar() == 1  # its snapshot
    assert took < 5, took
    reader.close()  # the last one: the log folded in, and gone
    assert log_bytes(tmp_path / "store.sqlite3") == 0
    assert len(open_store(url, readonly=True).find_problems()) == 2
