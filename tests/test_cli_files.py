"""What the CLI leaves on disk and in the database when it fails or only looks (issue 26): a failed
import or a dry run creates no store, a read-only command never creates or migrates one, the
migration lock exists only while a migration is needed, and an export never overwrites a file
unasked nor leaves its temporary file behind. Every check runs ``tunecache`` in a real process."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from builders import fill
from realcli import cli_process, one_line_error

from tunecache.exchange import export
from tunecache.store.engine import resolve_url
from tunecache.store.opening import open_store


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def pg_tables(url: str) -> list[str]:
    engine = sa.create_engine(resolve_url(url))
    try:
        with engine.connect() as c:
            return sa.inspect(c).get_table_names()
    finally:
        engine.dispose()


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """A valid, unsigned export of 3 problems."""
    src = f"sqlite:///{tmp_path / 'src' / 'src.sqlite3'}"
    (tmp_path / "src").mkdir()
    fill(src, 3)
    out = tmp_path / "files" / "three.jsonl"
    out.parent.mkdir()
    r = cli_process("--url", src, "export", str(out))
    assert r.returncode == 0, r.stderr
    return out


def bad_files(d: Path, good: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Files import must refuse, with the options that make it refuse them."""
    (d / "empty.jsonl").write_bytes(b"")
    (d / "text.jsonl").write_text("hello, not an export\n")
    (d / "bad.jsonl.gz").write_bytes(b"\x1f\x8b" + os.urandom(200))
    return {
        "missing": (d / "nothere.jsonl", ()),
        "empty": (d / "empty.jsonl", ()),
        "not an export": (d / "text.jsonl", ()),
        "bad gzip": (d / "bad.jsonl.gz", ()),
        "unsigned with --binaries": (good, ("--binaries",)),
    }


# ---- 1. a failed import or a dry run creates nothing ---------------------------------------------


def test_failed_import_and_dry_run_create_no_sqlite_store(tmp_path, export_file):
    target = tmp_path / "new" / "dir" / "store.sqlite3"
    url = f"sqlite:///{target}"
    for why, (path, opts) in bad_files(export_file.parent, export_file).items():
        one_line_error(cli_process("--url", url, "import", *opts, str(path)))
        assert not (tmp_path / "new").exists(), f"{why}: {tree(tmp_path / 'new')}"
    r = cli_process("--url", url, "import", "--dry-run", str(export_file))
    assert r.returncode == 0, r.stderr
    assert "dry run, nothing written: 3 problems" in r.stdout and "3 new" in r.stdout, r.stdout
    assert not (tmp_path / "new").exists(), tree(tmp_path / "new")
    # the real import creates no directory either (issue 38: at / as root); into one that exists, the store
    assert "does not exist" in one_line_error(cli_process("--url", url, "import", str(export_file)))
    assert not (tmp_path / "new").exists(), tree(tmp_path / "new")
    target.parent.mkdir(parents=True)
    r = cli_process("--url", url, "import", str(export_file))
    assert r.returncode == 0 and "3 new" in r.stdout, r.stderr
    assert target.is_file()


def test_failed_import_and_dry_run_create_no_postgres_tables(pg_url, export_file):
    for why, (path, opts) in bad_files(export_file.parent, export_file).items():
        one_line_error(cli_process("--url", pg_url, "import", *opts, str(path)))
        assert pg_tables(pg_url) == [], why
    r = cli_process("--url", pg_url, "import", "--dry-run", str(export_file))
    assert r.returncode == 0 and "3 new" in r.stdout, r.stderr
    assert pg_tables(pg_url) == []
    r = cli_process("--url", pg_url, "import", str(export_file))
    assert r.returncode == 0 and "3 new" in r.stdout, r.stderr
    r = cli_process("--url", pg_url, "import", "--dry-run", str(export_file))
    assert r.returncode == 0 and "0 new" in r.stdout and "3 skipped" in r.stdout, r.stdout


# ---- 2. a read-only command never creates or migrates a store ------------------------------------

