"""A library that builds its own Triton autotuners, as fla does, and knows nothing of tunecache:
its own Autotuner subclass (its own ``run`` with a JSON lookup first, None-safe hooks, and a
``self.kernel_name`` of its own), an Autotuner constructed directly, and ``autotune`` bound by
``from triton import autotune`` at import. For tests/test_coverage.py (imported by child processes)."""

from __future__ import annotations

import json
import os
import time

import triton
import triton.language as tl
from triton import autotune
from triton.runtime.autotuner import Autotuner

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32) for w in (1, 2)]
LOOKUPS: list[str] = []


def cpu_bench(call, quantiles):  # stock Triton's default benchmarker needs a GPU
    call()
    t0 = time.perf_counter()
    call()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms, ms, ms]


class LibAutotuner(Autotuner):
    """fla's CachedAutotuner, reduced."""

    def __init__(self, fn, arg_names, configs, key, reset_to_zero, restore_value, **kwargs):
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **kwargs)
        self.kernel_name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__
        if not self.user_defined_pre_hook and (self.reset_to_zero or self.restore_value):

            def _pre_hook(kw, reset_only=False):
                for n in self.reset_to_zero:
                    if kw[n] is not None:
                        kw[n].zero_()
                if not reset_only:
                    self.restore_copies = {n: kw[n].clone() for n in self.restore_value if kw[n] is not None}

            self.pre_hook = _pre_hook
        if not self.user_defined_post_hook and self.restore_value:

            def _post_hook(kw, exception):
                for n, copy in self.restore_copies.items():
                    kw[n].copy_(copy)
                self.restore_copies = {}

            self.post_hook = _post_hook

    def run(self, *args, **kwargs):
        nargs = {**dict(zip(self.arg_names, args)), **kwargs}
        path = os.environ.get("LIB_CONFIGS")
        if path and os.path.exists(path):  # its own per-kernel JSON, as fla's FLA_CACHE_MODE
            with open(path) as f:
                cfg = json.load(f).get(self.kernel_name)
            if cfg is not None:
                key = tuple(
                    [nargs[k] for k in self.keys] + [str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")]
                )
                self.cache[key] = triton.Config(cfg["kwargs"], num_warps=cfg["num_warps"])
        LOOKUPS.append(self.kernel_name)
        return super().run(*args, **kwargs)


def lib_autotune(configs, key, reset_to_zero=None, restore_value=None, **kw):
    def decorator(fn):
        return LibAutotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value, do_bench=cpu_bench, **kw)

    return decorator


@lib_autotune(CONFIGS, key=["N"], reset_to_zero=["cnt"], restore_value=["acc"])
@triton.jit
def lib_kernel(x, acc, cnt, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(acc + offs, tl.load(acc + offs, mask=m) + tl.load(x + offs, mask=m), mask=m)
    tl.store(cnt + offs, tl.load(cnt + offs, mask=m) + 1.0, mask=m)


@triton.jit
def _twice(x, out, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < N) * 2.0, mask=offs < N)


direct = Autotuner(_twice, _twice.arg_names, CONFIGS, ["N"], None, None, do_bench=cpu_bench)


@autotune(configs=CONFIGS, key=["N"], do_bench=cpu_bench)
@triton.jit
def plain(x, out, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < N) + 3.0, mask=offs < N)


KERNELS = {"lib_kernel": lib_kernel, "direct": direct, "plain": plain}


def run_all(n: int) -> bool:
    """Launch every kernel once at size ``n``; True when every output is right."""
    import torch

    x = torch.arange(n, dtype=torch.float32)
    acc0 = torch.full((n,), 10.0)
    acc, cnt, out1, out2 = acc0.clone(), torch.zeros(n), torch.empty(n), torch.empty(n)
    grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    lib_kernel[grid](x, acc, cnt, n)
    direct[grid](x, out1, n)
    plain[grid](x, out2, n)
    return bool(
        torch.equal(acc, acc0 + x)
        and torch.equal(cnt, torch.ones(n))
        and torch.equal(out1, x * 2)
        and torch.equal(out2, x + 3)
    )


def count_benchmarks() -> dict[str, int]:
    """Count every configuration benchmarked from now on, by autotuner class (``+tunecache`` where
    tunecache serves it), by wrapping Triton's own ``Autotuner._bench`` at the class level."""
    counts: dict[str, int] = {}
    base = Autotuner._bench

    def counting(self, *args, **kwargs):
        cls = type(self)
        tc = any(c.__name__ == "TunecacheAutotuner" for c in cls.__mro__)
        name = cls.__name__ + ("+tunecache" if tc else "")
        counts[name] = counts.get(name, 0) + 1
        return base(self, *args, **kwargs)

    Autotuner._bench = counting
    return counts


def spawned(q, n: int) -> None:
    """A spawned worker's body (a fresh interpreter: only the environment tells it about tunecache)."""
    import sys

    counts = count_benchmarks()
    ok = run_all(n)
    q.put({"benched": counts, "ok": ok, "imports_tunecache_itself": False, "tunecache": "tunecache" in sys.modules})
