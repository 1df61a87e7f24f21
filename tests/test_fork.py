"""Forked workers (how servers really start): locks, background state and deferred writes.

A server defines its kernels (which starts tunecache's background prefetch), then forks workers.
Each scenario runs in a fresh process (tests/forkprog.py) that forks at a chosen moment; a child
that hangs is killed after a deadline and reported as "hung", so these tests fail instead of hanging.
"""

from __future__ import annotations

import pytest
from processes import run_json


def fork_scenario(scenario: str, url: str) -> dict:
    return run_json(["forkprog.py", scenario, url], {"TUNECACHE_CONNECT_TIMEOUT": "2"}, timeout=240)


@pytest.mark.parametrize("moment", ["before", "connecting", "migrating", "after"])
def test_child_forked_at_any_moment_of_the_prefetch_launches(sqlite_url, moment):
    # "connecting": the prefetch waits on a server that accepts and never answers, holding the
    # store registry's lock; "migrating": it holds that lock and the migration lock. A child that
    # inherited them taken waited forever at its first launch.
    got = fork_scenario(moment, sqlite_url)
    assert got["rc"] == 0, got
    assert got["report"]["launched"] is True
    assert got["report"]["seconds"] < 20  # no lock waited out: at most the 2 s connect timeout
    if moment != "connecting":  # the child opened the store itself and wrote its result
        assert got["stored_problems"] == 1


def test_no_lock_held_by_another_thread_at_fork_blocks_the_child(sqlite_url):
    got = fork_scenario("locks", sqlite_url)
    assert got["rc"] == 0, got
    assert got["report"]["stuck"] == []
    assert got["report"]["launched"] is True


@pytest.mark.parametrize("exit_how", ["os_exit", "sys_exit"])
def test_child_writes_its_own_deferred_hits_and_results_exactly_once(sqlite_url, exit_how):
    # The parent has one hit queued when it forks; the child makes one of its own and defers a
    # result. os_exit: only the child's own timer can write them (the inherited timer has no
    # thread). sys_exit: the child's atexit flush must not write the parent's queued hit too.
    got = fork_scenario(f"hits:{exit_how}", sqlite_url)
    assert got["rc"] == 0, got
    assert got["hit_count"] == 2  # the parent's and the child's, each once
    assert got["child_result_stored"] is True
