"""A library of many autotuned kernels behind one store, as fla defines ~200 (for tests/test_breaker.py).

Run as ``python tests/manykernels.py N M``: writes a module of N ``@tunecache.autotune`` kernels,
imports it (every kernel queues its store prefetch in the background), launches the first M and
checks their output, then prints one JSON line: how long the definitions and the launches took and
when the script ended (``done_at``, wall clock), so that the parent times the exit on its own. At the
very end of the exit's own work (the joins of threads and every ``atexit`` handler, tunecache's
included; what remains is the interpreter's teardown, which load stretches and tunecache does not
own) it writes ``handlers_done_at=<wall clock>`` on stderr.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

KERNEL = """
@tunecache.autotune(configs=CONFIGS, key=["N"])
@triton.jit
def k{i}(x, out, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < N) + {i}, mask=offs < N)
"""


def _handlers_done() -> None:
    # Registered before tunecache is imported: atexit runs its handlers last in, first out, and
    # Python joins the process's threads before any of them.
    print(f"handlers_done_at={time.time()}", file=sys.stderr, flush=True)


def main(n: int, m: int) -> dict:
    d = tempfile.mkdtemp(prefix="tc-many-")
    head = "import triton\nimport triton.language as tl\nimport tunecache\n"
    head += 'CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32)]\n'
    with open(os.path.join(d, "library_of_kernels.py"), "w") as f:
        f.write(head + "".join(KERNEL.format(i=i) for i in range(n)))
    sys.path.insert(0, d)
    import torch
    import triton

    t0 = time.monotonic()
    import library_of_kernels as lib

    t1 = time.monotonic()
    for i in range(m):
        x = torch.arange(100, dtype=torch.float32)
        out = torch.empty(100)
        getattr(lib, f"k{i}")[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
        assert torch.equal(out, x + i), f"k{i} produced a wrong result"
    t2 = time.monotonic()
    import tunecache

    return {"define_s": t1 - t0, "launch_s": t2 - t1, "stats": tunecache.stats(), "done_at": time.time()}


if __name__ == "__main__":
    atexit.register(_handlers_done)
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))), flush=True)
