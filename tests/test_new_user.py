"""What a new user hit (issue 38): each check through the real CLI or real processes, on SQLite and
the real PostgreSQL where a store is involved."""

from __future__ import annotations

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
