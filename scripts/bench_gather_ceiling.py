#!/usr/bin/env python3
"""The memory ceiling for the bundled sparse decode kernel's gather, on a GPU:

    python scripts/bench_gather_ceiling.py [--out DIR]

The same rows (576 bytes of an fp8 cache per index, SGLang-style distinct random slots per query),
the same grid (query x split) and the same masked loads as the split stage, but no math: each
program only sums its bytes. The fastest (split count, BLOCK_T, warps, stages) per batch size is
what the kernel could reach if nothing but the gather cost time (docs/benchmarks/sparse-kernel.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import records  # noqa: E402
from gpu_children import inputs  # noqa: E402

# (BLOCK_T, warps, stages) tried for each split count.
CONFIGS = ((16, 4, 4), (32, 4, 1), (32, 4, 3), (64, 4, 1), (64, 4, 3), (64, 8, 2), (128, 8, 2))


@triton.jit
def _gather(KV, IDX, OUT, stride_kv, stride_ib, TOPK, CHUNK, BLOCK_T: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_d = tl.arange(0, 512)
    offs_r = 512 + tl.arange(0, 64)
    acc = tl.zeros([BLOCK_T, 512], dtype=tl.int32)
    acc_r = tl.zeros([BLOCK_T, 64], dtype=tl.int32)
    start = pid_s * CHUNK
    end = tl.minimum(start + CHUNK, TOPK)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        idx = tl.load(IDX + pid_b * stride_ib + offs_t, mask=offs_t < end, other=-1)
        valid = idx >= 0
        row = KV + tl.where(valid, idx, 0).to(tl.int64)[:, None] * stride_kv
        acc += tl.load(row + offs_d[None, :], mask=valid[:, None], other=0).to(tl.int32)
        acc_r += tl.load(row + offs_r[None, :], mask=valid[:, None], other=0).to(tl.int32)
    tl.store(OUT + pid_b * tl.num_programs(1) + pid_s, tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.sum(acc_r, 1), 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--batches", default="64,256")
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gather_ceiling.py needs a CUDA GPU")
    batches = [int(b) for b in ns.batches.split(",")]
    topk = 2048
    kv, data, _, _ = inputs(batches, 16, topk, "fp8", "cuda")
    kv_bytes = kv.view(torch.uint8)  # the bytes themselves: no fp8 arithmetic in the loop
    rows = []
    for b in batches:
        _, idx = data[b]
        for splits in (1, 2, 4, 8, 16):
            out = torch.empty(b * splits, dtype=torch.int32, device="cuda")
            for bt, warps, stages in CONFIGS:
                grid = (b, splits)

                def fn(idx=idx, out=out, splits=splits, bt=bt, warps=warps, stages=stages, grid=grid):
                    _gather[grid](
                        kv_bytes, idx, out, kv_bytes.stride(0), idx.stride(0), topk, triton.cdiv(topk, splits),
                        BLOCK_T=bt, num_warps=warps, num_stages=stages,
                    )  # fmt: skip

                fn()
                ms = triton.testing.do_bench_cudagraph(fn, rep=30)
                tbps = b * topk * kv.shape[1] / (ms * 1e-3) / 1e12
                rows.append({"B": b, "splits": splits, "config": [bt, warps, stages], "us": ms * 1e3, "TBps": tbps})
    records.write(ns.out / "gather_ceiling.json", rows, indent=1)
    for b in batches:
        best = min((r for r in rows if r["B"] == b), key=lambda r: r["us"])
        print(f"B={b}: {best['us']:.1f} us, {best['TBps']:.2f} TB/s (splits {best['splits']}, {best['config']})")


if __name__ == "__main__":
    main()
