"""Leases on torch.compile's entries (issue 28): one host computes what several would compute at once.

Two hosts are simulated in one process: the second host's ``lease_host`` (what a lease row names
as its holder's host) is another string, its sleep is the test's clock. The store is the real
SQLite file and the real PostgreSQL (``store_url``).
"""

from __future__ import annotations

import contextlib
import time

import pytest

pytest.importorskip("torch._inductor.remote_cache")

from tunecache import counters  # noqa: E402
from tunecache.inductor import entries as inductor_entries  # noqa: E402
from tunecache.inductor import leases  # noqa: E402
from tunecache.inductor.entries import InductorStore  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402

GRAPH = b'{"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    for var in ("TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY", "TUNECACHE_MODE", "TUNECACHE_WAIT_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    inductor_entries.inductor_target.cache_clear()
    yield
    inductor_entries.inductor_target.cache_clear()


@pytest.fixture
def store(store_url: str):
    with contextlib.closing(open_store(store_url)) as s:
        yield s


def on_another_host(monkeypatch, sleep) -> None:
    """From now on this process is a process of another host, whose waits call ``sleep``."""
    monkeypatch.setattr(leases, "lease_host", lambda: "another-host#pidns=1.2")
    monkeypatch.setattr(leases.time, "sleep", sleep)


def waits() -> int:
    return int(counters.stats()["inductor_lease_waits"])


def test_a_host_that_misses_what_another_computes_waits_and_is_served_its_put(store, monkeypatch):
    first, held = InductorStore(store), leases.held()
    assert first.get("fx_graph", "graph-1") is None  # a miss: this host takes the lease and compiles
    assert leases.held() == held + 1
    slept: list[float] = []

    def sleep(s: float) -> None:  # the first host's compile ends while the second waits
        slept.append(s)
        if len(slept) == 3:
            first.put("fx_graph", "graph-1", GRAPH)

    on_another_host(monkeypatch, sleep)
    before = waits()
    assert InductorStore(store).get("fx_graph", "graph-1") == GRAPH  # served, not compiled
    assert waits() == before + 1 and len(slept) == 3
    assert leases.held() == held  # the put released the lease
    assert store.lease_of(leases.lease_digest("fx_graph", "graph-1", _digest())) is None


def test_a_lease_released_without_a_put_or_lapsed_ends_the_wait_and_the_waiter_computes(store, monkeypatch):
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "1")
    assert InductorStore(store).get("autotune", "kernel-1") is None
    digest = leases.lease_digest("autotune", "kernel-1", _digest())
    holder = store.lease_of(digest)["holder"]
    on_another_host(monkeypatch, time.sleep)  # real waits, of a 1-second lease
    t = time.monotonic()
    assert InductorStore(store).get("autotune", "kernel-1") is None  # the holder never put: lapsed
    assert 0.5 < time.monotonic() - t < 5
    row = store.lease_of(digest)
    assert row is not None and row["expires_at"] > time.time()  # the waiter holds it now

    # Released without a put (Inductor decided not to cache it): the waiter stops at the next look.
    store.release_lease(digest, holder)
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "300")
    other = leases.lease_digest("autotune", "kernel-2", _digest())
    store.try_lease(other, "inductor:elsewhere", 300)
    looks: list[float] = []

    def sleep(s: float) -> None:
        looks.append(s)
        store.release_lease(other, "inductor:elsewhere")

    monkeypatch.setattr(leases.time, "sleep", sleep)
    assert InductorStore(store).get("autotune", "kernel-2") is None
    assert len(looks) == 1


def test_processes_of_one_host_never_wait_on_each_other(store, monkeypatch):
    """Inductor may get an entry in a compile worker and put it from the main process: a host that
    waited on its own lease would wait on itself."""
    digest = leases.lease_digest("fx_graph", "graph-2", _digest())
    assert store.try_lease(digest, "inductor:a-compile-worker", 300)  # this host, another process
    monkeypatch.setattr(leases.time, "sleep", lambda s: pytest.fail("waited on its own host"))
    before = waits()
    assert InductorStore(store).get("fx_graph", "graph-2") is None
    assert waits() == before


def test_no_lease_for_triton_kernels_in_readonly_mode_or_with_no_wait(store, monkeypatch):
    entries, held = InductorStore(store), leases.held()
    assert entries.get("triton_kernel", "ab" * 32) is None  # a compile of seconds: no lease
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    assert entries.get("fx_graph", "graph-3") is None
    monkeypatch.setenv("TUNECACHE_MODE", "readwrite")
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "0")
    assert entries.get("fx_graph", "graph-4") is None
    assert leases.held() == held


def _digest() -> str:
    return inductor_entries.inductor_target()[0]
