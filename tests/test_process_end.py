"""What a process leaves when it ends (issue 27): its counts written to the store however it ends,
and, with ``TUNECACHE_SUMMARY``, one line saying what it did. Each case runs real processes."""

from __future__ import annotations

import signal

import pytest
from poolprog import SIZES
from processes import run_json


@pytest.mark.parametrize(
    ("store", "method"), [("sqlite", "fork"), ("sqlite", "spawn"), ("postgresql", "fork")]
)  # PostgreSQL under spawn too would add only a slow start: the writes are the fork case's
def test_pool_workers_terminated_at_exit_have_their_counts_written(request, store, method):
    # `with Pool() as p` ends with terminate(): SIGTERM to every worker, whose atexit never runs
    # (a forked worker's never runs at all). Their hits, counters and coverage rows were lost:
    # `tunecache stats` said "kernels seen: 0" and gc took the problems they used for unused.
    url = request.getfixturevalue("sqlite_url" if store == "sqlite" else "pg_url")
    got = run_json(["poolprog.py", method, url], timeout=240)
    tuned, after_tune = got["tuned"], got["after_tune"]
    assert tuned["benchmarks"] > 0 and tuned["hits"] == 0
    assert after_tune["problems"] == len(SIZES)
    assert after_tune["kernels_seen"] == 1, got  # the workers' kernel_stats row
    assert after_tune["stats"] == {**tuned, "hits": 0}, got
    restarted, after = got["restarted"], got["after_restart"]
    assert restarted == {"hits": len(SIZES), "misses": 0, "benchmarks": 0}, got
    assert after["stats"] == {k: tuned[k] + restarted[k] for k in tuned}, got
    assert after["hit_counts"] == [1] * len(SIZES), got  # each problem's hit, once
    assert after["gc_would_delete"] == 0, got  # used since the cutoff: not unused
    assert got["restart_exitcodes"] == [-signal.SIGTERM]  # the workers still died of SIGTERM
