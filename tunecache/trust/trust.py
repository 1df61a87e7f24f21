"""Trust: which binaries, host modules and launch specs of a store this process places or preloads.

A stored binary or host module is native code, and a launch spec steers what Triton compiles and
under which cache key: whoever can write them into a store a fleet reads runs code on every GPU of
it. So each such row is signed where it is made, by the tuning process's key
(``TUNECACHE_SIGNING_KEY``, made by ``tunecache keygen``), and a process places or preloads a row
only when one of these holds:

- its signature verifies against a full public key in ``TUNECACHE_TRUSTED_KEYS`` (never a key id
  alone: two keys may share an id);
- the store is trusted as a whole: ``TUNECACHE_TRUST_STORE=yes``, or ``auto`` (the default) for a
  SQLite file that only this user can write (the file and its directory are this user's and
  neither group- nor world-writable): whoever can write it can already run code as this user.

What a row signature covers (:func:`spec_message`, :func:`binary_message`, :func:`inductor_message`):
the row's whole identity and payload. A launch spec's kernel source, target digest, config, Triton
cache key, Triton version and the sha256 of its specialisation text (the hash it is filed under
must be that); a binary's or host module's content address (every byte of its metadata, whose
``target`` names the GPU architecture, and of its binary; see :func:`tunecache.problem.model.binary_sha256`),
its Triton cache key, name, extension and Triton version; a torch.compile entry's cache, key,
target digest and the sha256 of its bytes. Each is recomputed when a row is checked: the payload's
digest from its bytes, the identity from what the reader asked for (the kernel source it reads, the
Triton key it places, the cache, key and target it looks up), never from what the row says of
itself, so a signed row copied under another key, cache or target does not verify.

Each signer keeps its own row of an identity (:mod:`tunecache.store.signers`), and a process reads
only the rows of the keys it trusts (:attr:`Policy.slots`): a row no trusted key signed never keeps
out one a trusted key signed.

A row that is not vouched for is not placed, not loaded, and counted (``stats()["untrusted"]``);
the process says so in one warning line, whatever the number of rows, and compiles those kernels
as Triton would. Results (timings, winners) are not code and are read from any store.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import stat
import threading
from dataclasses import dataclass, replace
from typing import Any

from tunecache import settings
from tunecache.errors import ConfigurationError, SigningError
from tunecache.problem.model import Binary, InductorEntry, LaunchSpec, binary_sha256
from tunecache.process import counters
from tunecache.trust import signing

log = logging.getLogger("tunecache")


def _message(kind: str, fields: dict[str, str]) -> bytes:
    return json.dumps({"kind": kind, **fields}, sort_keys=True, separators=(",", ":")).encode()


def spec_message(source_hash: str, target_digest: str, spec: LaunchSpec) -> bytes:
    """What a launch spec row's signature signs (not the kernel's name: its source is named)."""
    return _message(
        "launch_spec",
        {
            "source_hash": source_hash,
            "target_digest": target_digest,
            "config_hash": spec.config_hash,
            "kernel_hash": spec.kernel_hash,
            "triton_version": spec.triton_version,
            "spec_sha256": hashlib.sha256(spec.spec_json.encode()).hexdigest(),
        },
    )


def binary_message(b: Binary) -> bytes:
    """What a binary (or host module) row's signature signs (its content address recomputed)."""
    content = binary_sha256(b.triton_key, b.name, b.ext, b.triton_version, b.metadata, b.binary)
    return _binary_message(b.triton_key, content, b.name, b.ext, b.triton_version)


def _binary_message(triton_key: str, sha256: str, name: str, ext: str, triton_version: str) -> bytes:
    fields = {"triton_key": triton_key, "sha256": sha256, "name": name, "ext": ext, "triton_version": triton_version}
    return _message("binary", fields)


def inductor_message(e: InductorEntry) -> bytes:
    """What an Inductor cache entry's signature signs: its cache, key, target and the sha256 of its
    bytes. A lookup checks it with the cache, key and target it asked for (the key hash it selects by
    is the key's), so a row copied under another key, cache or target does not verify."""
    return _message(
        "inductor",
        {"cache": e.kind, "key": e.key, "target_digest": e.target_digest, "sha256": e.sha256},
    )


_signer_warned = False
_unsigned_warned: set[str] = set()


