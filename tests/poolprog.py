"""Pool workers for tests/test_process_end.py: ``python poolprog.py START_METHOD URL``.

Two ``multiprocessing.Pool`` runs used as context managers (``__exit__`` terminates the workers with
SIGTERM; their atexit never runs): the first tunes an add kernel over ``SIZES`` in the workers, the
second (fresh workers: a restart) hits the stored winners. After each, the parent reads what the
store says about the kernel; it prints one JSON line.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

import tinykernels  # noqa: E402

import tunecache  # noqa: E402
from tunecache.model import utcnow  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402

SIZES = [16, 40, 72, 100]
_kernel = None


def work(args: tuple[str, int]) -> tuple[int, dict]:
    """One launch in a worker; returns the worker's pid and its process counters so far."""
    global _kernel
    url, n = args
    if _kernel is None:
        _kernel = tinykernels.make_add(store=url)
    tinykernels.launch(_kernel, n)
    return os.getpid(), tunecache.stats()


def pool_run(method: str, url: str) -> dict:
    """Run ``work`` over SIZES in a pool of 2 used as a context manager; the workers' own final counts."""
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as p:
        out = p.map(work, [(url, n) for n in SIZES], chunksize=1)
    last: dict[int, dict] = {}
    for pid, st in out:  # each worker's tasks run in order: keep its largest counts
        if pid not in last or st["hits"] + st["misses"] >= last[pid]["hits"] + last[pid]["misses"]:
            last[pid] = st
    return {k: sum(s[k] for s in last.values()) for k in ("hits", "misses", "benchmarks")}


def store_view(url: str, cutoff=None) -> dict:
    s = open_store(url)
    rows = s.kernel_counters()
    view = {
        "kernels_seen": len(rows),
        "stats": {k: sum(int(r[k]) for r in rows) for k in ("hits", "misses", "benchmarks")},
        "problems": len(s.find_problems()),
        "hit_counts": sorted(p.hit_count for p in s.find_problems()),
    }
    if cutoff is not None:  # what gc would delete as unused since the cutoff
        view["gc_would_delete"] = len(s.delete(dry_run=True, no_hit_since=cutoff))
    s.close()
    return view


if __name__ == "__main__":
    method, url = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()
    tuned = pool_run(method, url)
    after_tune = store_view(url)
    time.sleep(0.05)
    cutoff = utcnow()
    time.sleep(0.05)
    restarted = pool_run(method, url)
    after_restart = store_view(url, cutoff)
    print(
        json.dumps(
            {
                "tuned": tuned,
                "after_tune": after_tune,
                "restarted": restarted,
                "after_restart": after_restart,
                "seconds": round(time.monotonic() - t0, 1),
            }
        ),
        flush=True,
    )
