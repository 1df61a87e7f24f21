"""The rollout tests that need a private PostgreSQL cluster (tests/faults/pgcluster.py): the store in
trouble during a fleet's rollout (scripts/bench_rollout.py's ``trouble``), and scripts/bench_fleet.py's
proof that its simulated start is a real one. Each test its own scheduling unit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rolloutbench import bench, hosts_ok

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "scripts" / "bench_fleet.py"
sys.path.insert(0, str(ROOT / "tests" / "faults"))

from pgcluster import private_cluster_available  # noqa: E402


@pytest.mark.slow
def test_store_trouble_loses_no_rows(tmp_path: Path) -> None:
    why = private_cluster_available()
    if why:
        pytest.skip(f"private PostgreSQL cluster unavailable: {why}")
    trouble = bench(tmp_path, "--workloads", "sparse", "--scenarios", "trouble", "--buckets", "2,1")
    rec = trouble["scenarios"]["sparse"]["trouble"]
    hosts_ok(rec["restart"])
    hosts_ok(rec["down"])  # every host produced its output with the database gone
    assert rec["rows_lost"] == 0, rec
    # A host whose store fails while it waits for another's benchmark tunes the key itself (the store
    # being down never stops a kernel) and writes it when the store is back: each key stored.
    assert rec["buckets_not_stored"] == 0 and rec["rows"]["after_restart"]["problems"] == 2


def prove(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(FLEET), "--prove-only", *args], env=env, capture_output=True, text=True)


@pytest.fixture
def private_cluster() -> None:
    why = private_cluster_available()
    if why:
        pytest.skip(f"private PostgreSQL cluster unavailable: {why}")


def test_bench_fleet_proves_its_simulated_start(private_cluster: None) -> None:
    r = prove()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "real start == simulated start: True" in r.stderr


def test_bench_fleet_exits_nonzero_when_its_proof_fails(private_cluster: None) -> None:
    r = prove("--drop-call=-1")  # a replay that lacks the real start's last call (its counters' write)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "proof failed, no load measured" in r.stderr and "only_real" in r.stderr
