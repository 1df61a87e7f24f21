"""A kernel whose constexpr arguments are not Python literals (a Triton dtype, an IntEnum, None, a
string, as a quantized-matmul library passes them), launched, recorded and preloaded offline for
sm90 as in tests/preload_roundtrip.py (whose driver stand-in it uses). Prints one JSON line for
tests/test_preload.py.

``python preload_constexprs.py roundtrip``: each variant is compiled through Triton's own launch path
(a warm-up) and recorded; preloaded into an empty cache, a second launch with the same arguments
must find the preloaded binary under the key Triton computes. Specs whose key names other constexprs
than their binary was built with (honest hashes) must not be loaded.

``python preload_constexprs.py tuples``: the same for a nested tuple constexpr and a tuple argument.

``python preload_constexprs.py functions``: the same for a @triton.jit function passed as a constexpr.

``python preload_constexprs.py all``: the three above in one process, by name.

``python preload_constexprs.py quiet N``: a restart meets N specs whose launch keys cannot be parsed,
on two devices; stderr is what a user sees with logging as the library leaves it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import sys

import preload_roundtrip as rt  # first: unsets TRITON_INTERPRET before triton is imported
import torch
import triton
import triton.compiler.compiler as compiler_module
import triton.language as tl
import triton.runtime.jit as jit_module
from triton.compiler import CompiledKernel

import tunecache
from tunecache.binaries import preload
from tunecache.problem.model import LaunchSpec


class Mode(enum.IntEnum):
    PLAIN = 1
    DOUBLE = 2


@triton.jit
def scale(X, Y, N, DT: tl.constexpr, MODE: tl.constexpr, BIAS: tl.constexpr, EVICT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(X + i, mask=m, eviction_policy=EVICT).to(DT)
    if MODE == 2:
        x = x * 2
    if BIAS is not None:
        x = x + BIAS
    tl.store(Y + i, x.to(tl.float32), mask=m)


@triton.jit
def shift(X, N, SHAPE: tl.constexpr, OUT, BLOCK: tl.constexpr):  # OUT: a tuple argument, (pointer, None)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    tl.store(OUT[0] + i, tl.load(X + i, mask=m) + SHAPE[0] + SHAPE[1][1], mask=m)


@triton.jit
def plus_one(x):
    return x + 1


@triton.jit
def plus_two(x):
    return x + 2


@triton.jit
def apply(X, Y, N, FN: tl.constexpr, BLOCK: tl.constexpr):  # FN: a @triton.jit function
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    tl.store(Y + i, FN(tl.load(X + i, mask=m)), mask=m)


WIN = triton.Config({"BLOCK": 128}, num_warps=2, num_stages=1)
#: The launches: the first is the one the mismatching specs claim the key of.
VARIANTS = {
    "fp16": {"DT": tl.float16, "MODE": Mode.PLAIN, "BIAS": None, "EVICT": "evict_last"},
    "bf16": {"DT": tl.bfloat16, "MODE": Mode.PLAIN, "BIAS": None, "EVICT": "evict_last"},
    "double": {"DT": tl.float16, "MODE": Mode.DOUBLE, "BIAS": None, "EVICT": "evict_last"},
    "bias": {"DT": tl.float16, "MODE": Mode.PLAIN, "BIAS": 0.5, "EVICT": "evict_last"},
    "first": {"DT": tl.float16, "MODE": Mode.PLAIN, "BIAS": None, "EVICT": "evict_first"},
}

jit_module.driver = rt._Driver()
compiler_module.driver = rt._Driver()
CompiledKernel._init_handles = lambda self: None  # no CUDA context here
preload.import_launch_modules = lambda: None


class _Launching(rt._Device):  # what Triton's run() asks the driver besides
    def get_current_stream(self, device: int | None = None) -> int:
        return 0


jit_module.driver.active = _Launching()
X, Y = torch.zeros(256), torch.zeros(256)


def launch(name: str):
    """Triton's own launch path (a warm-up: compiled if not cached, not run); the kernel it used."""
    return scale.warmup(X, Y, 100, **VARIANTS[name], BLOCK=128, num_warps=2, num_stages=1, grid=(1,))


def cache() -> dict:
    return scale.device_caches[0][0]


def with_key(s: LaunchSpec, key: str) -> LaunchSpec:
    """``s``'s binary (its honest hash) filed under ``key``."""
    data = json.loads(s.spec_json)
    data["key"] = key
    text = json.dumps(data)
    return dataclasses.replace(s, spec_hash=hashlib.sha256(text.encode()).hexdigest(), spec_json=text)


