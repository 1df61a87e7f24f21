"""Preload: load the stored winners' binaries while the server loads its weights.

A warm restart resolves every tuning key from the store without a benchmark, but Triton still
prepares each distinct binary at its first launch: it looks the kernel up in its cache, reads the
cubin and its metadata, loads it into the CUDA context and sets up its launcher. On the H200 that
is most of what a restart of 36 buckets spends before it is ready, and a tuned kernel has more
distinct binaries than one fixed config.

So the tuning process records, for every winner, the specialisation Triton compiled it with (the
exact data ``JITFunction.preload`` takes, written by Triton's own serialiser), and a restart hands
those to ``JITFunction.preload`` on a background thread as soon as CUDA is initialised, before the
first launch. A preloaded kernel sits in Triton's own per-device kernel cache under the same key a
launch computes, so the launch path does not change at all: it finds the kernel instead of
loading it.

Everything here is best effort: a specialisation that no longer applies (another Triton build, a
changed kernel) is skipped, never launched; the launch then loads the kernel as it always did.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import inspect
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tunecache import tritoncompat
from tunecache.identity import wrappers
from tunecache.model import LaunchSpec

log = logging.getLogger("tunecache")


def triton_version() -> str:
    import triton

    return str(triton.__version__)


def jit_function(fn: Any) -> Any | None:
    """The JITFunction under Autotuner/Heuristics wrappers; None under the interpreter."""
    return next((w for w in wrappers(fn) if hasattr(w, "device_caches") and hasattr(w, "preload")), None)


def _compiled(jf: Any) -> Iterator[tuple[str, Any, Any]]:
    """(cache key, CompiledKernel, backend) for every kernel Triton holds for ``jf``, all devices."""
    for entry in list(jf.device_caches.values()):
        kernel_cache, backend = entry[0], entry[-2]
        for key, kernel in list(kernel_cache.items()):
            if isinstance(key, str) and hasattr(kernel, "src") and hasattr(kernel, "metadata"):
                yield key, kernel, backend


def _matches(jf: Any, kernel: Any, config: Any) -> bool:
    """Was ``kernel`` compiled with ``config``: its meta-parameters and its launch options."""
    names = jf.arg_names
    consts = {}
    for path, v in kernel.src.constants.items():
        if isinstance(path, tuple) and len(path) == 1 and path[0] < len(names):
            consts[names[path[0]]] = getattr(v, "value", v)
    for k, v in config.kwargs.items():
        if k not in consts or consts[k] != v:
            return False
    md = kernel.metadata
    for opt in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        want = getattr(config, opt, None)
        if want is not None and getattr(md, opt, want) != want:
            return False
    return True


def _serialize(jf: Any, key: str, kernel: Any, backend: Any) -> str:
    """Triton's own serialisation of a specialisation, as its ``jit_post_compile_hook`` gives it."""
    serialize_specialization_data = tritoncompat.serialize_specialization_data()
    if serialize_specialization_data is None:
        raise RuntimeError("this Triton has no serialize_specialization_data: nothing to record")
    md = kernel.metadata
    options = backend.parse_options({k: getattr(md, k) for k in md._fields if k != "target"})
    src = kernel.src
    name = getattr(jf, "_fn_name", None) or jf.fn.__name__
    args: list[Any] = [name, src.signature, src.constants, src.attrs, options, key]
    if "target" in inspect.signature(serialize_specialization_data).parameters:  # Triton 3.7+
        args.append(md.target)
    return serialize_specialization_data(*args)


def capture(fn: Any, config: Any, config_hash: str) -> list[LaunchSpec]:
    """The specialisations Triton compiled for ``config`` in this process (none interpreted).

    Called after a benchmark, where every config was compiled with the real arguments. A
    specialisation Triton cannot serialise (e.g. a JITFunction constexpr on Triton 3.6) is skipped.
    """
    jf = jit_function(fn)
    if jf is None:
        return []
    version = triton_version()
    out = []
    for key, kernel, backend in _compiled(jf):
        try:
            if not _matches(jf, kernel, config):
                continue
            spec = _serialize(jf, key, kernel, backend)
        except Exception as e:  # noqa: BLE001 - best effort: the launch loads it as before
            log.debug("tunecache: cannot record a specialisation of %s: %r", getattr(jf, "__name__", jf), e)
            continue
        digest = hashlib.sha256(spec.encode()).hexdigest()
        out.append(LaunchSpec(digest, config_hash, str(kernel.hash), spec, version))
    return out


