"""Leases: one host computes an Inductor entry that several hosts would compute at once.

A fleet rolling out starts many hosts together; each misses the same FX graph and would compile it
(minutes in max-autotune) or autotune the same kernel. On a miss of such an entry a process takes
the entry's lease in the store (the table the tuner's single flight uses) and computes; a process
of another host that misses while the lease is live waits for the holder's put, polling the store,
and is served the entry when it lands. The wait ends when the entry lands, when the lease is gone
(released, or expired), or after ``TUNECACHE_WAIT_SECONDS``; then the process takes the lease if it
can and computes, as Inductor would without a remote cache.

The lease lives ``TUNECACHE_WAIT_SECONDS`` without renewal: Inductor's get, compile and put are not
ours to bracket, and a get may never be followed by a put (a compile that fails, an entry Inductor
decides not to cache), so a lease is not renewed by a heartbeat but simply lapses where no put
releases it; a holder that dies blocks the others no longer than they would wait anyway. Processes
of one host never wait on each other: Inductor may get an entry in a compile worker and put it from
the main process, and a host's processes share its local caches and Inductor's own locks.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

from tunecache import counters, forks, settings
from tunecache.model import InductorEntry
from tunecache.store.leases import lease_host
from tunecache.store.store import Store

#: The kinds whose entries are costly to compute (a compile, a benchmark): a miss takes a lease.
LEASED = frozenset({"fx_graph", "aot_autograd", "autotune", "bundled_autotune"})
#: Seconds between two looks at the store while waiting (doubling up to the last).
POLL = (0.2, 0.4, 0.8, 1.6, 2.0)

_holder = f"inductor:{os.getpid()}:{uuid.uuid4().hex[:12]}"
_held: dict[str, str] = {}  # lease digest -> holder, for the leases this process took
_lock = threading.Lock()


def lease_digest(kind: str, key: str, target_digest: str) -> str:
    """The lease row's digest of one entry (no tuning digest looks like it: a distinct prefix)."""
    return hashlib.sha256(f"tunecache-inductor-lease\0{kind}\0{target_digest}\0{key}".encode()).hexdigest()


def on_miss(store: Store, kind: str, key: str, target_digest: str) -> InductorEntry | None:
    """After a miss of ``key``: the entry, if another host was computing it and put it while this
    process waited; else None, with the lease taken where it could be (this process computes)."""
    if kind not in LEASED:
        return None
    digest = lease_digest(kind, key, target_digest)
    ttl = settings.get("TUNECACHE_WAIT_SECONDS")
    if ttl <= 0:
        return None
    if _take(store, digest, ttl):
        return None
    row = store.lease_of(digest)
    if row is None or row["host"] == lease_host():
        return None  # released meanwhile (then the entry may be there: Inductor asks again next start)
    counters.count(None, None, inductor_lease_waits=1)
    deadline, looks = time.monotonic() + ttl, 0
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(POLL[min(looks, len(POLL) - 1)], left))
        looks += 1
        entry = store.get_inductor(kind, key, target_digest)
        if entry is not None:
            return entry
        row = store.lease_of(digest)
        if row is None or row["expires_at"] < time.time():
            break  # released without a put, or lapsed: compute (holding the lease if it is free)
    _take(store, digest, ttl)
    return None


def on_put(store: Store, kind: str, key: str, target_digest: str) -> None:
    """After ``key`` was stored: release its lease if this process holds it."""
    if kind not in LEASED:
        return
    digest = lease_digest(kind, key, target_digest)
    with _lock:
        holder = _held.pop(digest, None)
    if holder is not None:
        store.release_lease(digest, holder)


def held() -> int:
    """How many leases this process holds (tests, stats)."""
    with _lock:
        return len(_held)


def _take(store: Store, digest: str, ttl: float) -> bool:
    if store.try_lease(digest, _holder, ttl):
        with _lock:
            _held[digest] = _holder
        return True
    return False


def _after_fork_in_child() -> None:
    """A forked child is another holder: it holds none of its parent's leases."""
    global _holder, _lock
    _lock = threading.Lock()
    _holder = f"inductor:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    _held.clear()


forks.register(__name__, _after_fork_in_child)

__all__ = ["LEASED", "held", "lease_digest", "on_miss", "on_put"]
