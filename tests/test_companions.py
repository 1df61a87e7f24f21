"""The plain ``@triton.jit`` kernels a process launches next to its tuned ones (tunecache.tuner.companions).

What Triton compiles reaches tunecache through its ``jit_post_compile_hook``; here the hook is
called as Triton calls it. The end to end path (Triton's own ``_call_hook``, the store, the preload
of real sm90 binaries) is in tests/test_binaries.py, and on the GPU in tests/test_gpu.py.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import time
import types

import pytest
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction, JitFunctionInfo

import tunecache
from tunecache.binaries import binaries, preload
from tunecache.problem.model import COMPANION_CONFIG, LaunchSpec
from tunecache.tuner import background, companions

CONFIGS = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})]


def _plain(X, N):  # never compiled here: only named
    pass


def _other(X, N):
    pass


def _tuned(X, N, BLOCK: tl.constexpr):
    pass


def plain_kernel(X, N):
    pass


plain_kernel = JITFunction(plain_kernel)  # what @triton.jit does off the interpreter  # noqa: F811


def _info(jf: JITFunction) -> JitFunctionInfo:
    return JitFunctionInfo(jf.fn.__module__, jf.fn.__qualname__, jf)


def _compiled(jf: JITFunction, warmup: bool = False) -> None:
    """What Triton's ``_call_hook`` passes after compiling a specialisation of ``jf``."""
    hook = triton.knobs.runtime.jit_post_compile_hook
    hook(key="k", repr="r", fn=_info(jf), compile={"key": "k"}, is_manual_warmup=warmup, already_compiled=False)


def _drain() -> None:
    background.submit(lambda: None).result(timeout=60)


@pytest.fixture
def fresh_watch():
    companions.unwatch()
    companions.forget()
    saved = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = None
    yield
    companions.unwatch()
    companions.forget()
    triton.knobs.runtime.jit_post_compile_hook = saved


def test_plain_kernels_are_filed_with_the_kernel_resolved_last_never_tuned_ones_or_warm_ups(
    fresh_watch, monkeypatch, sqlite_url
):
    filed: list = []
    monkeypatch.setattr(binaries, "record_companions", lambda t, *fns, store=None: filed.append((t, fns)) or 0)
    plain, other, tuned_jit = JITFunction(_plain), JITFunction(_other), JITFunction(_tuned)
    tuned = tunecache.autotune(configs=CONFIGS, key=["N"], store=sqlite_url)(tuned_jit)
    assert companions.watching()  # a tuner attached: Triton's compiles are watched

    _compiled(plain)  # before the process resolved any key: kept for the first kernel it resolves
    _compiled(tuned_jit)  # a benchmark's compile: the tuned kernel's own, never a companion
    _compiled(other, warmup=True)  # a manual warm-up, or a preload: not a launch
    _drain()
    assert filed == []
    companions.resolved(tuned)
    _drain()
    assert filed == [(tuned, (plain,))]
    _compiled(other)
    _drain()
    assert filed[-1] == (tuned, (other,)) and len(filed) == 2


def test_the_hook_chains_to_the_one_set_before_and_uninstall_puts_it_back(fresh_watch, sqlite_url):
    seen: list = []

    def users_hook(**kw):
        seen.append(kw["repr"])
        return "theirs"

    triton.knobs.runtime.jit_post_compile_hook = users_hook
    tunecache.install()
    try:
        tunecache.autotune(configs=CONFIGS, key=["N"], store=sqlite_url)(JITFunction(_tuned))
        assert triton.knobs.runtime.jit_post_compile_hook is not users_hook and companions.watching()
        out = triton.knobs.runtime.jit_post_compile_hook(
            key="k", repr="r1", fn=_info(plain_kernel), compile={}, is_manual_warmup=False, already_compiled=False
        )
        assert seen == ["r1"] and out == "theirs"  # the user's hook sees every compile, as before
    finally:
        tunecache.uninstall()
    assert triton.knobs.runtime.jit_post_compile_hook is users_hook  # Triton as it was