def roundtrip() -> dict:
    specs, keys, hashes = {}, {}, {}
    for name in VARIANTS:
        kernel = launch(name)
        (key,) = [k for k, v in cache().items() if v is kernel]
        keys[name], hashes[name] = key, str(kernel.hash)
        (specs[name],) = preload.capture(scale, WIN, "h128")
        cache().clear()
    tunecache.reset_stats()
    # Each spec filed under the first variant's key: built for other constexprs, never loaded.
    forged = {n: with_key(s, keys["fp16"]) for n, s in specs.items() if n != "fp16"}
    forged_counts = {n: list(preload.load(scale, [s], 0)) for n, s in forged.items()}
    after_forged = len(cache())
    loaded = list(preload.load(scale, list(specs.values()), 0))
    preloaded = {k: v for k, v in cache().items()}
    found = {}
    for name in VARIANTS:  # the launch computes its key and finds the preloaded binary there
        kernel = launch(name)
        found[name] = kernel is preloaded.get(keys[name]) and str(kernel.hash) == hashes[name]
    return {
        "keys": keys,
        "forged": forged_counts,
        "cache_after_forged": after_forged,
        "loaded": loaded,
        "found": found,
        "cache_after_launches": len(cache()),
        "skips": tunecache.preload_skips(),
    }


def tuples() -> dict:
    """A nested tuple constexpr and a tuple argument holding a None: loaded where this Triton's preload
    rebuilds the launch's binary (its hash says so), else skipped; a spec for other tuple values never."""
    out = {}
    caches = shift.device_caches[0][0]
    for name, shape in {"shape": (1, (2, 3)), "other": (1, (2, 4))}.items():
        kernel = shift.warmup(X, 100, shape, (Y, None), BLOCK=128, num_warps=2, num_stages=1, grid=(1,))
        (key,) = [k for k, v in caches.items() if v is kernel]
        (spec,) = preload.capture(shift, WIN, "h128")
        out[name] = {"key": key, "spec": spec, "hash": str(kernel.hash)}
        caches.clear()
    tunecache.reset_stats()
    forged = list(preload.load(shift, [with_key(out["other"]["spec"], out["shape"]["key"])], 0))
    loaded = list(preload.load(shift, [out["shape"]["spec"]], 0))
    preloaded = caches.get(out["shape"]["key"])
    kernel = shift.warmup(X, 100, (1, (2, 3)), (Y, None), BLOCK=128, num_warps=2, num_stages=1, grid=(1,))
    return {
        "key": out["shape"]["key"],
        "forged": forged,
        "loaded": loaded,
        "found": preloaded is not None and kernel is preloaded,
        "same_hash": str(kernel.hash) == out["shape"]["hash"],
        "skips": tunecache.preload_skips(),
    }


def functions() -> dict:
    """A @triton.jit function as a constexpr: Triton 3.9 records it by name and keys the launch by
    its ``cache_key``; earlier Tritons record no spec of it."""
    caches = apply.device_caches[0][0]
    keys, specs = {}, {}
    for name, fn in {"one": plus_one, "two": plus_two}.items():
        kernel = apply.warmup(X, Y, 100, fn, BLOCK=128, num_warps=2, num_stages=1, grid=(1,))
        (keys[name],) = [k for k, v in caches.items() if v is kernel]
        specs[name] = preload.capture(apply, WIN, "h128")
        caches.clear()
    if not specs["one"]:
        return {"recorded": False}
    tunecache.reset_stats()
    forged = list(preload.load(apply, [with_key(specs["two"][0], keys["one"])], 0))
    loaded = list(preload.load(apply, specs["one"], 0))
    preloaded = caches.get(keys["one"])
    kernel = apply.warmup(X, Y, 100, plus_one, BLOCK=128, num_warps=2, num_stages=1, grid=(1,))
    return {
        "recorded": True,
        "forged": forged,
        "loaded": loaded,
        "found": preloaded is not None and kernel is preloaded,
        "skips": tunecache.preload_skips(),
    }


def quiet(n: int) -> dict:
    launch("fp16")
    (good,) = preload.capture(scale, WIN, "h128")
    cache().clear()
    bad = [with_key(good, f"[('*fp32', 'D'), <unparseable {i}]{{}}") for i in range(n)]
    counts = [list(preload.load(scale, bad, 0)), list(preload.load(scale, bad, 0))]  # two devices
    tunecache.load_winners()  # the end of a restart's preload pass
    return {"counts": counts, "skips": tunecache.preload_skips(), "stats": tunecache.stats()}


if __name__ == "__main__":
    modes = {"roundtrip": roundtrip, "tuples": tuples, "functions": functions}
    if sys.argv[1] == "quiet":
        out = quiet(int(sys.argv[2]))
    elif sys.argv[1] == "all":  # one process for the three (each start imports torch and Triton)
        out = {name: mode() for name, mode in modes.items()}
    else:
        out = modes[sys.argv[1]]()
    print(json.dumps(out))
