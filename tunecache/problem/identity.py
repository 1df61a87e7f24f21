"""Identity: what makes a key.

A stored result is reusable exactly when the kernel, the machine it ran on and the problem are
the same. This module turns each of those into stable, portable strings:

* :func:`kernel_identity` hashes the kernel's source and the sources of the ``@jit`` functions,
  constexpr functions and aggregate classes it uses. The hash is over the parsed syntax tree, so
  comments, blank lines and the position of the kernel in its file do not change it (Triton's own
  ``cache_key`` includes the line number).
* :func:`tunecache.problem.target.detect_target` describes the device (arch, name, SM count, shared
  memory, driver...); its fields that enter the digest are ``target.DIGEST_TARGET_FIELDS``.
* :func:`canonical_key` and :func:`tunecache.problem.configidentity.config_identity` serialise tuning keys
  and configs as canonical JSON; anything that cannot be serialised raises ``TypeError`` naming
  the argument.
* :func:`problem_digest` combines the three into the content address of a row.

What goes into the digest, and why:

========================  ==========================================================
field                     why
========================  ==========================================================
source hash               different code, different timings (and maybe failures). It covers
                          every input of the generated code that is not a launch
                          argument: the kernel's and its called ``@jit`` functions'
                          source, the user's ``@triton.constexpr_function``s and
                          aggregate classes (fields and methods) they use (every
                          kind Triton's ``cache_key`` hashes; tests/test_identity.py
                          checks each against it), the globals they read as
                          compile-time values (``tl.constexpr``, ``tl.dtype``,
                          scalars, tuples), default
                          values bound from globals, ``@triton.jit`` options
                          (``do_not_specialize``, ``..._on_alignment``, ``debug``,
                          ``noinline``), ``@triton.heuristics`` functions (their values
                          are constexprs), and the environment variables Triton itself
                          puts in its compile-cache key (``DISABLE_LLVM_OPT``,
                          ``TRITON_DEFAULT_FP_FUSION``...: they change the binary, so
                          they change timings; see :func:`code_inputs`). Inputs that
                          are absent leave the hash as it was before they were hashed.
backend, arch             different instruction set and code generation
device name, SM count     H100 and H200 share an arch but not bandwidth or SM count
max shared memory         decides which configs fail with OutOfResources
warp size                 changes what num_warps means
driver version + release  the driver's JIT and scheduling change timings; an upgrade
                          must miss (and ``TUNECACHE_ON_DRIVER_CHANGE`` says how much
                          to re-check)
Triton major.minor        a Triton release changes the generated code; patch builds
                          and local rebuilds do not, so the key is portable across them
tuning key                the problem size (batch bucket, dtypes...)
========================  ==========================================================

Not in the digest: hostname (every host of a fleet must share results), CUDA runtime version
(Triton ships its own ptxas; the runtime does not touch Triton kernels), the config list (each
config is its own row, so adding a config benchmarks only that one). A config's own identity
(:mod:`tunecache.problem.configidentity`) holds its kwargs, launch options, ``pre_hook``
(:func:`callable_identity`) and ``ir_override`` (the IR file's contents).

When: a kernel's identity is computed no earlier than its first launch, or once its module provably
finished importing (:func:`module_imported`): a ``@jit`` helper defined below the kernel does not
exist while the module body runs. Triton's own ``JITFunction.cache_key`` is never read: Triton
memoises it at the first read, so an early read would make Triton's compile cache serve a binary
built without the helper.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import logging
import math
import os
import sys
import textwrap
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

DIGEST_VERSION = 1


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> str:
    """Sorted-key, compact JSON: the same value always gives the same bytes.

    >>> canonical_json({"b": 1, "a": [1, 2]})
    '{"a":[1,2],"b":1}'
    """
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


# --------------------------------------------------------------------------------------------
# Kernel identity
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelIdentity:
    name: str  # module.qualname of the Python function
    source_hash: str  # portable: source + called @jit sources + the other inputs of the code, normalised


def wrappers(fn: Any) -> Iterator[Any]:
    """``fn``, then each object it wraps (Autotuner, Heuristics, JITFunction, InterpretedFunction),
    down to the Python function, which comes last."""
    obj = fn
    for _ in range(17):
        yield obj
        if inspect.isfunction(obj):
            return
        obj = getattr(obj, "fn", None) or getattr(obj, "base_fn", None)  # Autotuner.base_fn skips the JITFunction
        if obj is None:
            break
    raise TypeError(f"cannot find the Python function inside {fn!r}")


def base_function(fn: Any) -> Any:
    """Unwrap Autotuner / Heuristics / JITFunction / InterpretedFunction to the Python function."""
    *_, last = wrappers(fn)
    return last


def _is_jit_wrapper(obj: Any) -> bool:
    """True for Triton's JITFunction and, under TRITON_INTERPRET=1, InterpretedFunction."""
    cls_names = {c.__name__ for c in type(obj).__mro__}
    return bool(cls_names & {"JITFunction", "InterpretedFunction"}) and inspect.isfunction(getattr(obj, "fn", None))


