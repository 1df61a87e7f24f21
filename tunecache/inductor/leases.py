"""Leases: one host computes an Inductor entry that several hosts would compute at once.

A fleet rolling out starts many hosts together; each misses the same FX graph and would compile it
(minutes in max-autotune) or autotune the same kernel. On a miss of such an entry a process takes
the entry's lease in the store (the table the tuner's single flight uses) and computes; a process
of another host that misses while the lease is live waits for the put, polling the store, and is
served the entry when it lands. Then it computes itself, as Inductor would without a remote cache.

The rule: **a host waits on a lease only while its holder is alive and still computing.**
Inductor's get, compile and put are not ours to bracket, and a get is not always followed by a put
(an entry Inductor decides not to keep, a failed compile, a kernel never launched so never
autotuned, a process that ends or is killed), so a lease is short and ends on whichever comes first:

- the entry's put, by **any** process (Inductor looks an autotune entry up where it loads the
  kernel, often a compile worker, and puts it from the process that benchmarks it at the first
  launch; so compile workers do take leases: the main process never looks those entries up);
- for FX graph, AOTAutograd and bundled autotune entries taken during a compile: the end of the
  process's compiles (dynamo's compile-end callback, torch >= 2.6); their put, if any, comes
  within the compile (a lazily compiled backward's AOTAutograd entry is put later: a waiter then
  computes it itself, as without a lease);
- the process idle (no compile in progress, no look at the store) for ``TUNECACHE_LEASE_SECONDS``:
  what ends the lease of an autotune entry whose kernel is never launched, and of a worker whose
  compile moved on. The process's compiles and its store traffic are what "still computing" can
  be told by; a kernel benchmarked at its first launch is put within seconds of the compile's end;
- the end of the process (atexit, and a multiprocessing child's last words, :mod:`tunecache.process.processend`);
- a holder killed: its lease is renewed by a heartbeat thread every third of
  ``TUNECACHE_LEASE_SECONDS`` while the rules above keep it, so it lapses that long after the kill
  (at once for a process of the same host and PID namespace: :meth:`Store.try_lease`), by the
  database's clock: hosts whose clocks disagree agree on it (:mod:`tunecache.store.dbclock`).

A waiter reads the lease at each look and stops when it is released, lapsed or taken by its own
host, and in any case after ``TUNECACHE_WAIT_SECONDS``. So a host waits at most as long as the
holder computes plus ``TUNECACHE_LEASE_SECONDS`` and a look (two lease periods for an idle holder).
Processes of one host never wait on each other: they share the host's local caches and
Inductor's own locks, and a worker's lease may be put from the main process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from tunecache import settings
from tunecache.problem.model import InductorEntry
from tunecache.process import counters, forks, processend
from tunecache.store.leases import lease_host
from tunecache.store.store import Store

log = logging.getLogger("tunecache")

#: The kinds whose entries are costly to compute (a compile, a benchmark): a miss takes a lease.
LEASED = frozenset({"fx_graph", "aot_autograd", "autotune", "bundled_autotune"})
#: The kinds put within the compile that looked them up: their leases end with the compile.
COMPILE_KINDS = frozenset({"fx_graph", "aot_autograd", "bundled_autotune"})
#: Seconds between two looks at the store while waiting (doubling up to the last; at most half
#: the lease seconds, so a lapsed lease is seen soon).
POLL = (0.2, 0.4, 0.8, 1.6, 2.0)


@dataclass
class Held:
    """A lease this process holds: its store, its entry's kind, whether a compile end releases it."""

    store: Store
    kind: str
    in_compile: bool
    ended: bool = False


_holder = f"inductor:{os.getpid()}:{uuid.uuid4().hex[:12]}"
_held: dict[str, Held] = {}  # lease digest -> the lease, for the leases this process holds
_lock = threading.Lock()
_wake = threading.Event()  # the heartbeat looks now (a compile ended, the process ends)
_beating: threading.Thread | None = None
_last_busy = time.monotonic()  # this process's last compile end or look at the store
_compiling = False  # a compile is in progress in this process (dynamo's compile callbacks)
_callbacks_on = False


