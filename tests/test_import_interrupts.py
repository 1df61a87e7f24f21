"""An import's outcome is decided once, by its commit (issue 44, item 3): a Ctrl-C at each stage of
``tunecache import``, timed exactly by tests/interrupt_after_commit.py, in a real process whose
stdout is a pipe."""

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
N = 3
AFTER_THE_COMMIT = ["commit", "returned", "summary", "close", "exit"]


def _count(url: str) -> int:
    s = open_store(url, readonly=True, create=False)
    try:
        return len(s.find_problems())
    finally:
        s.engine.dispose()


@pytest.fixture
def export(tmp_path: Path) -> Path:
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, N)
    path = tmp_path / "e.jsonl"
    assert tc("--url", src, "export", str(path)).returncode == 0
    return path


def _import(url: str, export: Path, at: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TC_INTERRUPT_AT": at}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(HERE / "interrupt_after_commit.py"), "--url", url, "import", str(export)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _says_it_committed(r: subprocess.CompletedProcess) -> None:
    """Exit 0 with the summary, or 130 with the summary first and the committed line on stderr too
    (stdout is a pipe here: a user at the terminal sees only stderr)."""
    assert "Traceback" not in r.stderr and "nothing imported" not in r.stderr, r.stderr
    assert r.returncode in (0, 130), (r.returncode, r.stdout, r.stderr)
    assert f"{N} problems ({2 * N} config rows): {N} new" in r.stdout, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    if r.returncode == 0:
        assert lines == [], r.stderr
    else:
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("tunecache: interrupted") and "committed" in lines[0], r.stderr
        assert f"{N} problems" in lines[0] and f"{N} new" in lines[0], r.stderr


@pytest.mark.parametrize("at", AFTER_THE_COMMIT)
def test_ctrl_c_after_the_commit_into_an_existing_store_reports_what_was_committed(at, tmp_path, export):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    assert tc("--url", url, "db", "upgrade").returncode == 0
    r = _import(url, export, at)
    _says_it_committed(r)
    assert _count(url) == N


@pytest.mark.parametrize("at", AFTER_THE_COMMIT)
def test_ctrl_c_after_the_commit_never_deletes_the_store_the_import_created(at, tmp_path, export):
    d = tmp_path / "new"
    d.mkdir()
    url = f"sqlite:///{d / 'store.sqlite3'}"
    r = _import(url, export, at)
    _says_it_committed(r)
    assert (d / "store.sqlite3").exists(), sorted(os.listdir(d))
    assert _count(url) == N


def test_ctrl_c_before_the_commit_leaves_nothing(tmp_path, export):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    assert tc("--url", url, "db", "upgrade").returncode == 0
    r = _import(url, export, "insert")
    assert "Traceback" not in r.stderr and r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip() == "tunecache: interrupted, nothing imported", r.stderr
    assert r.stdout == ""
    assert _count(url) == 0
    d = tmp_path / "new"
    d.mkdir()
    r = _import(f"sqlite:///{d / 'store.sqlite3'}", export, "insert")
    assert r.returncode == 130 and "nothing imported" in r.stderr, (r.returncode, r.stderr)
    assert list(d.iterdir()) == []


@pytest.mark.parametrize("at", ["commit", "returned", "summary"])
def test_ctrl_c_after_the_commit_into_postgresql_reports_what_was_committed(at, pg_url, export):
    assert tc("--url", pg_url, "db", "upgrade").returncode == 0
    _says_it_committed(_import(pg_url, export, at))
    assert _count(pg_url) == N


def test_a_settled_scope_keeps_the_commits_hold_and_hands_sigint_back():
    """In process (as under CliRunner): the commit's hold outlasts its block inside a scope, a
    SIGINT then is only recorded, and the handler is the default again once the scope ends; outside
    a scope the hold raises at its end, as before."""
    import signal

    from tunecache.process import interrupts

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.settled() as outcome:
        assert not outcome.committed
        with interrupts.held() as hold:
            hold()  # the commit begins
        assert outcome.committed and not outcome.interrupted
        os.kill(os.getpid(), signal.SIGINT)  # after the commit: recorded, not raised
        assert outcome.interrupted
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), interrupts.held() as hold:
        hold()
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
