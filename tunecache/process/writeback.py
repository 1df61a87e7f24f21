"""Deferred writes: what need not be written before a kernel launches.

Hit counts (of stored problems and of torch.compile's entries), per-kernel counters and results
measured while the store was down are queued here and flushed by a background thread and at exit, so
they never sit on the launch path (nor a compile's cache hit: a write waits for the store's write
lock, which a fleet's puts hold) and are not lost when the database blinks. The thread is started by
the background prefetch (:func:`start`), before the first launch: starting a thread costs a first
hit some 0.4 ms, in the middle of a restart's first pass. What is still queued when the process ends
is written by its last words (:mod:`tunecache.process.processend`), which also cover a multiprocessing
child's ends that skip atexit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from tunecache.process import counters, forks, processend

log = logging.getLogger("tunecache")

_lock = threading.Lock()
_flush_lock = threading.Lock()  # one flush at a time: a flush that returns found no write still running
_pending_hits: dict[Any, Counter[str]] = defaultdict(Counter)  # store -> digest -> n
_pending_stats: dict[Any, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
_pending_puts: dict[Any, list[tuple[Any, list[Any], bool]]] = defaultdict(list)
_pending_entry_hits: dict[Any, Counter[tuple[str, str, str]]] = defaultdict(Counter)  # store -> entry -> n
_wake = threading.Event()  # set: something is queued (or a flush failed and is retried)
_flusher: threading.Thread | None = None
FLUSH_DELAY_S = 2.0


def hit(store: Any, digest: str) -> None:
    """Count a launch served by ``digest``'s stored winner (``hit_count``)."""
    if store is None or store.readonly:
        return
    with _lock:
        _pending_hits[store][digest] += 1
        _schedule()
    processend.arm()  # outside the lock: it may import and set a signal handler


def inductor_hit(store: Any, entry: Any) -> None:
    """Count a torch.compile cache hit served by ``entry`` (its ``used_at`` and ``hit_count``)."""
    if store is None or store.readonly:
        return
    with _lock:
        _pending_entry_hits[store][(entry.kind, entry.key_hash, entry.target_digest)] += 1
        _schedule()
    processend.arm()  # outside the lock: it may import and set a signal handler


def add_stats(store: Any, kernel: str, deltas: Mapping[str, float]) -> None:
    """Add to ``kernel``'s counters in ``store`` (table ``kernel_stats``)."""
    with _lock:
        _pending_stats[store][kernel].update(deltas)
        _schedule()
    processend.arm()  # outside the lock: it may import and set a signal handler


def defer_put(store: Any, problem: Any, results: list[Any], replace: bool) -> None:
    """Keep a result the store could not take; the flusher retries it."""
    with _lock:
        _pending_puts[store].append((problem, results, replace))
        _schedule()
    processend.arm()  # outside the lock: it may import and set a signal handler


def start() -> None:
    """Start the flusher thread now, off the launch path (idempotent; also started by the first
    queued item where nothing called this)."""
    with _lock:
        _ensure_flusher()


def _ensure_flusher() -> None:
    """Called with ``_lock`` held."""
    global _flusher
    if _flusher is None:
        _flusher = threading.Thread(target=_flush_loop, args=(_wake,), name="tunecache-writeback", daemon=True)
        _flusher.start()


def _schedule() -> None:
    """Called with ``_lock`` held: wake the flusher (setting a flag, once it runs). Its callers then
    see that the process's end writes what is queued (:func:`tunecache.process.processend.arm`: a flag
    once armed)."""
    _ensure_flusher()
    _wake.set()


def _flush_loop(wake: threading.Event) -> None:
    """The flusher: ``FLUSH_DELAY_S`` after something is queued, write it all; a failed write is
    retried after the same delay. ``wake`` is this process's event (a forked child gets its own)."""
    while True:
        wake.wait()
        time.sleep(FLUSH_DELAY_S)  # gather what the same first pass queues next
        wake.clear()  # before the flush: an item queued during it wakes the next round
        try:
            done = flush()
        except Exception:  # noqa: BLE001 - a flusher that dies would queue forever
            log.debug("tunecache: deferred flush failed", exc_info=True)
            done = False
        if not done:
            wake.set()


def flush() -> bool:
    """Write queued counters and results; True when nothing is left queued. Waits for a flush that
    another thread is running: a process about to end must not cut its writes short."""
    with _flush_lock:
        return _flush()


def _flush() -> bool:
    from tunecache.errors import StoreError

    with _lock:
        hits = {s: dict(c) for s, c in _pending_hits.items()}
        sts = {s: {k: dict(c) for k, c in d.items()} for s, d in _pending_stats.items()}
        puts = {s: list(v) for s, v in _pending_puts.items()}
        entry_hits = {s: dict(c) for s, c in _pending_entry_hits.items()}
        _pending_entry_hits.clear()
        _pending_hits.clear()
        _pending_stats.clear()
        _pending_puts.clear()
    done = True
    for store, items in puts.items():
        for i, (problem, results, replace) in enumerate(items):
            try:
                store.put(problem, results, replace=replace)
                log.info("tunecache: wrote deferred result for %s (%s)", problem.kernel, problem.digest[:12])
            except StoreError:
                with _lock:
                    _pending_puts[store].extend(items[i:])
                done = False
                break
    counted = ((hits, "record_hits", _pending_hits), (entry_hits, "touch_inductor", _pending_entry_hits))
    for counts, write, pending in counted:
        for store, d in counts.items():
            try:
                getattr(store, write)(d)
            except StoreError:  # kept for the next flush
                done = False
                with _lock:
                    pending[store].update(d)
    for store, d in sts.items():
        try:
            store.bump_stats(d)
        except StoreError:
            done = False
            with _lock:
                for k, c in d.items():
                    _pending_stats[store][k].update(c)
    return done


def pending_puts() -> int:
    """Results queued for a store that could not take them yet."""
    with _lock:
        return sum(len(v) for v in _pending_puts.values())


def pending_hits() -> int:
    """Hits queued, not yet written (one per stored problem or torch.compile entry, and store)."""
    with _lock:
        return sum(len(v) for v in _pending_hits.values()) + sum(len(v) for v in _pending_entry_hits.values())


def fork_locks() -> dict[str, Any]:
    """This module's locks, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"writeback.lock": _lock, "writeback.flush_lock": _flush_lock}


def _after_fork_in_child() -> None:
    """A forked child writes its own deferred items, exactly once, with a flusher of its own.

    The parent's flusher thread does not exist in the child (so nothing would be written), and the
    inherited queue is the parent's to write: flushed by the child too, it is counted twice. A lock
    or event a parent's thread held at the fork would stay taken.
    """
    global _lock, _flush_lock, _wake, _flusher
    _lock = threading.Lock()
    _flush_lock = threading.Lock()
    _wake = threading.Event()
    _flusher = None
    _pending_hits.clear()
    _pending_entry_hits.clear()
    _pending_stats.clear()
    _pending_puts.clear()


forks.register(__name__, _after_fork_in_child)
counters.persist_with(add_stats)


def _flush_at_end() -> None:
    try:
        flush()
    except Exception:  # noqa: BLE001 - never fail interpreter shutdown
        log.debug("tunecache: final flush failed", exc_info=True)


processend.at_end(__name__, _flush_at_end, order=1)