def load(fn: Any, specs: Iterable[LaunchSpec], device: int) -> tuple[int, int]:
    """Preload ``specs`` onto ``device``; returns (loaded, skipped).

    A spec from another Triton build is skipped. A preload that yields another binary than the
    recorded one (the specialisation no longer round-trips) is dropped from Triton's cache, so a
    launch never runs a kernel other than the one it would have compiled.
    """
    jf = jit_function(fn)
    if jf is None:
        return 0, 0
    import torch

    version = triton_version()
    loaded = skipped = 0
    on_device = torch.cuda.device(device) if torch.cuda.is_available() else contextlib.nullcontext()
    with on_device:  # Triton compiles and loads for the current device
        entry = jf.device_caches[device]
        cache, backend = entry[0], entry[-2]
        for s in specs:
            try:
                if s.triton_version != version:
                    skipped += 1
                    continue
                data = json.loads(s.spec_json)
                key = data["key"]
                if cache.get(key) is not None:  # launched or preloaded already
                    continue
                why = key_mismatch(data, len(jf.arg_names))
                if why is not None:
                    skipped += 1
                    log.warning("tunecache: launch spec %s not preloaded: %s", s.spec_hash[:12], why)
                    continue
                why = options_mismatch(data, backend, jf.arg_names)
                if why is not None:
                    skipped += 1
                    if s.spec_hash not in _options_named:  # a restart tries it on every device: say it once
                        _options_named.add(s.spec_hash)
                        log.debug("tunecache: launch spec %s not preloaded: %s", s.spec_hash[:12], why)
                    continue
                kernel = jf.preload(s.spec_json)
                if kernel is None or str(getattr(kernel, "hash", "")) != s.kernel_hash:
                    if cache.get(key) is kernel:
                        cache.pop(key, None)
                    skipped += 1
                    continue
                init = getattr(kernel, "_init_handles", None)
                if init is not None:
                    init()  # cuModuleLoad and the launcher: the part worth doing early
                loaded += 1
            except Exception as e:  # noqa: BLE001 - best effort: the launch loads it as before
                skipped += 1
                log.debug("tunecache: preload of %s failed: %r", s.spec_hash[:12], e)
    if loaded:
        import_launch_modules()
    return loaded, skipped


#: What Triton's launch path imports at a process's first launch (the argument specialisation: in
#: jit.py on 3.4, in the native specializer since), beyond what the preload's own loading imported.
LAUNCH_IMPORTS = ("triton.tools.tensor_descriptor", "triton.experimental.gluon.nvidia.hopper")


def import_launch_modules() -> None:
    """Import :data:`LAUNCH_IMPORTS` now, on the preload's thread, so that a first launch finds them
    imported (0.5 ms in a restart's first pass on the H200). Modules Triton imports anyway: nothing
    it compiles or runs changes. Never raises."""
    for name in LAUNCH_IMPORTS:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 - absent in this Triton: its launch does not need it
                log.debug("tunecache: %s not imported: %r", name, e)


def _split_key(key: str) -> tuple[list[Any], dict[str, Any]] | None:
    """Triton's launch key is ``str(specialization) + str(launch options)``: a list of
    ``(type, specialisation)`` tuples, then a dict. Parsed, never evaluated; None if it is not that."""
    for i in (i for i, ch in enumerate(key) if ch == "{"):
        try:
            spec = ast.literal_eval(key[:i])
            opts = ast.literal_eval(key[i:])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(spec, list) and isinstance(opts, dict):
            return spec, opts
    return None


def _as_tuple(v: Any) -> Any:
    return tuple(_as_tuple(x) for x in v) if isinstance(v, list) else v


