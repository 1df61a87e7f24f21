"""What a process leaves when it ends (issue 27): its counts written to the store however it ends,
and, with ``TUNECACHE_SUMMARY``, one line saying what it did. Each case runs real processes."""

from __future__ import annotations

import re
import signal

import pytest
from poolprog import SIZES
from processes import run_json, run_json_stderr
from summaryprog import SIZES as SUMMARY_SIZES


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


# ---- the summary line (TUNECACHE_SUMMARY) ---------------------------------------------------------

SUMMARY = re.compile(
    r"tunecache(?: \(pid (?P<pid>\d+)\))?: (?P<covered>\d+)(?: of (?P<seen>\d+))? kernels? covered, "
    r"(?P<hits>[\d,]+) hits?, (?P<benchmarks>[\d,]+) benchmarks?, (?P<preloaded>[\d,]+) preloaded "
    r"\((?P<skipped>[\d,]+) skipped[^)]*\), saved (?P<saved>[\d.]+) s, spent (?P<bench>[\d.]+) s benchmarking"
)


def summaries(stderr: str) -> list[dict]:
    """The summary lines on stderr, parsed; any other line that starts like one fails the test."""
    out = []
    for line in stderr.splitlines():
        m = SUMMARY.fullmatch(line)
        if m:
            out.append({k: v.replace(",", "") if v else v for k, v in m.groupdict().items()})
        else:
            assert not re.match(r"tunecache( \(pid \d+\))?: \d", line), f"a summary line that does not parse: {line}"
    return out


def agrees(line: dict, stats: dict) -> None:
    """The line says what the process counted."""
    assert int(line["covered"]) == stats["kernels_covered"]
    assert line["seen"] is None or int(line["seen"]) == stats["kernels_seen"]
    for k in ("hits", "benchmarks", "preloaded", "preload_skipped"):
        assert int(line["skipped" if k == "preload_skipped" else k]) == stats[k], (k, line, stats)
    assert float(line["saved"]) == pytest.approx(stats["saved_seconds"], abs=0.051)
    assert float(line["bench"]) == pytest.approx(stats["bench_seconds"], abs=0.051)


def test_the_summary_line_says_what_a_first_run_and_a_restart_did(sqlite_url):
    on = {"TUNECACHE_SUMMARY": "1"}
    first, err = run_json_stderr(["summaryprog.py", sqlite_url], on)
    [line] = summaries(err)
    agrees(line, first["stats"])
    assert line["pid"] is None  # the process itself: no pid
    assert int(line["benchmarks"]) > 0 and int(line["hits"]) == 0 and int(line["covered"]) == 1
    restart, err = run_json_stderr(["summaryprog.py", sqlite_url], on)
    [line] = summaries(err)
    agrees(line, restart["stats"])
    assert int(line["benchmarks"]) == 0 and int(line["hits"]) == len(SUMMARY_SIZES)
    assert float(line["saved"]) > 0  # the first run's tuning time, not spent again
    for off in ({}, {"TUNECACHE_SUMMARY": "0"}):  # off by default
        _, err = run_json_stderr(["summaryprog.py", sqlite_url], off)
        assert summaries(err) == [] and "covered" not in err, err


def test_a_forked_child_summarises_its_own_counts_not_its_parents(sqlite_url):
    run_json_stderr(["summaryprog.py", sqlite_url], {})  # tune, silently
    got, err = run_json_stderr(["summaryprog.py", sqlite_url, "fork"], {"TUNECACHE_SUMMARY": "1"})
    assert got["child_status"] == 0
    lines = summaries(err)
    assert len(lines) == 2, err  # one each: the child did not repeat the parent's line
    parent = next(ln for ln in lines if ln["pid"] is None)
    child = next(ln for ln in lines if ln["pid"] is not None)
    agrees(parent, got["stats"])
    assert int(child["pid"]) == got["child"]["pid"]
    # the child's line: what it did since the fork (one hit), not the parent's hits again
    own = {k: v - got["child"]["before"].get(k, 0) for k, v in got["child"]["stats"].items()}
    assert int(child["hits"]) == own["hits"] == 1, (child, own)
    assert int(child["benchmarks"]) == 0
