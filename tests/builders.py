"""Rows and files the tests build their stores and scenarios from, shared by many test files.

Kept out of the test files so that no test file imports another (tests/test_architecture.py).
"""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path

from tunecache.problem.configidentity import config_hash_of
from tunecache.problem.identity import canonical_key, problem_digest, sha256_hex
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.store.opening import open_store

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
#: the source hash ``fill`` stores its problems under
SOURCE = "7a" * 32


def problem(i: int, target: Target = H200, source: str = "src1", kernel: str = "mod.kern") -> Problem:
    """Problem ``i``: its key is ``B=i``, so distinct ``i`` give distinct digests."""
    key = json.dumps([["B", i], ["q.dtype", "torch.bfloat16"]])
    return Problem(problem_digest(source, target, key), kernel, source, target, key, batch_bucket=i, tuning_seconds=1.5)


def results(n: int = 3, fast: int = 1) -> list[ConfigResult]:
    """``n`` measured configs (``c{fast}`` the fastest) and one that ran out of shared memory."""
    out = [
        ConfigResult(
            f"c{j}",
            {"kwargs": {"BLOCK_T": 16 << j}, "num_warps": 4},
            median_ms=1.0 + abs(j - fast),
            p20_ms=0.9 + abs(j - fast),
            p80_ms=1.1 + abs(j - fast),
            samples=100,
        )
        for j in range(n)
    ]
    out.append(
        ConfigResult(
            "oor",
            {"kwargs": {"BLOCK_T": 512}, "num_warps": 8},
            status="out_of_resources",
            failure={"resource": "shared", "required": 786432, "limit": 232448},
        )
    )
    return out


def fill(url: str, n: int) -> None:
    """n valid problems (digests and config hashes as the autotuner computes them), two configs each."""
    store = open_store(url)
    t0 = dt.datetime(2026, 11, 1, 8, 30)
    cfgs = [
        {"kwargs": {"BLOCK": b}, "num_warps": 4, "num_stages": 2, "num_ctas": 1, "maxnreg": None, "pre_hook": None}
        for b in (64, 128)
    ]
    for i in range(n):
        key = canonical_key(["N"], [1024 + i])
        p = Problem(problem_digest(SOURCE, H200, key), "tests.add", SOURCE, H200, key, 1024 + i, tuning_seconds=2.5)
        rows = [
            ConfigResult(config_hash_of(c), c, "ok", m, m * 0.9, m * 1.1, 25, None, "tuner-1", t0)
            for c, m in zip(cfgs, (0.25, 0.5))
        ]
        store.put(p, rows)
    store.close()


def write_warm_module(tmp_path: Path, keys: tuple[int, ...] = (32, 64, 128), total: bool = False) -> None:
    """``mywarm``: a warmup() over tinykernels' add, reporting each key (and the total, if asked)."""
    (tmp_path / "mywarm.py").write_text(
        textwrap.dedent(f"""
        import tinykernels

        def warmup(progress=None):
            k = tinykernels.make_add()
            for n in {keys!r}:
                tinykernels.launch(k, n)
                if progress:
                    progress(n, 0.01{", total=" + str(len(keys)) if total else ""})
        """)
    )


H100 = Target("cuda", "sm90", "NVIDIA H100 80GB HBM3", 132, 232448, 32, "12080", "570.124.06", "12.8", "3.6")
#: the report's large store: its hosts, its wide kernel's keys (B x N: numeric order is not text order)
FLEET_HOSTS = tuple(f"host-{i:02d}" for i in range(10))
WIDE_KERNEL = "big.attention.wide_kernel"
WIDE_B = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160)
WIDE_N = (128, 256, 1024, 2048, 4096, 8192, 16384)
#: two kernels with the same last name (their misses must stay apart)
SAME_NAME = ("alpha.attn.decode", "beta.attn.decode")


def _report_configs() -> list[dict]:
    """Configs that differ only in maxnreg or num_ctas (same BLOCK, warps and stages), and others."""
    base = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None}
    return [
        base,
        {**base, "maxnreg": 128},
        {**base, "num_ctas": 2},
        {**base, "kwargs": {"BLOCK": 128}},
        {**base, "kwargs": {"BLOCK": 32}, "num_warps": 8},
    ]


