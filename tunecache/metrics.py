"""Process counters and deferred writes.

Counters answer "did this restart benchmark anything?" (``tunecache.stats()``). Writes that are
not needed to launch a kernel (hit counts, per-kernel counters, results measured while the store
was down) are queued here and flushed by a background timer and at exit, so they never sit on the
launch path and are not lost when the database blinks.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import Counter, defaultdict
from typing import Any

log = logging.getLogger("tunecache")

COUNTERS = (
    "hits",
    "misses",
    "benchmarks",
    "store_errors",
    "capture_fallbacks",
    "offline_fallbacks",
    "waits",
    "bench_seconds",
    "saved_seconds",
    "lease_takeovers",
    "leases_lost",
    "poisoned",
    "preloaded",
    "preload_skipped",
)

_lock = threading.Lock()
_counters: Counter[str] = Counter()
_pending_hits: dict[Any, Counter[str]] = defaultdict(Counter)  # store -> digest -> n
_pending_stats: dict[Any, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
_pending_puts: dict[Any, list[tuple[Any, list[Any], bool]]] = defaultdict(list)
_timer: threading.Timer | None = None
FLUSH_DELAY_S = 2.0


def stats() -> dict[str, float]:
    """This process's counters: hits, misses, benchmarks (configs benchmarked), store_errors,
    capture_fallbacks, offline_fallbacks, bench_seconds, saved_seconds, ..."""
    with _lock:
        return {k: _counters.get(k, 0) for k in COUNTERS}


def reset_stats() -> None:
    with _lock:
        _counters.clear()


def count(kernel: str | None, store: Any, **deltas: float) -> None:
    with _lock:
        for k, v in deltas.items():
            _counters[k] += v
        if store is not None and kernel and not store.readonly:
            persisted = {
                k: v
                for k, v in deltas.items()
                if k in ("hits", "misses", "benchmarks", "bench_seconds", "saved_seconds")
            }
            if persisted:
                _pending_stats[store][kernel].update(persisted)
                _schedule()


def hit(store: Any, digest: str) -> None:
    if store is None or store.readonly:
        return
    with _lock:
        _pending_hits[store][digest] += 1
        _schedule()


def defer_put(store: Any, problem: Any, results: list[Any], replace: bool) -> None:
    """Keep a result the store could not take; the flusher retries it."""
    with _lock:
        _pending_puts[store].append((problem, results, replace))
        _schedule()


def _schedule() -> None:
    global _timer
    if _timer is None:
        _timer = threading.Timer(FLUSH_DELAY_S, _timer_flush)
        _timer.daemon = True
        _timer.start()


def _timer_flush() -> None:
    global _timer
    with _lock:
        _timer = None
    if not flush():
        with _lock:
            _schedule()


def flush() -> bool:
    """Write queued counters and results; True when nothing is left queued."""
    from tunecache.errors import StoreError

    with _lock:
        hits = {s: dict(c) for s, c in _pending_hits.items()}
        sts = {s: {k: dict(c) for k, c in d.items()} for s, d in _pending_stats.items()}
        puts = {s: list(v) for s, v in _pending_puts.items()}
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
    for store, d in hits.items():
        try:
            store.record_hits(d)
        except StoreError:
            done = False
            with _lock:
                _pending_hits[store].update(d)
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
    with _lock:
        return sum(len(v) for v in _pending_puts.values())


def _after_fork_in_child() -> None:
    """A forked child writes its own deferred items, exactly once, with a timer of its own.

    The inherited timer object has no thread in the child (so nothing would be scheduled again),
    and the inherited queue is the parent's to write: flushed by the child too, it is counted twice.
    A lock a parent's thread held at the fork would stay taken.
    """
    global _lock, _timer
    _lock = threading.Lock()
    _timer = None
    _pending_hits.clear()
    _pending_stats.clear()
    _pending_puts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _flush_at_exit() -> None:
    try:
        flush()
    except Exception:  # noqa: BLE001 - never fail interpreter shutdown
        log.debug("tunecache: final flush failed", exc_info=True)
