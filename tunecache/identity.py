"""Identity: what makes a key.

A stored result is reusable exactly when the kernel, the machine it ran on and the problem are
the same. This module turns each of those into stable, portable strings:

* :func:`kernel_identity` hashes the kernel's source and the sources of the ``@jit`` functions it
  calls. The hash is over the parsed syntax tree, so comments, blank lines and the position of the
  kernel in its file do not change it (Triton's own ``cache_key`` includes the line number).
* :func:`detect_target` describes the device (arch, name, SM count, shared memory, driver...).
  It needs no pynvml and returns a CPU target on a machine without a GPU.
* :func:`canonical_key` and :func:`config_identity` serialise tuning keys and configs as
  canonical JSON; anything that cannot be serialised raises ``TypeError`` naming the argument.
* :func:`problem_digest` combines the three into the content address of a row.

What goes into the digest, and why (``DIGEST_TARGET_FIELDS``):

========================  ==========================================================
field                     why
========================  ==========================================================
source hash               different code, different timings (and maybe failures)
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
config is its own row, so adding a config benchmarks only that one).
"""

from __future__ import annotations

import ast
import ctypes
import functools
import hashlib
import inspect
import json
import math
import os
import platform
import socket
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import orjson

DIGEST_VERSION = 1

#: Target fields that enter the problem digest (see the module docstring for why).
DIGEST_TARGET_FIELDS = (
    "backend",
    "arch",
    "device_name",
    "sm_count",
    "max_shared_mem",
    "warp_size",
    "driver_version",
    "driver_release",
    "triton_version",
)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> str:
    """Sorted-key, compact JSON: the same value always gives the same bytes."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


# --------------------------------------------------------------------------------------------
# Kernel identity
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelIdentity:
    name: str  # module.qualname of the Python function
    source_hash: str  # portable: source + called @jit sources, normalised
    triton_cache_key: str | None  # Triton's own JITFunction.cache_key, kept for reference


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


def _referenced(fn: Any) -> dict[str, Any]:
    """Globals and closure values the function refers to by name or dotted name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return {}
    env = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                env[name] = cell.cell_contents
            except ValueError:
                pass
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


def source_hash(fn: Any) -> str:
    """Portable hash of a kernel and every ``@jit`` function it calls (transitively)."""
    return _source_hash(base_function(fn), frozenset())


def _source_hash(pyfn: Any, visiting: frozenset[int]) -> str:
    parts = [_normalised_source(pyfn)]
    visiting = visiting | {id(pyfn)}
    for name, obj in sorted(_referenced(pyfn).items()):
        if _is_jit_wrapper(obj):
            callee = obj.fn
            if id(callee) in visiting:
                parts.append(f"{name}=<recursive>")
            else:
                parts.append(f"{name}={_source_hash(callee, visiting)}")
        elif type(obj).__name__ == "constexpr" and hasattr(obj, "value"):
            # Module-level tl.constexpr globals change the generated code, as Triton knows too.
            parts.append(f"{name}=constexpr({obj.value!r})")
    return sha256_hex("\n".join(parts))


def kernel_identity(fn: Any) -> KernelIdentity:
    pyfn = base_function(fn)
    jit = fn
    while jit is not None and not _is_jit_wrapper(jit):
        jit = getattr(jit, "fn", None)
    cache_key = None
    if jit is not None:
        try:
            cache_key = getattr(jit, "cache_key", None)  # absent under the interpreter
        except Exception:  # noqa: BLE001 - Triton computes it lazily and may fail on odd globals
            cache_key = None
    return KernelIdentity(
        name=f"{pyfn.__module__}.{pyfn.__qualname__}",
        source_hash=source_hash(pyfn),
        triton_cache_key=cache_key if isinstance(cache_key, str) else None,
    )


# --------------------------------------------------------------------------------------------
# Target identity
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    backend: str  # cuda | hip | cpu (the interpreter)
    arch: str  # sm90, gfx942, interpreter
    device_name: str
    sm_count: int
    max_shared_mem: int
    warp_size: int
    driver_version: str  # numeric, e.g. "13000" from cuDriverGetVersion
    driver_release: str  # e.g. "580.159.04" from /proc/driver/nvidia/version
    cuda_runtime: str
    triton_version: str  # major.minor

    def digest_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DIGEST_TARGET_FIELDS}

    @functools.cached_property
    def digest(self) -> str:
        """Hash of the timing-relevant fields: problems of one kernel on one target share it."""
        return sha256_hex(canonical_json({"v": DIGEST_VERSION, **self.digest_fields()}))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TARGET_FIELDS = tuple(f.name for f in fields(Target))


def _triton_minor() -> str:
    try:
        import triton

        parts = triton.__version__.split(".")
        return ".".join(parts[:2])
    except Exception:  # noqa: BLE001 - no Triton: still describe the machine
        return "none"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _cuda_driver_version() -> str:
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return str(v.value)
    return ""


