"""Small kernels for the autotuner tests: a module of its own so child processes import the same code."""

from __future__ import annotations

import triton
import triton.language as tl

import tunecache

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


@triton.jit
def _combine(a, b):
    return a + b


def make_add(configs=None, store=None, bucket=None, key=("N",), name=None, **autotune_kw):
    """A fresh autotuned add kernel (a new Autotuner each call, like a fresh process would have);
    ``name``: another kernel name (``__qualname__``), as another kernel of a library would have;
    ``autotune_kw``: more arguments of ``tunecache.autotune`` (``do_bench``)."""

    @triton.jit
    def add_kernel(x, y, out, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        tl.store(out + offs, _combine(tl.load(x + offs, mask=m), tl.load(y + offs, mask=m)), mask=m)

    if name is not None:
        add_kernel.fn.__qualname__ = add_kernel.fn.__name__ = name
    return tunecache.autotune(
        configs=list(configs or CONFIGS), key=list(key), store=store, bucket=bucket, **autotune_kw
    )(add_kernel)


def make_guarded(configs=None, store=None):
    """An add kernel with a non-key constexpr ``BAD``: a call with ``BAD`` equal to a config's BLOCK
    fails to compile that config (``tl.static_assert``), as a caller's argument can break one config."""

    @triton.jit
    def guarded_add(x, y, out, N, BAD: tl.constexpr, BLOCK: tl.constexpr):
        tl.static_assert(BLOCK != BAD, "BLOCK must not be BAD")
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    return tunecache.autotune(configs=list(configs or CONFIGS), key=["N"], store=store)(guarded_add)


def launch(kernel, n: int, **kw):
    import torch

    x = torch.arange(n, dtype=torch.float32)
    y = torch.full((n,), 2.0)
    out = torch.empty(n)
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, **kw)
    assert torch.equal(out, x + y), "kernel produced a wrong result"
    return kernel.best_config
