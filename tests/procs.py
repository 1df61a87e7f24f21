"""Child-process programs for the multi-process tests (run as ``python tests/procs.py CMD ...``).

Each prints one JSON line of results on stdout, so the parent can assert on what every process did.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))


def warm(url: str, sizes: list[int], start_at: float) -> dict:
    """Warm an add kernel over many sizes, largest first, as a server does before capture."""
    import tinykernels

    import tunecache

    kernel = tinykernels.make_add(store=url)
    while time.time() < start_at:  # start together
        time.sleep(0.005)
    winners = {}
    for n in sorted(sizes, reverse=True):
        cfg = tinykernels.launch(kernel, n)
        winners[n] = str(cfg)
    flushed = tunecache.flush()  # False: a queued write (hits, counters) failed
    return {"pid": os.getpid(), "stats": tunecache.stats(), "winners": winners, "flushed": flushed}


def put(url: str, n: int, start_at: float) -> dict:
    """Put the same n digests as every sibling, at the same moment."""
    from tunecache.problem.identity import problem_digest
    from tunecache.problem.model import ConfigResult, Problem
    from tunecache.problem.target import Target
    from tunecache.store.opening import open_store

    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    store = open_store(url)
    while time.time() < start_at:
        time.sleep(0.005)
    pid = os.getpid()
    for i in range(n):
        key = json.dumps([["B", i]])
        p = Problem(problem_digest("src", t, key), "m.k", "src", t, key, batch_bucket=i)
        store.put(p, [ConfigResult(f"c{j}", {"kwargs": {"X": j}}, median_ms=1.0 + j + pid % 7 / 10) for j in range(3)])
    store.close()
    return {"pid": pid}


def open_only(url: str, start_at: float) -> dict:
    from tunecache.store.opening import open_store

    while time.time() < start_at:
        time.sleep(0.001)
    s = open_store(url)
    rev = s.revision()
    s.close()
    return {"revision": rev}


if __name__ == "__main__":
    cmd, args = sys.argv[1], json.loads(sys.argv[2])
    out = {"warm": warm, "put": put, "open": open_only}[cmd](**args)
    print("RESULT " + json.dumps(out), flush=True)
