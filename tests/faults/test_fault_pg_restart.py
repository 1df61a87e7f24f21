"""Scenario 2: the PostgreSQL server is stopped and started again while workers keep launching kernels.

The server is a private throwaway cluster (pgcluster.py), never the shared one on 5432.
"""

from __future__ import annotations

import json
import random
import time

import pytest
import sqlalchemy as sa
from faultlib import check_ok, collect, fault_report_fixture, log_lines, reap, spawn, wait_until  # noqa: F401
from pgcluster import pg_cluster_fixture  # noqa: F401

import tunecache
from tunecache.store.opening import open_store
from tunecache.store.schema import configs, problems

N_WORKERS = 4
N_CONFIGS = 3
DURATION_S = 24.0
NEW_KEY_EVERY_S = 0.7
STOP_AT_S = 7.0
DOWN_S = 5.0


def _dump(url: str) -> dict[str, dict]:
    """Every stored problem with its winner and config rows, straight from the tables."""
    e = sa.create_engine(url)
    try:
        with e.connect() as c:
            probs = {r.digest: r for r in c.execute(sa.select(problems))}
            rows = c.execute(sa.select(configs).order_by(configs.c.digest, configs.c.config_hash)).all()
    finally:
        e.dispose()
    out = {
        d: {"n": json.loads(p.key_json)[0][1], "winner": p.winner_config_hash, "created": p.created_at, "configs": []}
        for d, p in probs.items()
    }
    for r in rows:
        out[r.digest]["configs"].append((r.config_hash, r.status, r.median_ms))
    return out


@pytest.mark.slow
def test_postgresql_restart_under_load(pg_cluster, tmp_path, fault_report):
    cluster = pg_cluster()
    url = cluster.create_database()
    open_store(url).close()
    sizes = list(tunecache.buckets.SGLANG_CAPTURE_SIZES)
    status = tmp_path / "status"
    status.mkdir()
    go = tmp_path / "go"
    env = {
        "TUNECACHE_LEASE_SECONDS": "5",
        "TUNECACHE_FAULTS_STATUS_DIR": str(status),
        "TUNECACHE_FAULTS_GO": str(go),
        "TUNECACHE_CONNECT_TIMEOUT": "2",
    }
    args = {"url": url, "start_at": 0, "duration": DURATION_S, "new_every": NEW_KEY_EVERY_S, "n_configs": N_CONFIGS}
    workers = [
        spawn("churn", {**args, "sizes": random.Random(i).sample(sizes, len(sizes))}, env) for i in range(N_WORKERS)
    ]
    try:
        wait_until(lambda: all((status / str(p.pid)).exists() for p in workers), 120, what="workers ready")
        go.touch()
        t_go = time.time()
        time.sleep(STOP_AT_S)
        before = _dump(url)  # what is stored when the server goes down
        t_stop = time.time()
        stop_s = cluster.stop("fast")
        time.sleep(DOWN_S)
        t_start = time.time()
        start_s = cluster.start()
        t_up = time.time()
        results = [collect(p, DURATION_S + 90) for p in workers]
    finally:
        reap(workers)
    for r in results:
        check_ok(r)  # no exception reached the caller; every launch's output was checked
        assert r["flushed"] and r["pending_puts"] == 0, "deferred writes were not all written after the restart"
        assert r["stats"]["store_errors"] >= 1, "this worker never noticed the outage"
        unavailable = [m for m in log_lines(r) if "store unavailable" in m]
        assert len(unavailable) == 1, "\n".join(log_lines(r))  # one warning per process, not one per failed query
    after = _dump(url)
    # Nothing stored before the stop was lost or changed.
    assert set(before) <= set(after)
    for d, p in before.items():
        assert after[d]["winner"] == p["winner"] and after[d]["configs"] == p["configs"], d[:12]
    # Every row is whole, and every key any worker launched is stored: keys first tuned while the
    # server was down (in-process, deferred) and keys introduced after the restart included.
    for d, p in after.items():
        assert p["winner"] is not None and len(p["configs"]) == N_CONFIGS, d[:12]
    launched = {n for r in results for n, _ in r["introduced"]}
    during = {n for r in results for n, t in r["introduced"] if t_stop <= t <= t_up}
    since = {n for r in results for n, t in r["introduced"] if t > t_up}
    stored = {p["n"] for p in after.values()}
    assert during and since, "the outage did not overlap new keys"
    assert launched == stored
    # Kernels kept launching (correct output checked each time) while the server was down.
    while_down = [sum(1 for t in r["ok_at"] if t_stop + 0.5 <= t <= t_start) for r in results]
    assert all(n > 0 for n in while_down), while_down
    deferred = sum(len([m for m in log_lines(r, "INFO") if "wrote deferred result" in m]) for r in results)
    assert deferred >= 1
    fault_report.update(
        workers=N_WORKERS,
        configs_per_key=N_CONFIGS,
        restarts=1,
        stop_after_s=round(t_stop - t_go, 1),
        down_s=round(t_up - t_stop, 1),
        pg_ctl_stop_s=round(stop_s, 2),
        pg_ctl_start_s=round(start_s, 2),
        launches=sum(r["launches"] for r in results),
        launches_while_down=sum(while_down),
        store_errors=sum(r["stats"]["store_errors"] for r in results),
        rows_before_stop=len(before),
        rows_after=len(after),
        keys_introduced_during_outage=len(during),
        keys_introduced_after_restart=len(since),
        deferred_writes=deferred,
        rows_checked=sum(1 + len(p["configs"]) for d in (before, after) for p in d.values()),
        restart_at_s=round(t_start - t_go, 1),
    )