def _signer(store: Any = None) -> signing.Signer | None:
    """This process's signing key; a key that cannot be read is warned about once and rows are stored
    unsigned (a fleet that trusts only signed rows then compiles them: never a failed launch). With
    ``store`` (a Store being written), a process storing unsigned rows where other hosts must check
    signatures (a store not private to this user) is told, once per store, that they will not use them."""
    global _signer_warned
    try:
        signer = signing.process_signer()
    except SigningError as e:
        if not _signer_warned:
            _signer_warned = True
            log.warning("tunecache: TUNECACHE_SIGNING_KEY: %s; binaries and launch specs are stored unsigned", e)
        signer = None
    if signer is None and store is not None and store.masked_url not in _unsigned_warned:
        why = not_private(store.url)
        if why is not None:
            _unsigned_warned.add(store.masked_url)
            log.warning(
                "tunecache: the binaries, launch specs and torch.compile entries this process stores in %s are "
                "unsigned (no usable TUNECACHE_SIGNING_KEY), and %s: hosts that trust only signed rows will not "
                "use them and build them again. Make a key (`tunecache keygen`), set TUNECACHE_SIGNING_KEY here "
                "and list its .pub in the other hosts' TUNECACHE_TRUSTED_KEYS",
                store.masked_url,
                why,
            )
    return signer


def sign_specs(source_hash: str, target_digest: str, specs: list[LaunchSpec], store: Any = None) -> list[LaunchSpec]:
    """``specs`` signed with this process's key (unchanged where no key is set or one is signed);
    ``store``: where they go (see :func:`_signer`)."""
    signer = _signer(store)
    if signer is None:
        return specs
    return [
        s if s.signature else replace(s, signature=signer.sign_row(spec_message(source_hash, target_digest, s)))
        for s in specs
    ]


def sign_binaries(bins: list[Binary], store: Any = None) -> list[Binary]:
    """``bins`` signed with this process's key (unchanged where no key is set or one is signed)."""
    signer = _signer(store)
    if signer is None:
        return bins
    return [b if b.signature else replace(b, signature=signer.sign_row(binary_message(b))) for b in bins]


def sign_inductor(e: InductorEntry, store: Any = None) -> InductorEntry:
    """``e`` signed with this process's key (unchanged where no key is set or it is signed)."""
    if e.signature:
        return e
    signer = _signer(store)
    if signer is None:
        return e
    return replace(e, signature=signer.sign_row(inductor_message(e)))


def own_row(slot: str, signature: str | None, message: bytes) -> bool:
    """Whether a row stored in signer ``slot`` is that signer's own as it stands: signed, by the
    slot's key, over ``message`` (recomputed from the row). A put of that signer keeps it, and
    replaces anything else there (a row planted in its slot, or altered). The unsigned slot has no
    key to tell: its row is kept, as a store trusted as a whole takes it."""
    if not slot:
        return True
    return signing.verify_row(signature, message, [base64.b64decode(slot)]) is None


def own_slot(store: Any = None) -> str:
    """The signer slot this process's rows go to (:mod:`tunecache.store.signers`): its key's, or ""."""
    signer = _signer(store)
    return "" if signer is None else signing.key_slot(signer.raw_public)


def signed_heads(heads: dict[str, tuple[Any, ...]], store: Any = None) -> set[str]:
    """The Triton keys whose binary in this process's own slot (``heads``: what
    :meth:`~tunecache.store.binaryrows.BinaryRows.binary_signatures` answers, read without bytes) this
    process's key signed as it stands: an uploader puts the others again (a row planted in its slot,
    a column altered). Without a key every row of its slot is taken as its own (nothing to check)."""
    signer = _signer(store)
    if signer is None:
        return set(heads)
    mine = [signer.raw_public]
    return {k for k, (sha, name, ext, version, sig) in heads.items()
            if signing.verify_row(sig, _binary_message(k, sha, name, ext, version), mine) is None}  # fmt: skip


def private_sqlite(url: Any) -> bool:
    """Whether ``url`` is a SQLite file (existing or not) that only this user can write."""
    return not_private(url) is None


