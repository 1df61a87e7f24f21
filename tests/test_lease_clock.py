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
from concurrent.futures import ThreadPoolExecutor

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
        sys.stdin.readline()  # benchmarking, until killed
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


def test_a_live_holders_lease_is_kept_and_a_killed_ones_taken_over_after_the_lease_seconds(
    db_url, tmp_path, monkeypatch
):
    """Whatever the holder's clock: while it lives (renewing), no other host takes its lease; once
    it is killed, a waiter takes over after the lease seconds, not at once and not after the wait.
    Two holders at once, one 120 s fast and one 120 s slow, each on its own key."""
    monkeypatch.setenv("TUNECACHE_LEASE_SECONDS", str(LEASE_S))
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", str(WAIT_S))
    store = open_store(db_url)
    store.revision()  # the schema is there before the holders open it
    skews = {"fast": SKEW, "slow": -SKEW}
    digests = {name: f"{name}".encode().hex().rjust(64, "c") for name in skews}
    holders: dict[str, subprocess.Popen] = {}
    try:
        for name, skew in skews.items():
            env = skewed_env(tmp_path / name, skew)
            env.update(TUNECACHE_URL=db_url, TUNECACHE_HOST_ID=f"{name}-host", TUNECACHE_LEASE_SECONDS=str(LEASE_S))
            holders[name] = subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(HOLDER), db_url, digests[name]],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        for name, h in holders.items():
            line = h.stdout.readline()
            assert line.strip() == "HELD", (name, line, h.stderr.read() if h.poll() is not None else "")
        # Live: a lease period and a half of looks from this host (another one: its pid means nothing here).
        wrong: list[str] = []  # every way it went wrong, both holders' (one does not hide the other)
        until = time.monotonic() + 1.5 * LEASE_S
        while time.monotonic() < until:
            for name, digest in digests.items():
                if f"{name}: took over the live holder's lease" in wrong:
                    continue
                if store.try_lease(digest, "waiter", LEASE_S):
                    wrong.append(f"{name}: took over the live holder's lease")
                    store.release_lease(digest, "waiter")
                    continue
                left = store.lease_of(digest)["expires_in"]  # as tunecache reports it: the database's clock
                assert 0 < left <= LEASE_S + 0.5, (name, left)
            time.sleep(0.1)

        # Killed mid-benchmark: the tuner's single flight of another host waits on each, then takes over.
        for h in holders.values():
            h.send_signal(signal.SIGKILL)
            h.wait()
        killed = time.monotonic()

        def lead(lease: singleflight.Lease) -> tuple[str | None, float]:
            return lease.holder, time.monotonic() - killed

        def trouble(what: str, e: StoreError) -> tuple[str | None, float]:
            raise e

        def wait_on(digest: str) -> tuple[str | None, float]:
            kw = {"kernel": "k", "what": "the problem", "lead": lead, "settled": lambda: None, "trouble": trouble}
            return singleflight.run(store, digest, **kw)

        tunecache.reset_stats()
        with ThreadPoolExecutor(2) as pool:
            got = dict(zip(digests, pool.map(wait_on, digests.values())))
        for name, (holder, after) in got.items():
            if holder is None:
                wrong.append(f"{name}: waited {after:.1f} s (TUNECACHE_WAIT_SECONDS) for a dead holder, then no lease")
            # Its last renewal came at most LEASE_S/3 before the kill: the lease lapsed 2/3 to 1 period after.
            elif not 0.5 * LEASE_S < after < LEASE_S + 2:
                wrong.append(f"{name}: took the dead holder's lease over {after:.1f} s after the kill")
        assert not wrong, wrong
        assert tunecache.stats()["lease_takeovers"] == 2
    finally:
        for h in holders.values():
            h.kill()
            h.communicate()
        store.close()
