"""Signing: Ed25519 keys, signatures of export files and of stored rows, and the keys a host trusts.

An export that carries binaries (or launch specs) carries code that will run on every GPU of a
fleet, so ``tunecache export --sign KEY`` signs it and ``import --binaries``/``--launch-specs``
accept it only when the signature verifies against a key in ``TUNECACHE_TRUSTED_KEYS``. Each
binary, host module and launch spec row is signed too, by the process that made it
(``TUNECACHE_SIGNING_KEY``): what a row signature covers, and when a row is used, is
:mod:`tunecache.trust.trust`'s. Trust is by the full public key, never by its id alone.

Keys (``tunecache keygen PATH``): PATH holds the private key (PKCS#8 PEM, unencrypted, mode 0600:
keep it in the build system's secret store), ``PATH.pub`` the public key as one line,
``tunecache-ed25519 <base64 of the 32 raw bytes> <key id>``. A key id is the first 16 hex digits of
the sha256 of the raw public key. ``TUNECACHE_TRUSTED_KEYS`` lists public keys, comma-separated,
each a ``.pub`` file's path or its text.

The cryptography is the ``cryptography`` package's (extra ``sign``), imported only here and only
when a key is made, used or checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tunecache import extras, settings
from tunecache.errors import ConfigurationError, SigningError

PUBLIC_PREFIX = "tunecache-ed25519"
ALGORITHM = "ed25519"
#: What an export's signature signs: this, then the header line exactly as written (padding and
#: newline included). The header carries the sha256 of every body line, so the one signature
#: covers every byte of the file before it.
SIGNED_CONTEXT = b"tunecache-export-signature-1\n"
#: What a row signature signs: this, then the row's message (:mod:`tunecache.trust.trust` builds it).
ROW_CONTEXT = b"tunecache-row-signature-1\n"


def _crypto() -> Any:
    """The Ed25519 module; SigningError naming the extra where cryptography is not installed. Called
    before any other import from cryptography, which would raise ImportError instead."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError(
            f"signing and verifying exports needs the 'cryptography' package: {extras.install_line('cryptography')}"
        ) from None
    return ed25519


def verifier_ready() -> None:
    """Import the crypto library now (a background warm-up: the first verification then pays no
    import); SigningError if it is missing."""
    _crypto()


def key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()[:16]


def public_line(raw_public: bytes) -> str:
    return f"{PUBLIC_PREFIX} {base64.b64encode(raw_public).decode()} {key_id(raw_public)}"


def keygen(path: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, str]:
    """Write a new private key to ``path`` (mode 0600) and its public key to ``path.pub``."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    priv_path = Path(path)
    pub_path = Path(f"{priv_path}.pub")
    for p in (priv_path, pub_path):
        if p.exists() and not overwrite:
            raise SigningError(f"{p} exists: not overwriting a key (remove it, or choose another path)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(priv_path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(priv_path, 0o600)  # an existing file keeps its mode through O_CREAT
    pub_path.write_text(public_line(raw) + "\n")
    return {"private_key": str(priv_path), "public_key": str(pub_path), "key_id": key_id(raw)}


class Signer:
    """A private key read from a ``tunecache keygen`` file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        ed25519 = _crypto()
        from cryptography.hazmat.primitives import serialization

        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise SigningError(f"cannot read the signing key {path}: {e.strerror or e}") from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise SigningError(
                f"{path} is not an unencrypted PEM private key (make one with `tunecache keygen`): {e}"
            ) from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise SigningError(f"{path} is not an Ed25519 key (make one with `tunecache keygen`)")
        self._key = key
        self.raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = key_id(self.raw_public)

    def sign_row(self, message: bytes) -> str:
        """A row signature: ``ed25519:<base64 public key>:<base64 signature>`` (a text column)."""
        sig = self._key.sign(ROW_CONTEXT + message)
        return f"{ALGORITHM}:{base64.b64encode(self.raw_public).decode()}:{base64.b64encode(sig).decode()}"

    def sign(self, header_line: bytes) -> dict[str, str]:
        """The signature object of an export whose header line is ``header_line``."""
        sig = self._key.sign(SIGNED_CONTEXT + header_line)
        return {
            "algorithm": ALGORITHM,
            "key_id": self.key_id,
            "public_key": base64.b64encode(self.raw_public).decode(),
            "value": base64.b64encode(sig).decode(),
        }


def _strict_b64(text: str) -> bytes:
    """Base64 in its one canonical spelling: decoders ignore the unused low bits of the last
    character, so two spellings decode alike and a flipped bit there would go unnoticed."""
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode() != text:
        raise ValueError("not canonical base64")
    return raw


def file_public_key(signature: dict[str, str]) -> bytes | None:
    """The raw public key an export's signature object names (None if it is not 32 bytes of base64)."""
    try:
        raw = _strict_b64(signature["public_key"])
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    return raw if len(raw) == 32 else None


def verify(signature: dict[str, str], header_line: bytes) -> bool:
    """Whether ``signature`` (checked for shape by the caller) signs ``header_line`` with the public
    key it names. Trust in that key is :func:`trusted_keys`'s business."""
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        raw = _strict_b64(signature["public_key"])
        sig = _strict_b64(signature["value"])
        if key_id(raw) != signature["key_id"]:
            return False
        ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(sig, SIGNED_CONTEXT + header_line)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def row_public_key(signature: str) -> bytes | None:
    """The raw public key a row signature names; None if it is not one."""
    parts = signature.split(":")
    if len(parts) != 3 or parts[0] != ALGORITHM:
        return None
    try:
        raw = _strict_b64(parts[1])
    except (ValueError, binascii.Error):
        return None
    return raw if len(raw) == 32 else None


