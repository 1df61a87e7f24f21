"""Rows and files the tests build their stores and scenarios from, shared by many test files.

Kept out of the test files so that no test file imports another (tests/test_architecture.py).
"""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path

from tunecache.identity import canonical_key, config_hash_of, problem_digest
from tunecache.model import ConfigResult, Problem
from tunecache.store.opening import open_store
from tunecache.target import Target

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
