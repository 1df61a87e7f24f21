"""Leases on the database's clock (issue 43, item 4), on SQLite, PostgreSQL and MariaDB.

A lease's expiry was the holder's ``time.time() + ttl``, compared with the waiter's ``time.time()``:
a killed holder whose clock ran 120 s fast held every other host for the whole
``TUNECACHE_WAIT_SECONDS``, and a live holder 120 s slow had its lease taken over at once. The holder
here is a real process of another host (``TUNECACHE_HOST_ID``) whose ``time.time`` runs ``SKEW``
seconds off (tests/skewclock.py); the waiter is this process, through the tuner's single flight.
Inductor's leases: tests/test_inductor_leases.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from skewclock import skewed_env

import tunecache
from tunecache.errors import StoreError
from tunecache.store.opening import open_store
from tunecache.tuner import singleflight

LEASE_S = 1.0  # TUNECACHE_LEASE_SECONDS of the holder and the waiter
WAIT_S = 6.0  # TUNECACHE_WAIT_SECONDS: what the waiter waited before the fix (a +120 s holder)
SKEW = 120.0  # minutes off: far more than any lease or wait here

HOLDER = """
    import sys
    from tunecache.store.opening import open_store
    from tunecache.tuner.singleflight import Lease, lease_seconds
    s = open_store(sys.argv[1])
    lease = Lease(s, sys.argv[2], "skewed:holder", lease_seconds(), "k")
    assert s.try_lease(lease.digest, lease.holder, lease.ttl)
    with lease.kept():  # renewed every ttl/3, as a benchmark's
        print("HELD", flush=True)
        sys.stdin.readline()  # benchmarking, until told or killed
    print("LOST" if lease.lost.is_set() else "KEPT", flush=True)
"""


def test_the_skewed_clock_is_the_childs_alone(tmp_path):
    env = skewed_env(tmp_path, -SKEW)
    code = "import time; print(time.time())"
    theirs = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
    assert theirs == pytest.approx(time.time() - SKEW, abs=5)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """SQLite, PostgreSQL and MariaDB: each computes the time of a lease in its own SQL."""
    return request.getfixturevalue(f"{request.param}_url" if request.param != "postgresql" else "pg_url")


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["holder-fast", "holder-slow"])
def test_a_live_holders_lease_is_kept_and_a_killed_ones_taken_over_after_the_lease_seconds(
    db_url, skew, tmp_path, monkeypatch
):
    """Whatever the holder's clock: while it lives (renewing), no other host takes its lease; once
    it is killed, a waiter takes over after the lease seconds, not at once and not after the wait."""
    monkeypatch.setenv("TUNECACHE_LEASE_SECONDS", str(LEASE_S))
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", str(WAIT_S))
    store = open_store(db_url)
    store.revision()  # the schema is there before the holder opens it
    digest = f"{abs(int(skew)):x}".rjust(64, "c")
    env = skewed_env(tmp_path, skew)
    env.update(TUNECACHE_URL=db_url, TUNECACHE_HOST_ID="skewed-host", TUNECACHE_LEASE_SECONDS=str(LEASE_S))
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), db_url, digest],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = holder.stdout.readline()
        assert line.strip() == "HELD", (line, holder.stderr.read() if holder.poll() is not None else "")
        # Live: a lease period and a half of looks from this host (another one: its pid means nothing here).
        tunecache.reset_stats()
        until = time.monotonic() + 1.5 * LEASE_S
        while time.monotonic() < until:
            assert store.try_lease(digest, "waiter", LEASE_S) is False, "took over a live holder's lease"
            left = store.lease_of(digest)["expires_in"]  # as `tunecache` reports it: the database's clock
            assert 0 < left <= LEASE_S + 0.5, left
            time.sleep(0.1)
        assert tunecache.stats()["lease_takeovers"] == 0

        # Killed mid-benchmark: the tuner's single flight of another host waits, then takes over.
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        killed = time.monotonic()

        def lead(lease: singleflight.Lease) -> tuple[str | None, float]:
            return lease.holder, time.monotonic() - killed

        def trouble(what: str, e: StoreError) -> tuple[str | None, float]:
            raise e

        got, after = singleflight.run(
            store, digest, kernel="k", what="the problem", lead=lead, settled=lambda: None, trouble=trouble
        )
        assert got is not None, f"waited {after:.1f} s (TUNECACHE_WAIT_SECONDS) for a dead holder: no lease taken"
        # Its last renewal came at most LEASE_S/3 before the kill: the lease lapsed 2/3 to 1 period after.
        assert 0.5 * LEASE_S < after < LEASE_S + 2, after
        assert tunecache.stats()["lease_takeovers"] == 1
    finally:
        holder.kill()
        holder.communicate()
        store.close()
