#!/usr/bin/env python
"""Time and peak memory of ``tunecache report`` on a large store (issue 29's acceptance).

Generates a SQLite store of N problems (default 100,000: 25 kernels on 4 GPU targets, 3 config rows
each, 10% of them out of resources), every ok config timed by 2 hosts in ``measurements`` (so the
fleet section compares 100,000 keys), 2,000 capture misses and some hits; then writes the report
once per code tree given, each in its own process (the peak RSS is that run's alone), side by side
in the same run:

    python scripts/bench_report.py                                  # this tree
    python scripts/bench_report.py --tree before=/tmp/base --tree after=$PWD --rounds 2

A tree is a directory holding a ``tunecache`` package (e.g. ``git archive <commit> | tar -x -C DIR``),
put first on the child's ``PYTHONPATH``. The generator writes straight into the tables (not measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchkit import memory, procs, timing  # noqa: E402


def generate(url: str, n: int) -> None:
    from bench_exchange import KERNELS, TARGETS

    from tunecache.problem.configidentity import config_hash_of, search_space_hash
    from tunecache.problem.identity import canonical_json, problem_digest, sha256_hex
    from tunecache.store.opening import open_store

    store = open_store(url)
    rnd = random.Random(0)
    now = dt.datetime(2026, 11, 30, 12, 0, 0)
    cfgs = [
        {"kwargs": {"BLOCK": b}, "num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None} for b in (32, 64, 128)
    ]
    cfg_ids = [(config_hash_of(c), canonical_json(c)) for c in cfgs]
    hosts = ("gpu-node-001.cluster.internal", "gpu-node-002.cluster.internal")
    per = -(-n // (len(KERNELS) * len(TARGETS)))
    p_rows, c_rows, m_rows, miss_rows = [], [], [], []

    def ts(v: dt.datetime) -> str:
        return v.isoformat(" ", "microseconds")

    def flush(conn: Any) -> None:
        for table, rows in (("problems", p_rows), ("configs", c_rows), ("measurements", m_rows), ("misses", miss_rows)):
            if rows:
                cols = list(rows[0])
                conn.exec_driver_sql(
                    f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(r[c] for c in cols) for r in rows],
                )
                rows.clear()

    count = 0
    with store.engine.begin() as conn:
        for kernel in KERNELS:
            source = sha256_hex(kernel)
            for target in TARGETS:
                for j in range(per):
                    if count >= n:
                        break
                    count += 1
                    fields = [["B", 1 << (j % 12)], ["N", 128 * (1 + j // 12)], ["q.dtype", "torch.bfloat16"]]
                    key = canonical_json(fields)
                    digest = problem_digest(source, target, key)
                    created = now - dt.timedelta(seconds=rnd.randrange(90 * 86400))
                    base = rnd.uniform(0.005, 4.0)
                    best = None
                    for i, (ch, cj) in enumerate(cfg_ids):
                        oor = i == 2 and rnd.random() < 0.1
                        ms = None if oor else base * (1 + i * 0.3) * rnd.uniform(1.0, 1.2)
                        fail = '{"limit":232448,"required":262144,"resource":"shared"}' if oor else None
                        c_rows.append(
                            {
                                "digest": digest,
                                "config_hash": ch,
                                "config_json": cj,
                                "status": "out_of_resources" if oor else "ok",
                                "median_ms": ms,
                                "p20_ms": ms,
                                "p80_ms": ms,
                                "samples": 0 if oor else 50,
                                "failure": fail,
                                "host": hosts[0],
                                "measured_at": ts(created),
                            }
                        )
                        if ms is None:
                            continue
                        if best is None or ms < best[1]:
                            best = (ch, ms)
                        for h, f in zip(hosts, (1.0, rnd.uniform(0.97, 1.06))):
                            m_rows.append(
                                {
                                    "digest": digest,
                                    "host": h,
                                    "config_hash": ch,
                                    "median_ms": ms * f,
                                    "p20_ms": None,
                                    "p80_ms": None,
                                    "samples": 50,
                                    "measured_at": ts(created),
                                }
                            )
                    hits = rnd.randrange(0, 1000) if rnd.random() < 0.7 else 0
                    p_rows.append(
                        {
                            "digest": digest,
                            "kernel": kernel,
                            "source_hash": source,
                            "target_digest": target.digest,
                            **target.as_dict(),
                            "key_json": key,
                            "batch_bucket": 1 << (j % 12),
                            "winner_config_hash": best[0] if best else None,
                            "winner_ms": best[1] if best else None,
                            "search_space_hash": search_space_hash([c[0] for c in cfg_ids]),
                            "tuning_seconds": rnd.uniform(2.0, 40.0),
                            "host": hosts[0],
                            "created_at": ts(created),
                            "updated_at": ts(created),
                            "hit_count": hits,
                            "last_hit_at": ts(now) if hits else None,
                        }
                    )
                    if j % 50 == 0:
                        mkey = canonical_json([["B", 3 << 12], ["N", 128 * (j + 1)], ["q.dtype", "torch.bfloat16"]])
                        miss_rows.append(
                            {
                                "digest": problem_digest(source, target, mkey),
                                "reason": "capture",
                                "kernel": kernel,
                                "source_hash": source,
                                "target_digest": target.digest,
                                "key_json": mkey,
                                "count": rnd.randrange(1, 500),
                                "host": hosts[1],
                                "first_seen": ts(created),
                                "last_seen": ts(now),
                            }
                        )
                    if len(c_rows) >= 30000:
                        flush(conn)
        flush(conn)
    store.close()


def child(url: str, out: str) -> None:
    """One report, in this process: its wall time and this process's own peak RSS."""
    from tunecache.report.report import write_report
    from tunecache.store.opening import open_store

    t0, cpu0 = time.perf_counter(), time.process_time()
    res = write_report(open_store(url), out)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rss = memory.peak_rss_mb()
    page_mb = round(res["bytes"] / 1e6, 2)
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "cpu_s": round(cpu, 2),
                "peak_rss_mb": round(rss, 1),
                "page_mb": page_mb,
                "plots": res["plots"],
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR: a tree with the tunecache package to time")
    ap.add_argument("--rounds", type=int, default=1, help="run the trees in turn this many times (median reported)")
    ap.add_argument("--store", type=Path, help="keep (or reuse) the generated store at this path")
    ap.add_argument("--child", nargs=2, metavar=("URL", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--schema",
        action="append",
        default=[],
        help="NAME=REVISION: that tree reads its own copy of the store, migrated down to REVISION with "
        "Alembic (an older tree refuses a store whose schema is newer than its own)",
    )
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    trees = [t.split("=", 1) for t in a.tree] or [["this", str(HERE.parent)]]
    with tempfile.TemporaryDirectory(prefix="tc-bench-report-") as tmp:
        path = a.store or Path(tmp) / "store.sqlite3"
        url = f"sqlite:///{path}"
        if not path.exists():
            t0 = time.perf_counter()
            generate(url, a.problems)
            print(f"generated {a.problems} problems in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        urls = {name: url for name, _ in trees}
        for name, revision in (x.split("=", 1) for x in a.schema):
            copy = Path(tmp) / f"store-{name}.sqlite3"
            shutil.copy(path, copy)
            urls[name] = f"sqlite:///{copy}"
            from alembic import command

            from tunecache.store.migrate import alembic_config
            from tunecache.store.opening import open_store

            store = open_store(urls[name])
            with store.engine.begin() as conn:
                command.downgrade(alembic_config(conn), revision)
            store.close()
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for turn in timing.rounds(trees, a.rounds):  # in turn: a load that changes over the run hits every tree alike
            for name, tree in turn:
                page = Path(tmp) / f"{name}.html"
                cmd = procs.python(__file__, "--child", urls[name], page)
                runs[name].append(procs.run_json(cmd, f"the report of tree {name}", env=procs.child_env(before=[tree])))
                print(f"{name}: {runs[name][-1]} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
        results = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} | {"runs": rs} for name, rs in runs.items()
        }
        print(json.dumps({"problems": a.problems, "cpus": os.cpu_count(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
