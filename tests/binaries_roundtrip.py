"""Real sm90 binaries, compiled offline on any machine (ptxas ships with Triton), through the store,
an export and into an empty Triton cache. Two phases, each a fresh process (the tests run under the
interpreter, where nothing is compiled), each printing one JSON line for tests/test_binaries.py:

    build   compile the winners of two tuning keys for sm90 into an empty Triton cache
            (TRITON_CACHE_DIR), store their problems and launch specs in TUNECACHE_URL, and
            upload their binaries with tunecache.binaries.binaries.upload (what the autotuner calls after
            storing its specs); the merge kernel too, as a companion.
    place   another empty Triton cache, the store TUNECACHE_URL (imported from the export): the
            tunecache kernel's load_winners places the binaries into Triton's cache and preloads
            the specs. Reports every compile Triton made and whether it was a cache hit.

Only the CUDA device query is answered here (there is no GPU), as in tests/preload_roundtrip.py.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.compiler.compiler as compiler_module  # noqa: E402
import triton.runtime.jit as jit_module  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, CompiledKernel, make_backend  # noqa: E402

import tunecache  # noqa: E402
from tunecache.binaries import binaries, preload  # noqa: E402
from tunecache.problem.identity import canonical_key, problem_digest  # noqa: E402
from tunecache.problem.model import COMPANION_CONFIG, ConfigResult, Problem  # noqa: E402
from tunecache.problem.target import detect_target  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.tuner import background, companions  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SIG = {"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"}
ALIGNED = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}


class _Device:  # what Triton asks the CUDA driver in JITFunction.preload: the current device
    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return TARGET


class _Driver:
    active = _Device()


def _stub(jf, backend) -> dict:
    """An empty per-device kernel cache for ``jf``, as create_binder sets up on a GPU."""
    cache: dict = {}
    jf.device_caches[0] = (cache, {}, TARGET, backend, None)
    jf.compile, jf.ASTSource = triton.compile, ASTSource
    return cache


def _launch_key(jf, backend, block: int, warps: int, ptrs: tuple, n: int = 100) -> str:
    binder = jit_module.create_function_from_signature(jf.signature, jf.params, backend)
    spec, opts = binder(*ptrs, n, BLOCK=block, num_warps=warps, num_stages=1)[1:3]
    return str(spec) + str(opts)


def build() -> dict:
    import binkernel as bk

    backend = make_backend(TARGET)
    x, y = torch.zeros(256), torch.zeros(256)
    cache = _stub(bk.add_one, backend)

    def compile_one(block: int, warps: int, attrs: dict, ptrs: tuple) -> None:
        src = ASTSource(bk.add_one, SIG, {"BLOCK": block}, attrs)
        k = triton.compile(src, target=TARGET, options={"num_warps": warps, "num_stages": 1})
        cache[_launch_key(bk.add_one, backend, block, warps, ptrs)] = k

    # What the benchmarks of two tuning keys leave in Triton's kernel cache: both configs; the
    # 128/2w winner in two specialisations (aligned and not).
    compile_one(64, 4, ALIGNED, (x, y))
    compile_one(128, 2, ALIGNED, (x, y))
    compile_one(128, 2, {}, (x[1:], y[1:]))
    # The companion: a plain kernel, compiled once.
    mcache = _stub(bk.merge, backend)
    msrc = ASTSource(bk.merge, {"X": "*fp32", "N": "i32", "BLOCK": "constexpr"}, {"BLOCK": 64}, {})
    mk = triton.compile(msrc, target=TARGET, options={"num_warps": 4, "num_stages": 1})
    binder = jit_module.create_function_from_signature(bk.merge.signature, bk.merge.params, backend)
    spec, opts = binder(x[1:], 100, BLOCK=64, num_warps=4, num_stages=1)[1:3]
    mkey = str(spec) + str(opts)
    mcache[mkey] = mk
    # ... and Triton tells its jit_post_compile_hook, as its launch path does after that compile.
    _post_compile_hook(bk.merge, mkey, {"X": "*fp32", "N": "i32", "BLOCK": "constexpr"}, {(2,): 64}, backend)

    launchers = _launcher_keys([*cache.values(), mk])
    from triton.runtime.cache import get_cache_manager

    from tunecache.binaries import hostmodules

    for key in {k for k in launchers["ours"] if k}:  # what CudaLauncher leaves in the cache on a GPU
        get_cache_manager(key).put(
            b"launcher " + key.encode(), f"__triton_launcher{hostmodules.ext_suffix()}", binary=True
        )
    tuned = bk.tuned
    ident = tuned.identity
    target = detect_target()
    store = open_store()
    hashes = {}
    for n, cfg in ((100, bk.CONFIGS[1]), (4096, bk.CONFIGS[0])):  # key -> its winner
        h = tuned.config_ids(cfg)[1]
        hashes[n] = h
        key = canonical_key(["N"], [n])
        p = Problem(
            digest=problem_digest(ident.source_hash, target, key),
            kernel=tuned.kernel_name,
            source_hash=ident.source_hash,
            target=target,
            key_json=key,
            batch_bucket=None,
            tuning_seconds=1.0,
            host="tuner",
        )
        cdict = {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        cdict.update(num_ctas=1, maxnreg=None, pre_hook=None)
        store.put(p, [ConfigResult(h, cdict, "ok", 0.5, 0.4, 0.6, 3)])
    uploaded = 0
    specs = []
    for n in (100, 4096):
        cfg = bk.CONFIGS[1] if n == 100 else bk.CONFIGS[0]
        got = preload.capture(bk.add_one, cfg, hashes[n])
        store.put_specs(tuned.kernel_name, ident.source_hash, target.digest, got)
        uploaded += binaries.upload(store, bk.add_one, tuned.kernel_name, ident.source_hash, got, target.digest)
        specs += got
    # The process resolved a key of the tuned kernel: the plain kernel compiled before is filed with it.
    companions.resolved(tuned)
    background.submit(lambda: None).result(timeout=60)
    comp = [s for s in store.get_specs(ident.source_hash)[target.digest] if s.config_hash == COMPANION_CONFIG]
    stored_companions = sorted(json.loads(s.spec_json).get("name", "host module") for s in comp)
    again = binaries.upload(store, bk.add_one, tuned.kernel_name, ident.source_hash, specs)  # stored already
    heads = store.binary_heads([s.kernel_hash for s in specs])
    store.close()
    return {
        "source_hash": ident.source_hash,
        "kernel": tuned.kernel_name,
        "specs": len(specs),
        "uploaded": uploaded,
        "companions": stored_companions,
        "watching": companions.watching(),
        "uploaded_again": again,
        "kernel_hashes": sorted({s.kernel_hash for s in specs}),
        "heads": sorted(heads),
        "merge_hash": str(mk.hash),
        "cubins": {str(k.hash): hashlib.sha256(k.asm["cubin"]).hexdigest() for k in [*cache.values(), mk]},
        "launchers": launchers,
        "host_modules_stored": sorted(store_heads(launchers["ours"])),
    }


def _post_compile_hook(jf, key: str, signature: dict, constexprs: dict, backend) -> None:
    """Call ``knobs.runtime.jit_post_compile_hook`` through Triton's own ``_call_hook``, which builds
    its arguments (its parameters differ between versions: 3.7+ pass the target)."""
    import inspect

    options = backend.parse_options({"num_warps": 4, "num_stages": 1})
    args = {"hook": knobs.runtime.jit_post_compile_hook, "key": key, "signature": signature, "target": TARGET}
    args.update(device=0, constants=constexprs, options=options, configs=[{}], is_warmup=False)
    params = [p for p in inspect.signature(jf._call_hook).parameters if p != "self"]
    jf._call_hook(*[args[p] for p in params])


def store_heads(keys: list) -> dict:
    store = open_store()
    try:
        return store.binary_heads(sorted({k for k in keys if k}))
    finally:
        store.close()


def _launcher_keys(kernels: list) -> dict:
    """For each compiled kernel: the launcher key tunecache computes, and the one Triton's own
    CudaLauncher asks its cache for (its C compiler stopped there: no libcuda on this machine)."""
    import triton.backends.nvidia.driver as nv
    import triton.runtime.build as build

    from tunecache.binaries import hostmodules

    ours = [hostmodules.launcher_key(k) for k in kernels]
    if not hasattr(nv, "make_launcher"):  # Triton 3.7+: one launcher for every signature, nothing built
        return {"ours": ours, "triton": [None] * len(kernels)}

    class Stop(Exception):
        pass

    asked: list = []
    real_manager, real_dirs = build.get_cache_manager, nv.library_dirs

    def manager(key: str):
        asked.append(key)
        raise Stop

    build.get_cache_manager, nv.library_dirs = manager, lambda: []
    try:
        for k in kernels:
            n = len(asked)
            try:
                nv.CudaLauncher(k.src, k.metadata)
            except Stop:
                pass
            if len(asked) == n:
                asked.append(None)
    finally:
        build.get_cache_manager, nv.library_dirs = real_manager, real_dirs
    return {"ours": ours, "triton": asked}


def _in_cache(keys: list) -> list:
    """Those of the launcher ``keys`` this Triton would find in its cache (not build)."""
    from triton.runtime.cache import get_cache_manager

    from tunecache.binaries import hostmodules

    name = f"__triton_launcher{hostmodules.ext_suffix()}"
    return sorted(k for k in keys if k and get_cache_manager(k).get_file(name) is not None)


class _Warnings(logging.Handler):
    """tunecache's warnings of this process, for the tests that count its lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def place() -> dict:
    warned = _Warnings()
    logging.getLogger("tunecache").addHandler(warned)
    compiles: list[dict] = []
    knobs.compilation.listener = lambda src, metadata, metadata_group, times, cache_hit: compiles.append(
        {"name": src.name, "hash": metadata["hash"], "cache_hit": cache_hit}
    )
    import binkernel as bk

    backend = make_backend(TARGET)
    cache = _stub(bk.add_one, backend)
    jit_module.driver = _Driver()
    compiler_module.driver = _Driver()  # Triton 3.4: compile(src, target=None) asks the driver
    inits = []
    CompiledKernel._init_handles = lambda self: inits.append(self.hash)
    background.submit(lambda: None).result(timeout=60)  # the kernel's background prefetch (and placement)
    mcache = _stub(bk.merge, backend)
    tunecache.reset_stats()
    loaded = bk.tuned.load_winners(0)  # what runs once CUDA is up: place, then preload
    at_preload = list(compiles)
    memoised = len(bk.tuned.config_ids)  # the first launch's check_disk_cache computes none of them
    cache_dir = os.environ["TRITON_CACHE_DIR"]
    groups = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(f"{cache_dir}/*/__grp__*.json"))
    # The companion was placed with the winners: its first launch's compile is a cache hit too.
    msrc = ASTSource(bk.merge, {"X": "*fp32", "N": "i32", "BLOCK": "constexpr"}, {"BLOCK": 64}, {})
    mk = triton.compile(msrc, target=TARGET, options={"num_warps": 4, "num_stages": 1})
    return {
        "loaded": loaded,
        "stats": tunecache.stats(),
        "compiles": compiles,
        "compiles_at_preload": at_preload,
        "config_ids_memoised": memoised,
        "merge_preloaded": sorted(str(k.hash) for k in mcache.values()),
        "inits": sorted(inits),
        "cached": sorted(str(k.hash) for k in cache.values()),
        "groups": len(groups),
        "launchers_placed": _in_cache(os.environ.get("LAUNCHERS", "").split(",")),
        "merge_hash": str(mk.hash),
        "cubins": {str(k.hash): hashlib.sha256(k.asm["cubin"]).hexdigest() for k in [*cache.values(), mk]},
        "warnings": warned.lines,
    }


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(build() if sys.argv[1] == "build" else place()))
