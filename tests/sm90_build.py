"""Compile the sparse decode split stage for sm90 on any machine (ptxas ships with Triton) and print,
as one JSON line, what the GPU build looks like: shared memory, registers, spills and SASS opcode
counts.

Run by tests/test_sparse_decode.py in a fresh process, because the tests themselves run under the
interpreter (TRITON_INTERPRET must be unset before triton is imported to get a compilable kernel).
Usage: python sm90_build.py [--gluon] BLOCK_T,WARPS,STAGES[,ROWS] [...]. Without --gluon it builds the
Triton stage (SM90_BUILD_FP8_ASM=0 builds it with Triton's own ``.to(tl.float16)`` conversion: 256
LDS.U8 per thread at 64,4,1, what the test guards against); with --gluon the Hopper kernel of
sparse_decode_sm90.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from tunecache.kernels import sparse_decode as sd  # noqa: E402
from tunecache.kernels import sparse_decode_sm90 as sm90  # noqa: E402

# The launch's signature for an fp8 cache with split partials (sparse_decode._launch_split).
POINTERS = {"Q": "*bf16", "KV": "*fp8e4nv", "IDX": "*i32", "O_PART": "*fp16", "LSE_PART": "*fp32"}
FLOATS = {"sm_scale", "k_scale"}
NOT_SPECIALISED = {"B", "stride_lb", "stride_lh", "stride_ls"}  # @triton.jit(do_not_specialize=...)
CONSTEXPRS = {
    "BLOCK_H": sd.BLOCK_H,
    "D_V": sd.D_V,
    "D_ROPE": sd.D_ROPE,
    "KV_FP8": True,
    "DOT_FP32": False,
    "FP8_ASM": os.environ.get("SM90_BUILD_FP8_ASM", "1") == "1",
    "IDX64": False,
}


def compile_stage(block_t: int, warps: int, stages: int, rows: int = 4, gluon: bool = False):
    """The split stage compiled for sm90 by Triton's own compiler (a CompiledKernel, in Triton's cache)."""
    fn = sm90.split_stage if gluon else sd._split_stage
    names = fn.arg_names
    constexprs = {**CONSTEXPRS, "BLOCK_T": block_t}
    if gluon:
        constexprs = {"BLOCK_H": sd.BLOCK_H, "D_V": sd.D_V, "D_ROPE": sd.D_ROPE, "BLOCK_T": block_t}
        constexprs.update(ROWS=rows, STAGES=stages)
    signature = {
        n: POINTERS.get(n) or ("fp32" if n in FLOATS else "constexpr" if n in constexprs else "i32") for n in names
    }
    # Integer and pointer arguments a real launch passes as multiples of 16 (strides of contiguous
    # tensors, sizes like 2048): without the hint nothing vectorises and the build is unrepresentative.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if signature[n] != "constexpr" and n not in FLOATS and n not in NOT_SPECIALISED
    }
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, signature, dict(constexprs), attrs)
    else:
        src = ASTSource(fn, signature, dict(constexprs), attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def build(block_t: int, warps: int, stages: int, rows: int = 4, gluon: bool = False) -> dict:
    try:
        k = compile_stage(block_t, warps, stages, rows, gluon)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
        res = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", path], capture_output=True, text=True)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    regs = re.search(r"REG:(\d+)", res.stdout)
    stack = re.search(r"STACK:(\d+)", res.stdout)
    return {
        "shared": k.metadata.shared,
        "registers": int(regs.group(1)) if regs else None,
        "stack": int(stack.group(1)) if stack else None,
        "ops": {op: n for op, n in ops.items() if op.startswith(("LDS", "F2FP", "HMMA", "HGMMA", "STL", "LDL"))},
    }


if __name__ == "__main__":
    out = {}
    gluon = "--gluon" in sys.argv[1:]
    for arg in (a for a in sys.argv[1:] if a != "--gluon"):
        out[arg] = build(*(int(x) for x in arg.split(",")), gluon=gluon)
    print(json.dumps(out))
