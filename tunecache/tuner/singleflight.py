"""Single-flight: exactly one process per problem benchmarks, on this host and across hosts.

On a host, a per-digest file lock (the OS drops it when its holder dies, even by kill -9); across
hosts, a lease row in the store, renewed by a heartbeat while the benchmark runs. The others wait
for the holder's result, and benchmark themselves once they have waited ``TUNECACHE_WAIT_SECONDS``.
What to do with the lease, the wait and a store that fails is the caller's (see :func:`run`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tunecache import settings
from tunecache.errors import StoreError
from tunecache.problem.target import hostname
from tunecache.process import counters
from tunecache.store.store import Store

log = logging.getLogger("tunecache")

T = TypeVar("T")


def lease_seconds() -> float:
    """How long a benchmark lease lives without renewal: a killed holder blocks others this long."""
    return settings.get("TUNECACHE_LEASE_SECONDS")


def wait_seconds() -> float:
    """How long a process waits for another's benchmark before benchmarking itself."""
    return settings.get("TUNECACHE_WAIT_SECONDS")


@dataclass
class Lease:
    """The right to benchmark one problem. ``holder`` None: benchmarking without one, after waiting
    in vain for the holder's result."""

    store: Store
    digest: str
    holder: str | None
    ttl: float
    kernel: str
    lost: threading.Event = field(default_factory=threading.Event)

    @contextlib.contextmanager
    def kept(self) -> Iterator[Lease]:
        """Renew the lease every ttl/3 while the body runs; after it, check once more that no other
        process took it since the last beat (then :attr:`lost` is set)."""
        stop = threading.Event()
        if self.holder is not None:
            threading.Thread(target=self._beat, args=(stop,), daemon=True).start()
        try:
            yield self
        finally:
            stop.set()
        if self.holder is not None and not self.lost.is_set():
            self.renew()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(max(self.ttl / 3.0, 0.05)):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Renew the lease; False once another process holds it (it judged ours expired or its
        holder dead): then :attr:`lost` is set, counted and warned about once per kernel. A failed
        renewal (store down) is not a loss: the lease may still be ours."""
        assert self.holder is not None
        try:
            if self.store.renew_lease(self.digest, self.holder, self.ttl):
                return True
        except StoreError:
            log.debug("tunecache: lease renewal failed", exc_info=True)
            return True
        self.lost.set()
        counters.count(None, None, leases_lost=1)
        counters.warn_once(
            self.kernel,
            "lease-lost",
            "tunecache: %s: lost the benchmark lease of %s to another process (renewals later than "
            "TUNECACHE_LEASE_SECONDS?); finishing this benchmark, then launching that process's result if it "
            "stored one",
            self.kernel,
            self.digest[:12],
        )
        return False


def run(
    store: Store,
    digest: str,
    *,
    kernel: str,
    what: str,
    lead: Callable[[Lease], T],
    settled: Callable[[], T | None],
    trouble: Callable[[str, StoreError], T],
    busy: Callable[[], T] | None = None,
) -> T:
    """Benchmark ``digest`` in exactly one process: ``lead(lease)`` where this process holds the
    host lock and the lease (or, once ``TUNECACHE_WAIT_SECONDS`` passed, without a lease); while
    another holds them, poll ``settled()`` for its result (None: not there yet). A store that fails
    (a ``StoreError`` from the lease or from ``settled``) ends in ``trouble("lease" | "read", e)``.
    ``busy``, where given, is called instead of waiting once another process holds them (its value
    is returned, or it raises: see :mod:`tunecache.tuner.deferral`); nothing is counted as a wait.
    ``what`` names the problem in messages."""
    holder = f"{hostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    ttl = lease_seconds()
    deadline = time.monotonic() + wait_seconds()
    flock = host_lock(store, digest)
    waiting: list[float] = []  # when this process began waiting for another's benchmark, once it did
    poll = 0.0
    started = time.monotonic()
    while True:
        got_host = flock is None or _try_acquire(flock)
        if got_host:
            try:
                if store.try_lease(digest, holder, ttl):
                    _waited(waiting, served=False)  # the holder went without storing it: benchmarked here
                    try:
                        return lead(Lease(store, digest, holder, ttl, kernel))
                    finally:
                        with contextlib.suppress(StoreError):
                            store.release_lease(digest, holder)
            except StoreError as e:
                _waited(waiting, served=False)
                return trouble("lease", e)
            finally:
                if flock is not None:
                    flock.release()
        if busy is not None:
            return busy()
        if not waiting:
            waiting.append(time.monotonic())
            counters.count(None, None, waits=1)
            log.info("tunecache: %s: another process is benchmarking %s; waiting", kernel, what)
        poll = next_poll(poll, time.monotonic() - started)
        time.sleep(poll * random.uniform(0.8, 1.2))  # jitter: a fleet that missed together polls apart
        try:
            done = settled()
        except StoreError as e:
            _waited(waiting, served=False)
            return trouble("read", e)
        if done is not None:
            _waited(waiting, served=True)
            return done
        if time.monotonic() > deadline:
            _waited(waiting, served=False)
            counters.warn_once(
                kernel,
                "wait-timeout",
                "tunecache: %s: waited %.0fs for another process's benchmark of %s; benchmarking here",
                kernel,
                wait_seconds(),
                what,
            )
            return lead(Lease(store, digest, None, ttl, kernel))


def _waited(waiting: list[float], *, served: bool) -> None:
    """The end of a wait for another process's benchmark (none if ``waiting`` is empty): its seconds,
    and whether it was in vain (this process benchmarks, or gives up, after all). Counted once."""
    if waiting:
        counters.count(None, None, wait_seconds=time.monotonic() - waiting.pop(), waits_in_vain=int(not served))


def next_poll(poll: float, waited: float) -> float:
    """Seconds until the next look for another process's result, after ``waited`` seconds.

    Quick at first (0.05 s, growing by half each time) so a short benchmark is seen at once, then at
    most one look every tenth of the time waited so far, capped at 5 s: a fleet that missed one key
    together (a driver upgrade) costs the database a read per waiting worker every 0.5 s for the
    first 5 s, and ever less after (about 40 reads in a minute instead of 120; docs/scaling.md).
    """
    return min(max(poll * 1.5, 0.05), max(0.5, min(5.0, waited / 10.0)))


def _lock_dir(store: Store) -> Path | None:
    base = settings.get("TUNECACHE_LOCK_DIR")
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("tunecache")
    d = Path(base) / "locks" / hashlib.sha256(str(store.url).encode()).hexdigest()[:16]
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return d if os.access(d, os.W_OK) else None


@functools.lru_cache(maxsize=64)
def _lock_dir_cached(store: Store) -> Path | None:
    return _lock_dir(store)


def host_lock(store: Store, digest: str) -> Any:
    """A per-digest file lock: the OS drops it when its holder dies, even by kill -9. None where no
    lock directory is writable (the lease row still serialises)."""
    d = _lock_dir_cached(store)
    if d is None:
        return None
    from filelock import FileLock

    return FileLock(str(d / f"{digest[:32]}.lock"))


def _try_acquire(lock: Any) -> bool:
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
        return True
    except Timeout:
        return False
    except OSError:
        return True  # no usable lock file: the lease row still serialises
