"""The simulated workers of scripts/bench_fleet.py, run in its load-generator processes
(``bench_fleet.py --child ARGS_JSON``): a worker start replaying a real start's store calls
(:func:`simulated_start`), or a worker in the rolling-restart storm (:func:`storm_worker`, the
autotuner's single flight, call for call); :func:`child` runs many of them in threads.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

# The autotuner's waiting loop (tunecache/tuner/autotuner.py, _single_flight): first poll, growth, cap.
POLL_FIRST_S, POLL_GROWTH, POLL_CAP_S = 0.05, 1.5, 0.5


def simulated_start(url: str, plan: list[list[Any]], keep: list[Any] | None = None) -> float:
    """One worker start's store traffic, replaying ``plan`` (the calls a real start made, in order,
    with their arguments); returns its wall time. ``keep``: leave the store open (a live process
    keeps its pool: TUNECACHE_POOL_SIZE > 0)."""
    from tunecache.store.opening import open_store

    t0 = time.perf_counter()
    store = open_store(url)  # shared_store: connect and check the schema
    for method, args in plan:
        getattr(store, method)(*args)
    elapsed = time.perf_counter() - t0
    if keep is None:
        store.engine.dispose()  # a process exits (no SQL)
    else:
        keep.append(store)
    return elapsed


def storm_worker(url: str, digest: str, host_lock: threading.Lock, bench_s: float, deadline: float) -> dict:
    """One worker missing ``digest``: the autotuner's single flight, call for call (host file lock,
    lease, re-check, benchmark, put, release; or poll with back-off until the result is stored)."""
    from tunecache.problem.model import ConfigResult
    from tunecache.problem.target import hostname
    from tunecache.store.opening import open_store

    store = open_store(url)
    t0 = time.perf_counter()
    holder = f"{hostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    benched = 0
    poll = POLL_FIRST_S
    p = store.get(digest)  # the lookup after the prefetch: tuned by another process since?
    while p is None or p.winner_config_hash is None:
        if host_lock.acquire(blocking=False):
            try:
                if store.try_lease(digest, holder, 30.0):
                    try:
                        p = store.get(digest)  # someone may have finished while we took the lease
                        if p is None or p.winner_config_hash is None:
                            time.sleep(bench_s)  # the benchmark: no connection held
                            benched = 1
                            problem = _storm_problem(digest)
                            p = store.put(problem, [ConfigResult("c0", {"kwargs": {"B": 1}}, median_ms=1.0)])
                    finally:
                        store.release_lease(digest, holder)
                    break
            finally:
                host_lock.release()
        if time.time() > deadline:
            raise TimeoutError("storm: the result did not arrive before the deadline")
        time.sleep(poll)
        poll = min(poll * POLL_GROWTH, POLL_CAP_S)
        p = store.get(digest)
    store.engine.dispose()
    return {"seconds": time.perf_counter() - t0, "benchmarks": benched}


def _storm_problem(digest: str) -> Any:
    from tunecache.problem.model import Problem
    from tunecache.problem.target import Target

    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13100", "590.1", "13.1", "3.6")
    return Problem(digest, "bench.storm", "f" * 64, t, '[["B", 1]]', batch_bucket=1)


def child(args: dict) -> dict:
    """Run ``args['threads']`` simulated workers in this process; one JSON result."""
    os.environ["TUNECACHE_POOL_SIZE"] = str(args.get("pool_size", 0))
    import tunecache.store.store  # noqa: F401 - imported before the start signal, as a worker has it loaded

    times: list[float] = []
    errors: list[str] = []
    results: list[dict] = []
    lock = threading.Lock()
    keep: list[Any] | None = [] if args.get("pool_size", 0) else None
    counter = iter(range(args["starts"]))
    host_locks = [threading.Lock() for _ in range(max(1, args["threads"] // args.get("gpus_per_host", 8)))]
    stop_at = args["start_at"] + args["max_seconds"]

    def run(i: int) -> None:
        while time.time() < args["start_at"]:
            time.sleep(0.002)
        if args["mode"] == "storm":
            try:
                r = storm_worker(args["url"], args["digest"], host_locks[i % len(host_locks)], args["bench_s"], stop_at)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:300])
            return
        while time.time() < stop_at:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            try:
                t = simulated_start(args["url"], args["plan"], keep)
                with lock:
                    times.append(t)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:300])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_end = time.time()
    for s in keep or []:
        s.engine.dispose()
    return {"times": times, "errors": errors, "results": results, "end": t_end}