def test_a_hook_set_after_ours_is_left_alone_and_companions_0_files_nothing(fresh_watch, monkeypatch, sqlite_url):
    companions.watch()
    later = lambda **kw: None  # noqa: E731
    triton.knobs.runtime.jit_post_compile_hook = later
    companions.unwatch()
    assert triton.knobs.runtime.jit_post_compile_hook is later
    triton.knobs.runtime.jit_post_compile_hook = None
    filed: list = []
    monkeypatch.setattr(binaries, "record_companions", lambda t, *fns, store=None: filed.append((t, fns)) or 0)
    monkeypatch.setenv("TUNECACHE_COMPANIONS", "0")
    tuned = tunecache.autotune(configs=CONFIGS, key=["N"], store=sqlite_url)(JITFunction(_tuned))
    assert companions.watching()  # a readwrite process still records its winners' compiles (tunecache.tuner.heal)
    companions.resolved(tuned)
    _compiled(JITFunction(_plain))
    _drain()
    assert filed == []
    companions.unwatch()
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")  # and one that writes nothing watches nothing
    tunecache.autotune(configs=CONFIGS, key=["N"], store=sqlite_url)(JITFunction(_tuned))
    assert triton.knobs.runtime.jit_post_compile_hook is None and not companions.watching()


def test_a_tuned_kernels_launch_compile_is_handed_to_heal_in_a_readwrite_process_only(
    fresh_watch, monkeypatch, sqlite_url
):
    healed: list = []
    tuned_jit = JITFunction(_tuned)
    tuned = tunecache.autotune(configs=CONFIGS, key=["N"], store=sqlite_url)(tuned_jit)
    monkeypatch.setattr(tuned, "record_hit_specs", lambda: healed.append(tuned) or 0, raising=False)
    _compiled(tuned_jit, warmup=True)  # a preload or a manual warm-up: not a launch
    _compiled(JITFunction(_plain))  # not a tuned kernel
    _drain()
    assert healed == []
    _compiled(tuned_jit)
    _drain()
    assert healed == [tuned]
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    _compiled(tuned_jit)
    _drain()
    assert healed == [tuned]


def test_a_companion_is_found_by_its_triton_name_only_in_a_module_imported_already():
    assert companions.find(f"{__name__}.plain_kernel") is plain_kernel
    assert companions.find(f"{__name__}._plain") is None  # a Python function, not a kernel
    assert companions.find(f"{__name__}.no_such_kernel") is None
    assert "json.tool" not in sys.modules
    assert companions.find("json.tool.main") is None and "json.tool" not in sys.modules  # never imports
    alias = JITFunction(_other)
    globals()["alias_jit"] = alias
    try:  # Triton names it test_companions._other: a spec for that name is not this object's
        assert companions.find(f"{__name__}.alias_jit") is None
    finally:
        del globals()["alias_jit"]


def test_a_companion_whose_module_still_imports_is_preloaded_once_it_finished(monkeypatch):
    """A library may touch CUDA while its modules import (fla-core does): the preload then runs before
    the companion's module has finished, and tries it again until it has."""
    state = {"importing": True}
    loads: list = []
    monkeypatch.setattr(companions, "find", lambda name: None if state["importing"] else plain_kernel)
    monkeypatch.setattr(companions, "may_appear", lambda name: True)  # its module imports (tested below)
    monkeypatch.setattr(
        preload, "load", lambda jf, specs, dev: loads.append((jf, [s.spec_hash for s in specs])) or (1, 0)
    )
    monkeypatch.setattr(background, "PRELOAD_RETRY_S", 0.01)
    spec_json = json.dumps({"name": f"{__name__}.plain_kernel", "key": "k"})
    spec = LaunchSpec("a" * 64, COMPANION_CONFIG, "b" * 64, spec_json, "3.9.0")
    host = binaries.host_module_spec("c" * 64, "cuda_utils", "3.9.0")  # also a companion: never preloaded
    tunecache.reset_stats()
    assert companions.load([spec, host], 0) == (0, 0)
    time.sleep(0.1)
    assert loads == []
    state["importing"] = False
    deadline = time.monotonic() + 10
    while not loads and time.monotonic() < deadline:
        time.sleep(0.01)
    _drain()
    assert loads == [(plain_kernel, ["a" * 64])]
    assert tunecache.stats()["preloaded"] == 1


def test_a_companion_is_waited_for_only_where_its_module_may_still_define_it(monkeypatch):
    assert companions.may_appear("nosuchlibrary.ops.kernel") is False  # a library this process never imported
    assert companions.may_appear("json.no_such_kernel") is False  # its module finished importing without it
    assert "json.not_yet" not in sys.modules
    assert companions.may_appear("json.not_yet.kernel") is True  # its library is imported, its module not yet
    importing = types.ModuleType("tc_importing_lib")
    importing.__spec__ = importlib.machinery.ModuleSpec("tc_importing_lib", None)
    importing.__spec__._initializing = True  # as CPython marks a module whose body still runs
    monkeypatch.setitem(sys.modules, "tc_importing_lib", importing)
    assert companions.may_appear("tc_importing_lib.kernel") is True
    importing.__spec__._initializing = False
    assert companions.may_appear("tc_importing_lib.kernel") is False