def report_store(url: str, small_kernels: int = 62, misses: int = 50) -> None:
    """A fleet's store for the report: ``small_kernels`` kernels of 3 keys (every fourth on a second
    GPU too), the wide kernel of 24 x 7 = 168 keys (B, N) whose largest N fails on every config, the
    two same-named kernels, each key timed by 3 of 10 hosts (the wide kernel's by all 10), tuned over
    several days, hits on most keys; and ``misses`` missed keys, each missed by two hosts in turn."""
    import os

    import sqlalchemy as sa

    from tunecache.problem.model import CONFIG_COLUMNS, PROBLEM_COLUMNS, new_config_row, new_problem_row
    from tunecache.store.schema import measurements

    store = open_store(url)
    cfgs = _report_configs()
    hashes = [config_hash_of(c) for c in cfgs]
    t0 = dt.datetime(2026, 11, 1, 8, 30)
    specs: list[tuple[str, Target, list[list]]] = []
    for i in range(small_kernels):
        name = f"team{i % 7}.mod{i}.kernel_{i}"
        for target in (H200, H100) if i % 4 == 0 else (H200,):
            specs.append((name, target, [[["N", n], ["x.dtype", "torch.float16"]] for n in (64, 512, 4096)]))
    for name in SAME_NAME:
        specs.append((name, H200, [[["N", n], ["x.dtype", "torch.float16"]] for n in (64, 512, 4096)]))
    specs.append(
        (WIDE_KERNEL, H200, [[["B", b], ["N", n], ["q.dtype", "torch.bfloat16"]] for b in WIDE_B for n in WIDE_N])
    )
    p_rows, c_rows, m_rows, idx = [], [], [], 0
    with store.bulk_load("report store") as w:
        for name, target, keys in specs:
            source = sha256_hex(name)
            for fields in keys:
                idx += 1
                key = canonical_key([f[0] for f in fields], [f[1] for f in fields])
                digest = problem_digest(source, target, key)
                wide = name == WIDE_KERNEL
                dead = wide and fields[1][1] == WIDE_N[-1]  # every config out of resources
                hosts = FLEET_HOSTS if wide else [FLEET_HOSTS[(idx + h) % 10] for h in range(3)]
                when = t0 + dt.timedelta(days=idx % 9, minutes=idx)
                best = None
                for j, (c, h) in enumerate(zip(cfgs, hashes)):
                    ms = (
                        None
                        if dead or (j == 4 and idx % 5 == 0)
                        else 0.01 * (1 + idx % 13) * (1 + 0.2 * ((j + idx) % 5))
                    )
                    status = "ok" if ms is not None else "out_of_resources"
                    failure = None if ms else {"resource": "shared", "required": 300000, "limit": 232448}
                    r = ConfigResult(h, c, status, ms, ms, ms, 20 if ms else 0, failure, hosts[0], when)
                    row = new_config_row(digest, r, hosts[0], when)
                    row["measured_at"] = w.timestamp(when.isoformat())
                    c_rows.append(tuple(row[k] for k in CONFIG_COLUMNS))
                    if ms is not None:
                        best = best if best and best[1] <= ms else (h, ms)
                        for n, host in enumerate(hosts):
                            m_rows.append((digest, host, h, ms * (1 + 0.01 * n), 20, when))
                hits = (idx * 37) % 500 if idx % 6 else 0
                p = Problem(
                    digest, name, source, target, key, fields[0][1] if wide else None, tuning_seconds=1.0 + idx % 7
                )
                prow = new_problem_row(p, hosts[0], when)
                prow.update(winner_config_hash=best[0] if best else None, winner_ms=best[1] if best else None)
                prow.update(hit_count=hits, search_space_hash="s" * 64)
                for k in ("created_at", "updated_at"):
                    prow[k] = w.timestamp(when.isoformat())
                p_rows.append(tuple(prow[k] for k in PROBLEM_COLUMNS))
        w.prepare(len(c_rows))
        w.write(p_rows, c_rows)
        w.finish()
    cols = ("digest", "host", "config_hash", "median_ms", "samples", "measured_at")
    with store.engine.begin() as conn:
        conn.execute(sa.insert(measurements), [dict(zip(cols, r)) for r in m_rows])
    old = os.environ.get("TUNECACHE_HOST_ID")
    try:
        for i in range(misses):
            name = SAME_NAME[i % 2] if i < 4 else f"team{i % 7}.mod{i}.kernel_{i}"
            key = canonical_key(["N"], [8192 + (i // 2 if i < 4 else i)])
            p = Problem(problem_digest(sha256_hex(name), H200, key), name, sha256_hex(name), H200, key)
            for host in ("miss-first", "miss-last"):
                os.environ["TUNECACHE_HOST_ID"] = host
                for _ in range(1 + i % 3):
                    store.record_miss(p, "capture" if i % 4 else "offline")
    finally:
        if old is None:
            os.environ.pop("TUNECACHE_HOST_ID", None)
        else:
            os.environ["TUNECACHE_HOST_ID"] = old
    store.close()
