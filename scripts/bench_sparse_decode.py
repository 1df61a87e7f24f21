#!/usr/bin/env python3
"""The bundled sparse MLA decode kernel on a GPU, in one run (issue 4's figures):

    python scripts/bench_sparse_decode.py --out DIR          # the kernel's phases below
    python scripts/bench_sparse_decode.py --out DIR --all    # plus the autotuner checks of bench_gpu.py

- per-bucket kernel time (split + merge, CUDA-graph timing) and bandwidth on gathered KV bytes for
  every batch bucket, and the torch fp32 reference at B=64;
- correctness of every bucket against the reference, and CUDA-graph capture and replay;
- restarts of 36 buckets side by side: stock ``triton.autotune`` cold and with cubins cached,
  tunecache first start and restart, one fixed config, interleaved rounds of restart vs fixed;
- a fresh host: a store imported from an export and an empty Triton cache.

The phases and their children live in scripts/bench_gpu.py; this picks the kernel's set.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_gpu  # noqa: E402

KERNEL_PHASES = (
    "stock-cold",
    "tunecache-first",
    "tunecache-restart",
    "fixed",
    "winners-direct",
    "restart-series",
    "fresh-host",
    "correctness",
    "capture",
    "bandwidth",
    "stock-restart",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--quick", action="store_true", help="a few buckets (also runs on a CPU, interpreted)")
    ap.add_argument("--all", action="store_true", help="every phase of bench_gpu.py, not only the kernel's")
    ns = ap.parse_args()
    if not ns.all:
        os.environ.setdefault("TC_BENCH_PHASES", ",".join(KERNEL_PHASES))
    bench_gpu.run_all(ns.out, ns.quick)


if __name__ == "__main__":
    main()
