"""Pool workers for tests/test_process_end.py: ``python poolprog.py START_METHOD URL``.

Two ``multiprocessing.Pool`` runs used as context managers (``__exit__`` terminates the workers with
SIGTERM; their atexit never runs): the first tunes an add kernel over ``SIZES`` in the workers, the
second (fresh workers: a restart) hits the stored winners. The flusher's delay is longer than the
runs, so only the end of each worker can write its counts. In the first run a worker may still be
reading its stop sentinel (a normal end) when SIGTERM comes; in the second each worker is asleep in
a task when the pool terminates it (SIGTERM for certain). After each, the parent reads what the
store says about the kernel; it prints one JSON line.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

import tinykernels  # noqa: E402

import tunecache  # noqa: E402
from tunecache.problem.model import utcnow  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402

SIZES = [16, 40, 72, 100]
HANG_S = 150  # the parent still running then writes its threads' stacks and exits (the test's limit is 240 s);
# not in the workers: a fork child that arms faulthandler's timer while the parent's runs deadlocks
CONFIGS = tinykernels.CONFIGS[:2]
_kernel = None
_asleep = None  # a queue the workers say "asleep" on


def init(asleep) -> None:
    global _asleep
    from tunecache.process import processend, writeback

    writeback.FLUSH_DELAY_S = 600.0  # the flusher would write nothing before the worker ends
    # What is checked is that the last words are written, not how soon: on a starved machine (CI,
    # and this suite beside itself at load 7+) a SQLite write took over the 1 s budget and a
    # worker's counts were dropped (test_process_end.py's own budget tests bound the time).
    processend.TERM_BUDGET_S = 60.0
    _asleep = asleep


def sleep_in_task(_: int) -> None:
    _asleep.put(os.getpid())
    time.sleep(600)


def work(args: tuple[str, int]) -> tuple[int, dict]:
    """One launch in a worker; returns the worker's pid and its process counters so far."""
    global _kernel
    url, n = args
    if _kernel is None:
        _kernel = tinykernels.make_add(configs=CONFIGS, store=url)
    tinykernels.launch(_kernel, n)
    return os.getpid(), tunecache.stats()


def pool_run(method: str, url: str, asleep_at_exit: bool) -> dict:
    """Run ``work`` over SIZES in a pool of 2 used as a context manager; the workers' own final
    counts; ``asleep_at_exit``: each worker is asleep in a task when the pool ends (and how they died)."""
    ctx = multiprocessing.get_context(method)
    asleep = ctx.Queue()
    with ctx.Pool(2, initializer=init, initargs=(asleep,)) as p:
        out = p.map(work, [(url, n) for n in SIZES], chunksize=1)
        if asleep_at_exit:  # a worker asleep cannot take the other task: one each
            p.map_async(sleep_in_task, range(2), chunksize=1)
            for _ in range(2):
                asleep.get(timeout=120)
        workers = list(p._pool)
    exitcodes = sorted({w.exitcode for w in workers})
    last: dict[int, dict] = {}
    for pid, st in out:  # each worker's tasks run in order: keep its largest counts
        if pid not in last or st["hits"] + st["misses"] >= last[pid]["hits"] + last[pid]["misses"]:
            last[pid] = st
    counts = {k: sum(s[k] for s in last.values()) for k in ("hits", "misses", "benchmarks")}
    return {**counts, "pids": sorted(last)}, exitcodes


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
    faulthandler.dump_traceback_later(HANG_S, exit=True)  # a hang fails with the stacks, not a bare timeout
    t0 = time.monotonic()
    tuned, _ = pool_run(method, url, False)
    after_tune = store_view(url)
    time.sleep(0.05)
    cutoff = utcnow()
    time.sleep(0.05)
    restarted, exitcodes = pool_run(method, url, True)
    after_restart = store_view(url, cutoff)
    print(
        json.dumps(
            {
                "tuned": tuned,
                "after_tune": after_tune,
                "restarted": restarted,
                "after_restart": after_restart,
                "restart_exitcodes": exitcodes,
                "seconds": round(time.monotonic() - t0, 1),
            }
        ),
        flush=True,
    )
