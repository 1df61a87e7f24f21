"""Compiled mode (no interpreter), where the JITFunction internals exist: prints one JSON line saying
which Triton internals tunecache found, for tests/test_triton_names.py."""

from __future__ import annotations

import json
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

import tunecache  # noqa: E402
from tunecache import tritoncompat  # noqa: E402
from tunecache.binaries import preload  # noqa: E402
from tunecache.tuner import background  # noqa: E402

JIT_ATTRS = ("device_caches", "preload", "arg_names", "_fn_name", "fn")


@tunecache.autotune(configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["N"])
@triton.jit
def k(x, N, B: tl.constexpr):
    pass


if __name__ == "__main__":
    jf = preload.jit_function(k)
    t = background.triton_key_thread()
    if t is not None:
        t.join(120)
    key = tritoncompat.triton_key()
    print(
        json.dumps(
            {
                "jit_function": type(jf).__name__ if jf is not None else None,
                "jit_attrs": {a: hasattr(jf, a) for a in JIT_ATTRS},
                "warm_thread": t is not None and t.name,
                "key_cached": key.cache_info().currsize if key is not None else None,
                # A lazy proxy (3.4) or a property (3.9): looked up without creating the CUDA driver.
                "driver_active": "active" in vars(driver)
                or isinstance(getattr(type(driver), "active", None), property),
                "lazy_call": callable(getattr(torch.cuda, "_lazy_call", None)),
            }
        )
    )
