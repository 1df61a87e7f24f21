"""The CLI's conventions, the same for every command (issue 26): shared options before or after
the command, exit codes and signals, one age spelling, one clear line per error. Every check runs
``tunecache`` in a real process (tests/realcli.py)."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import fill
from realcli import leaf_commands, one_line_error, tc

STORES = ["sqlite_url", "pg_url"]
HERE = Path(__file__).parent


@pytest.fixture(params=STORES)
def store_url(request) -> str:
    return request.getfixturevalue(request.param)


# ---- 1. shared options before and after the command -----------------------------------------


def test_json_and_url_work_before_and_after_the_command(store_url):
    assert tc("--url", store_url, "db", "upgrade").returncode == 0
    fill(store_url, 2)
    for args in (
        ["--json", "--url", store_url, "ls"],
        ["--url", store_url, "--json", "ls"],
        ["--url", store_url, "ls", "--json"],
        ["ls", "--json", "--url", store_url],
    ):
        r = tc(*args)
        assert r.returncode == 0, (args, r.stderr)
        assert len(json.loads(r.stdout)) == 2, args
    r = tc("--json", "--url", store_url, "stats")
    assert r.returncode == 0, r.stderr
    assert [row["kernel"] for row in json.loads(r.stdout)] == []
    r = tc("--json", "db", "--url", store_url, "current")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["is_head"] is True
    r = tc("db", "--json", "--url", store_url, "current")
    assert json.loads(r.stdout)["is_head"] is True, r.stderr
    # without --json anywhere, text
    r = tc("--url", store_url, "db", "current")
    assert r.returncode == 0 and not r.stdout.startswith("{"), r.stdout


def test_every_command_and_group_takes_the_shared_options():
    from tunecache.cli import main

    for name, cmd in leaf_commands().items():
        opts = {o for p in cmd.params for o in p.opts}
        assert {"--url", "--json"} <= opts, name
    for group in (main, main.commands["db"]):
        opts = {o for p in group.params for o in p.opts}
        assert {"--url", "--json"} <= opts, group.name


# ---- 2. broken pipes and Ctrl-C --------------------------------------------------------------


def _closed_stdout(*args: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    p.stdout.close()  # the reader is gone before the command writes
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    return p.returncode, err


def test_every_command_exits_141_quietly_on_a_closed_pipe(sqlite_url):
    fill(sqlite_url, 3)
    for args in (["--help"], ["--version"], ["ls", "--help"], ["db", "--help"], ["ls", "--json"], ["stats"]):
        assert _closed_stdout("--url", sqlite_url, *args) == (141, ""), args


def _wait_reading_stdin(pid: int, limit: float = 120.0) -> None:
    """Until the process is blocked reading its stdin (Linux: its main thread's read(0, ...) in
    /proc): it has imported, opened the store and waits for the import's bytes. A fixed 4 s sleep
    was too short for a busy machine (SIGINT then came during the imports)."""
    read = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            call = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            call = []
        if read is None:  # another architecture: the old fixed wait
            time.sleep(4)
            return
        if call[:2] == [read, "0x0"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the command did not wait on stdin within {limit:g} s")


def _interrupt(args: list[str], stdin: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """Start ``tunecache ARGS`` with stdin held open, send SIGINT once it waits, return what it did."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    _wait_reading_stdin(p.pid)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(args, p.returncode, out.decode(), err.decode()), time.monotonic() - t0


@pytest.mark.parametrize("store", STORES)
def test_ctrl_c_exits_130_with_one_line_and_imports_nothing(store, request, tmp_path):
    url = request.getfixturevalue(store)
    fill(url, 3)
    assert tc("--url", url, "export", str(tmp_path / "e.jsonl")).returncode == 0
    # an import from a pipe that is still being written: pass 1 reads it
    r, took = _interrupt(["--url", url, "import", "-", "--on-conflict", "replace"])
    assert took < 10, took
    assert "Traceback" not in r.stderr and r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip().splitlines() == ["tunecache: interrupted, nothing imported"], r.stderr
    # any other command: one line, 130
    r, _ = _interrupt(["--url", url, "import", "--dry-run", "-"])
    assert r.returncode == 130 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("tunecache: interrupted"), r.stderr