READ_ONLY = {
    "ls": ("ls",),
    "show": ("show", "abc"),
    "stats": ("stats",),
    "info": ("info",),
    "misses": ("misses",),
    "hosts": ("hosts",),
    "report": ("report", "-o", "{out}/r.html"),
    "export": ("export", "{out}/e.jsonl"),
}


def _one_error(r: subprocess.CompletedProcess, name: str, no_store: bool = False) -> str:
    """The one error line of a read-only command; ``hosts`` exits 2 on an error (1 is an outlier).
    ``info`` where no store is there yet (``no_store``) shows the machine, and that line, and exits 0."""
    if name == "info" and no_store:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
        return next(ln for ln in r.stdout.splitlines() if ln.startswith("store:"))
    if name != "hosts":
        return one_line_error(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (r.returncode, r.stderr[-3000:])
    assert lines[0].startswith("tunecache: error: "), lines
    return lines[0]


def _read_only_args(name: str, out: Path) -> list[str]:
    return [a.format(out=out) for a in READ_ONLY[name]]


@pytest.mark.parametrize("name", sorted(READ_ONLY))
def test_read_only_commands_leave_an_empty_or_foreign_file_alone(tmp_path, name):
    d = tmp_path / "stores"
    d.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (d / "empty.sqlite3").write_bytes(b"")
    (d / "notes.sqlite3").write_text("my notes, not a database\n")
    before = tree(d)
    err = _one_error(cli_process("--url", f"sqlite:///{d / 'empty.sqlite3'}", *_read_only_args(name, out)), name, True)
    assert "empty.sqlite3" in err and "empty file" in err and "tunecache db upgrade" in err, err
    err = _one_error(cli_process("--url", f"sqlite:///{d / 'notes.sqlite3'}", *_read_only_args(name, out)), name)
    assert "notes.sqlite3" in err and "not a SQLite database" in err, err
    err = _one_error(
        cli_process("--url", f"sqlite:///{d / 'missing.sqlite3'}", *_read_only_args(name, out)), name, True
    )
    assert "no store at" in err, err
    assert tree(d) == before
    assert list(out.iterdir()) == []


def test_read_only_commands_never_migrate(tmp_path):
    db = tmp_path / "old.sqlite3"
    url = f"sqlite:///{db}"
    r = cli_process("--url", url, "db", "upgrade", "--revision", "0005")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    out.mkdir()
    for name in sorted(READ_ONLY):
        err = _one_error(cli_process("--url", url, *_read_only_args(name, out)), name)
        assert "0005" in err and "tunecache db upgrade" in err, (name, err)
        r = cli_process("--url", url, "db", "current")
        assert r.stdout.split()[0] == "0005", (name, r.stdout)
    assert list(out.iterdir()) == []


# ---- 3. the migration lock: only while a migration is needed -------------------------------------


def test_no_migration_lock_for_an_up_to_date_store(tmp_path, make_readonly):
    db = tmp_path / "s.sqlite3"
    url = f"sqlite:///{db}"
    lock = Path(str(db) + ".migrate.lock")
    assert cli_process("--url", url, "db", "upgrade").returncode == 0
    fill(url, 2)
    lock.unlink(missing_ok=True)  # what a fresh store needed: a migration
    for args in (["db", "upgrade"], ["ls"], ["stats"], ["db", "current"]):
        r = cli_process("--url", url, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert not lock.exists(), args
    # a read-only image directory: nothing beside the store, and everything works
    ro = make_readonly([db])
    ro_url = f"sqlite:///{ro / db.name}"
    for args in (["db", "upgrade"], ["ls"], ["stats"]):
        r = cli_process("--url", ro_url, *args)
        assert r.returncode == 0, (args, r.stderr)
    assert sorted(p.name for p in ro.iterdir()) == [db.name]


def test_migration_lock_skipped_where_the_directory_is_not_writable(tmp_path, make_readonly):
    """A store that needs a migration in a directory nobody can write: the error says read-only,
    not that a lock file could not be created."""
    db = tmp_path / "old.sqlite3"
    url = f"sqlite:///{db}"
    assert cli_process("--url", url, "db", "upgrade", "--revision", "0005").returncode == 0
    ro = make_readonly([db])
    err = one_line_error(cli_process("--url", f"sqlite:///{ro / db.name}", "db", "upgrade"))
    assert "read-only" in err, err
    assert sorted(p.name for p in ro.iterdir()) == [db.name]


# ---- 4. export: never overwrite unasked, never leave a .tmp --------------------------------------


def test_export_refuses_to_overwrite_without_force(tmp_path, store_url):
    fill(store_url, 2)
    out = tmp_path / "signed.jsonl"
    out.write_bytes(b"precious\n")
    err = one_line_error(cli_process("--url", store_url, "export", str(out)))
    assert str(out) in err and "--force" in err, err
    assert out.read_bytes() == b"precious\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    r = cli_process("--url", store_url, "export", "--force", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes().startswith(b"{") and b"precious" not in out.read_bytes()
    r = cli_process("--url", store_url, "export", "-")
    assert r.returncode == 0 and r.stdout.startswith("{"), r.stderr
    r = cli_process("--url", store_url, "export", str(out))  # refused again: the file is there
    assert r.returncode == 1


def _big_sqlite_store(path: Path, n: int) -> None:
    """A store of ``n`` problems, two configs each, copied in SQL from two real ones: an export of
    it takes seconds (the export does not check digests; import would)."""
    url = f"sqlite:///{path}"
    fill(url, 1)
    c = sqlite3.connect(path)
    try:
        pcols = [r[1] for r in c.execute("PRAGMA table_info(problems)")]
        ccols = [r[1] for r in c.execute("PRAGMA table_info(configs)")]
        (digest,) = c.execute("SELECT digest FROM problems").fetchone()
        c.execute("CREATE TEMP TABLE n(i INTEGER PRIMARY KEY)")
        c.execute(
            f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
            "INSERT INTO n SELECT i FROM s"
        )
        new = "printf('%064x', n.i)"
        c.execute(
            f"INSERT INTO problems ({', '.join(pcols)}) SELECT "
            + ", ".join(new if col == "digest" else f"p.{col}" for col in pcols)
            + " FROM problems p, n WHERE p.digest = ?",
            (digest,),
        )
        c.execute(
            f"INSERT INTO configs ({', '.join(ccols)}) SELECT "
            + ", ".join(new if col == "digest" else f"x.{col}" for col in ccols)
            + " FROM configs x, n WHERE x.digest = ?",
            (digest,),
        )
        c.commit()
    finally:
        c.close()


def test_sigterm_mid_export_leaves_no_tmp_file(tmp_path):
    db = tmp_path / "big.sqlite3"
    _big_sqlite_store(db, 50_000)
    outdir = tmp_path / "out"
    outdir.mkdir()
    target = outdir / "all.jsonl.gz"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "--url", f"sqlite:///{db}", "export", str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.suffix == ".tmp" for p in outdir.iterdir()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no .tmp file appeared"
            time.sleep(0.01)
        time.sleep(0.3)  # well into the export
        assert proc.poll() is None, "the export finished before the signal: make the store bigger"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), (proc.returncode, err[-2000:])
    assert b"Traceback" not in err, err[-2000:]
    assert list(outdir.iterdir()) == []  # no .tmp, and no half-written export


def test_export_to_a_device_or_a_pipe_writes_through_it_and_never_replaces_it(tmp_path, sqlite_url):
    """A path that is a device or a pipe (/dev/null, a FIFO) is written through: the export's rename
    into place replaced /dev/null itself with a regular file (as root, for the whole machine)."""
    fill(sqlite_url, 2)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    summary = export(open_store(sqlite_url), fifo)
    reader.join(60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the pipe was replaced by a file"
    assert got and got[0].startswith(b'{"format":"tunecache-export"') and summary["problems"] == 2
    assert summary["path"] == str(fifo) and not list(tmp_path.glob(".pipe*"))
