"""What a new user hit (issue 38): each check through the real CLI or real processes, on SQLite and
the real PostgreSQL where a store is involved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import fill
from realcli import tc

from tunecache.store.opening import open_store

HERE = Path(__file__).parent


def _count(url: str) -> int:
    s = open_store(url, readonly=True)
    try:
        return len(s.find_problems())
    finally:
        s.engine.dispose()


# ---- 38.1: Ctrl-C after an import committed says so ------------------------------------------


def test_ctrl_c_after_the_import_committed_says_it_committed(store_url, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, 3)
    export = tmp_path / "e.jsonl"
    assert tc("--url", src, "export", str(export)).returncode == 0
    assert tc("--url", store_url, "db", "upgrade").returncode == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, str(HERE / "interrupt_after_commit.py"), "--url", store_url, "import", str(export)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert _count(store_url) == 3  # the import committed before the Ctrl-C
    assert "Traceback" not in r.stderr and r.returncode == 130, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing imported" not in lines[0], r.stderr
    assert lines[0].startswith("tunecache: interrupted") and "committed" in lines[0], r.stderr
    assert "3 problems" in lines[0], r.stderr


# ---- 38.3: a serving worker on a read-only store says so once, and spools its misses ---------

TUNED, SERVED = [64, 128], [64, 128, 256, 512]


def _tuned(url: str) -> None:
    from processes import run_procs

    (r,) = run_procs("warm", 1, url=url, sizes=TUNED)
    assert r["stats"]["misses"] == len(TUNED), r["stats"]


def _read_only(kind: str, url: str, tmp_path: Path, roles: dict | None) -> str:
    """The store at ``url`` as a serving worker sees it: a reader role, or a file mode 444."""
    if kind == "pg":
        from tunecache.store.engine import resolve_url

        assert tc("--url", url, "db", "grant", "--reader", roles["reader"]).returncode == 0
        return resolve_url(url).set(username=roles["reader"], password=None).render_as_string(hide_password=False)
    path = Path(url.removeprefix("sqlite:///"))
    path.chmod(0o444)
    return url


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_default_mode_on_a_read_only_store_says_so_once_and_spools_the_misses(kind, request, tmp_path):
    from processes import run_procs

    url = request.getfixturevalue("sqlite_url" if kind == "sqlite" else "pg_url")
    roles = request.getfixturevalue("roles") if kind == "pg" else None
    _tuned(url)
    ro = _read_only(kind, url, tmp_path, roles)
    (r,) = run_procs("warm", 1, url=ro, sizes=SERVED)  # the default mode: readwrite
    s = r["stats"]
    assert s["hits"] == len(TUNED) and s["misses"] == len(SERVED) - len(TUNED), s
    said = [ln for ln in r["stderr"].splitlines() if "read-only" in ln]
    assert len(said) == 1, r["stderr"][-3000:]
    assert "TUNECACHE_MODE=offline" in said[0] and "tunecache warm" in said[0], said
    # the misses are where `tunecache misses` finds them
    m = tc("--url", ro, "misses", "--json")
    assert m.returncode == 0, m.stderr
    got = json.loads(m.stdout)
    assert len(got) == len(SERVED) - len(TUNED), got
    assert {x["recorded"] for x in got} == {"spool"} and {x["reason"] for x in got} == {"readonly"}, got
    assert len(open_store(url).find_problems()) == len(TUNED)  # nothing written


# ---- 38.4: a store the image marks read-only is read-only for root too ----------------------


@pytest.mark.parametrize("marked", ["file 444", "directory 555"])
def test_a_store_marked_read_only_is_read_only_for_root_too(marked, tmp_path):
    d = tmp_path / "image"
    d.mkdir()
    path = d / "store.sqlite3"
    url = f"sqlite:///{path}"
    fill(url, 3)
    if marked == "file 444":
        path.chmod(0o444)
    else:
        d.chmod(0o555)
    try:
        before = sorted(p.name for p in d.iterdir())
        stat = path.stat()
        r = tc("--url", url, "gc", "--older-than", "0s")
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 1 and "read-only" in r.stderr, (os.geteuid(), r.returncode, r.stdout, r.stderr)
        assert tc("--url", url, "ls").returncode == 0
        assert tc("--url", url, "info").returncode == 0
        assert sorted(p.name for p in d.iterdir()) == before  # no WAL or shm file written
        assert path.stat().st_mtime_ns == stat.st_mtime_ns
    finally:
        d.chmod(0o755)
        path.chmod(0o644)
    assert _count(url) == 3


# ---- 38.5: import creates no directory, and a failed import leaves nothing --------------------


def _interrupted_import(url: str, export: Path, at: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TC_INTERRUPT_AT": at}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(HERE / "interrupt_after_commit.py"), "--url", url, "import", str(export)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _export(tmp_path: Path, n: int = 3) -> Path:
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, n)
    export = tmp_path / "e.jsonl"
    assert tc("--url", src, "export", str(export)).returncode == 0
    return export


def test_import_into_a_directory_that_does_not_exist_creates_nothing(tmp_path):
    export = _export(tmp_path)
    target = tmp_path / "no" / "such" / "dir"
    r = tc("--url", f"sqlite:///{target / 'store.sqlite3'}", "import", str(export))
    assert "Traceback" not in r.stderr and r.returncode == 1, (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert line.startswith("tunecache: error: ") and "does not exist" in line and "mkdir" in line, line
    assert not (tmp_path / "no").exists()


def test_an_import_into_a_new_store_interrupted_or_failed_leaves_nothing(tmp_path):
    export = _export(tmp_path)
    d = tmp_path / "new"
    d.mkdir()
    url = f"sqlite:///{d / 'store.sqlite3'}"
    r = _interrupted_import(url, export, "insert")
    assert r.returncode == 130 and "nothing imported" in r.stderr, (r.returncode, r.stderr)
    assert list(d.iterdir()) == []  # no empty store, no .migrate.lock, no WAL
    # a file that fails to import (its signature is not trusted): nothing either
    bad = tmp_path / "bad.jsonl"
    bad.write_text(export.read_text().replace('"configs"', '"config"', 1))
    r = tc("--url", url, "import", str(bad))
    assert r.returncode == 1, r.stderr
    assert list(d.iterdir()) == []
    # interrupted after the commit: the new store is kept, with what was imported
    r = _interrupted_import(url, export, "commit")
    assert r.returncode == 130 and "committed" in r.stderr, (r.returncode, r.stderr)
    assert _count(url) == 3
