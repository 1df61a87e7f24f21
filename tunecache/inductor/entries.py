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

from tunecache import settings
from tunecache.inductor import leases
from tunecache.problem.identity import canonical_json, sha256_hex
from tunecache.problem.model import INDUCTOR_KINDS, INDUCTOR_TARGET_FIELDS, InductorEntry
from tunecache.problem.target import detect_target
from tunecache.process import counters, processend, writeback
from tunecache.store import signers
from tunecache.store.opening import shared_store
from tunecache.store.store import Store
from tunecache.trust import signing, trust

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
        from tunecache.metrics import exporter  # imported at the first open (warm(), off the compile)

        exporter.start()  # the server's /metrics shows tunecache's counters
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
            policy = self._policy(store)
            entry, why = self._choose(store, policy, kind, key, digest)
            if entry is None and why is None and self._writes(store):
                # Another host's, if it was computing it (an entry this process trusts: leases.on_miss).
                entry = leases.on_miss(store, kind, key, digest, policy.slots)
                why = None if entry is None else policy.inductor(entry)
            if entry is None and why is None:
                counters.count(None, None, inductor_misses=1)
                return None, True
        except Exception as e:  # noqa: BLE001 - Inductor compiles as without a remote cache
            self._failed("get", e)
            return None, False
        if entry is None or why is not None:
            trust.refused(f"torch.compile {kind} entry", key[:60], why or "", store.masked_url)
            counters.count(None, None, inductor_misses=1, inductor_untrusted=1)
            return None, True
        counters.count(None, None, inductor_hits=1)
        if self._writes(store):
            writeback.inductor_hit(store, entry)  # written off this compile's path (tunecache.process.writeback)
        return entry.value, True

    @staticmethod
    def _choose(
        store: Store, policy: trust.Policy, kind: str, key: str, digest: str
    ) -> tuple[InductorEntry | None, str | None]:
        """(the entry this process may be served, None) or (None, why not) or (None, None): a miss.
        Only the rows of the signers it trusts are read (:mod:`tunecache.store.signers`), the newest
        that verifies served; where only others' rows are stored, one's signature says why not."""
        why = None
        for entry in store.get_inductor_rows(kind, key, digest, policy.slots):
            why = policy.inductor(entry)
            if why is None:
                return entry, None
        if why is None and policy.slots is not None:
            for signature in store.inductor_signatures_elsewhere(kind, key, digest, policy.slots):
                why = policy.not_read(signature)
        return None, why

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
            if len(data) > signers.MAX_ROW_BYTES["inductor_entries"]:
                log.debug("tunecache: torch.compile %s entry %s not stored: %d bytes", kind, key[:60], len(data))
                return  # no host would read it (tunecache.store.signers)
            entry = trust.sign_inductor(InductorEntry(kind, key, digest, bytes(data), desc), store)
            store.put_inductor(entry)  # in its signer's slot: never refused, never evicting another's
            counters.count(None, None, inductor_puts=1)
            leases.on_put(store, kind, key, digest)
        except Exception as e:  # noqa: BLE001 - Inductor keeps its result locally, as without a remote cache
            self._failed("put", e)

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
    """This process's Inductor cache counters: hits, misses (refusals included), puts, lease waits
    and the seconds they took, refusals (untrusted and store_errors are shared with the tuner)."""
    s = counters.stats()
    return {k: v for k, v in s.items() if k.startswith("inductor_") or k in ("untrusted", "store_errors")}


__all__ = ["InductorStore", "default", "host_target", "inductor_target", "stats"]