def key_mismatch(data: dict[str, Any], n_params: int) -> str | None:
    """Why the binary a spec describes is not the one a launch under its key would compile; None if
    it is. A preload files the compiled binary under the spec's ``key``, which nothing in Triton
    checks against the spec's own signature, constants, alignment and options."""
    parts = _split_key(str(data.get("key", "")))
    if parts is None:
        return "its launch key cannot be parsed"
    spec, opts = parts
    names = list(data.get("signature", {}))
    if len(spec) != n_params or len(names) != n_params:
        return f"its launch key has {len(spec)} arguments, the kernel {n_params}"
    consts = {tuple(k): v for k, v in zip(data.get("constant_keys", []), data.get("constant_vals", []))}
    attrs = {tuple(k): v for k, v in zip(data.get("attrs_keys", []), data.get("attrs_vals", []))}
    for i, (name, entry) in enumerate(zip(names, spec)):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            return f"argument {name}: {entry!r} is not a plain (type, specialisation) pair"
        kind, value = entry
        sig = data["signature"][name]
        if kind == "constexpr":
            if sig != "constexpr" or (i,) not in consts or _as_tuple(consts[(i,)]) != value:
                return f"argument {name}: the key says constexpr {value!r}, the binary {sig} {consts.get((i,))!r}"
            continue
        aligned = any(isinstance(a, list) and a == ["tt.divisibility", 16] for a in attrs.get((i,), []))
        if sig != kind or aligned != (value == "D"):
            return f"argument {name}: the key says {kind} {value!r}, the binary {sig} aligned={aligned}"
    options = data.get("options", {})
    for k, v in opts.items():
        if k in options and _as_tuple(options[k]) != _as_tuple(v):
            return f"option {k}: the key says {v!r}, the binary {options[k]!r}"
    return None


#: Specs already named in the log as built with other options (a restart meets them on every device).
_options_named: set[str] = set()


def options_mismatch(data: dict[str, Any], backend: Any, arg_names: list[str]) -> str | None:
    """Why the compile options a spec's binary was built with are not the ones this host's launch
    under the spec's key would build with; None if they are equal.

    A launch key names only the options the launch passed; Triton's launch compiles with
    ``backend.parse_options(kwargs)``, which fills the rest from this host's defaults and knobs
    (``TRITON_DEFAULT_FP_FUSION``, ``TRITON_PTXAS_OPTIONS``, the libdevice path, ...), while
    ``JITFunction.preload`` compiles with the spec's full recorded options. So a spec recorded where
    those defaults differ would file, under this host's launch key, a binary its launch never builds.
    """
    parts = _split_key(str(data.get("key", "")))
    if parts is None:
        return "its launch key cannot be parsed"
    # The launch's kwargs: its options, which are the key's, and the kernel's own arguments passed
    # by keyword, which the key does not tell apart from positional ones.
    host = backend.parse_options(dict(parts[1]))
    clash = [n for n in arg_names if n in vars(host)]
    if clash:
        return f"argument {clash[0]} is also a compile option: the key does not say how the launch passed it"
    recorded = {k: tuple(v) if isinstance(v, list) else v for k, v in data.get("options", {}).items()}
    built = backend.parse_options(recorded)  # as JITFunction.preload parses them
    mine, theirs = vars(host), vars(built)
    if mine == theirs:
        return None
    k = next(k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k, None) != theirs.get(k, None))
    why = f"option {k}: a launch here builds with {mine.get(k)!r}, the spec with {theirs.get(k)!r}"
    if hasattr(host, "hash"):  # Triton's own identity of options: its libraries by content, not path
        try:
            return None if host.hash() == built.hash() else why
        except OSError as e:  # the spec's library is not on this host
            return f"{why} ({e})"
    return why


def on_cuda_init(callback: Callable[[], None]) -> bool:
    """Run ``callback`` once CUDA is initialised in this process (now, if it already is).

    Uses torch's queue of calls deferred to its lazy CUDA initialisation, so nothing touches CUDA
    before the process does (a server may still fork). The callback runs on the thread that
    initialises CUDA and must be quick and never raise; it only schedules work. False if torch
    offers no such queue.
    """
    torch = sys.modules.get("torch")
    lazy = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
    if lazy is None:
        return False

    def safe() -> None:
        try:
            callback()
        except Exception as e:  # noqa: BLE001 - must never fail torch's CUDA initialisation
            log.debug("tunecache: preload scheduling failed: %r", e)

    try:
        lazy(safe)
    except Exception:  # noqa: BLE001 - CUDA unusable here (e.g. a forked child)
        return False
    return True