# ---- 3. hosts: an outlier is not an outage ----------------------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_hosts_tells_an_unreachable_store_from_an_outlier(store, request, tmp_path):
    url = request.getfixturevalue(store)
    if store == "sqlite_url":
        gone = f"sqlite:///{tmp_path}/nowhere/store.sqlite3"  # no store there: an error, not "no outliers"
    else:
        gone = "postgresql+psycopg://tc:secret@127.0.0.1:1/nothing"  # nothing listens on port 1
    r = tc("--url", gone, "hosts")
    assert "Traceback" not in r.stderr and r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("tunecache: error: "), r.stderr
    assert r.stdout == ""
    r = tc("--url", gone, "hosts", "--json")
    assert r.returncode == 2, r.stderr
    err = json.loads(r.stdout)["error"]
    assert err and err in r.stderr and "secret" not in err, (err, r.stderr)
    # the store itself is fine: exit 0, or 1 for an outlier (tests/test_report.py)
    assert tc("--url", url, "db", "upgrade").returncode == 0
    r = tc("--url", url, "--json", "hosts")
    assert r.returncode == 0 and json.loads(r.stdout)["outliers"] == [], r.stderr


# ---- 4. one spelling of an age ---------------------------------------------------------------

AGE_COMMANDS = {  # command -> (its age option, the other arguments)
    "export": ("--since", ["-"]),
    "report": ("--since", ["-o", "{tmp}/r.html"]),
    "hosts": ("--since", []),
    "invalidate": ("--older-than", ["--dry-run"]),
    "gc": ("--older-than", ["--dry-run"]),
}


def test_every_age_filter_takes_durations_and_iso_dates(sqlite_url, tmp_path):
    fill(sqlite_url, 3)
    for cmd, (opt, rest) in AGE_COMMANDS.items():
        rest = [a.format(tmp=tmp_path) for a in rest]
        for value in ("12h", "2", "2026-01-01T08:30:00+02:00"):
            r = tc("--url", sqlite_url, cmd, opt, value, *rest)
            assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (cmd, value, r.stderr)
            assert "error" not in r.stderr.lower(), (cmd, value, r.stderr)
        r = tc("--url", sqlite_url, cmd, opt, "soon", *rest)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, r.stderr)
        assert opt in r.stderr and "30d, 12h, 90m" in r.stderr and "ISO date" in r.stderr, (cmd, r.stderr)


@pytest.mark.parametrize("store", STORES)
def test_age_filters_select_the_same_way(store, request, tmp_path):
    url = request.getfixturevalue(store)
    fill(url, 3)  # just stored
    dry = ["--url", url, "--json"]
    # stored just now: newer than 1h ago, older than a date to come
    assert json.loads(tc(*dry, "invalidate", "--older-than", "1h", "--dry-run").stdout)["count"] == 0
    assert json.loads(tc(*dry, "invalidate", "--older-than", "2999-01-01", "--dry-run").stdout)["count"] == 3
    assert json.loads(tc(*dry, "gc", "--older-than", "12h", "--dry-run").stdout)["count"] == 0
    assert json.loads(tc(*dry, "gc", "--older-than", "0m", "--dry-run").stdout)["count"] == 3
    assert json.loads(tc(*dry, "gc", "--days", "0", "--dry-run").stdout)["count"] == 3  # the old spelling
    assert tc(*dry, "export", "-", "--since", "90M").stdout.count("\n") > 3
    r = tc(*dry, "export", str(tmp_path / "none.jsonl"), "--since", "2999-01-01")
    assert json.loads(r.stdout)["problems"] == 0, r.stderr


# ---- 5. one clear line, not a traceback nor a misleading one ---------------------------------


@pytest.mark.parametrize("buckets", ["0", "abc", "4,-1"])
def test_demo_refuses_bad_buckets_in_one_line(buckets):
    err = one_line_error(tc("demo", "--buckets", buckets), code=2)
    assert "--buckets" in err and "positive" in err, err


def test_a_postgresql_connection_failure_says_it_could_not_connect():
    r = tc("--url", "postgresql+psycopg://tc:s3cret@127.0.0.1:1/nothing", "ls")
    err = one_line_error(r)
    assert err.startswith("tunecache: error: cannot connect to the store at 127.0.0.1:1"), err
    assert "privileges" not in err and "s3cret" not in err and "***" in err, err


