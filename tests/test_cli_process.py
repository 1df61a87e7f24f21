"""The CLI as a new user meets it (issue 16): every check runs ``tunecache`` in a real process and
asserts on its real stdout, stderr and exit code (click's CliRunner hides tracebacks and pipes)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa
import warmpool
from builders import fill, write_warm_module
from realcli import leaf_commands, tc

from tunecache.cli import main
from tunecache.errors import ConfigurationError
from tunecache.store.engine import resolve_url
from tunecache.store.migrate import head_revision

HERE = Path(__file__).parent


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("tunecache: error: ")
    return r.stderr


# ---- --url and --json, one option each ------------------------------------------------------


def test_url_is_accepted_before_and_after_every_subcommand(tmp_path, sqlite_url):
    r = tc("db", "upgrade", "--url", sqlite_url)
    assert r.returncode == 0, r.stderr
    fill(sqlite_url, 2)
    r = tc("ls", "--url", sqlite_url, "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 2
    # after the subcommand wins over before it and over $TUNECACHE_URL
    r = tc("--url", f"sqlite:///{tmp_path}/other.sqlite3", "info", "--url", sqlite_url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["problems"] == 2
    r = tc("db", "--url", sqlite_url, "current")
    assert r.stdout.strip() == f"{head_revision()} (head)", r.stderr
    r = tc("--url", sqlite_url, "stats", "--json")  # the group-level one keeps working
    assert r.returncode == 0 and json.loads(r.stdout) == []
    for name, cmd in leaf_commands().items():
        assert any("--url" in p.opts for p in cmd.params), f"`tunecache {name}` does not take --url"
    for group in (main, main.commands["db"]):
        assert any("--url" in p.opts for p in group.params)


def test_json_is_one_shared_option_and_db_current_has_it(sqlite_url):
    from pathlib import Path

    from tunecache import cli

    sources = [path.read_text() for path in Path(cli.__file__).parent.glob("*.py")]
    assert sum(source.count('"--json"') for source in sources) == 1
    helps = {name: [p.help for p in cmd.params if "--json" in p.opts] for name, cmd in leaf_commands().items()}
    assert all(len(h) == 1 for h in helps.values()), helps
    assert len({h[0] for h in helps.values()}) == 1, helps
    assert tc("--url", sqlite_url, "db", "upgrade").returncode == 0
    r = tc("--url", sqlite_url, "db", "current", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["revision"] == out["head"] == head_revision() and out["is_head"] is True


# ---- warm ---------------------------------------------------------------------------------


def test_warm_prints_a_line_per_key_when_not_on_a_terminal(tmp_path, sqlite_url):
    write_warm_module(tmp_path)
    r = tc("--url", sqlite_url, "warm", "mywarm", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, pool=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  ")]
    assert len(lines) == 3, r.stderr
    for i, (n, line) in enumerate(zip((32, 64, 128), lines), 1):
        assert line.split()[:2] == [f"{i}", str(n)] and "benchmarked" in line, line
    r = tc("--url", sqlite_url, "warm", "mywarm", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, pool=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  ")]
    assert len(lines) == 3 and all("from the store" in ln for ln in lines), r.stderr


def test_warm_draws_a_progress_bar_on_a_terminal(tmp_path, sqlite_url):
    write_warm_module(tmp_path, total=True)
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE)])}
    p = warmpool.popen(  # the terminal is the child's own stderr, from the warm pool as from an exec
        ["-m", "tunecache.cli", "--url", sqlite_url, "warm", "mywarm"],
        env,
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=tmp_path,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "warming mywarm" in text and "[" in text and "#" in text, text  # click's bar
    assert "\r" in text  # redrawn in place, not one line per key
    assert b"warmed mywarm" in out


def test_warm_summary_counts_offline_fallbacks(tmp_path, sqlite_url):
    write_warm_module(tmp_path)
    r = tc(
        "--url",
        sqlite_url,
        "warm",
        "mywarm",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "TUNECACHE_MODE": "offline"},
        pool=True,
    )
    assert r.returncode == 0, r.stderr
    assert "3 fallbacks" in r.stdout and "0 configs benchmarked" in r.stdout, r.stdout
    r = tc("--url", sqlite_url, "misses", "--json")
    assert len(json.loads(r.stdout)) == 3


def test_warm_runs_the_interpreter_by_itself_without_a_gpu(tmp_path, sqlite_url):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: kernels run on it")
    write_warm_module(tmp_path, keys=(32,))
    r = tc(
        "--url",
        sqlite_url,
        "warm",
        "mywarm",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "TRITON_INTERPRET": None},
        pool=True,  # its server imports torch, not Triton: the command still sets the variable in time
    )
    assert r.returncode == 0, r.stderr
    assert "no GPU" in r.stderr and "TRITON_INTERPRET=1" in r.stderr


# ---- stores are created only by commands that write -----------------------------------------


READ_COMMANDS = [
    ["ls"],
    ["show", "abc123"],
    ["stats"],
    ["misses"],
    ["export", "OUT"],
    ["db", "current"],
    ["gc", "--dry-run"],
]


def test_read_commands_never_create_a_sqlite_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 's.sqlite3'}"
    for args in READ_COMMANDS:
        args = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in args]
        err = one_line_error(tc("--url", url, *args))
        assert "no store at" in err, (args, err)
        assert not (tmp_path / "no").exists(), args
        assert not (tmp_path / "out.jsonl").exists()
    # info shows the machine and says there is no store yet (issue 44), creating nothing either
    r = tc("--url", url, "info")
    assert r.returncode == 0 and "no store at" in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert not (tmp_path / "no").exists()


def test_read_commands_never_create_a_schema(pg_url):
    for args in (["ls"], ["stats"]):
        err = one_line_error(tc("--url", pg_url, *args))
        assert "no tunecache schema" in err and "tunecache db upgrade" in err, err
    r = tc("--url", pg_url, "info")  # the machine, and no store yet (issue 44)
    assert r.returncode == 0 and "no tunecache schema" in r.stdout and "tunecache db upgrade" in r.stdout, r.stdout
    engine = sa.create_engine(resolve_url(pg_url))
    try:
        with engine.connect() as c:
            assert sa.inspect(c).get_table_names() == []
    finally:
        engine.dispose()
    r = tc("--url", pg_url, "db", "current")  # an empty database is there: it has no revision
    assert r.returncode == 0 and r.stdout.startswith("none"), r.stderr


# ---- settings -------------------------------------------------------------------------------


def test_a_bad_mode_is_refused_by_every_command_and_the_library(sqlite_url, monkeypatch):
    assert tc("--url", sqlite_url, "db", "upgrade").returncode == 0
    for args in (["ls"], ["info"], ["db", "current"], ["stats"], ["export", "-"]):
        err = one_line_error(tc("--url", sqlite_url, *args, env={"TUNECACHE_MODE": "bogus"}))
        assert "TUNECACHE_MODE='bogus' is not one of" in err, (args, err)
    r = tc("--url", sqlite_url, "info", "--json", env={"TUNECACHE_MODE": "offline"})
    assert json.loads(r.stdout)["mode"] == "offline"
    r = tc("--url", sqlite_url, "info", env={"TUNECACHE_MODE": "offline"})
    assert re.search(r"^mode:\s+offline$", r.stdout, re.M), r.stdout
    # the library's explicit calls; a kernel's definition instead gets Triton's own Autotuner, warned
    # once (tests/test_coverage.py: a typo must not break an import)
    import tinykernels
    from triton.runtime.autotuner import Autotuner

    import tunecache

    monkeypatch.setenv("TUNECACHE_MODE", "bogus")
    monkeypatch.setenv("TUNECACHE_PREFETCH", "0")
    with pytest.raises(ConfigurationError, match="TUNECACHE_MODE='bogus'"):
        tunecache.install()
    assert type(tinykernels.make_add(store=sqlite_url)) is Autotuner


# ---- pipes ----------------------------------------------------------------------------------


def test_a_closed_pipe_ends_the_command_quietly(sqlite_url):
    fill(sqlite_url, 400)  # about 540 kB: more than a pipe holds
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    for args in (["export", "-"], ["ls"], ["ls", "--json"], ["info"]):
        # the reading end is closed before the command writes: its first write meets a closed pipe
        p = subprocess.Popen(
            [sys.executable, "-m", "tunecache.cli", "--url", sqlite_url, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=120)
        assert err == "", (args, err)
        assert p.returncode in (0, 141), (args, p.returncode)
    # as a user meets it
    r = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m tunecache.cli --url {sqlite_url} export - | head -c 100 | wc -c"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip() == "100" and "error" not in r.stderr and "Broken pipe" not in r.stderr, r.stderr


# ---- errors that say what is wrong ----------------------------------------------------------


def test_a_missing_postgres_database_is_named(pg_url):
    missing = resolve_url(pg_url).set(database=f"tc_missing_{uuid.uuid4().hex[:8]}").render_as_string(False)
    for args in (["ls"], ["db", "upgrade"]):
        err = one_line_error(tc("--url", missing, *args))
        assert "cannot reach" not in err, err
        assert "does not exist" in err and "CREATE DATABASE" in err and "tunecache db upgrade" in err, err


def test_an_edited_export_line_is_not_blamed_on_the_header(tmp_path, sqlite_url):
    fill(sqlite_url, 3)
    path = tmp_path / "e.jsonl"
    assert (
        tc(
            "--url",
            sqlite_url,
            "export",
            str(path),
        ).returncode
        == 0
    )
    lines = path.read_bytes().splitlines(keepends=True)
    obj = orjson.loads(lines[2])
    obj["tuning_seconds"] = 9.5  # still a valid problem: only the body's checksum can tell
    lines[2] = orjson.dumps(obj) + b"\n"
    path.write_bytes(b"".join(lines))
    err = one_line_error(
        tc(
            "--url",
            f"sqlite:///{tmp_path / 'b.sqlite3'}",
            "import",
            str(path),
        )
    )
    assert "line 1:" not in err and "lines 2-4" in err and "edited" in err, err


def test_db_upgrade_on_a_read_only_store_says_so(tmp_path, sqlite_url, make_readonly):
    assert tc("--url", sqlite_url, "db", "upgrade").returncode == 0
    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")
    ro = make_readonly([Path(resolve_url(sqlite_url).database), empty])
    r = tc("--url", f"sqlite:///{ro / 'store.sqlite3'}", "db", "upgrade")
    assert r.returncode == 0 and "read-only" in r.stdout and head_revision() in r.stdout, (r.stdout, r.stderr)
    err = one_line_error(tc("--url", f"sqlite:///{ro / 'empty.sqlite3'}", "db", "upgrade"))
    assert "read-only" in err and "reading the schema revision failed" not in err, err


def test_an_unknown_url_scheme_lists_the_supported_ones():
    err = one_line_error(tc("--url", "garbage://host/db", "ls"))
    assert ".[garbage]" not in err and "'garbage'" in err, err
    for scheme in ("sqlite://", "postgresql://", "mysql://", ".[postgres]", ".[mysql]"):
        assert scheme in err, err


# ---- files and directories ------------------------------------------------------------------


def test_exports_follow_the_umask(tmp_path, sqlite_url):
    fill(sqlite_url, 1)
    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
        path = tmp_path / f"e{umask:o}.jsonl"
        r = tc("--url", sqlite_url, "export", str(path), preexec_fn=lambda u=umask: os.umask(u))
        assert r.returncode == 0, r.stderr
        assert path.stat().st_mode & 0o777 == mode


def test_the_demo_and_the_tests_remove_their_temporary_directories(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = tc("demo", "--buckets", "1", "--json", env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(tmp.glob("tunecache-demo-*"))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider", str(HERE / "test_identity.py")],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert not list(tmp.glob("tc-collect-*"))