def lease_seconds() -> float:
    """How long a lease lives without a heartbeat: a killed holder blocks others this long."""
    return max(float(settings.get("TUNECACHE_LEASE_SECONDS")), 0.1)


def lease_digest(kind: str, key: str, target_digest: str) -> str:
    """The lease row's digest of one entry (no tuning digest looks like it: a distinct prefix)."""
    return hashlib.sha256(f"tunecache-inductor-lease\0{kind}\0{target_digest}\0{key}".encode()).hexdigest()


def busy() -> None:
    """This process looked at the store for torch.compile: it is still computing (see the module
    docstring); called by :class:`tunecache.inductor.entries.InductorStore` at each get and put."""
    global _last_busy
    _last_busy = time.monotonic()


def on_miss(
    store: Store, kind: str, key: str, target_digest: str, slots: Collection[str] | None = None
) -> InductorEntry | None:
    """After a miss of ``key``: the entry, if another host was computing it and put it while this
    process waited (one by a signer of ``slots``, those this process trusts; None: any); else None,
    with the lease taken where it could be (this process computes)."""
    if kind not in LEASED:
        return None
    wait = settings.get("TUNECACHE_WAIT_SECONDS")
    if wait <= 0:
        return None
    ttl = lease_seconds()
    digest = lease_digest(kind, key, target_digest)
    if _take(store, digest, kind, ttl):
        log.debug("tunecache: torch.compile %s: missed, lease %s taken by %s", _named(kind, key), digest[:12], _holder)
        return None
    row = store.lease_of(digest)
    if row is None or row["host"] == lease_host():
        log.debug("tunecache: torch.compile %s: missed, lease %s", _named(kind, key), row and "of this host")
        return None  # released meanwhile (then the entry may be there: Inductor asks again next start)
    log.debug(
        "tunecache: torch.compile %s: missed, waiting on %s of %s (its lease: %.1f s left)",
        _named(kind, key),
        row["holder"],
        row["host"],
        row["expires_in"],
    )
    counters.count(None, None, inductor_lease_waits=1)
    started = time.monotonic()
    deadline, looks = started + wait, 0
    try:
        while (left := deadline - time.monotonic()) > 0:
            busy()  # waiting is part of this process's compile: the leases it holds stay
            time.sleep(min(POLL[min(looks, len(POLL) - 1)], ttl / 2, left))
            looks += 1
            entry = store.get_inductor(kind, key, target_digest, slots)
            if entry is not None:
                log.debug("tunecache: torch.compile %s: served after the wait", _named(kind, key))
                return entry
            row = store.lease_of(digest)
            # Lapsed by the database's clock (expires_in): the holder's and this host's clocks may differ.
            if row is None or row["expires_in"] < 0 or row["host"] == lease_host():
                why = "released" if row is None else "lapsed" if row["expires_in"] < 0 else "this host's"
                log.debug("tunecache: torch.compile %s: lease %s without a put: computing", _named(kind, key), why)
                break  # released without a put, lapsed (holder killed), or its host's now: compute
        else:
            log.debug("tunecache: torch.compile %s: waited TUNECACHE_WAIT_SECONDS: computing", _named(kind, key))
        counters.count(None, None, inductor_waits_in_vain=1)  # waited, and computes it all the same
        _take(store, digest, kind, ttl)
        return None
    finally:
        counters.count(None, None, inductor_wait_seconds=time.monotonic() - started)


def _named(kind: str, key: str) -> str:
    """An entry as debug lines (and bench_inductor's put list) name it: its kind and key hash."""
    return f"{kind}:{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def on_put(store: Store, kind: str, key: str, target_digest: str) -> None:
    """After ``key`` was stored: release its lease, whichever process holds it (the entry is there)."""
    if kind not in LEASED:
        return
    digest = lease_digest(kind, key, target_digest)
    with _lock:
        _held.pop(digest, None)
    store.release_lease(digest, None)
    log.debug("tunecache: torch.compile %s: put, lease %s released", _named(kind, key), digest[:12])


def held() -> int:
    """How many leases this process holds (tests, stats)."""
    with _lock:
        return len(_held)


