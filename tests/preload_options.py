"""Specs built with compile options other than those a launch here computes for their key, recorded and
preloaded offline for sm90 as in tests/preload_roundtrip.py (whose kernel and driver stand-in it uses).

A launch key names only the options the launch passed; Triton's launch fills in the rest from the
host's defaults and knobs, and only some of those knobs are in the binary's hash (e.g.
``TRITON_DEFAULT_FP_FUSION`` is; ``PTXAS_OPTIONS`` and ``TRITON_LIBDEVICE_PATH`` are not). A host with
another default files its binary under the very key a launch here computes.

``python preload_options.py record`` prints the spec this host records for ``add_one`` (BLOCK=128,
2 warps) after a plain launch through Triton's own launch path; ``python preload_options.py load FILE
DIR`` preloads the specs in FILE (a JSON object of those, by name) and specs whose options were changed
in the record here (files in DIR), and prints what it loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys

import preload_roundtrip as rt  # first: unsets TRITON_INTERPRET before triton is imported
import torch
import triton
import triton.compiler.compiler as compiler_module
import triton.runtime.jit as jit_module
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompiledKernel, make_backend

from tunecache.binaries import preload
from tunecache.problem.model import LaunchSpec

TARGET = GPUTarget("cuda", 90, 32)
SIG = {"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"}
ALIGNED = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
WIN = triton.Config({"BLOCK": 128}, num_warps=2, num_stages=1)
CACHE: dict = {}  # add_one's kernel cache on device 0
BACKEND = make_backend(TARGET)
add_one = rt.add_one
add_one.device_caches[0] = (CACHE, {}, TARGET, BACKEND, None)
add_one.compile, add_one.ASTSource = triton.compile, ASTSource  # set by create_binder on a GPU
jit_module.driver = rt._Driver()
compiler_module.driver = rt._Driver()
CompiledKernel._init_handles = lambda self: None  # no CUDA context here
preload.import_launch_modules = lambda: None


def launch_key(**options) -> str:
    """The key Triton's run() computes for add_one(x, y, 100, BLOCK=128, num_warps=2, num_stages=1, **options)."""
    binder = jit_module.create_function_from_signature(add_one.signature, add_one.params, BACKEND)
    x, y = torch.zeros(256), torch.zeros(256)
    spec, opts = binder(x, y, 100, BLOCK=128, num_warps=2, num_stages=1, debug=False, **options)[1:3]
    return str(spec) + str(opts)


def build(**options) -> CompiledKernel:
    """What the launch compiles: triton.compile fills the options not given from this host's defaults."""
    src = ASTSource(add_one, SIG, {"BLOCK": 128}, ALIGNED)
    return triton.compile(src, target=TARGET, options={"num_warps": 2, "num_stages": 1, **options})


def record(key: str, kernel: CompiledKernel) -> LaunchSpec:
    """The spec capture() makes of ``kernel`` in Triton's cache under ``key``, as after a launch."""
    CACHE.clear()
    CACHE[key] = kernel
    (spec,) = preload.capture(add_one, WIN, "h128")
    CACHE.clear()
    return spec


class _Launching(rt._Device):  # what Triton's run() asks the driver besides
    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def record_launch() -> LaunchSpec:
    """The spec capture() makes after Triton's own launch path compiled add_one, under the key it
    computed (a warm-up: compiled, not run)."""
    jit_module.driver.active = _Launching()
    add_one.device_caches.clear()  # Triton's create_binder makes its own, for the stand-in's target
    x, y = torch.zeros(256), torch.zeros(256)
    add_one.warmup(x, y, 100, BLOCK=128, num_warps=2, num_stages=1, grid=(1,))
    (spec,) = preload.capture(add_one, WIN, "h128")
    return spec


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def load(specs: list[LaunchSpec]) -> dict:
    """Preload ``specs`` twice into an empty cache: counts, what is cached, what the log said."""
    logs = Records()
    log = logging.getLogger("tunecache")
    log.addHandler(logs)
    log.setLevel(logging.DEBUG)
    CACHE.clear()
    counts = [list(preload.load(add_one, specs, 0)), list(preload.load(add_one, specs, 0))]
    log.removeHandler(logs)
    messages = [r.getMessage() for r in logs.records if "not preloaded" in r.getMessage()]
    keys = {launch_key(): "plain", launch_key(enable_fp_fusion=False): "no_fusion"}
    return {
        "counts": counts,
        "cached": sorted(keys.get(k, k) for k in CACHE),
        "hashes": sorted(str(k.hash) for k in CACHE.values()),
        "warnings": [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING],
        "named": [m.split()[3] for m in messages],
        "why": messages,
    }


def main() -> None:
    if sys.argv[1] == "record":
        print(json.dumps(dataclasses.asdict(record_launch())))
        return
    with open(sys.argv[2]) as f:
        recorded = {name: LaunchSpec(**s) for name, s in json.load(f).items()}
    # Specs whose record says other options than the key implies, honest hashes: any option counts.
    plain = launch_key()
    changed = {
        "enable_fp_fusion": record(plain, build(enable_fp_fusion=False)),
        "default_dot_input_precision": record(plain, build(default_dot_input_precision="ieee")),
    }
    # The same libdevice at another path (another host's install): Triton's own option hash says equal.
    moved = json.loads(recorded["default"].spec_json)
    (name, path), *_ = moved["options"]["extern_libs"]
    copy = os.path.join(sys.argv[3], "libdevice-copy.bc")
    shutil.copyfile(path, copy)
    moved["options"]["extern_libs"] = [[name, copy]]
    moved_json = json.dumps(moved)
    moved_spec = dataclasses.replace(
        recorded["default"], spec_hash=hashlib.sha256(moved_json.encode()).hexdigest(), spec_json=moved_json
    )
    # A launch that passed enable_fp_fusion=False: its key says so, and a launch here builds that binary.
    asked = record(launch_key(enable_fp_fusion=False), build(enable_fp_fusion=False))
    out = {
        "ids": {n: s.spec_hash[:12] for n, s in {**recorded, **changed}.items()},
        "ptx_options": {n: json.loads(s.spec_json)["options"].get("ptx_options") for n, s in recorded.items()},
        "recorded": {n: load([s]) for n, s in recorded.items()},
        "changed": {n: load([s]) for n, s in changed.items()},
        "asked": load([asked]),
        "moved": load([moved_spec]),
        "here": record_launch().kernel_hash,  # last: Triton's own caches from here on
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
