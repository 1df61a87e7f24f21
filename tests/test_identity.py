"""Identity: what makes a key, and what must not change it."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from tunecache import identity
from tunecache.identity import Target, canonical_key, config_identity, detect_target, problem_digest, source_hash


def _load(tmp_path, name, src):
    import importlib.util

    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(src))
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


KERNEL = """
import triton, triton.language as tl
@triton.jit
def helper(a):
    return a + 1
{pad}
@triton.jit
def k(x, N, BLOCK: tl.constexpr):
    # a comment
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, helper(tl.load(x + offs)))
"""


def test_source_hash_ignores_position_and_comments_but_not_code(tmp_path):
    a = _load(tmp_path, "ka", KERNEL.format(pad=""))
    b = _load(tmp_path, "kb", KERNEL.format(pad="\n\n\n# moved down\n\n").replace("# a comment", "# other"))
    assert source_hash(a.k) == source_hash(b.k)
    c = _load(tmp_path, "kc", KERNEL.format(pad="").replace("a + 1", "a + 2"))
    assert source_hash(c.k) != source_hash(a.k)  # a called @jit function changed
    d = _load(tmp_path, "kd", KERNEL.format(pad="").replace("tl.store(x + offs,", "tl.store(x + offs + 0,"))
    assert source_hash(d.k) != source_hash(a.k)


def test_kernel_identity_under_the_interpreter_has_no_cache_key():
    @triton.jit
    def k(x):
        pass

    ident = identity.kernel_identity(k)
    assert ident.name.endswith("k") and len(ident.source_hash) == 64
    assert ident.triton_cache_key is None  # InterpretedFunction has none


def test_canonical_key_types_and_errors():
    assert canonical_key(["B", "d"], [8, torch.bfloat16]) == '[["B",8],["d","torch.bfloat16"]]'
    assert canonical_key(["x"], [True]) == '[["x",true]]'
    with pytest.raises(TypeError, match="'lst'"):
        canonical_key(["lst"], [[1, 2]])
    with pytest.raises(TypeError, match="'t'"):
        canonical_key(["t"], [torch.ones(2)])
    with pytest.raises(TypeError, match="'f'"):
        canonical_key(["f"], [float("nan")])


def test_config_identity_is_canonical_and_includes_options():
    a = triton.Config({"B": 16, "A": 1}, num_warps=4, num_stages=2)
    b = triton.Config({"A": 1, "B": 16}, num_warps=4, num_stages=2)
    c = triton.Config({"A": 1, "B": 16}, num_warps=8, num_stages=2)
    assert config_identity(a) == config_identity(b)
    assert config_identity(a)[1] != config_identity(c)[1]
    data = json.loads(config_identity(a)[0])
    assert data == {
        "kwargs": {"A": 1, "B": 16},
        "num_warps": 4,
        "num_stages": 2,
        "num_ctas": 1,
        "maxnreg": None,
        "pre_hook": None,
    }
    assert identity.make_config(data).all_kwargs() == a.all_kwargs()


def test_digest_has_driver_but_not_host_or_runtime():
    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    base = problem_digest("s", t, "[]")
    assert problem_digest("s", Target(**{**t.as_dict(), "driver_version": "13010"}), "[]") != base
    assert problem_digest("s", Target(**{**t.as_dict(), "device_name": "NVIDIA H100"}), "[]") != base
    assert problem_digest("s", Target(**{**t.as_dict(), "cuda_runtime": "12.8"}), "[]") == base
    assert problem_digest("s", t, '[["B",1]]') != base


def test_detect_target_on_a_cpu_machine(monkeypatch):
    t = detect_target()
    assert t.backend == "cpu" and t.arch == "interpreter"
    assert t.triton_version == ".".join(triton.__version__.split(".")[:2])
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", '{"driver_version": "999"}')
    assert detect_target().driver_version == "999"
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", '{"nope": 1}')
    with pytest.raises(ValueError, match="unknown fields"):
        detect_target()


def test_pre_hook_identity_changes_with_its_body():
    def h1(n):
        return 1

    def h2(n):
        return 2

    h2.__qualname__ = h1.__qualname__
    a = triton.Config({"X": 1}, pre_hook=h1)
    b = triton.Config({"X": 1}, pre_hook=h2)
    assert config_identity(a)[1] != config_identity(b)[1]
    assert "h1" in json.loads(config_identity(a)[0])["pre_hook"]


_ = tl