def release_all() -> None:
    """Release every lease this process holds (its end; never raises)."""
    with _lock:
        items = list(_held.items())
        _held.clear()
    for digest, h in items:
        log.debug("tunecache: torch.compile %s lease %s released (process end)", h.kind, digest[:12])
        with contextlib.suppress(Exception):
            h.store.release_lease(digest, _holder)


def _take(store: Store, digest: str, kind: str, ttl: float) -> bool:
    if not store.try_lease(digest, _holder, ttl):
        return False
    _watch_compiles()
    with _lock:
        _held[digest] = Held(store, kind, in_compile=kind in COMPILE_KINDS and _compiling)
    _start_heartbeat()
    processend.arm()  # a multiprocessing child (a compile worker) releases its leases as it ends
    return True


def _start_heartbeat() -> None:
    global _beating
    with _lock:
        if _beating is not None and _beating.is_alive():
            return
        _beating = threading.Thread(target=_heartbeat, name="tunecache-inductor-leases", daemon=True)
        _beating.start()


def _heartbeat() -> None:
    """Every third of the lease seconds (or when woken): renew the leases the rules keep, release
    the others; ends when this process holds none."""
    global _beating
    while True:
        _wake.wait(lease_seconds() / 3.0)
        _wake.clear()
        with _lock:
            if not _held:
                _beating = None
                return
            items = list(_held.items())
        ttl = lease_seconds()
        idle = not _compiling and time.monotonic() - _last_busy > ttl
        for digest, h in items:
            try:
                if idle or h.ended:
                    with _lock:
                        _held.pop(digest, None)
                    h.store.release_lease(digest, _holder)
                    why = "idle" if idle else "compile ended"
                    log.debug("tunecache: torch.compile %s lease %s released (%s)", h.kind, digest[:12], why)
                elif not h.store.renew_lease(digest, _holder, ttl):
                    with _lock:  # put by another process (or taken over): no longer ours
                        _held.pop(digest, None)
            except Exception:  # noqa: BLE001 - a store that fails: the lease lapses or is renewed next time
                log.debug("tunecache: torch.compile lease renewal failed", exc_info=True)


def _compile_started(args: object = None) -> None:
    global _compiling
    _compiling = True


def _compile_ended(args: object = None) -> None:
    """The process's compiles ended: the leases of the entries put within a compile are released
    (by the heartbeat thread, not in the compile's thread, which holds dynamo's callback lock)."""
    global _compiling
    _compiling = False
    busy()
    with _lock:
        for h in _held.values():
            h.ended = h.ended or h.in_compile
    _wake.set()


def _watch_compiles() -> None:
    """Have dynamo call :func:`_compile_started`/:func:`_compile_ended` around its compiles (torch
    >= 2.6; again after ``torch._dynamo.reset()``, which drops callbacks). Without that hook the
    leases end by the idle rule alone. Only where torch is loaded already: never imports it."""
    global _callbacks_on, _compiling
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # torch < 2.6
        return
    if _callbacks_on and _compile_ended in callback_handler.end_callbacks:
        return
    try:
        from torch._guards import CompileContext

        _compiling = _compiling or CompileContext.try_get() is not None  # registered within a compile
    except (ImportError, AttributeError):
        pass
    if _compile_started not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_compile_started)
    if _compile_ended not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_compile_ended)
    _callbacks_on = True


def watch_compiles() -> None:
    """Follow this process's torch.compile compiles from now on (``enable()`` calls it, so that a
    compile's start is seen; a lease taken later checks again)."""
    with contextlib.suppress(Exception):
        _watch_compiles()


def _after_fork_in_child() -> None:
    """A forked child is another holder: it holds none of its parent's leases, and has no heartbeat."""
    global _holder, _lock, _wake, _beating
    _lock = threading.Lock()
    _wake = threading.Event()
    _beating = None
    _holder = f"inductor:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    _held.clear()


forks.register(__name__, _after_fork_in_child)
processend.at_end(__name__, release_all, order=-1)  # first: other hosts may be waiting on them

__all__ = [
    "COMPILE_KINDS",
    "LEASED",
    "Held",
    "busy",
    "held",
    "lease_digest",
    "lease_seconds",
    "on_miss",
    "on_put",
    "release_all",
    "watch_compiles",
]