def not_private(url: Any) -> str | None:
    """Why ``url`` is not a SQLite file that only this user can write (None: it is), in a user's words."""
    if not str(getattr(url, "drivername", "")).startswith("sqlite"):
        return "it is not a SQLite file but a database others may write"
    db = getattr(url, "database", None)
    if not db or db == ":memory:" or db.startswith("file:"):
        return "it is an in-memory or URI SQLite database"
    path = os.path.abspath(os.path.expanduser(db))
    for p in (path, os.path.dirname(path)):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{p} cannot be checked ({e.strerror or e})"
        if st.st_uid != os.geteuid():
            return f"{p} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
            return f"{p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_why(url: Any) -> str:
    """Why a store :func:`not_private` passes is this user's alone: a file marked read-only (an
    image's store, mode 444) is not one "this user can write", though no one else can change it."""
    path = os.path.abspath(os.path.expanduser(url.database))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not mode & stat.S_IWUSR:
        return (
            f"the SQLite file is read-only (mode {stat.S_IMODE(mode):o}), and it and its directory are this "
            "user's, which no one else can write"
        )
    return "only this user can write the SQLite file and its directory"


def store_trust(url: Any) -> tuple[bool, str]:
    """Whether this process trusts the store at ``url`` as a whole (``TUNECACHE_TRUST_STORE``), and
    why, or why not and what to do, in one sentence."""
    mode = settings.get("TUNECACHE_TRUST_STORE")
    if mode == "yes":
        return True, "TUNECACHE_TRUST_STORE=yes"
    if mode == "no":
        return False, "TUNECACHE_TRUST_STORE=no: only rows a key in TUNECACHE_TRUSTED_KEYS signed are used"
    why = not_private(url)
    if why is None:
        return True, f"TUNECACHE_TRUST_STORE=auto, and {_private_why(url)}"
    return False, (
        f"TUNECACHE_TRUST_STORE=auto trusts only a SQLite file only this user can write, and {why}: move it to a "
        "directory only you can write, or sign rows where they are made (TUNECACHE_SIGNING_KEY) and list the "
        "public key in TUNECACHE_TRUSTED_KEYS, or set TUNECACHE_TRUST_STORE=yes if you trust whoever can write it"
    )


_why_not: dict[str, str] = {}  # masked store URL -> why it is not trusted as a whole (for refused())


@dataclass(frozen=True)
class Policy:
    """What one process trusts of one store."""

    keys: frozenset[bytes]  # raw Ed25519 public keys
    whole: bool  # the store is trusted as a whole
    store: str  # its masked URL, for messages

    @property
    def slots(self) -> frozenset[str] | None:
        """The signer slots whose rows this process reads (:mod:`tunecache.store.signers`): its
        trusted keys'; None (every slot) for a store trusted as a whole."""
        return None if self.whole else frozenset(signing.key_slot(k) for k in self.keys)

    def not_read(self, signature: str | None) -> str:
        """Why a row signed ``signature``, stored in a slot this process does not read, is not used."""
        return signing.verify_row(signature, b"", self.keys) or "it is not in its signer's slot"

    def spec(self, source_hash: str, target_digest: str, s: LaunchSpec) -> str | None:
        """Why launch spec ``s`` must not be preloaded; None if it may. A signed one must be filed
        under its text's hash (the signature covers the sha256 of its text)."""
        if self.whole:
            return None
        if hashlib.sha256(s.spec_json.encode()).hexdigest() != s.spec_hash:
            return "its spec hash is not that of its text (the row was altered or moved)"
        return signing.verify_row(s.signature, spec_message(source_hash, target_digest, s), self.keys)

    def specs(self, source_hash: str, by_target: dict[str, list[LaunchSpec]]) -> dict[str, list[LaunchSpec]]:
        """The launch specs of ``by_target`` (one kernel source's, by target digest) this process
        may preload; each one refused is counted (:func:`refused`)."""
        out: dict[str, list[LaunchSpec]] = {}
        for t, specs in by_target.items():
            taken: set[str] = set()  # one spec per hash: the newest that is vouched for (several signers')
            for s in specs:
                if s.spec_hash in taken:
                    continue
                why = self.spec(source_hash, t, s)
                if why is None:
                    out.setdefault(t, []).append(s)
                    taken.add(s.spec_hash)
                else:
                    refused("launch spec", s.spec_hash[:12], why, self.store)
        return out

    def stored_specs(self, store: Any, source_hash: str) -> dict[str, list[LaunchSpec]]:
        """The launch specs of one kernel source stored in ``store`` that this process may preload, by
        target: only those of the signers it trusts are read (:mod:`tunecache.store.signers`), each
        checked (:meth:`specs`); where only others' are stored, one is counted and said (refused)."""
        out = self.specs(source_hash, store.get_specs(source_hash, self.slots))
        if not out and self.slots is not None:
            n, one = store.specs_elsewhere(source_hash, self.slots)
            if one is not None:
                refused("launch spec", one[0][:12], self.not_read(one[1]), self.store, n)
        return out

    def binary(self, b: Binary) -> str | None:
        """Why binary (or host module) ``b`` must not be placed; None if it may."""
        if self.whole:
            return None
        return signing.verify_row(b.signature, binary_message(b), self.keys)

    def inductor(self, e: InductorEntry) -> str | None:
        """Why Inductor cache entry ``e`` (its kind, key and target those of the lookup: see
        :meth:`tunecache.store.inductorrows.InductorRows.get_inductor_rows`) must not be served;
        None if it may. Every entry must hold
        the bytes its sha256 names, and be vouched for by a trusted key or come from a store trusted
        as a whole: a compiled graph (FX graph, AOTAutograd) is code, and an autotune entry, though
        only config choices, is rebuilt by Inductor (torch 2.13) into a config it never generated
        when it matches none of its own, so a planted one could make every host's compile fail."""
        if hashlib.sha256(e.value).hexdigest() != e.sha256:
            return "its bytes do not match its sha256 (the row was altered or damaged)"
        if self.whole:
            return None
        return signing.verify_row(e.signature, inductor_message(e), self.keys)


