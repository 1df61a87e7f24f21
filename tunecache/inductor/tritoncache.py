"""Triton cache: the Triton kernels torch.compile compiles, shared through the store as signed code.

Why: Inductor's FX graph entries bundle the binaries of the kernels a graph *uses*, not of every
kernel its tuning compiled. In max-autotune, torch (2.11) runs its coordinate-descent search again at
every start for some kernels (a persistent reduction, a pointwise), compiling each variant it tries:
a warm host finds those in its local Triton cache, a fresh host compiles them all (run AQ: 41
compiles against stock warm's 16). So a process with ``TUNECACHE_INDUCTOR`` files every Triton
kernel it compiles in the store too (kind ``triton_kernel``, keyed by Triton's own cache key, bound
to the target, signed where made), and looks a kernel up there when its local Triton cache lacks it,
before Triton compiles it.

Seam: Triton's cache-manager class (``triton.knobs.cache.manager_class``, what ``TRITON_CACHE_MANAGER``
names), set in the process only when the user has not set one (one slot: a manager of yours stays,
and this is off). :class:`StoreCacheManager` is Triton's own ``FileCacheManager`` with two additions:

- ``get_group`` of a kernel the local cache lacks asks the store; a verified entry is written into
  the local cache through ``FileCacheManager`` itself (as a compile would), and Triton loads it. A
  local hit never touches the store, and a lookup only ever precedes what would be a compile.
- ``put_group`` after a compile files the kernel's metadata and binary (what
  ``TRITON_STORE_BINARY_ONLY`` keeps) in the store, if this process's lookup found it missing there,
  and only a build of this process that may leave the host (:mod:`tunecache.trust.sharing`): not bytes
  tunecache placed (a stored binary, an entry), not a kernel compiled inside a benchmark (tunecache's,
  Inductor's select_algorithm candidates), nothing from a process with ``TRITON_KERNEL_OVERRIDE``,
  ``TRITON_KERNEL_DUMP`` or another knob outside Triton's key (which neither fetches).
- ``get_file``/``put`` do the same for the host modules Triton builds with gcc
  (:mod:`tunecache.binaries.hostmodules`: its driver utilities, and up to 3.6 a launcher per kernel
  signature), bound to :func:`~tunecache.inductor.entries.host_target` instead of the device: a
  fresh host's first compile otherwise builds ``cuda_utils`` (0.3 s on the H200 host, run of
  2026-12-06) before its first lookup. Placed only where this interpreter and platform load it.

A stored kernel is native code: it is placed only if the store's trust policy vouches for the entry
(:mod:`tunecache.trust.trust`) and it passes the checks of a stored binary
(:func:`tunecache.binaries.binaries.problems_of`: its metadata names the key it is filed under,
plain file names, the backend's extension). Every failure is a miss: Triton compiles as without it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from typing import Any

import orjson
from triton.runtime.cache import FileCacheManager

from tunecache.binaries import hostmodules
from tunecache.binaries.binaries import from_group, problems_of, write_kernel
from tunecache.binaries.preload import triton_version
from tunecache.inductor.entries import InductorStore, default, host_target
from tunecache.problem.model import BINARY_EXTS, Binary, binary_sha256
from tunecache.process import counters, forks
from tunecache.trust import sharing

log = logging.getLogger("tunecache")

#: The kind of Inductor entry a compiled Triton kernel is stored as.
KIND = "triton_kernel"
#: Version of the entry's value format.
FORMAT = 1

_entries: InductorStore | None = None  # pinned by enable(entries=...); None: the process default
_missing: set[tuple[str, str]] = set()  # (key, name) this process looked up and the store lacked
_lock = threading.Lock()


def hex_key(key: str) -> str | None:
    """Triton's cache key (64 hex digits) from the base32 directory name its cache manager is given."""
    try:
        raw = base64.b32decode(key + "=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def encode(b: Binary) -> bytes:
    """The entry value of binary ``b``: JSON, the binary in base64."""
    return orjson.dumps(
        {
            "format": FORMAT,
            "name": b.name,
            "ext": b.ext,
            "triton_version": b.triton_version,
            "metadata": b.metadata.decode("utf-8"),
            "binary": base64.b64encode(b.binary).decode("ascii"),
        }
    )


def decode(triton_key: str, value: bytes) -> Binary:
    """The binary an entry value holds for ``triton_key``; ValueError if it is not one."""
    try:
        obj = orjson.loads(value)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} Triton kernel entry")
        name, ext, version = str(obj["name"]), str(obj["ext"]), str(obj["triton_version"])
        metadata = str(obj["metadata"]).encode("utf-8")
        binary = base64.b64decode(str(obj["binary"]), validate=True)
    except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error) as e:
        raise ValueError(f"not a Triton kernel entry: {e}") from e
    sha = binary_sha256(triton_key, name, ext, version, metadata, binary)
    return Binary(triton_key, sha, name, ext, version, metadata, binary)


