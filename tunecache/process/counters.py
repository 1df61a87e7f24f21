"""Process counters and one-time warnings: what this process reports about itself.

Counters answer "did this restart benchmark anything?" (``tunecache.stats()``). The per-kernel
counters a store keeps (``tunecache stats``) are queued for it by :mod:`tunecache.process.writeback`, off
the launch path: writeback registers itself here (:func:`persist_with`) at import, so that this core
module imports nothing of the layers above it. Warnings that every later miss would repeat are
logged once per kernel and kind.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from tunecache.process import forks

log = logging.getLogger("tunecache")

COUNTERS = (
    "hits",
    "misses",
    "benchmarks",
    "store_errors",
    "capture_fallbacks",
    "offline_fallbacks",
    "waits",
    "wait_seconds",
    "waits_in_vain",
    "bench_seconds",
    "saved_seconds",
    "lease_takeovers",
    "leases_lost",
    "poisoned",
    "preloaded",
    "preload_skipped",
    "untrusted",
    "kernels_seen",
    "kernels_covered",
    "inductor_hits",
    "inductor_misses",
    "inductor_puts",
    "inductor_lease_waits",
    "inductor_wait_seconds",
    "inductor_waits_in_vain",
    "inductor_untrusted",
    "breaker_opened",
    "spooled_misses",
)

#: The counters a store keeps per kernel (table ``kernel_stats``).
PERSISTED = ("hits", "misses", "benchmarks", "bench_seconds", "saved_seconds")

_lock = threading.Lock()
_counters: Counter[str] = Counter()
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()
_coverage: dict[str, dict[str, Any]] = {}  # kernel -> its class, covered, why not (see coverage())
_skips: Counter[str] = Counter()  # why launch specs were not preloaded (see preload_skips())
_refusals: Counter[tuple[str, str]] = Counter()  # (what, why) of the rows not used as untrusted (see refusals())
#: Where the persisted counters go: (store, kernel, deltas); set by tunecache.process.writeback at import.
_persist: Callable[[Any, str, Mapping[str, float]], None] | None = None


def persist_with(sink: Callable[[Any, str, Mapping[str, float]], None]) -> None:
    """Queue the persisted counters (:data:`PERSISTED`) of every later :func:`count` with ``sink``."""
    global _persist
    _persist = sink


def stats() -> dict[str, float]:
    """This process's counters: hits, misses, benchmarks (configs benchmarked), store_errors,
    capture_fallbacks, offline_fallbacks, bench_seconds, saved_seconds, ..."""
    with _lock:
        return {k: _counters.get(k, 0) for k in COUNTERS}


def reset_stats() -> None:
    with _lock:
        _counters.clear()
        _coverage.clear()
        _skips.clear()
        _refusals.clear()


def count(kernel: str | None, store: Any, **deltas: float) -> None:
    """Add ``deltas`` to this process's counters; with a kernel and a writable store, also queue the
    persisted ones for that store's per-kernel counters."""
    with _lock:
        for k, v in deltas.items():
            _counters[k] += v
    if store is not None and kernel and not store.readonly:
        persisted = {k: v for k, v in deltas.items() if k in PERSISTED}
        if persisted and _persist is not None:
            _persist(store, kernel, persisted)


def kernel_seen(kernel: str, cls: type, covered: bool, why: str | None = None) -> None:
    """A kernel's first call in this process, and whether it reached tunecache's hooks (counted once
    per kernel: ``kernels_seen``, ``kernels_covered``; see :func:`coverage`)."""
    with _lock:
        if kernel in _coverage:
            return
        _coverage[kernel] = {"class": f"{cls.__module__}.{cls.__qualname__}", "covered": covered, "why": why}
        _counters["kernels_seen"] += 1
        _counters["kernels_covered"] += int(covered)


def coverage() -> dict[str, dict[str, Any]]:
    """Every kernel this process launched through an Autotuner tunecache saw: ``{name: {"class",
    "covered", "why"}}``; ``why`` says what kept an uncovered one from tunecache."""
    with _lock:
        return {k: dict(v) for k, v in _coverage.items()}


def preload_skipped(reason: str, n: int = 1) -> None:
    """``n`` launch specs not preloaded for ``reason`` (a short stable name, see
    :data:`tunecache.binaries.preload.SKIP_REASONS`): counted in ``preload_skipped`` and by reason."""
    with _lock:
        _counters["preload_skipped"] += n
        _skips[reason] += n


def preload_skips() -> dict[str, int]:
    """Why this process's launch specs were not preloaded: ``{reason: count}`` (reasons counted at
    least once; the counts sum to ``stats()["preload_skipped"]``)."""
    with _lock:
        return dict(_skips)


def refused(what: str, why: str, n: int = 1) -> None:
    """``n`` stored rows of code not used because nothing this process trusts vouches for them (see
    :func:`tunecache.trust.trust.refused`): counted in ``untrusted`` and by (``what``, ``why``)."""
    with _lock:
        _counters["untrusted"] += n
        _refusals[(what, why)] += n


def refusals() -> dict[tuple[str, str], int]:
    """The rows this process refused as untrusted: ``{(what, why): count}``, in :func:`tunecache.trust.trust.refused`'s
    words (a few kinds of row and reasons, and the key ids that signed them; the counts sum to
    ``stats()["untrusted"]``)."""
    with _lock:
        return dict(_refusals)


def warn_once(kernel: str, what: str, msg: str, *args: Any) -> None:
    """Log a warning once per process for each (kernel, kind): an outage or a capture miss would
    otherwise repeat it at every launch."""
    with _warned_lock:
        if (kernel, what) in _warned:
            return
        _warned.add((kernel, what))
    log.warning(msg, *args)


def first_time(what: str, key: str) -> bool:
    """True the first time this process asks for (``what``, ``key``): for what is said once per
    process, such as a spec named in the log or a summary line (cleared by :func:`reset_warnings`)."""
    with _warned_lock:
        if (key, what) in _warned:
            return False
        _warned.add((key, what))
    return True


def reset_warnings() -> None:
    """Warn again about what was warned about already (for tests)."""
    with _warned_lock:
        _warned.clear()


def fork_locks() -> dict[str, Any]:
    """This module's locks, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"counters.lock": _lock, "counters.warned_lock": _warned_lock}


def _after_fork_in_child() -> None:
    # A lock a parent's thread held at the fork would stay taken in the child.
    global _lock, _warned_lock
    _lock = threading.Lock()
    _warned_lock = threading.Lock()


forks.register(__name__, _after_fork_in_child)
