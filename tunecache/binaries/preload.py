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
import functools
import hashlib
import importlib
import inspect
import io
import json
import logging
import re
import sys
import tokenize
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tunecache import tritoncompat
from tunecache.problem.identity import wrappers
from tunecache.problem.model import SPEC_BINARY_FIELD, LaunchSpec
from tunecache.process import counters

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


def for_binary(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` as a spec of its own binary: its JSON names its ``kernel_hash`` (a field Triton's
    ``preload`` ignores), so that it has its own ``spec_hash``. A store keeps one spec per
    specialisation hash; two texts of one kernel (a comment edit in a rolling deploy, a
    cache-invalidating setting that differs between hosts) compile one specialisation to two
    binaries, and each host's spec must be added beside the other's, not replace it (heal)."""
    data = json.loads(spec.spec_json)
    if data.get(SPEC_BINARY_FIELD) == spec.kernel_hash:
        return spec
    data[SPEC_BINARY_FIELD] = spec.kernel_hash
    text = json.dumps(data)
    return LaunchSpec(
        hashlib.sha256(text.encode()).hexdigest(), spec.config_hash, spec.kernel_hash, text, spec.triton_version
    )


def beside(held: Iterable[LaunchSpec], specs: Iterable[LaunchSpec]) -> list[LaunchSpec]:
    """Of ``specs`` (this process's), those to record beside the ``held`` ones (the store's, for one
    source and target): each whose binary no held spec names, as a spec of its own binary where its
    specialisation's spec is taken (:func:`for_binary`), so that it is added, never dropped as a
    duplicate of the other text's spec."""
    held = list(held)
    binaries, taken = {s.kernel_hash for s in held}, {s.spec_hash for s in held}
    return [for_binary(s) if s.spec_hash in taken else s for s in specs if s.kernel_hash not in binaries]


#: Why a launch spec was not preloaded: the short, stable names counted by reason
#: (``tunecache.preload_skips()``), with what each means.
SKIP_REASONS = {
    "other_triton": "recorded by another Triton version",
    "unparseable": "launch key not read",
    "key_mismatch": "key names another binary",
    "options": "built with other compile options than a launch here",
    "rebuilt_differs": "rebuilt binary differs from the record",
    "unsupported": "this Triton's preload cannot rebuild it (tuples before 3.9)",
    "error": "preload failed",
}

#: The reasons a user should act on: tunecache could not read or match a key Triton made (a case
#: to report), the store holds a spec inconsistent with itself, or the preload failed. The others are
#: what a fleet of mixed Triton versions or host settings, or an edited kernel, meets by design: the
#: launch compiles or loads those kernels as before.
ACTIONABLE = ("unparseable", "key_mismatch", "error")


def load(fn: Any, specs: Iterable[LaunchSpec], device: int) -> tuple[int, int]:
    """Preload ``specs`` onto ``device``; returns (loaded, skipped).

    A spec from another Triton build is skipped. A preload that yields another binary than the
    recorded one (the specialisation no longer round-trips) is dropped from Triton's cache, so a
    launch never runs a kernel other than the one it would have compiled. Each spec skipped is
    counted by reason (``tunecache.preload_skips()``) and named at debug level once; a process
    summarises them in one line (:func:`summarise_skips`).
    """
    jf = jit_function(fn)
    if jf is None:
        return 0, 0
    import torch

    version = triton_version()
    specs = list(specs)
    # Another text's spec of the same launch may name what this host builds (heal adds specs, see for_binary).
    recorded = {(_launch_key(s), s.kernel_hash) for s in specs if s.triton_version == version}
    loaded = skipped = 0
    on_device = torch.cuda.device(device) if torch.cuda.is_available() else contextlib.nullcontext()
    with on_device:  # Triton compiles and loads for the current device
        entry = jf.device_caches[device]
        cache, backend = entry[0], entry[-2]
        for s in specs:
            why: tuple[str, str] | None = None
            try:
                if s.triton_version != version:
                    why = "other_triton", f"recorded by Triton {s.triton_version}, this is {version}"
                else:
                    data = json.loads(s.spec_json)
                    key = data["key"]
                    if cache.get(key) is not None:  # launched or preloaded already
                        continue
                    why = key_mismatch(data, len(jf.arg_names))
                    if why is None:
                        options = options_mismatch(data, backend, jf.arg_names)
                        why = ("options", options) if options is not None else None
                    if why is None and not rebuildable(data):
                        why = "unsupported", f"Triton {version}'s preload rebuilds no tuple argument or constexpr"
                    if why is None:
                        kernel = jf.preload(s.spec_json)
                        built = str(getattr(kernel, "hash", ""))
                        if kernel is None or (built != s.kernel_hash and (key, built) not in recorded):
                            if cache.get(key) is kernel:
                                cache.pop(key, None)
                            built = getattr(kernel, "hash", None)
                            why = "rebuilt_differs", f"it builds binary {built}, not the recorded one"
                        else:
                            init = getattr(kernel, "_init_handles", None)
                            if init is not None:
                                init()  # cuModuleLoad and the launcher: the part worth doing early
                            loaded += 1
            except Exception as e:  # noqa: BLE001 - best effort: the launch loads it as before
                why = "error", f"its preload failed: {e!r}"
            if why is not None:
                skipped += 1
                _skipped(s, *why)
    if loaded:
        import_launch_modules()
    return loaded, skipped


def _launch_key(s: LaunchSpec) -> str | None:
    try:
        key = json.loads(s.spec_json).get("key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def _skipped(s: LaunchSpec, reason: str, why: str) -> None:
    counters.preload_skipped(reason)
    if counters.first_time("preload_named", s.spec_hash):  # a restart meets it on every device: said once
        log.debug("tunecache: launch spec %s not preloaded (%s): %s", s.spec_hash[:12], reason, why)


def summarise_skips() -> str | None:
    """Log, once per process, how many launch specs were not preloaded and why (called where a
    preload pass ends); the line, or None if there is nothing to say or it was said.

    One line, not one per spec: a library's 81 specs were 81 warnings at every start. A warning
    only where a reason in :data:`ACTIONABLE` was counted; else at info level, since those kernels
    load at their first launch as without tunecache and nothing is to be done. Later skips are
    counted in ``tunecache.preload_skips()`` (and ``stats()["preload_skipped"]``), not logged again.
    """
    skips = counters.preload_skips()
    if not skips or not counters.first_time("preload_summary", ""):
        return None
    parts = ", ".join(f"{n} {r}" for r, n in sorted(skips.items(), key=lambda kv: (-kv[1], kv[0])))
    line = f"tunecache: {sum(skips.values())} launch specs not preloaded: {parts}"
    if any(r in ACTIONABLE for r in skips):
        log.warning("%s (they load at their first launch; logger 'tunecache' at debug level names each)", line)
    else:
        log.info("%s (they load at their first launch)", line)
    return line


def rebuildable(data: dict[str, Any]) -> bool:
    """Can this Triton's ``JITFunction.preload`` rebuild the spec's binary at all? Before 3.9 it
    hands a tuple constexpr (a JSON list) to the compiler as a list, which builds another binary than
    the launch's tuple (seen on 3.6; 3.4 also keeps a tuple argument's signature a list, and fails).
    Known here, such a spec costs no compile that the hash check would throw away."""
    version = _triton_minor()
    if version >= (3, 9):
        return True
    vals = [v["constexpr"] if isinstance(v, dict) and "constexpr" in v else v for v in data.get("constant_vals", [])]
    if any(isinstance(v, list) for v in vals):
        return False
    return version >= (3, 6) or not any(isinstance(v, list) for v in data.get("signature", {}).values())


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


#: Python's tokens that carry no text of a key's value (line structure).
_LAYOUT = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT)


def _tokens(text: str) -> list[tuple[str, int, int]] | None:
    """``text``'s tokens as Python's tokenizer reads them, with their offsets: quoted strings are one
    token (their commas and brackets split nothing). Tokenized, never evaluated; None if refused."""
    starts, pos = [], 0
    for line in io.StringIO(text):
        starts.append(pos)
        pos += len(line)
    out = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type not in _LAYOUT:
                out.append((t.string, starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]))
    except (tokenize.TokenError, SyntaxError, ValueError, IndexError):
        return None
    return out


def _group_end(toks: list[tuple[str, int, int]]) -> int | None:
    """The offset just past the bracket group that ``toks`` starts with; None if unbalanced."""
    depth = 0
    for tok, _, end in toks:
        if tok in ("(", "[", "{"):
            depth += 1
        elif tok in (")", "]", "}"):
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                return end
    return None


def _items(text: str) -> list[str] | None:
    """The items of ``text`` if it is one tuple or list written as ``repr`` writes one (items joined by
    ``", "``, a 1-tuple with its trailing comma), each item's own text; None otherwise. Items are cut
    at the group's own commas only (a comma in a quoted string or a nested group cuts nothing)."""
    toks = _tokens(text)
    if not toks or toks[0][0] not in ("(", "[") or toks[0][1] != 0 or _group_end(toks) != len(text):
        return None
    depth, cuts = 0, []
    for tok, start, _ in toks:
        depth += tok in ("(", "[", "{")
        depth -= tok in (")", "]", "}")
        if tok == "," and depth == 1:
            cuts.append(start)
    bounds = [0, *cuts, len(text) - 1]
    items = [text[a + 1 : b].strip() for a, b in zip(bounds, bounds[1:])]
    if items == [""]:
        items = []
    elif toks[0][0] == "(" and len(items) == 2 and items[1] == "":
        items = items[:1]
    trailing = "," if toks[0][0] == "(" and len(items) == 1 else ""
    close = ")" if toks[0][0] == "(" else "]"
    return items if f"{toks[0][0]}{', '.join(items)}{trailing}{close}" == text else None


def _literal(text: str) -> tuple[bool, Any]:
    """(True, value) if ``text`` is a Python literal written exactly as ``repr`` writes its value."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None
    return repr(value) == text, value


def _split_key(key: str) -> tuple[list[str], dict[str, Any]] | None:
    """Triton's launch key is ``str(specialization) + str(launch options)``: a list of ``(type,
    specialisation)`` tuples, then a dict. Returns each argument's entry as its own text (what
    Triton wrote, constexpr values as their ``repr``) and the options; None if it is not that.
    Tokenized, never evaluated."""
    toks = _tokens(key)
    end = _group_end(toks) if toks and toks[0][0] == "[" else None
    if end is None:
        return None
    entries = _items(key[:end])
    ok, opts = _literal(key[end:])
    if entries is None or not ok or not isinstance(opts, dict):
        return None
    return entries, opts


def _as_tuple(v: Any) -> Any:
    return tuple(_as_tuple(x) for x in v) if isinstance(v, list) else v


@functools.cache
def _triton_minor() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", triton_version())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


_UNDECODED = object()  # a constant this Triton's preload could not decode: it raises, nothing matches


def _decode_constant(value: Any) -> Any:
    """A spec's constant as this Triton's ``JITFunction.preload`` decodes it, the value its binary is
    built with: a dtype's name -> ``tl.dtype`` (3.4+); ``{"constexpr": v}`` -> ``tl.constexpr(v)``
    (3.6+); ``{"jit_function": "module:name"}`` -> that JITFunction, looked up among the ones this
    process defined, never imported (3.9+); JSON lists -> tuples (3.9+). Anything else as it is."""
    import triton.language as tl

    version = _triton_minor()
    if tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value and version >= (3, 6):
        inner = value["constexpr"]
        return tl.constexpr(_as_tuple(inner) if version >= (3, 9) else inner)
    if isinstance(value, dict) and "jit_function" in value and version >= (3, 9):
        import triton.runtime.jit as jit

        registry = getattr(jit, "_triton_jit_function_registry", {})
        return registry.get(value["jit_function"], _UNDECODED)
    return _as_tuple(value) if version >= (3, 9) else value


def _render(value: Any) -> str:
    """``value`` written as a launch writes it in its key: ``repr``, a JITFunction by its
    ``cache_key`` (3.6+ replaces JITCallables so), a tuple as a tuple (JSON made every tuple a list,
    and Triton accepts no list as an argument)."""
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = [_render(x) for x in value]
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if hasattr(value, "cache_key") and hasattr(value, "preload") and _triton_minor() >= (3, 6):
        return repr(value.cache_key)
    return repr(value)


#: An enum member as ``repr`` writes it: ``<Mode.A: 1>``, ``<Policy.LAST: 'evict_last'>``.
_ENUM = re.compile(r"<[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+: (.+)>\Z", re.S)


def constant_matches(text: str, value: Any) -> bool:
    """Does a launch whose key says ``text`` for a constexpr build what a preload builds from the
    spec's recorded constant ``value``?

    The rule, exact: ``text`` must be the constant decoded as this Triton's preload decodes it
    (:func:`_decode_constant`) and written as a launch writes it (:func:`_render`), character for
    character; or, for an int or str enum member (``<Mode.A: 1>``), its literal value must equal the
    decoded constant and have its very type (``int``/``str``: not ``True``, not ``1.0``, not a dtype).

    Why the enum exception: Triton's serialiser stores an ``IntEnum``/``StrEnum`` member as its value
    (JSON has no enums), so a preload builds with ``1`` where the launch built with ``Mode.A``, and no
    spec can say otherwise. Whether those build the same binary is what Triton's own compile identity
    answers: :func:`load` keeps a preloaded binary only if its hash equals the recorded one, which
    the launch under this very key compiled. The key check makes sure the key names this constant
    (``<Mode.B: 2>`` never takes the binary of ``1``); the hash check, that the binary is the one
    the launch built. Triton's identity hashes each constant's ``str``: an ``IntEnum`` or ``StrEnum``
    member whose ``str`` is its value (Python 3.11+) rebuilds the launch's binary and loads; a
    ``(str, Enum)`` member, or any enum on Python 3.10, does not and is skipped (``rebuilt_differs``).
    This rests on the recorded hash being the launch's, as the capture records it; a spec is code
    that only a trusted key vouches for. A member of a plain ``Enum`` is not serialisable: never
    recorded.
    """
    decoded = _decode_constant(value)
    if decoded is _UNDECODED:
        return False
    if text == _render(decoded):
        return True
    m = _ENUM.match(text)
    if m is None:
        return False
    ok, literal = _literal(m.group(1))
    return ok and type(literal) in (int, str) and type(decoded) is type(literal) and decoded == literal


def key_mismatch(data: dict[str, Any], n_params: int) -> tuple[str, str] | None:
    """Why the binary a spec describes is not the one a launch under its key would compile, as
    (reason, message) with reason ``unparseable`` or ``key_mismatch``; None if it is. A preload files
    the compiled binary under the spec's ``key``, which nothing in Triton checks against the spec's
    own signature, constants, alignment and options.

    Compares what Triton compares, the key's text: each argument's entry as the launch wrote it,
    non-constexpr ones by type and alignment, constexpr ones by :func:`constant_matches`, and every
    constant the binary is built with must be one the key names."""
    parts = _split_key(str(data.get("key", "")))
    if parts is None:
        return "unparseable", "its launch key cannot be parsed"
    entries, opts = parts
    pairs = []
    for i, entry in enumerate(entries):
        pair = _items(entry)
        ok, kind = _literal(pair[0]) if pair is not None and len(pair) == 2 else (False, None)
        if not ok or not _is_kind(kind):
            return "unparseable", f"argument {i}: {entry} is not a (type, specialisation) pair"
        pairs.append((kind, pair[1]))
    names = list(data.get("signature", {}))
    if len(pairs) != n_params or len(names) != n_params:
        return "key_mismatch", f"its launch key has {len(pairs)} arguments, the kernel {n_params}"
    consts = {tuple(k): v for k, v in zip(data.get("constant_keys", []), data.get("constant_vals", []))}
    attrs = {tuple(k): v for k, v in zip(data.get("attrs_keys", []), data.get("attrs_vals", []))}
    named: set[tuple[int, ...]] = set()
    for i, (name, (kind, text)) in enumerate(zip(names, pairs)):
        why = _entry_mismatch((i,), kind, text, _as_tuple(data["signature"][name]), consts, attrs, named)
        if why is not None:
            return "key_mismatch", f"argument {name}: {why}"
    if set(consts) != named:
        return "key_mismatch", f"the binary is built with constants {sorted(set(consts) - named)} the key does not name"
    options = data.get("options", {})
    for k, v in opts.items():
        if k in options and _as_tuple(options[k]) != _as_tuple(v):
            return "key_mismatch", f"option {k}: the key says {v!r}, the binary {options[k]!r}"
    return None


def _is_kind(kind: Any) -> bool:
    return isinstance(kind, str) or (isinstance(kind, tuple) and all(map(_is_kind, kind)))


def _entry_mismatch(
    path: tuple[int, ...],
    kind: Any,
    text: str,
    sig: Any,
    consts: dict[tuple[int, ...], Any],
    attrs: dict[tuple[int, ...], Any],
    named: set[tuple[int, ...]],
) -> str | None:
    """Why the key's entry (``kind``, the specialisation ``text``) at ``path`` is not what the spec's
    binary was built with (signature ``sig``); a tuple argument entry by entry. Adds the constexpr
    paths met to ``named``."""
    if isinstance(kind, tuple):
        items = _items(text)
        if not isinstance(sig, tuple) or len(sig) != len(kind) or items is None or len(items) != len(kind):
            return f"the key says {kind!r} {text}, the binary {sig!r}"
        for j, (k, t, s) in enumerate(zip(kind, items, sig)):
            why = _entry_mismatch((*path, j), k, t, s, consts, attrs, named)
            if why is not None:
                return why
        return None
    if kind == "constexpr":
        named.add(path)
        if sig != "constexpr" or path not in consts or not constant_matches(text, consts[path]):
            return f"the key says constexpr {text}, the binary {sig} {consts.get(path)!r}"
        return None
    ok, value = _literal(text)
    aligned = any(isinstance(a, list) and a == ["tt.divisibility", 16] for a in attrs.get(path, []))
    if not ok or sig != kind or aligned != (value == "D"):
        return f"the key says {kind} {text}, the binary {sig} aligned={aligned}"
    return None


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