class StoreCacheManager(FileCacheManager):  # type: ignore[misc]
    """Triton's file cache, with the store behind it for the kernels it lacks (module docstring)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        self._shared = not override and not dump  # override and dump directories stay local

    def get_group(self, filename: str) -> dict[str, str] | None:
        group = super().get_group(filename)
        wanted = group is None and self._shared and filename.endswith(".json")
        if (
            wanted
            and sharing.builds_shareable()
            and _guarded("placing a Triton kernel", self._fetch, filename[: -len(".json")])
        ):
            group = super().get_group(filename)
        return group

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path = super().put_group(filename, group)
        if self._shared and filename.endswith(".json"):
            _guarded("filing a Triton kernel", self._keep, filename[: -len(".json")], group)
        return str(path)

    def get_file(self, filename: str) -> str | None:
        path = super().get_file(filename)
        name = self._host_module(filename) if path is None else None
        if name and sharing.builds_shareable() and _guarded("placing a host module", self._fetch_host, name, filename):
            path = super().get_file(filename)
        return path

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary=binary)
        name = self._host_module(filename)
        if name and isinstance(data, bytes):
            _guarded("filing a host module", self._keep_host, name, data)
        return str(path)

    def _host_module(self, filename: str) -> str | None:
        """The host module ``filename`` is for this interpreter (None: another file)."""
        if not self._shared:
            return None
        suffix = hostmodules.ext_suffix()
        return next((n for n in hostmodules.NAMES if filename == f"{n}{suffix}"), None)

    # ---- the store side: never raises into Triton ----------------------------------------------

    def _fetch(self, name: str) -> bool:
        """Place the stored kernel ``name`` of this key into the local cache; whether it was placed."""
        key = hex_key(self.key)
        if key is None:
            return False
        value, answered = (_entries or default()).lookup(KIND, key)  # verified against the trust policy
        if value is None:
            if answered:  # the store lacks it (or holds one it does not vouch for): file ours after the compile
                with _lock:
                    _missing.add((key, name))
            return False
        try:
            b = decode(key, value)
        except ValueError as e:
            why: str | None = str(e)
        else:
            why = problems_of(b) or (None if b.name == name else f"it is named {b.name!r}, not {name!r}")
        if why is not None:
            log.warning("tunecache: stored Triton kernel %s... not placed: %s; Triton compiles it", key[:16], why)
            return False
        try:
            write_kernel(self, b)  # its put_group files nothing back: this lookup did not miss
        except OSError as e:
            log.warning("tunecache: stored Triton kernel %s... not placed: %s", key[:16], e)
            return False
        return True

    def _fetch_host(self, name: str, filename: str) -> bool:
        """Place the stored host module ``name`` of this key into the local cache; whether it was."""
        key = hex_key(self.key)
        if key is None:
            return False
        value, answered = (_entries or default()).lookup(KIND, key, host_target()[0])  # verified (trust)
        if value is None:
            log.debug("tunecache: host module %s %s...: not in the store (%s)", name, key[:16], answered)
            if answered:
                with _lock:
                    _missing.add((key, name))
            return False
        try:
            b = decode(key, value)
            md = orjson.loads(b.metadata)
        except (ValueError, orjson.JSONDecodeError) as e:
            why: str | None = str(e)
        else:
            why = problems_of(b) or (None if b.name == name else f"it is named {b.name!r}, not {name!r}")
            if why is None and not (isinstance(md, dict) and hostmodules.loads_here(md)):
                why = "it was built for another interpreter or platform"
        if why is not None:
            log.warning("tunecache: stored host module %s %s... not placed: %s; Triton builds it", name, key[:16], why)
            return False
        try:
            FileCacheManager.put(self, b.binary, filename, binary=True)  # placed: never filed again
        except OSError as e:
            log.warning("tunecache: stored host module %s %s... not placed: %s", name, key[:16], e)
            return False
        return True

    def _keep_host(self, name: str, data: bytes) -> None:
        """File a host module Triton just built in the store, if this process found the store lacking it."""
        key = hex_key(self.key)
        if key is None:
            return
        with _lock:
            if (key, name) not in _missing:
                log.debug("tunecache: host module %s %s...: built, not looked up in the store", name, key[:16])
                return
            _missing.discard((key, name))
        why = sharing.unfiled_reason()
        if why is not None or not sharing.builds_shareable():
            why = why or "this process shares no build"
            log.debug("tunecache: host module %s %s... not filed: %s", name, key[:16], why)
            return
        md, version, ext = hostmodules.metadata(key, name), triton_version(), hostmodules.EXT
        b = Binary(key, binary_sha256(key, name, ext, version, md, data), name, ext, version, md, data)
        why = problems_of(b)
        if why is None:
            (_entries or default()).put(KIND, key, encode(b), host_target())
        log.debug("tunecache: host module %s %s...: %s", name, key[:16], why or "filed")

    def _keep(self, name: str, group: dict[str, str]) -> None:
        """File a kernel Triton just compiled in the store, if this process found the store lacking it."""
        key = hex_key(self.key)
        if key is None:
            return
        with _lock:
            if (key, name) not in _missing:
                return
            _missing.discard((key, name))
        why = sharing.unfiled_reason()
        if why is not None or not sharing.builds_shareable():
            log.debug("tunecache: Triton kernel %s... not filed: %s", key[:16], why or "this process shares no build")
            return
        ext = next((e for e in BINARY_EXTS.values() if f"{name}.{e}" in group), None)
        try:
            b = from_group(key, name, ext, triton_version(), group) if ext else None
        except OSError:
            b = None
        if b is None:
            return  # not a kernel group tunecache knows how to carry
        if problems_of(b) is None:
            (_entries or default()).put(KIND, key, encode(b))


def _guarded(what: str, step: Any, *args: Any) -> Any:
    """``step(*args)``, or None where it raised: the store side never raises into Triton's compile
    (a build is kept locally, as without a store), and says once what failed."""
    try:
        return step(*args)
    except Exception as e:  # noqa: BLE001 - Triton compiles and loads as without the store
        log.debug("tunecache: %s failed", what, exc_info=True)
        counters.warn_once("torch.compile", f"tritoncache-{what}", "tunecache: %s failed (%r); Triton goes on as "
                           "without a store", what, e)  # fmt: skip
        return None


def install(entries: InductorStore | None = None) -> bool:
    """Make :class:`StoreCacheManager` Triton's cache manager in this process, unless one is set
    (``TRITON_CACHE_MANAGER`` or ``knobs.cache.manager_class``). Returns whether it is ours now."""
    global _entries
    from triton import knobs

    current = knobs.cache.manager_class
    if current is not None and current is not StoreCacheManager:
        log.info(
            "tunecache: Triton's cache manager is %s (TRITON_CACHE_MANAGER): torch.compile's Triton kernels"
            " are not shared through the store",
            getattr(current, "__qualname__", current),
        )
        return False
    _entries = entries
    knobs.cache.manager_class = StoreCacheManager
    return True


def uninstall() -> None:
    """Undo :func:`install` (tests): Triton's default manager again, if ours is set."""
    global _entries
    from triton import knobs

    if knobs.cache.manager_class is StoreCacheManager:
        knobs.cache.manager_class = None
    _entries = None
    with _lock:
        _missing.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent thread may have held it at the fork


forks.register(__name__, _after_fork_in_child)

__all__ = ["FORMAT", "KIND", "StoreCacheManager", "decode", "encode", "hex_key", "install", "uninstall"]
