"""Entries: what tunecache does with the bytes Inductor's remote caches get and put, without torch.

Inductor treats a remote cache as best effort: a miss means it compiles (or autotunes) as it would
without one. So every failure here (a store that does not answer, a read-only store, a row that
does not verify) is a miss on get and nothing on put, logged once per process, never an exception
into Inductor. Entries are bound to the target (:func:`inductor_target`): what Inductor's own key
does not include (the device, its driver, the torch and Triton versions).

Modes (``TUNECACHE_MODE``): readwrite and strict read and write; readonly only reads (nothing is
written, not even a hit, and no lease is taken); offline and off use no store at all. A miss of a
costly entry takes its lease, or waits for the host that holds it (:mod:`tunecache.inductor.leases`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tunecache import counters, processend, settings, signing, trust, writeback
from tunecache.identity import canonical_json, sha256_hex
from tunecache.inductor import leases
from tunecache.model import INDUCTOR_KINDS, INDUCTOR_TARGET_FIELDS, InductorEntry
from tunecache.store.opening import shared_store
from tunecache.store.store import Store
from tunecache.target import detect_target

log = logging.getLogger("tunecache")

#: Versions of the target digest of Inductor entries (bumped if its fields change).
TARGET_VERSION = 1


@functools.lru_cache(maxsize=1)
def inductor_target() -> tuple[str, dict[str, str]]:
    """(digest, description) of this process's target as Inductor entries are bound to it.

    Inductor's keys hash the graph, the config and (for FX graphs) torch's sources, but not always
    the driver, and a stored compiled graph holds device code: an entry is served only where all of
    these are the same."""
    import torch  # the process compiles with torch: it is loaded already

    t = detect_target()
    desc = {
        "backend": t.backend,
        "arch": t.arch,
        "device_name": t.device_name,
        "driver_version": t.driver_version,
        "driver_release": t.driver_release,
        "torch_version": str(torch.__version__),
        "triton_version": t.triton_version,
    }
    digest = sha256_hex(
        canonical_json({"v": TARGET_VERSION, **t.digest_fields(), "torch_version": desc["torch_version"]})
    )
    return digest, desc


@functools.lru_cache(maxsize=1)
def host_target() -> tuple[str, dict[str, str]]:
    """(digest, description) of what a host module is bound to (a C extension Triton builds with the
    system's compiler, :mod:`tunecache.binaries.hostmodules`): the machine, the interpreter's extension
    suffix and Triton's version, no device nor driver. Read without CUDA: Triton builds its driver
    utilities while the device target is being read (:func:`inductor_target`)."""
    import platform
    import sysconfig

    import triton

    desc = {field: "" for field in INDUCTOR_TARGET_FIELDS}
    desc.update(backend="host", arch=platform.machine(), triton_version=str(triton.__version__))
    ext = str(sysconfig.get_config_var("EXT_SUFFIX"))
    return sha256_hex(canonical_json({"v": TARGET_VERSION, "ext_suffix": ext, **desc})), desc


class InductorStore:
    """tunecache's side of Inductor's remote caches: ``get``/``put`` of bytes under (cache kind, key).

    ``store`` pins one store (tests, tools); by default the process's shared store of ``TUNECACHE_URL``
    is opened on first use."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store
        self._policies: dict[int, trust.Policy] = {}

    def _open(self) -> Store | None:
        if settings.current_mode() in ("offline", "off"):
            return None
        return self.store if self.store is not None else shared_store()

    def _policy(self, store: Store) -> trust.Policy:
        p = self._policies.get(id(store))
        if p is None:
            p = self._policies[id(store)] = trust.policy(store)
        return p

    def warm(self) -> None:
        """Open the store and read this process's trust in it, so that the first lookup of a compile
        finds both ready (the imports of the database and crypto layers and the schema check cost a
        fresh host some 0.1-0.3 s that a warm host, reading its local caches, never pays). No CUDA
        call: the target is read at the first lookup. Never raises: the lookup says what fails."""
        try:
            store = self._open()
            if store is not None and trust.policy(store).keys:  # not kept: the first lookup reads it
                signing.verifier_ready()
        except Exception:  # noqa: BLE001, S110 - the first lookup opens it again and reports
            pass

    def get(self, kind: str, key: str) -> bytes | None:
        """The bytes stored under ``key`` in cache ``kind`` for this target, or None (a miss)."""
        return self.lookup(kind, key)[0]

    def lookup(self, kind: str, key: str, target: str | None = None) -> tuple[bytes | None, bool]:
        """(:meth:`get`'s answer, whether the store answered): (None, True) when the store lacks the
        entry or holds one it does not vouch for, (None, False) with no store or on a failure.
        ``target``: the digest the entry is bound to (default: this process's, :func:`inductor_target`)."""
        if kind not in INDUCTOR_KINDS:
            raise ValueError(f"{kind!r} is not an Inductor cache tunecache keeps: {', '.join(INDUCTOR_KINDS)}")
        try:
            store = self._open()
            if store is None:
                return None, False
            leases.busy()
            processend.arm()  # a compile worker says its summary line (and releases its leases) as it ends
            digest = target or inductor_target()[0]
            entry = store.get_inductor(kind, key, digest)
            if entry is None and self._writes(store):
                entry = leases.on_miss(store, kind, key, digest)  # another host's, if it was computing it
            if entry is None:
                counters.count(None, None, inductor_misses=1)
                return None, True
            why = self._policy(store).inductor(entry)
        except Exception as e:  # noqa: BLE001 - Inductor compiles as without a remote cache
            self._failed("get", e)
            return None, False
        if why is not None:
            trust.refused(f"torch.compile {kind} entry", key[:60], why, store.masked_url)
            counters.count(None, None, inductor_misses=1, inductor_untrusted=1)
            return None, True
        counters.count(None, None, inductor_hits=1)
        if self._writes(store):
            writeback.inductor_hit(store, entry)  # written off this compile's path (tunecache.writeback)
        return entry.value, True

    def put(self, kind: str, key: str, data: bytes, target: tuple[str, dict[str, str]] | None = None) -> None:
        """Store ``data`` under ``key`` in cache ``kind`` for this target (or ``target``, a digest and
        its description), signed with this process's key; nothing in readonly, offline or off mode, or
        on a read-only store."""
        if kind not in INDUCTOR_KINDS:
            raise ValueError(f"{kind!r} is not an Inductor cache tunecache keeps: {', '.join(INDUCTOR_KINDS)}")
        try:
            if settings.current_mode() == "readonly":
                return
            store = self._open()
            if store is None or store.readonly:
                return
            leases.busy()
            digest, desc = target or inductor_target()
            entry = trust.sign_inductor(InductorEntry(kind, key, digest, bytes(data), desc), store)
            kept = store.put_inductor(entry)
            if kept is None:
                counters.count(None, None, inductor_puts=1)
            else:
                self._not_stored(store, entry, kept)
            leases.on_put(store, kind, key, digest)
        except Exception as e:  # noqa: BLE001 - Inductor keeps its result locally, as without a remote cache
            self._failed("put", e)

    def _not_stored(self, store: Store, entry: InductorEntry, kept: str) -> None:
        """Count a put the store refused (it holds the entry signed by a key this one is not signed
        by) and say once why, and what to do: this host then compiles what the fleet's key made."""
        counters.count(None, None, inductor_not_stored=1)
        raw = signing.row_public_key(kept)
        theirs = signing.key_id(raw) if raw is not None else "(a malformed signature)"
        ours = signing.row_public_key(entry.signature) if entry.signature else None
        how = f"with key {signing.key_id(ours)}" if ours else "with no key (TUNECACHE_SIGNING_KEY is unset)"
        policy = self._policy(store)
        trusted = "" if policy.whole or raw in policy.keys else ", which this host does not trust"
        counters.warn_once(
            "torch.compile",
            "inductor-not-stored",
            "tunecache: torch.compile entries this host computes are not stored in %s (first: %s %s): the "
            "store holds them signed by key %s%s, and this host signs %s; a signed entry is replaced only by "
            "one of its own key, so that hosts with other keys never evict each other's. If key %s is your "
            "fleet's, list it in TUNECACHE_TRUSTED_KEYS (this host is then served those entries) and sign "
            "with it (TUNECACHE_SIGNING_KEY); if it was retired, drop its entries (tunecache invalidate, "
            "gc). stats()['inductor_not_stored'] counts them",
            store.masked_url,
            entry.kind,
            entry.key[:60],
            theirs,
            trusted,
            how,
            theirs,
        )

    @staticmethod
    def _writes(store: Store) -> bool:
        """Whether this process writes to ``store`` (hits recorded, leases taken)."""
        return not store.readonly and settings.current_mode() != "readonly"

    def _failed(self, what: str, e: Exception) -> None:
        counters.count(None, None, store_errors=1)
        counters.warn_once(
            "torch.compile",
            f"inductor-{what}",
            "tunecache: torch.compile's remote cache %s failed (%s); Inductor compiles as without a remote cache",
            what,
            _short(e),
        )


def _short(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:300]


_default: InductorStore | None = None


def default() -> InductorStore:
    """The process's InductorStore on ``TUNECACHE_URL`` (what the backends use)."""
    global _default
    if _default is None:
        _default = InductorStore()
    return _default


def stats() -> dict[str, Any]:
    """This process's Inductor cache counters: hits, misses (refusals included), puts, puts not stored
    (the store holds the entry signed by another key), lease waits and the seconds they took,
    refusals (untrusted and store_errors are shared with the tuner)."""
    s = counters.stats()
    return {k: v for k, v in s.items() if k.startswith("inductor_") or k in ("untrusted", "store_errors")}


__all__ = ["InductorStore", "default", "host_target", "inductor_target", "stats"]