def _nvidia_release() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return ""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..."
    for tok in text.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _apply_override(t: Target) -> Target:
    """``TUNECACHE_TARGET_OVERRIDE`` (a JSON object) replaces detected fields.

    For simulations and tests (e.g. "what does a driver upgrade miss?"), never for production.
    """
    raw = os.environ.get("TUNECACHE_TARGET_OVERRIDE")
    if not raw:
        return t
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"TUNECACHE_TARGET_OVERRIDE is not valid JSON: {e}") from None
    unknown = set(data) - set(TARGET_FIELDS) if isinstance(data, dict) else {"<not an object>"}
    if unknown:
        raise ValueError(f"TUNECACHE_TARGET_OVERRIDE has unknown fields {sorted(unknown)}; known: {TARGET_FIELDS}")
    return replace(t, **{k: type(getattr(t, k))(v) for k, v in data.items()})


def detect_target(device: int | None = None) -> Target:
    """Describe the device tuning runs on; a CPU target under the interpreter or without a GPU."""
    return _apply_override(_detect(device, interpreting()))


@functools.lru_cache(maxsize=16)
def _detect(device: int | None, interp: bool) -> Target:
    triton_version = _triton_minor()
    torch = None
    if not interp:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    if torch is not None and torch.cuda.is_available():
        dev = torch.cuda.current_device() if device is None else device
        props = torch.cuda.get_device_properties(dev)
        hip = getattr(torch.version, "hip", None)
        max_smem = 0
        try:
            from triton.runtime.driver import driver

            max_smem = int(driver.active.utils.get_device_properties(dev)["max_shared_mem"])
        except Exception:  # noqa: BLE001 - fall back to torch's (non opt-in) figure
            max_smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
        if hip:
            return Target(
                backend="hip",
                arch=str(getattr(props, "gcnArchName", "gfx")).split(":")[0],
                device_name=props.name,
                sm_count=int(props.multi_processor_count),
                max_shared_mem=max_smem,
                warp_size=int(getattr(props, "warp_size", 64) or 64),
                driver_version=str(hip),
                driver_release="",
                cuda_runtime=str(hip),
                triton_version=triton_version,
            )
        return Target(
            backend="cuda",
            arch=f"sm{props.major}{props.minor}",
            device_name=props.name,
            sm_count=int(props.multi_processor_count),
            max_shared_mem=max_smem,
            warp_size=int(getattr(props, "warp_size", 32) or 32),
            driver_version=_cuda_driver_version(),
            driver_release=_nvidia_release(),
            cuda_runtime=str(torch.version.cuda or ""),
            triton_version=triton_version,
        )
    return Target(
        backend="cpu",
        arch="interpreter",
        device_name=_cpu_name(),
        sm_count=os.cpu_count() or 1,
        max_shared_mem=0,
        warp_size=1,
        driver_version="",
        driver_release="",
        cuda_runtime="",
        triton_version=triton_version,
    )


def hostname() -> str:
    return os.environ.get("TUNECACHE_HOST_ID") or socket.gethostname()


# --------------------------------------------------------------------------------------------
# Tuning key and config identity
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
    """Canonical JSON list of (name, value) pairs; raises TypeError naming a bad argument."""
    if len(names) != len(values):
        raise ValueError("names and values of a tuning key differ in length")
    return canonical_json([[n, _key_value(n, v)] for n, v in zip(names, values)])


def hook_identity(hook: Any) -> str | None:
    """A config ``pre_hook`` enters the config's identity as its qualified name and source hash.

    Editing the hook's body therefore re-tunes the configs that use it; renaming it does too.
    """
    if hook is None:
        return None
    fn = getattr(hook, "__func__", hook)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        body = sha256_hex(textwrap.dedent(inspect.getsource(fn)))[:16]
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        body = sha256_hex(code.co_code)[:16] if code is not None else "opaque"
    return f"{name}:{body}"


CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def config_dict(config: Any) -> dict[str, Any]:
    """A Triton Config as plain data: kwargs plus launch options and the pre_hook identity."""
    kwargs = {}
    for k, v in config.kwargs.items():
        if not isinstance(v, (bool, int, float, str)) and v is not None:
            raise TypeError(f"config kwarg {k!r} has type {type(v).__name__}; configs must hold scalars")
        kwargs[k] = v
    out: dict[str, Any] = {"kwargs": kwargs}
    for f in CONFIG_FIELDS:
        out[f] = getattr(config, f, None)
    out["pre_hook"] = hook_identity(getattr(config, "pre_hook", None))
    return out


def config_hash_of(data: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(dict(data)))[:32]


def config_identity(config: Any) -> tuple[str, str]:
    """(canonical JSON, hash) of a Triton Config."""
    d = config_dict(config)
    return canonical_json(d), config_hash_of(d)


def make_config(data: Mapping[str, Any]) -> Any:
    """Rebuild a ``triton.Config`` from stored data (without its pre_hook, which is code)."""
    from triton import Config

    opts = {f: data.get(f) for f in CONFIG_FIELDS if data.get(f) is not None}
    return Config(dict(data.get("kwargs", {})), **opts)


def search_space_hash(config_hashes: Sequence[str]) -> str:
    return sha256_hex(",".join(sorted(config_hashes)))


def problem_digest(source: str, target: Target, key_json: str) -> str:
    """The content address of one tuning problem."""
    return sha256_hex(
        canonical_json({"v": DIGEST_VERSION, "source": source, "target": target.digest_fields(), "key": key_json})
    )
