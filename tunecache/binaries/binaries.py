"""Binaries: the winners' compiled kernels travel with the results, so that a fresh host compiles nothing.

A tuning process stores, after its results and launch specs, what Triton's compile cache holds for
each winner's specialisation: the metadata JSON and the binary (cubin/hsaco), the two files
Triton's ``TRITON_STORE_BINARY_ONLY`` keeps and needs to load a kernel without compiling. Each is
filed under Triton's own cache key for that specialisation (the launch spec's ``kernel_hash``) and
addressed by the sha256 of its content (:func:`tunecache.problem.model.binary_sha256`).

A restart or a fresh host, while the server loads its weights, reads which of its kernels'
binaries its Triton cache lacks and writes those into it through Triton's own cache API
(``get_cache_manager(key).put`` and ``put_group``, exactly what ``triton.compile`` does after a
compile), each one verified first (:func:`problems_of`): its content hash, that its metadata is
filed under the key it claims, that its file names are plain names. Triton's compile of that
specialisation, by the preload or by the first launch, is then a cache hit: it loads, it does not
compile. Why this seam and not ``TRITON_CACHE_MANAGER`` or ``TRITON_REMOTE_CACHE_BACKEND``:
docs/binaries.md, "Which seam".

Nothing here is on the launch path, and all of it is best effort: a binary that is missing,
too large or fails a check is left out, and Triton compiles that kernel as it always did.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tunecache import settings
from tunecache.binaries import hostmodules, preload
from tunecache.errors import StoreError
from tunecache.problem.model import BINARY_EXTS, COMPANION_CONFIG, Binary, LaunchSpec, binary_sha256
from tunecache.problem.target import detect_target, interpreting
from tunecache.store.opening import shared_store
from tunecache.store.store import Store
from tunecache.trust import sharing, trust

log = logging.getLogger("tunecache")

#: A binary's file-name stem: Triton names the files after the kernel function (``src.name[:150]``);
#: anything else (a path separator, a dot-dot) would write outside the cache directory.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,149}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def problems_of(b: Binary) -> str | None:
    """Why ``b`` must not be placed into Triton's cache; None if it may.

    Checks what can be checked without compiling: the content matches its sha256 (flipped bytes,
    a swapped binary); the metadata is a JSON object that Triton itself filed under ``triton_key``
    (Triton writes its cache key into every kernel's metadata: a binary moved to another key is
    caught); the backend's binary extension; a file name that stays inside the cache directory; the
    Triton version. That the key is the one this host's Triton computes for the spec is checked by
    Triton: it looks a kernel up under its own key only.
    """
    if not _HEX64.fullmatch(b.triton_key):
        return "its Triton key is not 64 hex digits"
    if not _NAME.fullmatch(b.name):
        return f"file name {b.name[:40]!r} is not a kernel name"
    if binary_sha256(b.triton_key, b.name, b.ext, b.triton_version, b.metadata, b.binary) != b.sha256:
        return "its content does not match its sha256 (corrupted or altered)"
    try:
        md = json.loads(b.metadata.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return "its metadata is not JSON"
    if not isinstance(md, dict):
        return "its metadata is not a JSON object"
    if md.get("hash") != b.triton_key:
        return f"its metadata says Triton key {str(md.get('hash'))[:16]}..., not {b.triton_key[:16]}..."
    backend = (md.get("target") or {}).get("backend") if isinstance(md.get("target"), dict) else None
    if backend == hostmodules.BACKEND:
        if b.ext != hostmodules.EXT:
            return f"a host module's record has ext {b.ext!r}, not {hostmodules.EXT!r}"
        why = hostmodules.problems(b.name, md)
        if why is not None:
            return why
    elif BINARY_EXTS.get(str(backend)) != b.ext:
        return f"a {b.ext!r} file is not what Triton's {backend!r} backend loads"
    if "triton_version" in md and md["triton_version"] != b.triton_version:
        return f"its metadata says Triton {md['triton_version']}, its record {b.triton_version}"
    if not b.binary:
        return "its binary is empty"
    return None


# ---- the tuning side: collect and upload ------------------------------------------------------------


def _kernels(jf: Any) -> Iterator[tuple[Any, Any]]:
    """(CompiledKernel, backend) for every kernel Triton holds for the JITFunction ``jf``, all devices."""
    for entry in list(jf.device_caches.values()):
        kernel_cache, backend = entry[0], entry[-2]
        for kernel in list(kernel_cache.values()):
            if hasattr(kernel, "src") and hasattr(kernel, "metadata") and hasattr(kernel, "hash"):
                yield kernel, backend


def _files(kernel: Any, name: str) -> dict[str, str] | None:
    """The files of ``kernel``'s group in Triton's cache: {file name: path}."""
    group = getattr(kernel, "metadata_group", None)  # Triton 3.6+
    if group:
        return dict(group)
    from triton.runtime.cache import get_cache_manager

    return get_cache_manager(str(kernel.hash)).get_group(f"{name}.json")


def from_group(key: str, name: str, ext: str, version: str, group: dict[str, str]) -> Binary | None:
    """The binary whose files a kernel's group in Triton's cache lists ({file name: path}), unchecked;
    None if the group lacks its metadata or its binary. OSError if a file cannot be read."""
    md_path, bin_path = group.get(f"{name}.json"), group.get(f"{name}.{ext}")
    if md_path is None or bin_path is None:
        return None
    metadata, binary = Path(md_path).read_bytes(), Path(bin_path).read_bytes()
    return Binary(key, binary_sha256(key, name, ext, version, metadata, binary), name, ext, version, metadata, binary)


def collect(fn: Any, triton_keys: Iterable[str]) -> list[Binary]:
    """The binaries Triton compiled in this process for ``fn`` under ``triton_keys`` (none interpreted),
    read from Triton's cache; a kernel whose files are gone from it is left out."""
    jf = preload.jit_function(fn)
    wanted = set(triton_keys)
    if jf is None or not wanted:
        return []
    version = preload.triton_version()
    out: dict[str, Binary] = {}
    for kernel, backend in _kernels(jf):
        key = str(kernel.hash)
        if key not in wanted or key in out:
            continue
        try:
            name = str(kernel.src.name)[:150]
            ext = str(backend.binary_ext)
            b = from_group(key, name, ext, version, _files(kernel, name) or {})
        except (OSError, AttributeError, TypeError) as e:
            log.debug("tunecache: cannot read binary %s: %r", key[:12], e)
            continue
        if b is None:
            log.debug("tunecache: %s: the files of binary %s are not in Triton's cache", name, key[:12])
            continue
        why = problems_of(b)
        if why is not None:
            log.debug("tunecache: not uploading binary %s: %s", key[:12], why)
            continue
        out[key] = b
    return list(out.values())


