"""Identity: what makes a key, and what must not change it."""

from __future__ import annotations

import functools
import json
import os
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from tunecache.problem import identity
from tunecache.problem.configidentity import config_identity, make_config
from tunecache.problem.identity import canonical_key, problem_digest, source_hash
from tunecache.problem.target import Target, detect_target


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


def test_kernel_identity_is_the_name_and_the_hash_of_the_code(tmp_path):
    a = _load(tmp_path, "ia", KERNEL.format(pad=""))
    b = _load(tmp_path, "ib", KERNEL.format(pad="").replace("a + 1", "a + 2"))
    ia, ib = identity.kernel_identity(a.k), identity.kernel_identity(b.k)
    assert ia.name == "ia.k" and ib.name == "ib.k"
    assert ia.source_hash == source_hash(a.k) and len(ia.source_hash) == 64
    assert ib.source_hash != ia.source_hash  # the helper's body is in the hash
    assert not hasattr(ia, "triton_cache_key")  # Triton's memoised key is never read (issue 13.1)


HELPER_BELOW = """
import triton, triton.language as tl, tunecache
@tunecache.autotune(configs=[triton.Config({{"BLOCK": 16}}), triton.Config({{"BLOCK": 32}})], key=["N"])
@triton.jit
def k(x, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, helper(tl.load(x + offs)))
@triton.jit
def helper(a):
    return a * {factor}
"""

READ_KEYS = """
import importlib, json, os, sys
sys.path.insert(0, sys.argv[1])
mod = importlib.import_module(sys.argv[2])
k = mod.k
k.wait_for_prefetch()  # whatever the background prefetch does, it has done it
print(json.dumps({"triton_key": k.fn.cache_key, "ours": k.identity.source_hash, "type": type(k.fn).__name__}))
"""


