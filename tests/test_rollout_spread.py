"""A cold fleet of scripts/bench_rollout.py over three buckets, on SQLite and on PostgreSQL: the
fleet spreads its keys over its hosts (issue 36). Each test its own scheduling unit."""

from __future__ import annotations

from pathlib import Path

import pytest
from rolloutbench import bench, hosts_ok


@pytest.mark.parametrize("where", ["sqlite", "postgresql"])
def test_cold_fleet_spreads_its_keys_over_its_hosts(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Three hosts warm three buckets together (largest first, each host in the same order): each key
    is benchmarked once fleet-wide, by more than one host, and hosts benchmark at the same time
    (warmup defers a key another host is benchmarking: without it the fleet tunes one key at a time)."""
    url = ["--url", request.getfixturevalue("pg_url")] if where == "postgresql" else []
    res = bench(tmp_path, "--workloads", "sparse", "--scenarios", "cold", "--hosts", "3", "--buckets", "4,2,1", *url)
    cold = res["scenarios"]["sparse"]["cold"]
    hosts_ok(cold)
    f = cold["fleet"]
    assert f["keys"] == 3 and f["most_per_key"] == 1, f
    assert sum(n > 0 for n in f["keys_led"].values()) >= 2, f["keys_led"]
    assert f["most_at_once"] >= 2, f
    assert f["waits_in_vain"] == 0
    winners = [h["winners"] for h in cold["hosts"]]
    assert all(w == winners[0] for w in winners) and sorted(winners[0], key=int) == ["1", "2", "4"]