def policy(store: Any) -> Policy:
    """The trust this process gives ``store`` (a :class:`tunecache.store.store.Store`) now, from the settings.
    Raises :class:`~tunecache.errors.ConfigurationError` for a bad ``TUNECACHE_TRUSTED_KEYS`` entry."""
    whole, why = store_trust(store.url)
    if not whole:
        _why_not[store.masked_url] = why
    keys = frozenset(signing.trusted_keys().values()) if not whole else frozenset()
    return Policy(keys, whole, store.masked_url)


def describe(url: Any) -> dict[str, Any]:
    """This process's trust in the store at ``url`` (there or not yet), for ``tunecache info``: the
    trusted keys (key id, and the file each came from) or why they cannot be read, the signing key,
    and whether the store is trusted as a whole and why. Never raises for a bad setting: it is what
    is shown."""
    out: dict[str, Any] = {"trusted_keys": [], "trusted_keys_error": None, "signing_key": None}
    try:
        out["trusted_keys"] = [
            {"key_id": signing.key_id(raw), "from": src} for src, raw in signing.trusted_key_sources()
        ]
    except ConfigurationError as e:
        out["trusted_keys_error"] = str(e)
    path = settings.get("TUNECACHE_SIGNING_KEY")
    if path:
        try:
            signer = signing.process_signer()
            out["signing_key"] = {"path": path, "key_id": signer.key_id if signer else None, "error": None}
        except SigningError as e:
            out["signing_key"] = {"path": path, "key_id": None, "error": str(e)}
    out["trust_store"] = settings.get("TUNECACHE_TRUST_STORE")
    out["store_trusted"], out["why"] = store_trust(url)
    return out


_refused_lock = threading.Lock()
_refused_warned = False


def refused(what: str, name: str, why: str, store: str, n: int = 1) -> None:
    """Count a row (``n`` rows like it) that was not placed or loaded; one warning per process, a
    debug line per call."""
    global _refused_warned
    counters.refused(what, why, n)  # untrusted, and by what and why (tunecache.metrics)
    log.debug("tunecache: %s %s from %s not used: %s", what, name, store, why)
    with _refused_lock:
        if _refused_warned:
            return
        _refused_warned = True
    log.warning(
        "tunecache: binaries, launch specs and compiled graphs from %s that no trusted key signed are not used "
        "(first: %s %s: %s); Triton (or torch.compile) compiles them here instead. "
        "Sign them where they are made (TUNECACHE_SIGNING_KEY) and list the public "
        "key in TUNECACHE_TRUSTED_KEYS, or set TUNECACHE_TRUST_STORE=yes for a store only you can write. "
        "stats()['untrusted'] counts them%s",
        store,
        what,
        name,
        why,
        f". The store is not trusted as a whole: {_why_not[store]}" if store in _why_not else "",
    )


def reset_warnings() -> None:
    """Warn again (for tests)."""
    global _refused_warned
    with _refused_lock:
        _refused_warned = False
        _unsigned_warned.clear()


__all__ = [
    "Policy",
    "binary_message",
    "describe",
    "inductor_message",
    "policy",
    "not_private",
    "own_row",
    "own_slot",
    "private_sqlite",
    "refused",
    "reset_warnings",
    "sign_binaries",
    "sign_inductor",
    "sign_specs",
    "signed_heads",
    "spec_message",
    "store_trust",
]
