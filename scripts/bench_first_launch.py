"""What a process's first Triton launch imports, and what it costs (issue 14's floor).

    python scripts/bench_first_launch.py [--preimport]

Fresh process: CUDA up, one kernel's binary loaded (Triton's cache, warm from an earlier run),
then the first launch timed, with the modules it imported; a second kernel's first launch after it.
``--preimport``: tunecache's ``preload.import_launch_modules()`` first (run AG imported the same
two modules by name).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import triton
import triton.language as tl

from tunecache.binaries.preload import import_launch_modules  # in both modes: the processes differ only in the call


@triton.jit
def _a(x, n, B: tl.constexpr):
    o = tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)


@triton.jit
def _b(x, n, B: tl.constexpr):
    o = tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


def main() -> None:
    torch.cuda.init()
    x = torch.zeros(64, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    if "--preimport" in sys.argv:
        import_launch_modules()  # what tunecache's preload does once it loaded a binary
    pre = time.perf_counter() - t
    before = set(sys.modules)
    t = time.perf_counter()
    _a[(1,)](x, 64, B=64)
    first = time.perf_counter() - t
    new = sorted(set(sys.modules) - before)
    t = time.perf_counter()
    _a[(1,)](x, 64, B=64)
    again = time.perf_counter() - t
    t = time.perf_counter()
    _b[(1,)](x, 64, B=64)
    other = time.perf_counter() - t
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "preimport_s": pre,
                "first_s": first,
                "again_s": again,
                "other_first_s": other,
                "imported": [m for m in new if m.startswith("triton")],
                "n_imported": len(new),
            }
        )
    )


if __name__ == "__main__":
    main()
