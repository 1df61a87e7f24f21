"""prometheus_client's multiprocess mode: tunecache's values in this process's files, for the
server's ``MultiProcessCollector`` to sum.

In that mode (``PROMETHEUS_MULTIPROC_DIR``, as vLLM runs it with several API servers) the process
that answers a scrape reads only the files each process's prometheus_client metrics keep (one per
process and type, mmap'ed); a collector such as :class:`tunecache.metrics.exporter.Collector` would
show only the answering process's own counts, and the kernels run in other processes. So every
metric of :mod:`tunecache.metrics.families` is mirrored into a prometheus_client ``Counter`` or
``Gauge`` of this process, which writes its file, and the server sums them.

The mirror is synced (a counter increased by what was counted since the last sync, a gauge set) off
the launch path: every :data:`SYNC_S` seconds by a thread of this process, when the process ends
(its last words, :mod:`tunecache.process.processend`: a normal exit, a multiprocessing child's end or a
pool's SIGTERM), and before a scrape that this process answers (``TUNECACHE_METRICS_PORT``). The
trade-off: a process that dies without last words (``kill -9``, a crash, a forked child ending in
``os._exit`` without multiprocessing) loses what it counted in its last interval, at most
:data:`SYNC_S` seconds; its earlier counts stay in its file and in the sum. A process ending with a
breaker open writes 0 (``ends_at_zero``): a gauge of a dead process would otherwise say so for good
(prometheus_client keeps the last value of a ``livemax`` gauge until the server calls
``mark_process_dead``, which removes it).

A forked child counts from the fork (:mod:`tunecache.metrics.families`) into files of its own pid
(prometheus_client resets its values when the pid changes), with a thread of its own started at its
first store open. A fork waits for a sync in progress (at most :data:`FORK_WAIT_S`): a child forked
while this thread held prometheus_client's lock would never write its metrics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from tunecache.metrics import families
from tunecache.process import forks, processend

log = logging.getLogger("tunecache")

#: Seconds between two syncs of a process's counts into its files.
SYNC_S = 5.0
#: The longest a fork waits for a sync in progress.
FORK_WAIT_S = 2.0

_metrics: dict[str, Any] = {}  # name -> the prometheus_client Counter or Gauge mirroring it
_pushed: dict[families.Key, float] = {}  # what this process has added to each counter so far
_sync_lock = threading.Lock()
_held_for_fork = False
_thread_pid: int | None = None  # the process whose sync thread runs


def begin() -> None:
    """Mirror the metrics in this process: created once (their files are per process), synced now,
    then by a thread of this process and at its end. Raises what prometheus_client raises (a
    missing directory): :func:`tunecache.metrics.exporter.start` warns."""
    global _thread_pid
    if not _metrics:
        _create()
    sync()
    if _thread_pid != os.getpid():
        _thread_pid = os.getpid()
        threading.Thread(target=_run, name="tunecache-metrics", daemon=True).start()
    processend.arm()  # a multiprocessing child syncs as it ends, also on a pool's SIGTERM


def _create() -> None:
    from prometheus_client import Counter, Gauge

    made: dict[str, Any] = {}  # all or none (a missing directory fails the first)
    for f in families.FAMILIES:
        if f.kind == families.COUNTER:
            made[f.name] = Counter(f.name, f.help, list(f.labels), registry=None)
        else:
            mode = f.multiprocess_mode or "livesum"
            made[f.name] = Gauge(f.name, f.help, list(f.labels), registry=None, multiprocess_mode=mode)
    _metrics.update(made)


def sync(*, final: bool = False) -> None:
    """Write this process's values into its files; ``final``: the process is ending (gauges of what
    it holds now go to 0)."""
    with _sync_lock:
        if not _metrics:
            return
        for key, v in families.now().items():
            name, labels = key
            f = families.BY_NAME[name]
            metric = _metrics[name].labels(*labels) if labels else _metrics[name]
            if f.kind == families.GAUGE:
                metric.set(0.0 if final and f.ends_at_zero else v)
                continue
            delta = v - _pushed.get(key, 0.0)
            if delta > 0:
                metric.inc(delta)
            _pushed[key] = v  # below what was pushed: the counters were reset (tests); count on from here


def _run() -> None:
    while True:
        time.sleep(SYNC_S)
        try:
            sync()
        except Exception:  # noqa: BLE001 - a full disk: the next sync tries again
            log.debug("tunecache: syncing the metrics failed", exc_info=True)


def _sync_at_end() -> None:
    sync(final=True)


class SyncFirst:
    """Collected before the ``MultiProcessCollector`` of the registry this process serves: its own
    values are in its files when the directory is read."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        sync()
        return []


def fork_locks() -> dict[str, Any]:
    """This module's lock, which a forked child gets fresh (for tests/test_fork.py); a fork waits
    for it at most :data:`FORK_WAIT_S`."""
    return {"metrics.sync_lock": _sync_lock}


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _sync_lock.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _sync_lock.release()


def _after_fork_in_child() -> None:
    """The child's values start at 0 in files of its own pid; its thread starts at its first store open."""
    global _sync_lock, _held_for_fork
    _sync_lock = threading.Lock()
    _held_for_fork = False
    _pushed.clear()


forks.register(__name__, _after_fork_in_child, before=_before_fork, after_in_parent=_after_fork_in_parent)
processend.at_end(__name__, _sync_at_end, order=0)
