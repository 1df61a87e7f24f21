"""A fleet's rollout on the CPU (issue 36): scripts/bench_rollout.py with the bundled kernel, each host
a real process with its own TUNECACHE_HOST_ID and local caches, started together on one store: one
invocation (cold, warm, rolling upgrade, mixed trust) that this file's tests read. The rest of the
rollout tests, each its own scheduling unit (tests/scheduling.py): torch.compile fleets in
tests/test_rollout_inductor.py, the cold fleet over three buckets in tests/test_rollout_spread.py,
the private PostgreSQL cluster's in tests/test_rollout_cluster.py, the harness's own parts in
tests/test_rollout_checks.py.

Counts only, never times."""

from __future__ import annotations

from typing import Any

import pytest
from rolloutbench import bench, hosts_ok


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The bundled kernel (interpreted, one bucket): cold, warm, rolling upgrade, mixed trust."""
    out = tmp_path_factory.mktemp("rollout-sparse")
    res = bench(out, "--workloads", "sparse", "--scenarios", "cold,warm,upgrade,trust", "--buckets", "1")
    return res["scenarios"]["sparse"]


def test_cold_fleet_benchmarks_each_key_once(sparse: dict[str, Any]) -> None:
    cold = sparse["cold"]
    hosts_ok(cold)
    f = cold["fleet"]
    assert f["keys"] == 1 and f["most_per_key"] == 1, f
    assert sum(bool(h["benchmarks"]) for h in cold["hosts"]) == 1  # the others waited and were served
    assert f["waits_in_vain"] == 0


def test_warm_fleet_benchmarks_nothing(sparse: dict[str, Any]) -> None:
    warm = sparse["warm"]
    hosts_ok(warm)
    assert warm["fleet"]["benchmarks"] == 0 and warm["fleet"]["waits"] == 0
    assert all(h["entries_served"] == 1 for h in warm["hosts"])
    assert all(" 0 benchmarks," in h["summary"][0] for h in warm["hosts"]), [h["summary"] for h in warm["hosts"]]


def test_rolling_upgrade_benchmarks_each_edit_once_and_fresh_hosts_nothing(sparse: dict[str, Any]) -> None:
    up = sparse["upgrade"]
    hosts_ok(up)
    assert up["fleet"]["most_per_key"] == 1  # no key of any version benchmarked twice
    assert up["per_edit_benchmarked_keys"] == {"comment": 0, "code": 1}  # a comment is not a new kernel
    assert [h["benchmarks"] for h in up["fresh_hosts"]] == [0, 0, 0]  # v1, comment edit, code edit


def test_misconfigured_host_loses_the_fleet_nothing(sparse: dict[str, Any]) -> None:
    trust = sparse["trust"]
    hosts_ok(trust)
    assert trust["hosts"][-1]["trust"] == "no-keys"
    assert trust["problems_after"] == trust["problems_before"]
    assert trust["signed_entries_lost"] == []
    assert trust["fleet_after"]["benchmarks"] == 0
