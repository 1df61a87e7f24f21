"""A fleet's rollout of torch.compile on the CPU (issue 36): scripts/bench_rollout.py's ``inductor``
workload, one invocation (cold, warm, mixed trust) that this file's tests read: a unit of its own
(tests/scheduling.py), apart from the bundled kernel's fleets of tests/test_rollout.py.

Counts only, never times. A check that fails on today's main because of a known defect of the
torch.compile layer is marked ``xfail(strict=True)`` with its item of issue 35: it flips (and must
lose its mark) when the fix is merged."""

from __future__ import annotations

from typing import Any

import pytest
from rolloutbench import bench, hosts_ok


@pytest.fixture(scope="module")
def inductor(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """torch.compile of bench_inductor.py's block on the CPU: cold, warm, mixed trust."""
    out = tmp_path_factory.mktemp("rollout-inductor")
    res = bench(out, "--workloads", "inductor", "--scenarios", "cold,warm,trust")  # TUNECACHE_WAIT_SECONDS 300
    return res["scenarios"]["inductor:default"]


@pytest.mark.slow
def test_inductor_cold_fleet_never_waits_on_an_entry_that_never_lands(inductor: dict[str, Any]) -> None:
    cold = inductor["cold"]
    hosts_ok(cold)
    assert cold["fleet"]["waits_in_vain"] == 0, [(h["host"], h["waits"], h["waits_in_vain"]) for h in cold["hosts"]]


@pytest.mark.slow
def test_inductor_cold_fleet_computes_each_entry_once(inductor: dict[str, Any]) -> None:
    f = inductor["cold"]["fleet"]
    assert f["keys"] >= 1 and f["most_per_key"] == 1, f


@pytest.mark.slow
def test_inductor_warm_fleet_computes_nothing(inductor: dict[str, Any]) -> None:
    warm = inductor["warm"]
    hosts_ok(warm)
    assert warm["fleet"]["keys"] == 0 and warm["fleet"]["benchmarks"] == 0 and warm["fleet"]["waits"] == 0
    assert all(h["entries_served"] >= 1 and h["fxgraph_cache_hit"] >= 1 for h in warm["hosts"])


@pytest.mark.slow
def test_inductor_misconfigured_host_evicts_no_signed_entry(inductor: dict[str, Any]) -> None:
    trust = inductor["trust"]
    hosts_ok(trust)
    assert trust["signed_entries_before"] >= 1
    assert trust["signed_entries_lost"] == []
    assert trust["fleet_after"]["keys"] == 0  # the host after it is still served


@pytest.mark.slow
def test_inductor_hosts_say_what_the_store_did(inductor: dict[str, Any]) -> None:
    for h in inductor["warm"]["hosts"]:
        said = [ln for ln in h["summary"] if ": torch.compile: " in ln]
        assert said and " 0 computed," in said[0], (h["host"], h["summary"])