def key_slot(raw_public: bytes) -> str:
    """The signer slot of the rows a key signs: its raw public key in base64 (44 characters)."""
    return base64.b64encode(raw_public).decode()


def row_slot(signature: str | None) -> str:
    """The signer slot of a row signed ``signature`` (a store's ``signer`` column, see
    :mod:`tunecache.store.signers`): the key it names, or "" for an unsigned row or a malformed
    signature. Names a key; verifies nothing."""
    raw = row_public_key(signature) if signature else None
    return "" if raw is None else key_slot(raw)


def verify_row(signature: str | None, message: bytes, trusted: Collection[bytes]) -> str | None:
    """Why ``signature`` does not vouch for ``message``; None if it does: a well-formed row signature
    by one of the ``trusted`` raw public keys (compared whole) that verifies."""
    if not signature:
        return "it is unsigned"
    raw = row_public_key(signature)
    if raw is None:
        return "its signature is malformed"
    if raw not in trusted:
        return f"it is signed by key {key_id(raw)}, which is not in TUNECACHE_TRUSTED_KEYS"
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        sig = _strict_b64(signature.split(":")[2])
        ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(sig, ROW_CONTEXT + message)
    except (InvalidSignature, ValueError, binascii.Error):
        return f"its signature by key {key_id(raw)} does not verify (the row was altered)"
    return None


_signers: dict[str, Signer] = {}
_signers_lock = threading.Lock()


def process_signer() -> Signer | None:
    """The key this process signs the rows it makes with (``TUNECACHE_SIGNING_KEY``), read once per
    path; None when unset. Raises :class:`SigningError` for a key that cannot be read."""
    path = settings.get("TUNECACHE_SIGNING_KEY")
    if not path:
        return None
    with _signers_lock:
        signer = _signers.get(path)
        if signer is None:
            signer = _signers[path] = Signer(path)
        return signer


def parse_public(text: str, where: str) -> bytes:
    """The raw public key of a ``tunecache-ed25519 BASE64 [comment]`` line."""
    parts = text.split()
    if len(parts) < 2 or parts[0] != PUBLIC_PREFIX:
        raise ConfigurationError(f"{where}: not a tunecache public key (expected '{PUBLIC_PREFIX} BASE64 ...')")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != 32:
        raise ConfigurationError(f"{where}: the key is not 32 bytes of base64 (an Ed25519 public key)")
    return raw


def trusted_keys(environ: Any = None) -> dict[str, bytes]:
    """The public keys of ``TUNECACHE_TRUSTED_KEYS``, by key id (for messages: trust is decided by
    the raw key, the values). A bad entry raises :class:`ConfigurationError` naming it: a typo must
    not silently trust nothing (or anything)."""
    return {key_id(raw): raw for _, raw in trusted_key_sources(environ)}


def trusted_key_sources(environ: Any = None) -> list[tuple[str, bytes]]:
    """Each entry of ``TUNECACHE_TRUSTED_KEYS`` (a ``.pub`` file's path, or "inline" for a key given
    as text) with its raw public key; raises as :func:`trusted_keys`."""
    value = settings.get("TUNECACHE_TRUSTED_KEYS", environ) or ""
    out: list[tuple[str, bytes]] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        if entry.startswith(PUBLIC_PREFIX):
            out.append(("inline", parse_public(entry, "TUNECACHE_TRUSTED_KEYS")))
            continue
        try:
            text = Path(entry).read_text()
        except OSError as e:
            raise ConfigurationError(
                f"TUNECACHE_TRUSTED_KEYS: cannot read the public key file {entry}: {e.strerror or e}"
            ) from None
        out.append((entry, parse_public(text.strip(), f"TUNECACHE_TRUSTED_KEYS: {entry}")))
    return out


def key_file_problems() -> list[str]:
    """What is wrong with ``TUNECACHE_TRUSTED_KEYS`` and ``TUNECACHE_SIGNING_KEY`` (a file that
    cannot be read, a bad key), one line each with what follows from it; empty when both are usable
    or unset. Said once at start (:func:`warn_key_files`) rather than at the first import or lookup."""
    out = []
    try:
        trusted_key_sources()
    except ConfigurationError as e:
        out.append(
            f"{e}; until it is fixed, nothing of a store that needs a trusted key (binaries, launch specs, "
            "torch.compile entries) is used, and imports that need one are refused"
        )
    try:
        process_signer()
    except (SigningError, ConfigurationError) as e:
        out.append(f"TUNECACHE_SIGNING_KEY: {e}; binaries, launch specs and torch.compile entries are stored unsigned")
    return out


_key_files_checked = False


def warn_key_files() -> None:
    """Log :func:`key_file_problems` once per process (``install()`` and the start-up hook call it)."""
    global _key_files_checked
    if _key_files_checked:
        return
    _key_files_checked = True
    for line in key_file_problems():
        logging.getLogger("tunecache").warning("tunecache: %s", line)


__all__ = [
    "ALGORITHM",
    "PUBLIC_PREFIX",
    "ROW_CONTEXT",
    "Signer",
    "file_public_key",
    "key_id",
    "verifier_ready",
    "key_file_problems",
    "keygen",
    "process_signer",
    "public_line",
    "key_slot",
    "row_public_key",
    "row_slot",
    "trusted_key_sources",
    "trusted_keys",
    "warn_key_files",
    "verify",
    "verify_row",
]
