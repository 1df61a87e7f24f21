"""The CLI's conventions, the same for every command (issue 26): shared options before or after
the command, exit codes and signals, one age spelling, one clear line per error. Every check runs
``tunecache`` in a real process (tests/realcli.py)."""

from __future__ import annotations

import json

import pytest
from builders import fill
from realcli import leaf_commands, tc

STORES = ["sqlite_url", "pg_url"]


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