def test_show_caps_what_it_echoes(sqlite_url):
    fill(sqlite_url, 1)
    err = one_line_error(tc("--url", sqlite_url, "show", "a" * 100_000))
    assert "too long" in err and len(err) < 300, err[:300]
    err = one_line_error(tc("--url", sqlite_url, "show", "xyz" * 21))
    assert "not hexadecimal" in err and len(err) < 300, err[:300]


def test_a_bad_target_override_names_the_setting_and_the_field(sqlite_url):
    fill(sqlite_url, 1)
    err = one_line_error(tc("--url", sqlite_url, "info", env={"TUNECACHE_TARGET_OVERRIDE": '{"sm_count":"many"}'}))
    assert "TUNECACHE_TARGET_OVERRIDE" in err and "sm_count" in err and "'many'" in err, err


@pytest.mark.parametrize("store", STORES)
def test_an_over_long_filter_is_refused_clearly(store, request):
    url = request.getfixturevalue(store)
    fill(url, 1)
    for opt in ("--kernel", "--device"):
        r = tc("--url", url, "ls", opt, "k%" * 50_000)
        err = one_line_error(r, code=2)
        assert opt in err and "too long" in err and "LIKE" not in err and len(err) < 300, err[:300]
    assert json.loads(tc("--url", url, "ls", "--json", "--kernel", "add").stdout), "a normal filter still works"


def test_export_says_what_is_wrong_with_the_path(sqlite_url, tmp_path):
    fill(sqlite_url, 1)
    (tmp_path / "file").write_text("x")
    err = one_line_error(tc("--url", sqlite_url, "export", str(tmp_path / "file" / "sub.jsonl")))
    assert "is not a directory" in err and "does not exist" not in err, err
    err = one_line_error(tc("--url", sqlite_url, "export", str(tmp_path)))
    assert f"{tmp_path} is a directory" in err and ".tmp" not in err, err
    assert not [p for p in tmp_path.parent.iterdir() if p.name.endswith(".tmp")]


# ---- 6. invalidate --driver-not-current reads the target as info does -------------------------


@pytest.mark.parametrize("store", STORES)
def test_driver_not_current_uses_the_target_override(store, request):
    url = request.getfixturevalue(store)
    fill(url, 3)  # stored with driver 13000
    args = ["--url", url, "--json", "invalidate", "--driver-not-current", "--dry-run"]
    for driver, count in (("13010", 3), ("13000", 0)):
        env = {"TUNECACHE_TARGET_OVERRIDE": json.dumps({"driver_version": driver})}
        assert json.loads(tc("--url", url, "--json", "info", env=env).stdout)["target"]["driver_version"] == driver
        r = tc(*args, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["count"] == count, (driver, r.stdout)
    err = one_line_error(tc(*args, env={"TUNECACHE_TARGET_OVERRIDE": None}))  # a CPU: no driver to compare
    assert "--driver X" in err, err
    err = one_line_error(tc("--url", url, "invalidate"), code=2)
    assert "--device" in err and "--driver-not-current" in err, err


# ---- 7. help that says what the command does -------------------------------------------------


def test_help_texts_agree_with_the_commands_and_the_docs():
    keygen = tc("keygen", "--help").stdout
    assert "--url" not in keygen, keygen  # it opens no store
    demo = tc("demo", "--help").stdout
    assert "default $TUNECACHE_URL" not in " ".join(demo.split()), demo
    for name in leaf_commands():
        text = tc(*name.split(), "--help").stdout
        assert "``" not in text, (name, text)  # raw reST markup
    show = tc("show", "--help").stdout
    assert "show [OPTIONS] DIGEST\n" in show, show
    page = (HERE.parent / "docs" / "cli.md").read_text()
    assert "show DIGEST " in page and "Usage: tunecache show [OPTIONS] DIGEST\n" in page


def test_an_error_message_starting_with_a_newline_shows_its_first_words(tmp_path, sqlite_url):
    (tmp_path / "raiser.py").write_text("def warmup():\n    raise ValueError('\\n\\nthe real reason\\nmore detail')\n")
    r = tc(
        "--url",
        sqlite_url,
        "warm",
        "raiser",
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )
    assert one_line_error(r) == "tunecache: error: raiser.warmup() failed: ValueError: the real reason", r.stderr