def host_module_keys(fn: Any, triton_keys: Iterable[str]) -> dict[str, str]:
    """{key: name} of the host modules (:mod:`tunecache.binaries.hostmodules`) that Triton's cache holds for
    launching ``fn``'s kernels under ``triton_keys`` (their launchers), and of its driver utilities."""
    from triton.runtime.cache import get_cache_manager

    jf = preload.jit_function(fn)
    wanted = set(triton_keys)
    if jf is None or not wanted:
        return {}
    keys = {hostmodules.utils_key(): "cuda_utils"}
    for kernel, _ in _kernels(jf):
        if str(kernel.hash) in wanted:
            try:
                keys[hostmodules.launcher_key(kernel)] = "__triton_launcher"
            except Exception as e:  # noqa: BLE001 - best effort: the fresh host builds it
                log.debug("tunecache: no launcher key for %s: %r", str(kernel.hash)[:12], e)
    suffix = hostmodules.ext_suffix()
    return {k: n for k, n in sorted(keys.items()) if k and get_cache_manager(k).get_file(f"{n}{suffix}") is not None}


def host_module_spec(key: str, name: str, version: str) -> LaunchSpec:
    """The companion launch spec that files host module ``name`` (under ``key``) with a kernel's."""
    spec_json = json.dumps({"host_module": name, "key": key}, sort_keys=True)
    return LaunchSpec(hashlib.sha256(spec_json.encode()).hexdigest(), COMPANION_CONFIG, key, spec_json, version)


def host_module(key: str, name: str, version: str) -> Binary | None:
    """The host module ``name`` that Triton keeps under ``key`` in its cache, as a binary record;
    None if the cache does not hold it."""
    from triton.runtime.cache import get_cache_manager

    path = get_cache_manager(key).get_file(f"{name}{hostmodules.ext_suffix()}")
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    md = hostmodules.metadata(key, name)
    ext = hostmodules.EXT
    return Binary(key, binary_sha256(key, name, ext, version, md, data), name, ext, version, md, data)


