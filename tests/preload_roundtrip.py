"""Record a compiled kernel's specialisation and preload it through Triton's own ``preload``, on any
machine: kernels are compiled for sm90 offline (ptxas ships with Triton); only the CUDA device
query is answered here, since there is no GPU. Prints one JSON line for tests/test_preload.py.

Run in a fresh process because the tests run under the interpreter, where nothing is compiled.
"""

from __future__ import annotations

import hashlib
import json
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.compiler.compiler as compiler_module  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.jit as jit_module  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, CompiledKernel, make_backend  # noqa: E402

from tunecache.binaries import preload  # noqa: E402
from tunecache.problem.model import LaunchSpec  # noqa: E402


@triton.jit
def add_one(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    tl.store(Y + i, tl.load(X + i, mask=m) + 1, mask=m)


class _Device:  # what Triton asks the CUDA driver in JITFunction.preload: the current device
    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:  # Triton 3.4's preload compiles for the current target
        return GPUTarget("cuda", 90, 32)


class _Driver:
    active = _Device()


def main() -> None:
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    sig = {"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"}
    aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}

    def build(block: int, warps: int, attrs: dict) -> CompiledKernel:
        src = ASTSource(add_one, sig, {"BLOCK": block}, attrs)
        return triton.compile(src, target=target, options={"num_warps": warps, "num_stages": 1})

    # What a benchmark leaves in Triton's kernel cache: two configs, one of them in two specialisations,
    # each under the launch key Triton's own binder computes for such arguments (N=100: not a multiple of 16).
    kernels = {"k64": build(64, 4, aligned), "k128": build(128, 2, aligned), "k128-unaligned": build(128, 2, {})}
    binder = jit_module.create_function_from_signature(add_one.signature, add_one.params, backend)
    x, y = torch.zeros(256), torch.zeros(256)

    def launch_key(block: int, warps: int, ptrs: tuple) -> str:
        spec, opts = binder(*ptrs, 100, BLOCK=block, num_warps=warps, num_stages=1)[1:3]
        return str(spec) + str(opts)

    keys = {
        "k64": launch_key(64, 4, (x, y)),
        "k128": launch_key(128, 2, (x, y)),
        "k128-unaligned": launch_key(128, 2, (x[1:], y[1:])),
    }
    label = {v: k for k, v in keys.items()}
    cache = {keys[n]: k for n, k in kernels.items()}
    add_one.device_caches[0] = (cache, {}, target, backend, None)
    add_one.compile, add_one.ASTSource = triton.compile, ASTSource  # set by create_binder on a GPU
    jit_module.driver = _Driver()
    compiler_module.driver = _Driver()  # Triton 3.4: compile(src, target=None) asks the driver

    # The autotuner hands over its own fn; a user may hand the decorated kernel: both unwrap to the JITFunction.
    decorated = triton.autotune([triton.Config({})], key=["N"])(triton.heuristics({"BLOCK": lambda a: 128})(add_one))
    unwraps = preload.jit_function(decorated) is add_one and preload.jit_function(decorated.fn) is add_one

    win = triton.Config({"BLOCK": 128}, num_warps=2, num_stages=1)
    specs = preload.capture(add_one, win, "h128")
    other_warps = preload.capture(add_one, triton.Config({"BLOCK": 128}, num_warps=4), "x")
    captured = {label[json.loads(s.spec_json)["key"]]: s for s in specs}

    # Triton's preload of each recorded spec, into an empty cache: the same binary under the same key.
    cache.clear()
    roundtrip = {}
    for name, s in captured.items():
        k = add_one.preload(s.spec_json)
        roundtrip[name] = {
            "same_hash": k.hash == kernels[name].hash == s.kernel_hash,
            "cached": cache.get(keys[name]) is k,
        }

    # load(): initialises handles of what it loaded, skips what is cached, another Triton's or a
    # spec whose binary does not match the record (dropped from the cache, never launched).
    inits = []
    CompiledKernel._init_handles = lambda self: inits.append(self.hash)
    cache.clear()
    s0 = captured["k128"]
    bad_hash = LaunchSpec(s0.spec_hash, s0.config_hash, "0" * 64, s0.spec_json, s0.triton_version)
    other_triton = LaunchSpec(s0.spec_hash, s0.config_hash, s0.kernel_hash, s0.spec_json, "2.0.0")
    # The 128/2w binary filed under the 64/4w launch key, its own hash recorded: a launch of 64/4w would run it.
    forged = json.loads(s0.spec_json)
    forged["key"] = keys["k64"]
    forged_json = json.dumps(forged)
    misfiled = LaunchSpec(
        hashlib.sha256(forged_json.encode()).hexdigest(), s0.config_hash, s0.kernel_hash, forged_json, s0.triton_version
    )
    imports = []  # load() imports what a first launch would, once it loaded something
    preload.import_launch_modules = lambda: imports.append(len(cache))
    r_bad = preload.load(add_one, [bad_hash, other_triton, misfiled], 0)
    after_bad = sorted(label.get(k, k) for k in cache)
    imports_after_bad = list(imports)
    r_good = preload.load(add_one, specs, 0)
    r_again = preload.load(add_one, specs, 0)
    print(
        json.dumps(
            {
                "unwraps": unwraps,
                "captured": sorted(captured),
                "other_warps": len(other_warps),
                "roundtrip": roundtrip,
                "bad": list(r_bad),
                "cache_after_bad": after_bad,
                "good": list(r_good),
                "again": list(r_again),
                "inits": sorted(inits) == sorted(kernels[k].hash for k in captured),
                "cache_after_good": sorted(label.get(k, k) for k in cache),
                "launch_imports": [imports_after_bad, imports],
            }
        )
    )


if __name__ == "__main__":
    main()
