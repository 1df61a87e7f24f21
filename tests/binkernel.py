"""The kernel of tests/binaries_roundtrip.py: a module of its own, so that both of its processes
define the same tunecache kernel (same source hash) by importing it."""

from __future__ import annotations

import triton
import triton.language as tl

import tunecache

CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK": 128}, num_warps=2, num_stages=1),
]


@triton.jit
def add_one(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    tl.store(Y + i, tl.load(X + i, mask=m) + 1, mask=m)


@triton.jit
def merge(X, N, BLOCK: tl.constexpr):  # a plain kernel launched after the tuned one: a companion
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(X + i, tl.load(X + i, mask=i < N) * 2, mask=i < N)


tuned = tunecache.autotune(configs=CONFIGS, key=["N"])(add_one)