def upload(
    store: Store,
    fn: Any,
    kernel: str,
    source_hash: str,
    specs: Sequence[LaunchSpec],
    target_digest: str | None = None,
) -> int:
    """After a tuning process stored ``specs`` (its winners' launch specs): store their binaries that
    the store lacks, within the size limits, and with ``target_digest`` the host modules their
    launches need (recorded as companions of that target). Returns how many were new; never raises."""
    try:
        if store.readonly or not specs or not settings.get("TUNECACHE_BINARIES") or not sharing.builds_shareable():
            return 0
        keys = {s.kernel_hash for s in specs}
        host = host_module_keys(fn, keys) if target_digest is not None else {}
        # What this process's own slot holds as its key signed it (a row planted there, or altered, is
        # put again: tunecache.store.signers); another signer's rows are theirs, neither used nor kept.
        mine = trust.own_slot(store)
        have = trust.signed_heads(store.binary_signatures(sorted(keys | set(host)), mine), store)
        bins = collect(fn, keys - have)
        if host and target_digest is not None:
            version = preload.triton_version()
            store.put_specs(
                kernel, source_hash, target_digest, [host_module_spec(k, n, version) for k, n in host.items()]
            )
            missing = (host_module(k, n, version) for k, n in host.items() if k not in have)  # read only these
            bins += [b for b in missing if b is not None]
        limit = settings.get("TUNECACHE_BINARY_MAX_BYTES")
        small = [b for b in bins if b.size <= limit]
        for b in bins:
            if b.size > limit:
                log.warning(
                    "tunecache: %s: binary %s is %d bytes, over TUNECACHE_BINARY_MAX_BYTES=%d: not uploaded "
                    "(a fresh host compiles it)",
                    kernel,
                    b.triton_key[:12],
                    b.size,
                    limit,
                )
        n = store.put_binaries(kernel, source_hash, small, settings.get("TUNECACHE_KERNEL_BINARIES_MAX_BYTES"))
        if n < len(small) and len(store.binary_heads([b.triton_key for b in small], [mine])) < len(small):
            log.warning("tunecache: %s: binaries past TUNECACHE_KERNEL_BINARIES_MAX_BYTES were not uploaded", kernel)
        return n
    except StoreError as e:
        log.debug("tunecache: %s: binaries not uploaded: %s", kernel, e)
    except Exception as e:  # noqa: BLE001 - best effort: the results are stored already
        log.debug("tunecache: %s: binaries not uploaded: %r", kernel, e)
    return 0


class _AnyConfig(SimpleNamespace):
    """A config that every compiled specialisation matches (preload.capture's filter)."""

    kwargs: dict[str, Any] = {}


def record_companions(tuner: Any, *fns: Any, store: Store | None = None) -> int:
    """Keep the binaries of plain ``@triton.jit`` kernels ``fns`` (e.g. a merge stage launched after an
    autotuned kernel) with ``tuner``'s: every specialisation Triton compiled of them in this process
    is recorded as a launch spec of ``tuner``'s kernel source on this target (config hash
    :data:`~tunecache.problem.model.COMPANION_CONFIG`) and its binary uploaded. Call it after a warm-up that
    launched them (an image build); ``store`` defaults to ``TUNECACHE_URL``'s. They are exported,
    placed and dropped with ``tuner``'s; a fresh host then compiles them no more than the winners.
    Returns how many binaries were new."""
    store = store if store is not None else shared_store()
    if store.readonly:
        return 0
    target = detect_target().digest
    any_config = _AnyConfig(num_warps=None, num_stages=None, num_ctas=None, maxnreg=None)
    n = 0
    held = store.get_specs(tuner.identity.source_hash, [trust.own_slot(store)]).get(target, [])  # its own
    for fn in fns:
        # beside the specs of another text (a comment edit in a rolling deploy), never dropped as their duplicates
        specs = preload.beside(held, preload.capture(fn, any_config, COMPANION_CONFIG))
        if not specs:
            continue
        store.put_specs(tuner.identity.name, tuner.identity.source_hash, target, specs)
        n += upload(store, fn, tuner.identity.name, tuner.identity.source_hash, specs, target)
    return n


# ---- the serving side: place into Triton's cache ----------------------------------------------------


