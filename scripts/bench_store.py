#!/usr/bin/env python3
"""Store read latency with 100k problems stored (issue 2): ``get`` p50/p99 and the warm-start bulk
fetch of one kernel on one target (36 problems x 12 configs), on SQLite and on PostgreSQL.

    python scripts/bench_store.py [--problems 100000] [--reps 2000]

The 100k problems (1.2M config rows) come from scripts/bench_exchange.py's generator; the 36
problems of the bulk fetch are added on top with their own kernel source and target, as a real
kernel's buckets would be. Both backends are measured in the same run, side by side.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_exchange import PG_URL, fill, generate  # noqa: E402
from benchkit import records, stores, timing  # noqa: E402

from tunecache.problem.identity import problem_digest  # noqa: E402
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")


def add_kernel(store, source: str = "f" * 64) -> None:
    for b in range(36):
        key = json.dumps([["B", b], ["q.dtype", "torch.bfloat16"]])
        p = Problem(problem_digest(source, H200, key), "bench.sparse_decode", source, H200, key, batch_bucket=b)
        store.put(
            p, [ConfigResult(f"{j:032x}", {"kwargs": {"BLOCK_T": j}}, median_ms=0.1 + j / 100) for j in range(12)]
        )


def measure(url: str, n: int, reps: int) -> dict:
    t0 = time.perf_counter()
    fill(url, n)
    fill_s = time.perf_counter() - t0
    store = open_store(url)
    add_kernel(store)
    digests = [p["digest"] for p, _ in generate(n)]
    rnd = random.Random(1)
    sample = [rnd.choice(digests) for _ in range(reps)]
    for d in sample[:100]:  # warm the connection pool and the statement cache
        store.get(d)
    gets = []
    for d in sample:
        t = time.perf_counter()
        p = store.get(d)
        gets.append((time.perf_counter() - t) * 1e3)
        assert p is not None and len(p.configs) == 12
    bulk = []
    for _ in range(max(50, reps // 20)):
        t = time.perf_counter()
        many = store.get_many("f" * 64, H200.digest)
        bulk.append((time.perf_counter() - t) * 1e3)
        assert len(many) == 36 and all(len(p.configs) == 12 for p in many)
    counts = store.counts()
    store.close()
    return {
        "problems": counts["problems"],
        "configs": counts["configs"],
        "fill_s": round(fill_s, 1),
        "get_p50_ms": timing.quantile(gets, 50),
        "get_p99_ms": timing.quantile(gets, 99),
        "bulk36x12_p50_ms": timing.quantile(bulk, 50),
        "bulk36x12_p99_ms": timing.quantile(bulk, 99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=2000)
    ns = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        rows["sqlite"] = measure(f"sqlite:///{Path(d) / 'bench.sqlite3'}", ns.problems, ns.reps)
    url, drop = stores.pg_database(PG_URL)
    try:
        rows["postgresql"] = measure(url, ns.problems, ns.reps)
    finally:
        drop()
    header = ["backend", "problems", "config rows", "get p50 (ms)", "get p99 (ms)", "bulk 36x12 p50 (ms)"]
    table = [
        [name, r["problems"], r["configs"], f"{r['get_p50_ms']:.3f}", f"{r['get_p99_ms']:.3f}",
         f"{r['bulk36x12_p50_ms']:.2f}", f"{r['bulk36x12_p99_ms']:.2f}"]
        for name, r in rows.items()
    ]  # fmt: skip
    print("\n".join(records.table([*header, "bulk p99 (ms)"], table)))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