def _normalised_source(fn: Any) -> str:
    """The function from ``def`` on, as a syntax-tree dump: no comments, no line numbers.

    Decorators are dropped on purpose: the config list lives in ``@autotune(...)`` and each config
    is its own row, so adding one must not change the kernel's identity.
    """
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        code = fn.__code__
        return sha256_hex(code.co_code + repr(code.co_consts).encode())
    tree = ast.parse(src)
    node = tree.body[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _referenced(fn: Any, tree: ast.AST | None = None) -> dict[str, Any]:
    """Globals and closure values the function refers to by name or dotted name."""
    if tree is None:
        tree = _parse(fn)
    if tree is None:
        return {}
    env = _env_of(fn)
    out: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in env:
            out[node.id] = env[node.id]
        elif isinstance(node, ast.Attribute):
            parts = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in env:
                obj = env[cur.id]
                for attr in reversed(parts):
                    obj = getattr(obj, attr, None)
                    if obj is None:
                        break
                if obj is not None:
                    out[".".join([cur.id, *reversed(parts)])] = obj
    return out


def _parse(fn: Any) -> ast.Module | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _env_of(fn: Any) -> dict[str, Any]:
    env = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                env[name] = cell.cell_contents
            except ValueError:
                pass
    return env


def _local_names(tree: ast.AST) -> set[str]:
    """Parameters and assigned names: a global of the same name is shadowed, not read."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
    return out


# Modules whose attributes are fixed by the library version (which is in the digest): ``tl.float16``
# is spelled out in the source already.
_FIXED_MODULES = frozenset({"triton", "math", "torch", "numpy", "builtins"})


def _is_dtype(obj: Any) -> bool:
    mod = type(obj).__module__
    return (mod.startswith("triton") or mod.startswith("torch")) and any(
        c.__name__ == "dtype" for c in type(obj).__mro__
    )


def _token(v: Any) -> str | None:
    """A deterministic spelling of a value that can change generated code; None if there is none."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    if type(v).__name__ == "constexpr" and hasattr(v, "value"):
        inner = _token(v.value)
        return None if inner is None else f"constexpr({inner})"
    if _is_dtype(v):
        return f"dtype({v})"
    if isinstance(v, (tuple, list)):
        items = [_token(x) for x in v]
        return None if None in items else f"{type(v).__name__}({','.join(items)})"
    return None


def _code_input(name: str, obj: Any, env: Mapping[str, Any], local: set[str]) -> str | None:
    """The token of a global the kernel reads as a compile-time value (a ``tl.dtype``, a scalar,
    a tuple of them), or None: functions, modules and shadowed names are not inputs."""
    root = name.split(".", 1)[0]
    if root in local:
        return None
    if "." in name:
        base = env.get(root)
        if inspect.ismodule(base) and base.__name__.split(".", 1)[0] in _FIXED_MODULES:
            return None
    if _is_dtype(obj) or isinstance(obj, (bool, int, float, str, tuple)):
        return _token(obj)
    return None


def _defaults(pyfn: Any, node: ast.AST) -> str | None:
    """Default values bound at ``def`` time (``BLOCK: tl.constexpr = DEFAULT``), when any default is
    not a literal already in the source."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    nodes = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    if all(isinstance(d, ast.Constant) for d in nodes):
        return None
    pos = [_token(v) or f"<{type(v).__qualname__}>" for v in (pyfn.__defaults__ or ())]
    kw = {k: _token(v) or f"<{type(v).__qualname__}>" for k, v in sorted((pyfn.__kwdefaults__ or {}).items())}
    return "defaults=" + canonical_json([pos, kw])


def source_hash(fn: Any) -> str:
    """Portable hash of a kernel, every ``@jit`` function, ``@triton.constexpr_function`` and aggregate
    class (``triton.language.core._aggregate``) it uses (transitively) and every other
    input of its generated code that is not a launch argument (see :func:`code_inputs`)."""
    base = _source_hash(base_function(fn), frozenset())
    extra = code_inputs(fn)
    return sha256_hex(base + "\n" + canonical_json(extra)) if extra else base


def _source_hash(pyfn: Any, visiting: frozenset[int]) -> str:
    parts = [_normalised_source(pyfn)]
    visiting = visiting | {id(pyfn)}
    tree = _parse(pyfn)
    extra: list[str] = []
    for name, obj in sorted(_referenced(pyfn, tree).items()):
        if _is_jit_wrapper(obj):
            callee = obj.fn
            if id(callee) in visiting:
                parts.append(f"{name}=<recursive>")
            else:
                parts.append(f"{name}={_source_hash(callee, visiting)}")
                opts = jit_options(obj, kernel=False)  # noinline / debug change the caller's code
                if opts:
                    extra.append(f"{name}.options={canonical_json(opts)}")
        elif type(obj).__name__ == "constexpr" and hasattr(obj, "value"):
            # Module-level tl.constexpr globals change the generated code, as Triton knows too.
            parts.append(f"{name}=constexpr({obj.value!r})")
        elif (cfn := _constexpr_function(obj)) is not None:
            parts.append(f"{name}=constexpr_function:{_callee_hash(cfn, visiting)}")
        elif _is_aggregate(obj):
            parts.append(f"{name}=aggregate:{_aggregate_hash(obj, visiting)}")
    if tree is not None and tree.body:
        node = tree.body[0]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []  # the config list is not the kernel's code
        env, local = _env_of(pyfn), _local_names(node)
        for name, obj in sorted(_referenced(pyfn, tree).items()):
            tok = _code_input(name, obj, env, local)
            if tok is not None:
                extra.append(f"{name}={tok}")
        d = _defaults(pyfn, node)
        if d:
            extra.append(d)
    # Kernels without these inputs keep the hash they had before they were hashed.
    return sha256_hex("\n".join(parts + (["--", *extra] if extra else [])))


def _callee_hash(pyfn: Any, visiting: frozenset[int]) -> str:
    return "<recursive>" if id(pyfn) in visiting else _source_hash(pyfn, visiting)


def _user_code(pyfn: Any) -> bool:
    """False for code of a fixed module (Triton's own helpers): the Triton version in the digest
    covers it, and leaving it out keeps the hash of kernels that call it as it was."""
    return (getattr(pyfn, "__module__", None) or "").split(".", 1)[0] not in _FIXED_MODULES


def _constexpr_function(obj: Any) -> Any | None:
    """The Python function of a user's ``@triton.constexpr_function`` (Triton 3.5+), bound or not:
    it runs at compile time, so its body is code of the kernel, as in Triton's ``cache_key``."""
    names = {c.__name__ for c in type(obj).__mro__}
    if "BoundConstexprFunction" in names:
        obj = getattr(obj, "__func__", None)
        names = {c.__name__ for c in type(obj).__mro__}
    fn = getattr(obj, "fn", None)
    if "ConstexprFunction" in names and inspect.isfunction(fn) and _user_code(fn):
        return fn
    return None


def _is_aggregate(obj: Any) -> bool:
    """A user's ``@triton.language.core._aggregate`` class (Triton's ``__triton_aggregate__``)."""
    try:
        return isinstance(obj, type) and getattr(obj, "__triton_aggregate__", False) is True and _user_code(obj)
    except Exception:  # noqa: BLE001 - an object whose attribute lookup fails is no aggregate
        return False


def _type_name(t: Any) -> str:
    return f"{t.__module__}.{t.__qualname__}" if isinstance(t, type) else repr(t)


def _wrapped_class(cls: type) -> type | None:
    """The class ``_aggregate`` decorated: its wrapper's methods hold it in their closures (Triton
    3.4-3.9). Its ``__dict__`` has every method, also those Triton leaves off the wrapper (the
    interpreter's ``@jit`` methods) and off ``hash_attrs`` (3.4 has none)."""
    for attr in vars(cls).values():
        fn = getattr(attr, "__func__", None) or getattr(attr, "fget", None) or attr
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, type) and v is not cls and v.__qualname__ == cls.__qualname__:
                return v
    return None


def _aggregate_hash(cls: type, visiting: frozenset[int]) -> str:
    """An aggregate's fields (names, types, defaults) and the code of its methods: what Triton's
    ``cache_key`` hashes of it (``__annotations__`` and ``hash_attrs``), comments left out, and
    what some Triton versions leave out of it (3.4: all of it; before 3.9: the fields)."""
    if id(cls) in visiting:
        return "<recursive>"
    visiting = visiting | {id(cls)}
    orig = _wrapped_class(cls)
    ann = cls.__dict__.get("__annotations__") or getattr(orig, "__annotations__", None) or {}
    fields = {k: _type_name(v) for k, v in ann.items()}
    defaults = {
        k: _token(v) or f"<{type(v).__qualname__}>" for k, v in getattr(cls, "__aggregate_defaults__", {}).items()
    }
    parts = [canonical_json({"fields": fields, "defaults": defaults})]
    members = [*getattr(cls, "hash_attrs", ()), *(vars(orig).values() if orig is not None else ())]
    methods: dict[int, str] = {}
    for member in members:
        opts: dict[str, Any] = {}
        if _is_jit_wrapper(member):
            opts = jit_options(member, kernel=False)
            pyfn = member.fn
        else:
            pyfn = _constexpr_function(member) or getattr(member, "__func__", member)  # staticmethod too
        if not inspect.isfunction(pyfn) or getattr(pyfn, "__triton_builtin__", False) or not _user_code(pyfn):
            continue  # Triton's generated __init__ (its fields are hashed above), attributes
        entry = f"{pyfn.__qualname__}={_callee_hash(pyfn, visiting)}"
        methods[id(pyfn)] = entry + (f";options={canonical_json(opts)}" if opts else "")
    return sha256_hex("\n".join(parts + sorted(methods.values())))


def jit_options(jit: Any, *, kernel: bool = True) -> dict[str, Any]:
    """The ``@triton.jit(...)`` options that change generated code, where they differ from the
    default: ``do_not_specialize``/``..._on_alignment`` (of the launched kernel; as parameter
    names), ``debug`` and ``noinline``. Read from a JITFunction or an InterpretedFunction."""
    src: Mapping[str, Any]
    if type(jit).__name__ == "InterpretedFunction":
        src = getattr(jit, "kwargs", None) or getattr(getattr(jit, "rewriter", None), "kwargs", None) or {}
    else:
        src = {
            k: getattr(jit, k, None)
            for k in ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline")
        }
    out: dict[str, Any] = {}
    if kernel:
        try:
            params = list(inspect.signature(jit.fn).parameters)
        except (TypeError, ValueError, AttributeError):
            params = []
        for k in ("do_not_specialize", "do_not_specialize_on_alignment"):
            v = src.get(k)
            if v:
                names = {params[x] if isinstance(x, int) and 0 <= x < len(params) else str(x) for x in v}
                out[k] = sorted(names)
    for k in ("debug", "noinline"):
        if src.get(k) is not None:
            out[k] = bool(src[k])
    return out


def code_inputs(fn: Any) -> dict[str, Any]:
    """Inputs of the generated code outside the kernel's source, present only where set:

    * ``jit``: :func:`jit_options` of the launched ``@jit`` function;
    * ``heuristics``: the identity (:func:`callable_identity`) of each ``@triton.heuristics``
      function between the autotuner and the kernel: their values are constexprs of the kernel;
    * ``env``: the environment variables Triton itself puts in its compile-cache key
      (:func:`cache_invalidating_env`).
    """
    out: dict[str, Any] = {}
    for obj in wrappers(fn):
        if _is_jit_wrapper(obj):
            opts = jit_options(obj)
            if opts:
                out["jit"] = opts
        elif type(obj).__name__ == "Heuristics" and isinstance(getattr(obj, "values", None), Mapping):
            out.setdefault("heuristics", []).append(
                {k: callable_identity(v, module=False) for k, v in sorted(obj.values.items())}
            )
    env = cache_invalidating_env()
    if env:
        out["env"] = env
    return out


# Triton 3.4-3.9 list these in C++ (``get_cache_invalidating_env_vars``); the fallback if that
# private name moves is the list read from those versions.
CACHE_INVALIDATING_ENV_FALLBACK = (
    "AMDGCN_ENABLE_DUMP",
    "DISABLE_LLVM_OPT",
    "DISABLE_MMA_V3",
    "DISABLE_PTXAS_OPT",
    "LLVM_IR_ENABLE_DUMP",
    "MLIR_ENABLE_DIAGNOSTICS",
    "NVPTX_ENABLE_DUMP",
    "TRITON_DEFAULT_FP_FUSION",
    "TRITON_DISABLE_LINE_INFO",
    "TRITON_ENABLE_LLVM_DEBUG",
    "TRITON_F32_DEFAULT",
    "TRITON_LLVM_DEBUG_ONLY",
    "USE_IR_LOC",
)


def cache_invalidating_env() -> dict[str, str]:
    """The environment variables that Triton puts in its own compile-cache key, those set only."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return {str(k): str(v) for k, v in sorted(get_cache_invalidating_env_vars().items())}
    except Exception:  # noqa: BLE001 - moved or renamed in another Triton: read the known list
        return {k: os.environ[k] for k in CACHE_INVALIDATING_ENV_FALLBACK if k in os.environ}


def kernel_identity(fn: Any) -> KernelIdentity:
    """Name and source hash of a kernel. Call it no earlier than the first launch (or once the
    kernel's module finished importing, see :func:`module_imported`): a ``@jit`` helper defined
    below the kernel does not exist before. Never reads Triton's ``JITFunction.cache_key``, which
    Triton memoises at its first read."""
    pyfn = base_function(fn)
    return KernelIdentity(name=kernel_name(pyfn), source_hash=source_hash(fn))


def kernel_name(fn: Any) -> str:
    """``module.qualname`` of the kernel's Python function: known at decoration, no parsing."""
    pyfn = base_function(fn)
    return f"{pyfn.__module__}.{pyfn.__qualname__}"


def module_imported(fn: Any) -> bool:
    """True only where it is provable that the module defining ``fn`` finished executing, so
    every global the kernel may call exists: the module is in ``sys.modules`` with ``fn``'s globals
    and its import machinery says it is no longer initialising (CPython sets
    ``__spec__._initializing`` around the module body). ``__main__``, a module run by hand
    (``exec_module`` without the import system) or a closure cell still empty: not provable."""
    pyfn = base_function(fn)
    mod = sys.modules.get(getattr(pyfn, "__module__", None) or "")
    if mod is None or mod.__name__ == "__main__" or getattr(mod, "__dict__", None) is not pyfn.__globals__:
        return False
    spec = getattr(mod, "__spec__", None)
    if spec is None or getattr(spec, "_initializing", True) is not False:
        return False
    for cell in pyfn.__closure__ or ():
        try:
            cell.cell_contents  # noqa: B018
        except ValueError:  # a helper defined later in the enclosing function
            return False
    return True


# --------------------------------------------------------------------------------------------
# Tuning key and hook identity (a config's own: tunecache.problem.configidentity)
# --------------------------------------------------------------------------------------------


def _key_value(name: str, value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"tuning key argument {name!r} is {value!r}: non-finite floats cannot be stored")
        return value
    mod = type(value).__module__
    if mod.startswith("torch") and type(value).__name__ == "dtype":
        return str(value)
    if mod.startswith("triton") and hasattr(value, "name") and "dtype" in type(value).__name__:
        return str(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return _key_value(name, value.item())
    raise TypeError(
        f"tuning key argument {name!r} has type {type(value).__name__}; tunecache stores ints, floats, "
        "bools, strings and dtypes. Remove it from `key=` or pass a scalar derived from it."
    )


def canonical_key(names: Sequence[str], values: Sequence[Any]) -> str:
    """Canonical JSON list of (name, value) pairs; raises TypeError naming a bad argument.

    >>> canonical_key(["B", "causal"], [8, True])
    '[["B",8],["causal",true]]'
    >>> canonical_key(["x"], [[1, 2]])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: tuning key argument 'x' has type list; tunecache stores ints, floats, bools, strings ...
    """
    if len(names) != len(values):
        raise ValueError("names and values of a tuning key differ in length")
    return canonical_json([[n, _key_value(n, v)] for n, v in zip(names, values)])


def hook_identity(hook: Any) -> str | None:
    """A config ``pre_hook`` enters the config's identity as :func:`callable_identity`.

    Editing the hook's body therefore re-tunes the configs that use it; renaming it does too.
    """
    return None if hook is None else callable_identity(hook)


def callable_identity(fn: Any, *, module: bool = True) -> str:
    """A function's qualified name and source hash, and what it was bound to: a
    ``functools.partial``'s function and arguments, a closure's cell values.

    Values without a deterministic spelling (tensors, arbitrary objects, callables without code)
    make the identity *opaque*: ``name:opaque:<process nonce>:<pid>:<n>``, unique to this object
    in this process. A config (or kernel) holding such a hook is then never shared between
    processes: it is benchmarked in each, never served another process's timing for a hook that
    may do something else. Two opaque hooks never collide. ``module=False`` leaves the module's
    name out (the kernel's own hash does not depend on where it is defined either).
    """
    return _callable_identity(fn, 0, module)


_log = logging.getLogger("tunecache")
_NONCE = uuid.uuid4().hex[:12]
_opaque_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_opaque_warned: set[str] = set()


def _callable_identity(fn: Any, depth: int, module: bool = True) -> str:
    fn = getattr(fn, "__func__", fn)  # a bound method: its function (the instance is not hashed)
    if isinstance(fn, functools.partial):
        args = [_bound_token(a, depth) for a in fn.args]
        kw = {k: _bound_token(v, depth) for k, v in sorted(fn.keywords.items())}
        if depth > 8 or None in args or None in kw.values():
            return _opaque(fn, "functools.partial")
        return f"functools.partial({_callable_identity(fn.func, depth + 1, module)},{canonical_json([args, kw])})"
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if module:
        name = f"{getattr(fn, '__module__', '?')}.{name}"
    try:
        body = sha256_hex(textwrap.dedent(inspect.getsource(fn)))[:16]
    except Exception:  # noqa: BLE001 - no source (OSError, TypeError) or a lambda inspect cannot cut out
        code = getattr(fn, "__code__", None)
        if code is None:
            return _opaque(fn, name)
        body = sha256_hex(code.co_code)[:16]
    cells = getattr(fn, "__closure__", None)
    if not cells:
        return f"{name}:{body}"
    vals = []
    for cell in cells:
        try:
            v = cell.cell_contents
        except ValueError:
            v = None
        tok = _bound_token(v, depth)
        if tok is None or depth > 8:
            return _opaque(fn, name)
        vals.append(tok)
    return f"{name}:{body}:closure={sha256_hex(canonical_json(vals))[:16]}"


def _bound_token(v: Any, depth: int) -> str | None:
    """A value a hook is bound to (a partial's argument, a closure cell): spelled out, or None."""
    tok = _token(v)
    if tok is not None:
        return tok
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        items = {k: _bound_token(x, depth) for k, x in sorted(v.items())}
        return None if None in items.values() else canonical_json(items)
    if inspect.ismodule(v):
        return f"module({v.__name__})"
    if isinstance(v, type):
        return f"class({v.__module__}.{v.__qualname__})"
    if inspect.isfunction(v) or inspect.ismethod(v) or isinstance(v, functools.partial):
        return _callable_identity(v, depth + 1)
    return None


def _opaque(fn: Any, name: str) -> str:
    try:
        n = _opaque_ids.get(fn)
        if n is None:
            n = _opaque_ids[fn] = len(_opaque_ids) + 1
        tag = str(n)
    except TypeError:  # not weakly referenceable: its id, unique while the config holding it lives
        tag = f"id{id(fn):x}"
    if name not in _opaque_warned:
        _opaque_warned.add(name)
        _log.warning(
            "tunecache: %s has no identity that other processes can check (a partial or closure over "
            "objects, or no source); configs or kernels using it are benchmarked in each process. "
            "Bind it to scalars, or use a plain function, to share its results.",
            name,
        )
    return f"{name}:opaque:{_NONCE}:{os.getpid()}:{tag}"


class DigestTarget(Protocol):
    """What a problem's digest needs of its target (a :class:`tunecache.problem.target.Target`), named here
    so that identity, which the target module uses, does not import it back."""

    def digest_fields(self) -> dict[str, Any]: ...


def problem_digest(source: str, target: DigestTarget, key_json: str) -> str:
    """The content address of one tuning problem."""
    return sha256_hex(
        canonical_json({"v": DIGEST_VERSION, "source": source, "target": target.digest_fields(), "key": key_json})
    )