def place(store: Store, specs: Iterable[LaunchSpec], policy: trust.Policy | None = None) -> tuple[int, int]:
    """Write into Triton's cache the stored binaries of ``specs`` (this Triton's) that it lacks, each
    verified first and vouched for by ``policy`` (default: :func:`tunecache.trust.trust.policy` of
    ``store``); returns (placed, refused). Never raises: what is not placed is compiled, and one bad
    row never keeps the others out.

    Reads only the names of the stored binaries first, then the bytes of those missing here: a warm
    restart, whose Triton cache has them all, reads no bytes.
    """
    try:
        version = preload.triton_version()
        keys = sorted({s.kernel_hash for s in specs if s.triton_version == version})
        if not keys:
            return 0, 0
        policy = policy if policy is not None else trust.policy(store)
        heads = store.binary_heads(keys, policy.slots)  # only the signers it trusts (tunecache.store.signers)
        # A key or name Triton's cache manager cannot take is refused below, with the row's other checks.
        missing = [k for k, (name, ext, _) in heads.items() if not _placeable(k, name) or not _cached(k, name, ext)]
        bins = store.get_binaries(missing, policy.slots) if missing else []
        others = [k for k in keys if k not in heads]
        elsewhere = store.binaries_elsewhere(others, policy.slots) if others and policy.slots is not None else {}
    except Exception as e:  # noqa: BLE001 - best effort: Triton compiles what is not placed
        log.debug("tunecache: reading binaries to place failed: %r", e)
        return 0, 0
    placed = refused = 0
    for key, signature in elsewhere.items():  # stored only by signers it does not trust: not read
        refused += 1
        trust.refused("binary", key[:12], policy.not_read(signature), policy.store)
    by_key: dict[str, list[Binary]] = {}
    for b in bins:
        by_key.setdefault(b.triton_key, []).append(b)
    for rows in by_key.values():  # the newest row of a trusted signer that passes every check
        chosen, why, untrusted = None, None, False
        for b in rows:
            bad = problems_of(b)
            if bad is None and b.triton_version != version:
                bad = f"it was compiled by Triton {b.triton_version}, this is {version}"
            vouch = policy.binary(b) if bad is None else None
            if bad is None and vouch is None:
                chosen = b
                break
            if why is None:
                why, untrusted = bad or vouch, bad is None
        b = chosen or rows[0]
        if chosen is None:
            refused += 1
            if untrusted:
                trust.refused("binary", f"{b.triton_key[:12]} ({b.name})", why or "", policy.store)
            else:
                log.warning("tunecache: binary %s (%s) not placed: %s", b.triton_key[:12], b.name[:40], why)
            continue
        try:
            placed += _put(b)
        except Exception as e:  # noqa: BLE001 - this one is compiled; the next row may still be placed
            refused += 1
            log.debug("tunecache: placing binary %s failed: %r", b.triton_key[:12], e)
    if placed or refused:
        log.debug("tunecache: placed %d binaries into Triton's cache (%d refused)", placed, refused)
    return placed, refused


def _put(b: Binary) -> int:
    """Write verified binary ``b`` where this host's Triton looks; returns 1 if written."""
    from triton.runtime.cache import get_cache_manager

    mgr = get_cache_manager(b.triton_key)
    if b.ext == hostmodules.EXT:  # a host module: one file, where this host's Triton looks
        md = json.loads(b.metadata)
        if not hostmodules.loads_here(md):
            return 0
        with sharing.not_built_here("placed from the store"):  # never filed (nor signed) again as this host's
            mgr.put(b.binary, hostmodules.file_name(b.name, md), binary=True)
        return 1
    write_kernel(mgr, b)
    return 1


def write_kernel(mgr: Any, b: Binary) -> None:
    """Write verified kernel binary ``b`` through Triton cache manager ``mgr``, as a compile does:
    both files, then their group (Triton sees the group only once both files are whole)."""
    md_file, bin_file = f"{b.name}.json", f"{b.name}.{b.ext}"
    with sharing.not_built_here("placed from the store"):  # never filed (nor signed) again as this host's
        paths = {bin_file: mgr.put(b.binary, bin_file, binary=True), md_file: mgr.put(b.metadata, md_file)}
        mgr.put_group(md_file, paths)


def _placeable(triton_key: str, name: str) -> bool:
    """A key and name Triton's cache manager can take (checked before asking it anything)."""
    return bool(_HEX64.fullmatch(triton_key)) and bool(_NAME.fullmatch(name))


def _cached(triton_key: str, name: str, ext: str) -> bool:
    from triton.runtime.cache import get_cache_manager

    mgr = get_cache_manager(triton_key)
    if ext == hostmodules.EXT:
        return mgr.get_file(f"{name}{hostmodules.ext_suffix()}") is not None
    return mgr.get_group(f"{name}.json") is not None


def place_for(
    store: Store | None, specs_by_target: dict[str, list[LaunchSpec]] | None, policy: trust.Policy | None = None
) -> tuple[int, int]:
    """:func:`place` for every target's specs of one kernel (the target is not known before CUDA is up;
    another target's binary sits under a key this host never looks up)."""
    if store is None or not specs_by_target or interpreting() or not settings.get("TUNECACHE_BINARIES"):
        return 0, 0
    if not sharing.builds_shareable():  # an override or dump must apply: Triton builds these itself
        return 0, 0
    return place(store, [s for specs in specs_by_target.values() for s in specs], policy)


__all__ = [
    "collect",
    "from_group",
    "host_module",
    "host_module_keys",
    "host_module_spec",
    "place",
    "place_for",
    "problems_of",
    "record_companions",
    "upload",
    "write_kernel",
]
