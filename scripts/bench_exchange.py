#!/usr/bin/env python
"""Time ``tunecache export`` and ``import`` on a large store (issue 5's acceptance).

Generates N problems x 12 config rows (default 100,000 x 12 = 1.2M rows) with realistic values:
25 kernels on 4 GPU targets, about 10% failed configs with their failure details. Then, per
backend (SQLite in a temporary file, PostgreSQL in a fresh database that is dropped at the end):
export the store to a JSON Lines file, import that file into a fresh empty store. Each timed
step runs in its own process, so the peak RSS is that step's alone.

    python scripts/bench_exchange.py                 # full size, markdown table on stdout
    python scripts/bench_exchange.py --problems 5000 # quick run
    TUNECACHE_TEST_PG_URL=postgresql+psycopg://u@host/db python scripts/bench_exchange.py

The generator writes straight into the tables (it is not what is measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from benchkit import memory, procs, records, stores

from tunecache.problem.configidentity import config_hash_of, search_space_hash
from tunecache.problem.identity import canonical_json, problem_digest, sha256_hex
from tunecache.problem.target import Target
from tunecache.store.opening import open_store
from tunecache.store.schema import configs, problems

PG_URL = os.environ.get("TUNECACHE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CONFIGS_PER_PROBLEM = 12

TARGETS = [
    Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.5"),
    Target("cuda", "sm90", "NVIDIA H100 80GB HBM3", 132, 232448, 32, "12080", "570.124.06", "12.8", "3.5"),
    Target("cuda", "sm80", "NVIDIA A100-SXM4-80GB", 108, 166912, 32, "12040", "550.54.15", "12.4", "3.4"),
    Target("hip", "gfx942", "AMD Instinct MI300X", 304, 65536, 64, "6.3.42131", "", "6.3.42131", "3.5"),
]
KERNELS = [
    f"{mod}.{fn}"
    for mod in (
        "sglang.srt.layers.attention.triton_ops.decode_attention",
        "sglang.srt.layers.moe.fused_moe_triton.fused_moe",
        "vllm.attention.ops.prefix_prefill",
        "flash_mla.sparse_decode",
        "myteam.kernels.rmsnorm",
    )
    for fn in ("_fwd_kernel", "_fwd_kernel_stage1", "_fwd_kernel_stage2", "_bwd_kernel", "_reduce_kernel")
]
HOSTS = [f"gpu-node-{i:03d}.cluster.internal" for i in range(64)]


def _configs_for(kernel_index: int) -> list[dict[str, Any]]:
    rnd = random.Random(kernel_index)
    out = []
    for bm in (32, 64, 128):
        for bn in (32, 64, 128, 256):
            out.append(
                {
                    "kwargs": {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8},
                    "num_warps": rnd.choice((4, 8)),
                    "num_stages": rnd.choice((2, 3, 4)),
                    "num_ctas": 1,
                    "maxnreg": None,
                    "pre_hook": None,
                }
            )
    return out


def generate(n: int, seed: int = 0) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(problem row, config rows) for n distinct problems, as they would come out of tuning."""
    rnd = random.Random(seed)
    now = dt.datetime(2026, 11, 30, 12, 0, 0)
    cfg_sets = []
    for k in range(len(KERNELS)):
        cfgs = _configs_for(k)
        cfg_sets.append([(config_hash_of(c), canonical_json(c)) for c in cfgs])
    t_digests = [t.digest for t in TARGETS]
    per_combo = -(-n // (len(KERNELS) * len(TARGETS)))
    specs = []
    for k, kernel in enumerate(KERNELS):
        source = sha256_hex(kernel)
        for ti, target in enumerate(TARGETS):
            for j in range(per_combo):
                key = canonical_json([["B", 1 << (j % 12)], ["N", 128 * (1 + j // 12)], ["q.dtype", "torch.bfloat16"]])
                specs.append((problem_digest(source, target, key), k, ti, j, key))
    # In random digest order, as a store grows: export then reads tables laid out like a real
    # store's (filled in digest order, SQLite's export is 20% faster than this).
    specs = specs[:n]
    rnd.shuffle(specs)
    for digest, k, ti, j, key in specs:
        kernel, target, source = KERNELS[k], TARGETS[ti], sha256_hex(KERNELS[k])
        created = now - dt.timedelta(seconds=rnd.randrange(90 * 86400), microseconds=rnd.randrange(10**6))
        host = rnd.choice(HOSTS)
        rows = []
        base = rnd.uniform(0.005, 4.0)
        for ch, cj in cfg_sets[k]:
            r = rnd.random()
            measured = created + dt.timedelta(milliseconds=rnd.randrange(60000))
            row = {
                "digest": digest,
                "config_hash": ch,
                "config_json": cj,
                "status": "ok",
                "median_ms": None,
                "p20_ms": None,
                "p80_ms": None,
                "samples": 0,
                "failure": None,
                "host": host,
                "measured_at": measured,
            }
            if r < 0.10:
                row["status"] = "out_of_resources"
                row["failure"] = json.dumps(
                    {"resource": "shared", "required": rnd.randrange(232449, 400000), "limit": 232448},
                    sort_keys=True,
                    separators=(",", ":"),
                )
            elif r < 0.13:
                row["status"] = "compile_error"
                row["failure"] = json.dumps(
                    {"error": "CompilationError", "message": "at 42:8: unsupported layout conversion"},
                    sort_keys=True,
                    separators=(",", ":"),
                )
            else:
                m = base * rnd.uniform(1.0, 3.0)
                row.update(median_ms=m, p20_ms=m * 0.98, p80_ms=m * 1.03, samples=rnd.randrange(20, 200))
            rows.append(row)
        ok = [r for r in rows if r["status"] == "ok"]
        win = min(ok, key=lambda r: (r["median_ms"], r["config_hash"])) if ok else None
        hit = rnd.random() < 0.7
        problem = {
            "digest": digest,
            "kernel": kernel,
            "source_hash": source,
            "target_digest": t_digests[ti],
            **target.as_dict(),
            "key_json": key,
            "batch_bucket": 1 << (j % 12),
            "winner_config_hash": win["config_hash"] if win else None,
            "winner_ms": win["median_ms"] if win else None,
            "search_space_hash": search_space_hash([r["config_hash"] for r in rows]),
            "tuning_seconds": rnd.uniform(2.0, 40.0),
            "host": host,
            "created_at": created,
            "updated_at": created + dt.timedelta(minutes=1),
            "hit_count": rnd.randrange(0, 100000) if hit else 0,
            "last_hit_at": now - dt.timedelta(seconds=rnd.randrange(86400)) if hit else None,
        }
        yield problem, rows


def fill(url: str, n: int) -> None:
    """Create the schema at ``url`` and bulk-insert n generated problems.

    Through the driver (executemany on SQLite, COPY on PostgreSQL): SQLAlchemy's per-row parameter
    processing would make the setup take minutes.
    """
    store = open_store(url)
    sqlite = store.dialect == "sqlite"
    p_cols = [c.name for c in problems.c]
    c_cols = [c.name for c in configs.c]

    def ts(v: Any) -> Any:
        return v.isoformat(" ", "microseconds") if sqlite and isinstance(v, dt.datetime) else v

    def flush(conn: sa.Connection, table: str, cols: list[str], rows: list[dict[str, Any]]) -> None:
        tuples = [tuple(ts(r[c]) for c in cols) for r in rows]
        if sqlite:
            conn.exec_driver_sql(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", tuples
            )
            return
        with (
            conn.connection.driver_connection.cursor() as cur,
            cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy,
        ):
            for t in tuples:
                copy.write_row(t)

    try:
        with store.engine.begin() as conn:
            p_batch: list[dict[str, Any]] = []
            c_batch: list[dict[str, Any]] = []
            for p, rows in generate(n):
                p_batch.append(p)
                c_batch.extend(rows)
                if len(c_batch) >= 24000:
                    flush(conn, "problems", p_cols, p_batch)
                    flush(conn, "configs", c_cols, c_batch)
                    p_batch, c_batch = [], []
            if p_batch:
                flush(conn, "problems", p_cols, p_batch)
                flush(conn, "configs", c_cols, c_batch)
    finally:
        store.close()


# ---- one timed step per process -----------------------------------------------------------


def step(op: str, url: str, path: str) -> dict[str, Any]:
    from tunecache.exchange import export, import_

    store = open_store(url)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    try:
        res = export(store, path) if op == "export" else import_(store, path).as_dict()
    finally:
        store.close()  # on SQLite this checkpoints the WAL: part of the cost
    seconds = time.perf_counter() - t0
    rss_mb = memory.peak_rss_mb()
    return {"op": op, "seconds": seconds, "cpu": time.process_time() - cpu0, "peak_rss_mb": rss_mb, "result": res}


def run_step(op: str, url: str, path: Path) -> dict[str, Any]:
    return procs.run_json(procs.python(__file__, "--step", op, "--url", url, "--file", path), f"the {op} step")


def bench(backend: str, n: int, workdir: Path, gz: bool) -> dict[str, Any]:
    drops: list[Callable[[], None]] = []
    try:
        if backend == "sqlite":
            src_url = f"sqlite:///{workdir / 'src.sqlite3'}"
            dst_url = f"sqlite:///{workdir / f'dst-{uuid.uuid4().hex[:6]}.sqlite3'}"
        else:
            src_url, d1 = stores.pg_database(PG_URL)
            drops.append(d1)
            dst_url, d2 = stores.pg_database(PG_URL)
            drops.append(d2)
        if backend != "sqlite" or not (workdir / "src.sqlite3").exists():
            t0 = time.perf_counter()
            fill(src_url, n)
            print(f"[{backend}] generated {n} problems in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        path = workdir / f"export-{backend}.jsonl{'.gz' if gz else ''}"
        load = os.getloadavg()[0]
        exp = run_step("export", src_url, path)
        imp = run_step("import", dst_url, path)
        load = max(load, os.getloadavg()[0])
        print(
            f"[{backend}{' gz' if gz else ''}] export {exp['seconds']:.1f}s (cpu {exp['cpu']:.1f}s) "
            f"import {imp['seconds']:.1f}s (cpu {imp['cpu']:.1f}s), load average up to {load:.1f}",
            file=sys.stderr,
        )
        assert imp["result"]["new"] == n, imp
        return {
            "backend": backend + (" (.gz)" if gz else ""),
            "problems": exp["result"]["problems"],
            "configs": exp["result"]["configs"],
            "export_s": exp["seconds"],
            "import_s": imp["seconds"],
            "export_cpu": exp["cpu"],
            "import_cpu": imp["cpu"],
            "file_mb": path.stat().st_size / 1e6,
            "peak_rss_mb": max(exp["peak_rss_mb"], imp["peak_rss_mb"]),
        }
    finally:
        for d in drops:
            d()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--gzip", action="store_true", help="Also time a .gz export/import on SQLite.")
    ap.add_argument("--step", choices=["export", "import"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        print(json.dumps(step(args.step, args.url, args.file)))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="tunecache-bench-") as tmp:
        for backend in args.backends.split(","):
            results.append(bench(backend, args.problems, Path(tmp), gz=False))
            if args.gzip and backend == "sqlite":
                results.append(bench(backend, args.problems, Path(tmp), gz=True))
    header = ["backend", "problems", "configs", "export s", "import s", "file MB", "peak RSS MB"]
    rows = [
        [r["backend"], f"{r['problems']:,}", f"{r['configs']:,}", f"{r['export_s']:.1f}", f"{r['import_s']:.1f}",
         f"{r['file_mb']:.0f}", f"{r['peak_rss_mb']:.0f}", f"{r['export_cpu']:.1f} / {r['import_cpu']:.1f}"]
        for r in results
    ]  # fmt: skip
    print("\n".join(records.table([*header, "client CPU s (exp / imp)"], rows, align="lrrrrrrr")))


if __name__ == "__main__":
    main()
