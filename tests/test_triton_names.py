"""Every Triton internal tunecache uses resolves on the installed Triton (run on 3.4, 3.6 and 3.9).

tunecache reaches a few private or moved Triton names; where one is missing it skips an
optimisation silently (the fingerprint warm-up, the preload). These tests make the silence loud: on
each Triton of the matrix every name must resolve where tunecache looks for it, and the feature
that depends on it must actually run.
"""

from __future__ import annotations

import inspect

import triton
from processes import run_json

from tunecache import tritoncompat

VERSION = tuple(int(x) for x in triton.__version__.split(".")[:2])


def test_triton_key_is_found_where_this_triton_keeps_it():
    expected = "triton.compiler.compiler" if VERSION < (3, 5) else "triton.runtime.cache"
    assert tritoncompat.triton_key_location() == expected
    key = tritoncompat.triton_key()
    assert callable(key) and hasattr(key, "cache_info")  # memoised by Triton: the warm-up is worth it


def test_serializer_has_the_signature_preload_expects():
    fn = tritoncompat.serialize_specialization_data()
    assert fn is not None
    params = list(inspect.signature(fn).parameters)
    want = ["name", "signature", "constants", "attrs", "options", "key"] + (["target"] if VERSION >= (3, 7) else [])
    assert params == want


def test_autotuner_hooks_exist_with_the_signatures_used():
    from triton.runtime.autotuner import Autotuner

    assert list(inspect.signature(Autotuner.check_disk_cache).parameters) == [
        "self",
        "tuning_key",
        "configs",
        "bench_fn",
    ]
    assert "config" in inspect.signature(Autotuner._bench).parameters
    assert callable(Autotuner.prune_configs)
    assert "do_bench" in vars(Autotuner)  # a cached_property that TunecacheAutotuner shadows


def test_compiled_mode_internals_resolve_and_the_fingerprint_warm_up_runs(tmp_path):
    got = run_json(["triton_names.py"], {"TUNECACHE_URL": f"sqlite:///{tmp_path / 's.sqlite3'}"})
    assert got == {
        "jit_function": "JITFunction",
        "jit_attrs": dict.fromkeys(("device_caches", "preload", "arg_names", "_fn_name", "fn"), True),
        "warm_thread": "tunecache-triton-key",
        "key_cached": 1,
        "driver_active": True,
        "lazy_call": True,
    }
