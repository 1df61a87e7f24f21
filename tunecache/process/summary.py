"""One line per process as it ends, with ``TUNECACHE_SUMMARY``: what tunecache did in it.

    tunecache: 36 kernels covered, 1,296 hits, 0 benchmarks, 48 preloaded (0 skipped), saved 52.1 s,
    spent 0.0 s benchmarking

(one line): what a user looks at to know a restart did what it should (no benchmark, every kernel covered and
preloaded) without diffing the cumulative ``tunecache stats``. A process whose torch.compile used the
store (``TUNECACHE_INDUCTOR``) says so in a line of its own, the tuner's line unchanged:

    tunecache: torch.compile: 41 served, 0 computed, 0 put, 1 lease wait (3.2 s), 0 untrusted


It is written straight to stderr, not logged: a process started with only ``TUNECACHE_INSTALL=1``
has no handler on the "tunecache" logger, and Python's last-resort handler shows only warnings
(the summary is none; as a warning it would also read as trouble); a program that configures
logging may drop or reroute the logger. The user asked for the line by setting the variable, so
it goes where they look.

A process that did nothing with tunecache (no kernel seen, nothing counted) prints nothing: with
``TUNECACHE_INSTALL`` every Python process that imports Triton runs tunecache, compile workers and
tools included. A forked child says what it did since the fork, not its parent's counts again
(:data:`COUNTED` are taken relative to the fork), and names its pid, as does a multiprocessing
child; the line is said once per process, by its last words (:mod:`tunecache.process.processend`), so a
pool worker ended by SIGTERM says it too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from tunecache import settings
from tunecache.errors import ConfigurationError
from tunecache.process import counters, forks, processend

#: The counters the line adds up since this process started (or forked).
COUNTED = ("hits", "benchmarks", "preloaded", "preload_skipped", "saved_seconds", "bench_seconds")
#: The counters of the torch.compile line (:func:`inductor_line`).
INDUCTOR_COUNTED = (
    "inductor_hits",
    "inductor_misses",
    "inductor_puts",
    "inductor_lease_waits",
    "inductor_wait_seconds",
    "inductor_untrusted",
)

_since: dict[str, float] = {}  # the counters at the fork (a forked child's line is its own)
_since_skips: dict[str, int] = {}  # the preload skips by reason at the fork
_child = False  # a forked child, or the process a multiprocessing start made (names its pid)
_said = False


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def line(
    stats: Mapping[str, float],
    since: Mapping[str, float] | None = None,
    *,
    pid: int | None = None,
    skip_reasons: Mapping[str, int] | None = None,
) -> str | None:
    """The summary of ``stats`` (``tunecache.stats()``) less ``since``; None when nothing was done.

    >>> line({"kernels_seen": 2, "kernels_covered": 2, "hits": 1296, "benchmarks": 0, "preloaded": 48,
    ...       "preload_skipped": 0, "saved_seconds": 52.08, "bench_seconds": 0.0})
    ... # doctest: +NORMALIZE_WHITESPACE
    'tunecache: 2 kernels covered, 1,296 hits, 0 benchmarks, 48 preloaded (0 skipped), saved 52.1 s,
    spent 0.0 s benchmarking'
    >>> print(*line({"kernels_seen": 3, "kernels_covered": 2, "hits": 1, "preload_skipped": 5}, pid=7,
    ...             skip_reasons={"key cannot be parsed": 4, "not signed": 1}).split(", "), sep="\\n")
    tunecache (pid 7): 2 of 3 kernels covered
    1 hit
    0 benchmarks
    0 preloaded (5 skipped: 4 key cannot be parsed
    1 not signed)
    saved 0.0 s
    spent 0.0 s benchmarking
    >>> line({"kernels_seen": 1, "kernels_covered": 1, "hits": 4}, {"kernels_seen": 1, "hits": 4}) is None  # a fork
    True
    """
    since = since or {}
    d = {k: stats.get(k, 0) - since.get(k, 0) for k in COUNTED}
    seen, covered = int(stats.get("kernels_seen", 0)), int(stats.get("kernels_covered", 0))
    if not any(d.values()) and seen == int(since.get("kernels_seen", 0)):
        return None
    kernels = f"{covered:,} of {_plural(seen, 'kernel')}" if covered != seen else _plural(covered, "kernel")
    skipped = f"{int(d['preload_skipped']):,} skipped"
    if d["preload_skipped"] and skip_reasons:
        skipped += ": " + ", ".join(f"{n:,} {why}" for why, n in sorted(skip_reasons.items(), key=lambda r: -r[1]))
    who = "tunecache" if pid is None else f"tunecache (pid {pid})"
    return (
        f"{who}: {kernels} covered, {_plural(int(d['hits']), 'hit')}, {_plural(int(d['benchmarks']), 'benchmark')}, "
        f"{int(d['preloaded']):,} preloaded ({skipped}), saved {d['saved_seconds']:.1f} s, "
        f"spent {d['bench_seconds']:.1f} s benchmarking"
    )


def inductor_line(
    stats: Mapping[str, float], since: Mapping[str, float] | None = None, *, pid: int | None = None
) -> str | None:
    """What torch.compile's remote caches did with the store (``TUNECACHE_INDUCTOR``), as a second
    line; None when they did nothing. "computed" are the misses (refusals included): Inductor
    compiled or autotuned those itself.

    >>> inductor_line({"inductor_hits": 3, "inductor_misses": 2, "inductor_puts": 2, "inductor_lease_waits": 1,
    ...                "inductor_wait_seconds": 4.21, "inductor_untrusted": 1})
    'tunecache: torch.compile: 3 served, 2 computed, 2 put, 1 lease wait (4.2 s), 1 untrusted'
    >>> inductor_line({"hits": 4}) is None
    True
    """
    since = since or {}
    d = {k: stats.get(k, 0) - since.get(k, 0) for k in INDUCTOR_COUNTED}
    if not any(d.values()):
        return None
    who = "tunecache" if pid is None else f"tunecache (pid {pid})"
    return (
        f"{who}: torch.compile: {int(d['inductor_hits']):,} served, {int(d['inductor_misses']):,} computed, "
        f"{int(d['inductor_puts']):,} put, {_plural(int(d['inductor_lease_waits']), 'lease wait')} "
        f"({d['inductor_wait_seconds']:.1f} s), {int(d['inductor_untrusted']):,} untrusted"
    )


def _skip_reasons() -> Mapping[str, int]:
    """Why this process's preloads skipped specs, by reason (``tunecache.preload_skips()``), counted
    from the fork in a forked child as the rest of its line."""
    now = counters.preload_skips()
    return {r: n - _since_skips.get(r, 0) for r, n in now.items() if n > _since_skips.get(r, 0)}


def say() -> None:
    """Write this process's line on stderr, once, if ``TUNECACHE_SUMMARY`` is on (read now, at the
    end: the program may have set it after importing tunecache)."""
    global _said
    if _said:
        return
    _said = True
    try:
        if not settings.get("TUNECACHE_SUMMARY"):
            return
    except ConfigurationError:  # not settings.usable(): its one warning, or the CLI's error, says why
        return
    mp = sys.modules.get("multiprocessing")
    child = _child or (mp is not None and mp.parent_process() is not None)
    stats, pid = counters.stats(), os.getpid() if child else None
    lines = [line(stats, _since, pid=pid, skip_reasons=_skip_reasons()), inductor_line(stats, _since, pid=pid)]
    text = "".join(f"{t}\n" for t in lines if t)
    if text and sys.stderr is not None:
        sys.stderr.write(text)
        sys.stderr.flush()


def _after_fork_in_child() -> None:
    """A forked child's line starts from what its parent had counted (``counters`` resets its locks
    first: it registered first, being imported by this module)."""
    global _since, _since_skips, _child, _said
    _since = counters.stats()
    _since_skips = counters.preload_skips()
    _child = True
    _said = False


forks.register(__name__, _after_fork_in_child)
processend.at_end(__name__, say, order=0)  # before the final flush, which may wait for a slow store