def test_a_helper_below_the_kernel_is_in_both_keys_and_tritons_key_is_not_read_early(tmp_path):
    """Without the interpreter (a real JITFunction: no GPU needed until the launch): a helper
    defined BELOW the kernel must be in tunecache's hash and in Triton's own ``cache_key``, which
    Triton memoises at its first read: reading it while the module still imports freezes a key
    without the helper, and Triton's compile cache then serves the old binary."""
    import subprocess
    import sys

    (tmp_path / "read_keys.py").write_text(READ_KEYS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TUNECACHE_URL"] = f"sqlite:///{tmp_path / 's.sqlite3'}"
    got = {}
    for factor in (2, 3):
        (tmp_path / f"below{factor}.py").write_text(HELPER_BELOW.format(factor=factor))
        r = subprocess.run(
            [sys.executable, str(tmp_path / "read_keys.py"), str(tmp_path), f"below{factor}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        got[factor] = json.loads(r.stdout.strip().splitlines()[-1])
    assert got[2]["type"] == "JITFunction"
    assert got[2]["ours"] != got[3]["ours"]
    assert got[2]["triton_key"] != got[3]["triton_key"]


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
    assert make_config(data).all_kwargs() == a.all_kwargs()


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


# ---- issue 13.2: every input of the generated code is in the hash, one test per input ----------

PLAIN = """
import triton, triton.language as tl
{pre}
{deco}
@triton.jit{jit_args}
def k(x, N, BLOCK: tl.constexpr{extra_param}):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs){body})
"""


def _kernel(tmp_path, name, pre="", deco="", jit_args="", extra_param="", body=""):
    src = PLAIN.format(pre=pre, deco=deco, jit_args=jit_args, extra_param=extra_param, body=body)
    return _load(tmp_path, name, src).k


def test_heuristics_functions_are_in_the_hash(tmp_path):
    def h(n):
        return f'@triton.heuristics({{"EVEN": lambda a: a["N"] % {n} == 0}})'

    a = _kernel(tmp_path, "ha", deco=h(16), extra_param=", EVEN: tl.constexpr")
    b = _kernel(tmp_path, "hb", deco=h(32), extra_param=", EVEN: tl.constexpr")
    a2 = _kernel(tmp_path, "ha2", deco=h(16), extra_param=", EVEN: tl.constexpr")
    assert type(a).__name__ == "Heuristics"
    assert source_hash(a) != source_hash(b)
    assert source_hash(a) == source_hash(a2)


@pytest.mark.parametrize("option", ["do_not_specialize", "do_not_specialize_on_alignment"])
def test_jit_specialisation_options_are_in_the_hash(tmp_path, option):
    plain = _kernel(tmp_path, f"{option}_0")
    by_name = _kernel(tmp_path, f"{option}_1", jit_args=f'({option}=["N"])')
    by_index = _kernel(tmp_path, f"{option}_2", jit_args=f"({option}=[1])")
    assert source_hash(plain) != source_hash(by_name)
    assert source_hash(by_name) == source_hash(by_index)  # index 1 is N: the same kernel
    assert identity.code_inputs(plain) == {}  # kernels without the option keep their old hash


def test_dtype_and_scalar_globals_are_in_the_hash(tmp_path):
    f16 = _kernel(tmp_path, "d16", pre="DT = tl.float16", body=".to(DT).to(tl.float32)")
    f32 = _kernel(tmp_path, "d32", pre="DT = tl.bfloat16", body=".to(DT).to(tl.float32)")
    assert source_hash(f16) != source_hash(f32)
    # Other compile-time globals: a scalar (TRITON_ALLOW_NON_CONSTEXPR_GLOBALS) and a tuple.
    s2 = _kernel(tmp_path, "s2", pre="SCALE = 2", body=" * SCALE")
    s3 = _kernel(tmp_path, "s3", pre="SCALE = 3", body=" * SCALE")
    assert source_hash(s2) != source_hash(s3)
    t1 = _kernel(tmp_path, "t1", pre="SH = (1, 2)", body=" * SH[0]")
    t2 = _kernel(tmp_path, "t2", pre="SH = (4, 2)", body=" * SH[0]")
    assert source_hash(t1) != source_hash(t2)
    # A parameter that shadows a global of the same name does not read it.
    p1 = _kernel(tmp_path, "p1", pre="N = 1", body=" * N")
    p2 = _kernel(tmp_path, "p2", pre="N = 2", body=" * N")
    assert source_hash(p1) == source_hash(p2)


def test_defaults_bound_from_globals_are_in_the_hash(tmp_path):
    # The default is computed when `def` runs: only __defaults__ holds it (the dict is not an input).
    a = _kernel(tmp_path, "df16", pre='_D = {"w": 16}', extra_param=', W: tl.constexpr = _D["w"]')
    b = _kernel(tmp_path, "df32", pre='_D = {"w": 32}', extra_param=', W: tl.constexpr = _D["w"]')
    assert source_hash(a) != source_hash(b)
    lit = _kernel(tmp_path, "dflit", extra_param=", W: tl.constexpr = 16")
    assert "defaults=" not in "".join(identity.code_inputs(lit))  # literal defaults are in the source


def test_tritons_cache_invalidating_env_vars_are_in_the_hash(tmp_path, monkeypatch):
    k = _kernel(tmp_path, "env")
    base = source_hash(k)
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")
    with_env = source_hash(k)
    assert with_env != base
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert source_hash(k) not in (base, with_env)
    monkeypatch.setenv("TUNECACHE_SOMETHING_ELSE", "1")  # not Triton's: not in the key
    assert source_hash(k) == source_hash(k)
    # If Triton's private list moves, the fallback reads the same variables.
    import triton._C.libtriton as lib

    expected = identity.cache_invalidating_env()
    monkeypatch.delattr(lib, "get_cache_invalidating_env_vars")
    fallback = identity.cache_invalidating_env()
    assert set(fallback) == set(expected) == {"DISABLE_LLVM_OPT", "TRITON_DEFAULT_FP_FUSION"}


def test_config_ir_override_is_its_files_contents(tmp_path):
    ir_a, ir_b = tmp_path / "a.ttgir", tmp_path / "b.ttgir"
    ir_a.write_text("module { a }")
    ir_b.write_text("module { b }")
    plain = triton.Config({"X": 1})
    a = triton.Config({"X": 1}, ir_override=str(ir_a))
    b = triton.Config({"X": 1}, ir_override=str(ir_b))
    assert len({config_identity(c)[1] for c in (plain, a, b)}) == 3
    assert "ir_override" not in json.loads(config_identity(plain)[0])  # old hashes unchanged
    ir_b.write_text("module { a }")
    assert config_identity(b)[0].replace("b.ttgir", "a.ttgir") == config_identity(a)[0]


def _scale(nargs, factor, name="x"):
    return factor


def test_partial_pre_hooks_hash_their_function_and_arguments():
    p = functools.partial
    ids = [
        config_identity(triton.Config({"X": 1}, pre_hook=h))[1]
        for h in (p(_scale, factor=2), p(_scale, factor=3), p(_scale, 2), p(_scale, factor=2, name="y"))
    ]
    assert len(set(ids)) == 4
    assert config_identity(triton.Config({"X": 1}, pre_hook=p(_scale, factor=2)))[1] == ids[0]  # by value


def test_opaque_hooks_never_collide(caplog):
    """A partial bound to a tensor cannot be spelled out: its identity says so and is unique to the
    object in this process, so it is never served another process's timing."""
    t1, t2 = torch.ones(2), torch.ones(2)
    h1, h2 = functools.partial(_scale, t1), functools.partial(_scale, t2)
    i1 = json.loads(config_identity(triton.Config({"X": 1}, pre_hook=h1))[0])["pre_hook"]
    i2 = json.loads(config_identity(triton.Config({"X": 1}, pre_hook=h2))[0])["pre_hook"]
    assert "opaque" in i1 and i1 != i2
    assert str(os.getpid()) in i1
    assert json.loads(config_identity(triton.Config({"X": 1}, pre_hook=h1))[0])["pre_hook"] == i1  # stable


def test_closure_hooks_hash_their_cell_values():
    def make(v):
        def hook(nargs):
            return v

        return hook

    a, b, a2 = (config_identity(triton.Config({"X": 1}, pre_hook=make(v)))[1] for v in (1, 2, 1))
    assert a != b and a == a2


# ---- issue 25.3: the tuning key covers every input Triton's own cache_key covers -----------------
#
# Each case is a kernel using one kind of dependency that Triton's DependenciesFinder puts in
# ``JITFunction.cache_key`` and one edit of it. The expectation is read from Triton, not written
# here: where the edit changes Triton's key, it must change tunecache's source hash, unless the
# edit is cosmetic (comments, whitespace, position), which must keep the source hash equal.

_CONSTEXPR_FN = """
import triton, triton.language as tl

FACTOR = tl.constexpr(1)

@triton.constexpr_function
def inner(n):
    return n // 2 * FACTOR

@triton.constexpr_function
def half(n):
    # note
    return inner(n)

@triton.jit
def k(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, half(BLOCK))
    tl.store(x + offs, tl.load(x + offs))
"""

_AGGREGATE = """
import triton, triton.language as tl
from triton.language.core import _aggregate as aggregate

@aggregate
class Acc:
    total: tl.tensor
    SCALE: tl.constexpr

    @triton.constexpr_function
    def __init__(self, total, SCALE):
        self.total = total
        self.SCALE = tl.constexpr(SCALE)

    @triton.jit
    def add(self, x):
        # note
        return Acc(self.total + x * self.SCALE, self.SCALE)

@triton.jit
def k(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = Acc(tl.load(x + offs), 2)
    tl.store(x + offs, a.add(tl.load(x + offs)).total)
"""

_JIT_HELPER = """
import triton, triton.language as tl

BLOCK_G = tl.constexpr(16)

@triton.jit
def helper(a):
    # note
    return a + 1

@triton.jit
def k(x):
    offs = tl.arange(0, BLOCK_G)
    tl.store(x + offs, helper(tl.load(x + offs)))
"""

_HAS_CONSTEXPR_FN = hasattr(triton, "constexpr_function")
_HAS_AGGREGATE = hasattr(tl.core, "_aggregate")
_NO_CONSTEXPR_FN = f"Triton {triton.__version__} has no triton.constexpr_function"
_NO_AGGREGATE = f"Triton {triton.__version__} has no triton.language.core._aggregate"

# (id, source, old, new, cosmetic, needs constexpr_function, needs _aggregate)
_EDITS = [
    ("jit-helper-body", _JIT_HELPER, "a + 1", "a + 2", False, False, False),
    (
        "jit-helper-noinline",
        _JIT_HELPER,
        "@triton.jit\ndef helper",
        "@triton.jit(noinline=True)\ndef helper",
        False,
        False,
        False,
    ),
    ("constexpr-global", _JIT_HELPER, "tl.constexpr(16)", "tl.constexpr(32)", False, False, False),
    ("jit-helper-comment", _JIT_HELPER, "# note", "# another note", True, False, False),
    ("jit-helper-whitespace", _JIT_HELPER, "a + 1", "a  +  1", True, False, False),
    ("kernel-position", _JIT_HELPER, "\n@triton.jit\ndef k", "\n\n\n@triton.jit\ndef k", True, False, False),
    ("constexpr-function-body", _CONSTEXPR_FN, "return inner(n)", "return inner(2 * n)", False, True, False),
    ("constexpr-function-callee", _CONSTEXPR_FN, "n // 2", "n // 4", False, True, False),
    ("constexpr-function-global", _CONSTEXPR_FN, "tl.constexpr(1)", "tl.constexpr(2)", False, True, False),
    ("constexpr-function-comment", _CONSTEXPR_FN, "# note", "# another note", True, True, False),
    ("aggregate-method-body", _AGGREGATE, "x * self.SCALE", "x + self.SCALE", False, True, True),
    ("aggregate-init-body", _AGGREGATE, "tl.constexpr(SCALE)", "tl.constexpr(SCALE * 2)", False, True, True),
    (
        "aggregate-fields",
        _AGGREGATE,
        "SCALE: tl.constexpr\n",
        "SCALE: tl.constexpr\n    EXTRA: tl.constexpr\n",
        False,
        True,
        True,
    ),
    ("aggregate-method-comment", _AGGREGATE, "# note", "# another note", True, True, True),
    ("aggregate-method-whitespace", _AGGREGATE, "return Acc(self.total", "return  Acc( self.total", True, True, True),
]


def _compiled(tmp_path, monkeypatch, name, src):
    """The module's kernel as Triton's real JITFunction (its ``cache_key`` needs no GPU). Each
    version of a module has the same name in its own folder: Triton's key of a recursive
    dependency holds the module's name."""
    (tmp_path / name).mkdir()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    try:
        k = _load(tmp_path / name, "edited", src).k
    finally:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert type(k).__name__ == "JITFunction"
    return k


@pytest.mark.parametrize("case", _EDITS, ids=[c[0] for c in _EDITS])
def test_an_edit_that_changes_tritons_key_changes_the_source_hash(tmp_path, monkeypatch, case):
    name, src, old, new, cosmetic, needs_cfn, needs_agg = case
    if needs_cfn and not _HAS_CONSTEXPR_FN:
        pytest.skip(_NO_CONSTEXPR_FN)
    if needs_agg and not _HAS_AGGREGATE:
        pytest.skip(_NO_AGGREGATE)
    assert old in src
    mod = name.replace("-", "_")
    base = _compiled(tmp_path, monkeypatch, f"{mod}_a", src)
    same = _compiled(tmp_path, monkeypatch, f"{mod}_b", src)
    edited = _compiled(tmp_path, monkeypatch, f"{mod}_c", src.replace(old, new, 1))
    assert base.cache_key == same.cache_key and source_hash(base) == source_hash(same)  # stable
    if base.cache_key == edited.cache_key:
        pytest.skip(f"Triton {triton.__version__} does not put this edit in its cache_key")
    if cosmetic:
        assert source_hash(edited) == source_hash(base)
    else:
        assert source_hash(edited) != source_hash(base)


def test_the_edit_cases_cover_every_kind_of_dependency_triton_tracks(tmp_path, monkeypatch):
    """Every kind of value Triton's DependenciesFinder hashes (each ``JITCallable`` class of
    ``triton.runtime.jit``, aggregate classes, constexpr globals) appears in the cases above: a
    kind a later Triton adds fails here until a case (and the source hash) covers it."""
    import triton.runtime.jit as jit

    if not hasattr(jit, "JITCallable"):
        pytest.skip(f"Triton {triton.__version__} has no JITCallable: its only kind is JITFunction")
    seen: set[str] = set()
    record = jit.DependenciesFinder.record_reference

    def spy(self, val, var_dict=None, name=None):
        if getattr(val, "__triton_aggregate__", False):
            seen.add("aggregate")
        elif isinstance(val, jit.JITCallable):
            seen.add(type(val).__name__)
        elif type(val).__name__ == "constexpr" and var_dict is not None:
            seen.add("constexpr")
        return record(self, val, var_dict, name)

    monkeypatch.setattr(jit.DependenciesFinder, "record_reference", spy)
    sources = {c[1] for c in _EDITS if (_HAS_CONSTEXPR_FN or not c[5]) and (_HAS_AGGREGATE or not c[6])}
    for i, src in enumerate(sorted(sources)):
        _compiled(tmp_path, monkeypatch, f"kinds_{i}", src).cache_key  # noqa: B018
    kinds = {c.__name__ for c in vars(jit).values() if isinstance(c, type) and issubclass(c, jit.JITCallable)}
    # BoundConstexprFunction: Triton's own cache_key raises on it (it lacks used_global_vals).
    kinds -= {"JITCallable", "BoundConstexprFunction"}
    kinds |= {"constexpr"} | ({"aggregate"} if _HAS_AGGREGATE else set())
    assert kinds <= seen, f"kinds of dependency no case covers: {sorted(kinds - seen)}"


_AGGREGATE_PLAIN_INIT = """
import triton, triton.language as tl
from triton.language.core import _aggregate as aggregate

@aggregate
class Acc:
    total: tl.tensor

    def __init__(self, total):
        self.total = total

    @triton.jit
    def add(self, x):
        # note
        return Acc(self.total + x)

@triton.jit
def k(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, Acc(tl.load(x + offs)).add(1).total)
"""


@pytest.mark.skipif(not _HAS_AGGREGATE, reason=_NO_AGGREGATE)
def test_aggregates_are_in_the_hash_where_tritons_key_misses_them(tmp_path, monkeypatch):
    """Triton 3.4's cache_key leaves aggregates out, 3.6's their fields, and the interpreter
    drops their ``@jit`` methods: the source hash has all of them, in both modes alike."""
    src = _AGGREGATE_PLAIN_INIT
    base = _load(tmp_path, "agg_base", src).k
    assert type(base).__name__ == "InterpretedFunction"
    assert source_hash(_compiled(tmp_path, monkeypatch, "agg_jit", src)) == source_hash(base)
    edits = {
        "method": ("self.total + x", "self.total - x"),
        "init": ("self.total = total", "self.total = total * 2"),
        "fields": ("total: tl.tensor\n", "total: tl.tensor\n    count: tl.tensor\n"),
    }
    for name, (old, new) in edits.items():
        assert old in src
        assert source_hash(_load(tmp_path, f"agg_{name}", src.replace(old, new, 1)).k) != source_hash(base), name
    assert source_hash(_load(tmp_path, "agg_comment", src.replace("# note", "# other note")).k) == source_hash(base)
