"""Validation: every check of an export file's lines, and import's pass 1 (:func:`scan`).

Nothing in a file is trusted: every field is type-checked against the store's limits, every hash
recomputed, every count and the body's sha256 compared with the header. A failure is
:class:`Invalid` inside a line, raised as :class:`~tunecache.errors.ImportFormatError` naming it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.errors import ImportFormatError
from tunecache.exchange.format import (
    BATCH,
    BINARIES_VERSION,
    CONFIG_OBJECT_FIELDS,
    FILTER_FIELDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER_FIELDS,
    HEADER_FIELDS_V1,
    HEADER_FIELDS_V3,
    HEADER_FIELDS_V5,
    INDUCTOR_FIELDS,
    INDUCTOR_TARGET_OPTIONAL,
    INDUCTOR_VERSION,
    MAX_FAILURE_DEPTH,
    MAX_INDUCTOR_KEY,
    READABLE_VERSIONS,
    SIGNATURE_FIELDS,
    SIGNED_ROWS_VERSION,
    Progress,
    Rewind,
    line_limits,
    tunecache_version,
)
from tunecache.problem.configidentity import CONFIG_FIELDS, config_hash_of
from tunecache.problem.identity import canonical_json, problem_digest
from tunecache.problem.model import (
    BINARY_FIELDS,
    BINARY_FIELDS_SIGNED,
    CONFIG_ROW_FIELDS,
    INDUCTOR_KINDS,
    INDUCTOR_TARGET_FIELDS,
    LAUNCH_SPEC_FIELDS,
    LAUNCH_SPEC_FIELDS_SIGNED,
    PROBLEM_FIELDS,
    STATUSES,
    InductorEntry,
    binary_from_json,
    binary_row,
    launch_spec_from_json,
    launch_spec_row,
)
from tunecache.problem.target import TARGET_FIELDS, Target
from tunecache.settings import MAX_BINARY_BYTES
from tunecache.store.schema import problems
from tunecache.trust import signing

_SPEC_FIELDS = {False: LAUNCH_SPEC_FIELDS, True: LAUNCH_SPEC_FIELDS_SIGNED}  # by "carries row signatures"
_BINARY_FIELDS = {False: BINARY_FIELDS, True: BINARY_FIELDS_SIGNED}
_SPEC_SETS = {k: frozenset(v) for k, v in _SPEC_FIELDS.items()}
_BINARY_SETS = {k: frozenset(v) for k, v in _BINARY_FIELDS.items()}
_SIGNATURE_SET = frozenset(SIGNATURE_FIELDS)
_INDUCTOR_SET = frozenset(INDUCTOR_FIELDS)
_PROBLEM_SET = frozenset(PROBLEM_FIELDS)
_CONFIG_ROW_SET = frozenset(CONFIG_ROW_FIELDS)
_N_CONFIG_ROW_FIELDS = len(CONFIG_ROW_FIELDS)
_CONFIG_SET = frozenset(CONFIG_OBJECT_FIELDS)
_TARGET_SET = frozenset(TARGET_FIELDS)
_TARGET_INT = frozenset(f for f in TARGET_FIELDS if problems.c[f].type.python_type is int)
_STATUS_SET = frozenset(STATUSES)
_INT_MAX = 2**31 - 1  # the Integer columns are 32-bit on PostgreSQL and MySQL
_HEX = re.compile(r"[0-9a-f]*")


class Invalid(Exception):
    """A validation failure inside one line; the caller adds the line number."""


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        if line.strip() == b"":
            raise Invalid("empty line: every line must be one JSON object") from None
        hint = " (NaN and Infinity are not JSON numbers)" if b"NaN" in line or b"Infinity" in line else ""
        raise Invalid(f"not valid JSON: {e.msg} at column {e.colno}{hint}") from None


def _tname(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(v), type(v).__name__
    )


def _check_fields(obj: Any, allowed: frozenset[str], order: Sequence[str], what: str) -> None:
    if type(obj) is not dict:
        raise Invalid(f"{what} must be a JSON object, got {_tname(obj)}")
    if obj.keys() != allowed:
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise Invalid(f"unknown field{'s' if len(unknown) > 1 else ''} in {what}: {', '.join(map(repr, unknown))}")
        missing = [f for f in order if f not in obj]
        raise Invalid(f"missing field{'s' if len(missing) > 1 else ''} in {what}: {', '.join(map(repr, missing))}")


def _check_header(obj: Any) -> dict[str, Any]:
    if type(obj) is not dict or obj.get("format") != FORMAT_NAME:
        if type(obj) is dict and "digest" in obj:
            raise Invalid(
                f'missing header: line 1 is a problem; a {FORMAT_NAME} file starts with {{"format": '
                f'"{FORMAT_NAME}", "version": {FORMAT_VERSION}, ...}} (was its start cut off?)'
            )
        raise Invalid(f'not a tunecache export: line 1 must be the header {{"format": "{FORMAT_NAME}", ...}}')
    version = obj.get("version")
    if type(version) is not int:
        raise Invalid(f"header field 'version' must be an integer, got {_tname(version)}")
    if version not in READABLE_VERSIONS:
        raise Invalid(
            f"unsupported format version {version}: this tunecache ({tunecache_version()}) reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
            + ("; upgrade tunecache to import this file" if version > max(READABLE_VERSIONS) else "")
        )
    if version == 1:
        fields = HEADER_FIELDS_V1
    elif version == FORMAT_VERSION:
        fields = HEADER_FIELDS
    else:
        fields = HEADER_FIELDS_V5 if version >= INDUCTOR_VERSION else HEADER_FIELDS_V3
    _check_fields(obj, frozenset(fields), fields, "the header")
    if version < INDUCTOR_VERSION:
        obj = {**obj, "inductor_entries": 0}
    if version == 1:
        obj = {**obj, "launch_specs": 0}
    if version < BINARIES_VERSION:
        obj = {**obj, "binaries": 0, "signed_by": None}
    if obj["signed_by"] is not None and not _is_hex(obj["signed_by"], 16):
        raise Invalid("header field 'signed_by' must be null or a key id of 16 lowercase hex digits")
    for name in ("problems", "configs", "launch_specs", "binaries", "inductor_entries"):
        v = obj[name]
        if type(v) is not int or v < 0:
            raise Invalid(f"header field {name!r} must be a non-negative integer, got {v!r}")
    if not _is_hex(obj["body_sha256"], 64):
        raise Invalid("header field 'body_sha256' must be 64 lowercase hex digits")
    for name in ("tunecache", "created_at"):
        if type(obj[name]) is not str:
            raise Invalid(f"header field {name!r} must be a string, got {_tname(obj[name])}")
    filters = obj["filters"]
    if type(filters) is not dict or not set(filters) <= set(FILTER_FIELDS):
        raise Invalid(f"header field 'filters' must be an object with keys among {', '.join(FILTER_FIELDS)}")
    if any(v is not None and type(v) is not str for v in filters.values()):
        raise Invalid("header field 'filters' must map to strings or null")
    return obj


def _is_hex(v: Any, n: int) -> bool:
    return type(v) is str and len(v) == n and _HEX.fullmatch(v) is not None


def _text(v: Any, name: str, limit: int | None) -> str:
    if type(v) is not str:
        raise Invalid(f"{name} must be a string, got {_tname(v)}")
    if limit is not None and len(v) > limit:
        raise Invalid(f"{name} is {len(v)} characters long; the store's limit is {limit}")
    return v


def _int(v: Any, name: str, nullable: bool = False) -> int | None:
    if type(v) is int and 0 <= v <= _INT_MAX:
        return v
    if v is None and nullable:
        return None
    if type(v) is int:
        raise Invalid(f"{name} must be between 0 and {_INT_MAX}, got {v}")
    raise Invalid(f"{name} must be an integer{' or null' if nullable else ''}, got {_tname(v)}")


def _ms(v: Any, name: str, nullable: bool = True) -> float | None:
    """A timing: finite and non-negative (an int is accepted as a number, a boolean is not)."""
    t = type(v)
    if t is float:
        if 0.0 <= v < math.inf:
            return v
    elif t is int:
        if 0 <= v < 2**63:
            return float(v)
    elif v is None and nullable:
        return None
    else:
        raise Invalid(f"{name} must be a number{' or null' if nullable else ''}, got {_tname(v)}")
    raise Invalid(f"{name} must be finite and non-negative, got {v!r}")


def _ts(v: Any, name: str, nullable: bool = False) -> dt.datetime | None:
    if v is None and nullable:
        return None
    if type(v) is not str:
        raise Invalid(f"{name} must be an ISO 8601 date-time string{' or null' if nullable else ''}, got {_tname(v)}")
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError:
        raise Invalid(f"{name} is not an ISO 8601 date-time: {v[:40]!r}") from None
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t


def _scalar(v: Any) -> bool:
    return v is None or type(v) in (str, int, float, bool)


def _depth_ok(v: Any, left: int) -> bool:
    if type(v) is dict:
        return left > 0 and all(_depth_ok(x, left - 1) for x in v.values())
    if type(v) is list:
        return left > 0 and all(_depth_ok(x, left - 1) for x in v)
    return True


_TEXT_LIMITS = {c.name: getattr(c.type, "length", None) for c in problems.c}


class _Validator:
    """Checks problem lines; caches what repeats (targets, configs) so 1.2M rows stay fast."""

    def __init__(self) -> None:
        self.targets: dict[bytes, Target] = {}
        self.config_hashes: dict[bytes, str] = {}

    def target(self, t: Any) -> Target:
        # Keyed by the exact JSON text: 1, 1.0 and true differ there, unlike in a dict lookup.
        text = orjson.dumps(t) if type(t) is dict else b""
        found = self.targets.get(text)
        if found is None:
            _check_fields(t, _TARGET_SET, TARGET_FIELDS, "target")
            for f in TARGET_FIELDS:
                if f in _TARGET_INT:
                    _int(t[f], f"target.{f}")
                else:
                    _text(t[f], f"target.{f}", _TEXT_LIMITS[f])
            found = Target(**t)
            if len(self.targets) < 10_000:
                self.targets[text] = found
        return found

    def config_hash(self, cfg: Any, name: str) -> str:
        if type(cfg) is not dict:
            raise Invalid(f"{name} must be a JSON object, got {_tname(cfg)}")
        canon = orjson.dumps(cfg, option=orjson.OPT_SORT_KEYS)
        h = self.config_hashes.get(canon)
        if h is None:
            if "ir_override" in cfg:  # optional: only configs that replace their IR carry it
                if type(cfg["ir_override"]) is not str:
                    raise Invalid(f"{name}.ir_override must be a string (the IR file's name and hash)")
                rest = {k: v for k, v in cfg.items() if k != "ir_override"}
                _check_fields(rest, _CONFIG_SET, CONFIG_OBJECT_FIELDS, name)
            else:
                _check_fields(cfg, _CONFIG_SET, CONFIG_OBJECT_FIELDS, name)
            kwargs = cfg["kwargs"]
            if type(kwargs) is not dict:
                raise Invalid(f"{name}.kwargs must be an object, got {_tname(kwargs)}")
            for k, v in kwargs.items():
                if not _scalar(v):
                    raise Invalid(f"{name}.kwargs[{k!r}] must be a scalar, got {_tname(v)}")
            for f in CONFIG_FIELDS:
                v = cfg[f]
                if v is not None and (type(v) is not int or abs(v) > _INT_MAX):
                    raise Invalid(f"{name}.{f} must be an integer or null, got {_tname(v)}")
            if cfg["pre_hook"] is not None and type(cfg["pre_hook"]) is not str:
                raise Invalid(f"{name}.pre_hook must be a string (the hook's identity) or null")
            h = config_hash_of(cfg)
            if len(self.config_hashes) < 100_000:
                self.config_hashes[canon] = h
        return h

    def problem(self, obj: Any) -> tuple[str, str | None, float | None, int]:
        """Validate one problem line; return (digest, winner hash, winner ms, config rows)."""
        _check_fields(obj, _PROBLEM_SET, PROBLEM_FIELDS, "a problem")
        digest = obj["digest"]
        if not _is_hex(digest, 64):
            raise Invalid("digest must be 64 lowercase hex digits")
        _text(obj["kernel"], "kernel", 255)
        if not _is_hex(obj["source_hash"], 64):
            raise Invalid("source_hash must be 64 lowercase hex digits")
        target = self.target(obj["target"])
        key = obj["key"]
        if type(key) is not list:
            raise Invalid(f"key must be a list of [name, value] pairs, got {_tname(key)}")
        for pair in key:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or not _scalar(pair[1]):
                raise Invalid(f"key must be a list of [name, scalar] pairs, got {orjson.dumps(pair).decode()[:60]}")
        _int(obj["batch_bucket"], "batch_bucket", nullable=True)
        winner = obj["winner_config_hash"]
        winner_ms = _ms(obj["winner_ms"], "winner_ms")
        ssh = obj["search_space_hash"]
        if not (ssh == "" or _is_hex(ssh, 64)):
            raise Invalid("search_space_hash must be 64 lowercase hex digits (or empty)")
        _ms(obj["tuning_seconds"], "tuning_seconds", nullable=False)
        _text(obj["host"], "host", 255)
        _ts(obj["created_at"], "created_at")
        _ts(obj["updated_at"], "updated_at")
        _int(obj["hit_count"], "hit_count")
        _ts(obj["last_hit_at"], "last_hit_at", nullable=True)
        rows = obj["configs"]
        if type(rows) is not list:
            raise Invalid(f"configs must be a list, got {_tname(rows)}")
        seen: set[str] = set()
        self.config_rows(rows, seen)
        if winner is not None and winner not in seen:
            if not _is_hex(winner, 32):
                raise Invalid("winner_config_hash must be 32 lowercase hex digits or null")
            raise Invalid(f"winner_config_hash {winner} is not the hash of any of this problem's configs")
        expected = problem_digest(obj["source_hash"], target, canonical_json(key))
        if digest != expected:
            raise Invalid(
                f"digest {digest[:16]}... does not match its content (source_hash, target, key give "
                f"{expected[:16]}...): the line was edited or corrupted"
            )
        return digest, winner, winner_ms, len(rows)

    def config_rows(self, rows: list[Any], seen: set[str]) -> None:
        """Validate a problem's config rows; the common case runs inline (1.2M rows per 100k problems)."""
        cache, dumps, sort = self.config_hashes, orjson.dumps, orjson.OPT_SORT_KEYS
        parse_ts, inf = dt.datetime.fromisoformat, math.inf
        for i, row in enumerate(rows):
            if type(row) is not dict or len(row) != _N_CONFIG_ROW_FIELDS:
                _check_fields(row, _CONFIG_ROW_SET, CONFIG_ROW_FIELDS, f"configs[{i}]")
            try:
                cfg, given, status = row["config"], row["config_hash"], row["status"]
                m, lo, hi, n = row["median_ms"], row["p20_ms"], row["p80_ms"], row["samples"]
                failure, host, measured = row["failure"], row["host"], row["measured_at"]
            except KeyError:  # ten fields, but not the right ten
                _check_fields(row, _CONFIG_ROW_SET, CONFIG_ROW_FIELDS, f"configs[{i}]")
                raise
            h = cache.get(dumps(cfg, option=sort)) if type(cfg) is dict else None
            if h is None:
                h = self.config_hash(cfg, f"configs[{i}].config")
            if given != h:
                if not _is_hex(given, 32):
                    raise Invalid(f"configs[{i}].config_hash must be 32 lowercase hex digits")
                raise Invalid(
                    f"configs[{i}].config_hash {given} does not match its config (hash {h}): edited or corrupted"
                )
            if h in seen:
                raise Invalid(f"configs[{i}]: config {h} appears twice")
            seen.add(h)
            if status not in _STATUS_SET:
                raise Invalid(f"configs[{i}].status {str(status)[:40]!r} is not one of {', '.join(STATUSES)}")
            if not (
                (m is None and lo is None and hi is None)
                or (
                    type(m) is float
                    and type(lo) is float
                    and type(hi) is float
                    and 0.0 <= m < inf
                    and 0.0 <= lo < inf
                    and 0.0 <= hi < inf
                )
            ):
                for f in ("median_ms", "p20_ms", "p80_ms"):
                    _ms(row[f], f"configs[{i}].{f}")
            if type(n) is not int or not 0 <= n <= _INT_MAX:
                _int(n, f"configs[{i}].samples")
            if failure is not None:
                if type(failure) is not dict:
                    raise Invalid(f"configs[{i}].failure must be an object or null, got {_tname(failure)}")
                if not _depth_ok(failure, MAX_FAILURE_DEPTH):
                    raise Invalid(f"configs[{i}].failure nests deeper than {MAX_FAILURE_DEPTH} levels")
            if type(host) is not str or len(host) > 255:
                _text(host, f"configs[{i}].host", 255)
            try:
                parse_ts(measured)
            except (TypeError, ValueError):
                _ts(measured, f"configs[{i}].measured_at")


# --------------------------------------------------------------------------------------------
# Import's pass 1
# --------------------------------------------------------------------------------------------


@dataclass
class Scan:
    """What pass 1 found in a valid file: enough for pass 2 to decide and to check the re-read."""

    header: dict[str, Any]
    sha: str
    lines: int
    problems: list[tuple[str, str | None, float | None, int]]  # digest, winner hash, winner ms, config rows
    configs: int
    specs: int  # launch-spec lines (version 2), validated; pass 2 re-reads them if they are to be added
    pairs: set[tuple[str, str]]  # (source_hash, target digest) of the problems, which specs must belong to
    binaries: int = 0  # binary lines (version 3), validated (content hash, key binding, names)
    refs: set[bytes] = field(default_factory=set)  # digests of (source_hash, kernel_hash) of the specs
    signed_by: str | None = None  # the key id whose signature verified (version 3), else None
    signed_key: bytes | None = None  # that key, whole: trust is decided by it, never by its id
    inductor: int = 0  # torch.compile cache entry lines (version 5), validated

    @property
    def row_signatures(self) -> bool:
        """Whether its launch spec and binary lines carry row signatures (version 4)."""
        return bool(self.header["version"] >= SIGNED_ROWS_VERSION)


def scan(reader: Rewind, gz: bool, max_line: int, progress: Progress | None) -> Scan:
    """Pass 1: validate every line and hash the body, one line in memory at a time.

    What it keeps is bounded by the work, not by the file: a few hashes per problem, 48 bytes per
    launch spec and binary (to refuse duplicates), never a line. A launch-spec line may be 4 MiB of
    text that gzip shrinks a thousandfold; pass 2 re-reads them only when they are to be added.
    A signed file's signature is checked here (whether its key is trusted is the caller's business).
    """
    header: dict[str, Any] | None = None
    header_line = b""
    signature: dict[str, Any] | None = None
    sig_line = 0
    sha = hashlib.sha256()
    seen: dict[str, int] = {}
    found: list[tuple[str, str | None, float | None, int]] = []
    n_found_specs = n_found_bins = 0
    pairs: set[tuple[str, str]] = set()  # (source_hash, target digest) of the problems
    seen_specs: set[bytes] = set()
    refs: set[bytes] = set()
    seen_bins: set[str] = set()
    n_configs = 0
    validator = _Validator()
    lineno = 0
    announced = n_specs = n_bins = n_ind = n_found_ind = 0
    seen_ind: set[bytes] = set()
    bound = [line_limits(max_line, 0, 0)]  # until the header says where the torch.compile entries are
    for lineno, line in reader.lines(gz, lambda n: bound[0](n)):
        try:
            obj = _loads(line)
            if header is None:
                header = _check_header(obj)
                header_line = line
                announced, n_specs, n_bins = header["problems"], header["launch_specs"], header["binaries"]
                n_ind = header["inductor_entries"]
                bound[0] = line_limits(max_line, 2 + announced + n_specs + n_bins, n_ind)
                continue
            if len(found) >= announced:
                if n_found_specs < n_specs:
                    check_spec(obj, pairs, seen_specs, header["version"] >= SIGNED_ROWS_VERSION)
                    refs.add(_ref(obj["source_hash"], obj["kernel_hash"]))
                    n_found_specs += 1
                elif n_found_bins < n_bins:
                    check_binary(obj, refs, seen_bins, header["version"] >= SIGNED_ROWS_VERSION)
                    n_found_bins += 1
                elif n_found_ind < n_ind:
                    check_inductor(obj, seen_ind)
                    n_found_ind += 1
                elif header["signed_by"] is not None and signature is None:
                    signature = check_signature(obj, header["signed_by"])
                    sig_line = lineno
                    continue  # not part of the body
                else:
                    v3 = f", {n_bins} binaries, {n_ind} torch.compile entries" + (
                        " and a signature" if header["signed_by"] else ""
                    )
                    raise Invalid(
                        f"more lines than the {announced} problems and {n_specs} launch specs"
                        f"{v3 if header['version'] >= BINARIES_VERSION else ''} the header announces"
                    )
                sha.update(line)
                continue
            digest, winner, winner_ms, n = validator.problem(obj)
            pairs.add((obj["source_hash"], validator.target(obj["target"]).digest))
        except Invalid as e:
            raise ImportFormatError(lineno, str(e)) from None
        if digest in seen:
            raise ImportFormatError(lineno, f"duplicate problem {digest[:16]}..., also on line {seen[digest]}")
        seen[digest] = lineno
        sha.update(line)
        found.append((digest, winner, winner_ms, n))
        n_configs += n
        if progress is not None and len(found) % BATCH == 0:
            progress("validate", len(found), announced)
    if header is None:
        raise ImportFormatError(1, f"empty file: expected a {FORMAT_NAME} header on line 1")
    if len(found) != announced:
        raise ImportFormatError(
            lineno + 1,
            f"unexpected end of file after {len(found)} of the {announced} problems the header announces "
            "(truncated file?)",
        )
    if n_found_specs != n_specs:
        raise ImportFormatError(
            lineno + 1,
            f"unexpected end of file after {n_found_specs} of the {n_specs} launch specs the header announces "
            "(truncated file?)",
        )
    if n_found_bins != n_bins:
        raise ImportFormatError(
            lineno + 1,
            f"unexpected end of file after {n_found_bins} of the {n_bins} binaries the header announces "
            "(truncated file?)",
        )
    if n_found_ind != n_ind:
        raise ImportFormatError(
            lineno + 1,
            f"unexpected end of file after {n_found_ind} of the {n_ind} torch.compile entries the header announces "
            "(truncated file?)",
        )
    if header["signed_by"] is not None and signature is None:
        raise ImportFormatError(
            lineno + 1, "the header says the file is signed but its signature line is missing (truncated file?)"
        )
    if n_configs != header["configs"]:
        raise ImportFormatError(1, f"the header announces {header['configs']} config rows but the file has {n_configs}")
    digest = sha.hexdigest()
    if digest != header["body_sha256"]:  # almost always an edited body line: blame those, not the header
        raise ImportFormatError(
            2,
            f"sha256 {digest[:16]}... does not match the header's body_sha256 {header['body_sha256'][:16]}...: "
            "one of these lines was edited or corrupted after export (the checksum cannot tell which); "
            "export the file again",
            last=lineno - (1 if signature is not None else 0),
        )
    if signature is not None and not signing.verify(signature, header_line):
        raise ImportFormatError(
            sig_line,
            f"the signature by key {signature['key_id']} does not verify: the file was changed after it "
            "was signed; nothing was imported",
        )
    if progress is not None:
        progress("validate", len(found), announced)
    return Scan(
        header,
        digest,
        lineno,
        found,
        n_configs,
        n_found_specs,
        pairs,
        n_found_bins,
        refs,
        signature["key_id"] if signature is not None else None,
        signing.file_public_key(signature) if signature is not None else None,
        n_found_ind,
    )


def _ref(source_hash: str, kernel_hash: str) -> bytes:
    return hashlib.sha256(f"{source_hash}{kernel_hash}".encode()).digest()


def _row_signature(obj: dict[str, Any], what: str) -> None:
    sig = obj.get("signature")
    if sig is not None and (type(sig) is not str or len(sig) > 300 or signing.row_public_key(sig) is None):
        raise Invalid(f"{what} 'signature' must be null or a row signature 'ed25519:<key>:<signature>'")


def check_binary(obj: Any, refs: set[bytes], seen: set[str] | None, signed: bool = False) -> dict[str, Any]:
    """Validate one binary line (version 3, with its row signature in version 4); return its binaries
    row values (without host and time).

    A binary is code: its content must match its sha256, its metadata must be filed under its
    Triton key, its names must be plain (:func:`tunecache.binaries.binaries.problems_of`), and a launch spec of
    this file must reference it (``refs``), so nothing arrives that no winner uses.
    """
    from tunecache.binaries.binaries import problems_of

    _check_fields(obj, _BINARY_SETS[signed], _BINARY_FIELDS[signed], "a binary")
    _row_signature(obj, "binary")
    for name in ("source_hash", "triton_key", "sha256"):
        if not _is_hex(obj[name], 64):
            raise Invalid(f"binary {name} must be 64 lowercase hex digits")
    _text(obj["kernel"], "kernel", 255)
    _text(obj["triton_version"], "triton_version", 32)
    for name in ("name", "ext", "metadata", "binary"):
        _text(obj[name], name, None)
    try:
        kernel, source_hash, b = binary_from_json(obj)
    except ValueError:
        raise Invalid("binary 'binary' must be base64") from None
    if len(b.name) > 150 or len(b.ext) > 16:
        raise Invalid("binary name or ext too long")
    if b.size > MAX_BINARY_BYTES:
        raise Invalid(f"binary {b.triton_key[:16]}... is {b.size} bytes, over the {MAX_BINARY_BYTES} a binary may be")
    why = problems_of(b)
    if why is not None:
        raise Invalid(f"binary {b.triton_key[:16]}... ({b.name}) refused: {why}")
    if _ref(source_hash, b.triton_key) not in refs:
        raise Invalid(f"binary {b.triton_key[:16]}... is referenced by no launch spec of its kernel in this file")
    if seen is not None:
        if b.triton_key in seen:
            raise Invalid(f"duplicate binary {b.triton_key[:16]}...")
        seen.add(b.triton_key)
    return binary_row(kernel, source_hash, b)


def check_inductor(obj: Any, seen: set[bytes] | None) -> InductorEntry:
    """Validate one torch.compile cache entry line (version 5); return the entry.

    A compiled graph is code: its bytes must match its sha256 (recomputed here), and, as every row
    that is code, it is served only where a trusted key's row signature vouches for it
    (:mod:`tunecache.trust.trust`), whatever the file says."""
    import base64
    import binascii

    _check_fields(obj, _INDUCTOR_SET, INDUCTOR_FIELDS, "a torch.compile entry")
    _row_signature(obj, "torch.compile entry")
    if obj["cache"] not in INDUCTOR_KINDS:
        raise Invalid(f"torch.compile entry 'cache' must be one of {', '.join(INDUCTOR_KINDS)}")
    key = _text(obj["key"], "key", MAX_INDUCTOR_KEY)
    for name in ("target_digest", "sha256"):
        if not _is_hex(obj[name], 64):
            raise Invalid(f"torch.compile entry {name} must be 64 lowercase hex digits")
    t = obj["target"]
    shape = type(t) is dict and set(INDUCTOR_TARGET_FIELDS) - INDUCTOR_TARGET_OPTIONAL <= set(t) <= set(
        INDUCTOR_TARGET_FIELDS
    )
    if not shape or any(type(v) is not str for v in t.values()):
        raise Invalid(f"torch.compile entry 'target' must be an object of strings: {', '.join(INDUCTOR_TARGET_FIELDS)}")
    if any(len(v) > 128 for v in t.values()):
        raise Invalid("torch.compile entry 'target' values must be at most 128 characters")
    try:
        value = base64.b64decode(_text(obj["value"], "value", None), validate=True)
    except (ValueError, binascii.Error):
        raise Invalid("torch.compile entry 'value' must be base64") from None
    if hashlib.sha256(value).hexdigest() != obj["sha256"]:
        raise Invalid(f"torch.compile entry sha256 {obj['sha256'][:16]}... does not match its value")
    entry = InductorEntry(obj["cache"], key, obj["target_digest"], value, dict(t), obj["signature"], obj["sha256"])
    if seen is not None:
        ident = hashlib.sha256(f"{entry.kind}\0{entry.key_hash}\0{entry.target_digest}".encode()).digest()
        if ident in seen:
            raise Invalid(f"duplicate torch.compile entry {entry.kind} {key[:40]}")
        seen.add(ident)
    return entry


def check_signature(obj: Any, signed_by: str) -> dict[str, Any]:
    """Check the shape of a signature line (version 3); return its signature object."""
    _check_fields(obj, frozenset({"signature"}), ("signature",), "the signature line")
    sig = obj["signature"]
    _check_fields(sig, _SIGNATURE_SET, SIGNATURE_FIELDS, "the signature")
    if sig["algorithm"] != "ed25519":
        raise Invalid(f"signature algorithm {sig['algorithm']!r} is not ed25519")
    for name in ("key_id", "public_key", "value"):
        if type(sig[name]) is not str or len(sig[name]) > 200:
            raise Invalid(f"signature field {name!r} must be a short string")
    if sig["key_id"] != signed_by:
        raise Invalid(f"the signature is by key {sig['key_id'][:16]}, the header says {signed_by}")
    return sig


def check_spec(obj: Any, pairs: set[tuple[str, str]], seen: set[bytes] | None, signed: bool = False) -> dict[str, Any]:
    """Validate one launch-spec line (version 2, with its row signature in version 4); return its
    launch_specs row values.

    A spec only tells Triton which specialisation of a kernel this store already knows to compile;
    the kernel's code always comes from the importing process, and a preload whose binary differs
    from ``kernel_hash`` is dropped (tunecache.binaries.preload). Still, every field is checked, the hash
    recomputed, and a spec must belong to a kernel and target of this file's problems.
    """
    _check_fields(obj, _SPEC_SETS[signed], _SPEC_FIELDS[signed], "a launch spec")
    _row_signature(obj, "launch spec")
    for name in ("source_hash", "target_digest", "spec_hash", "kernel_hash"):
        if not _is_hex(obj[name], 64):
            raise Invalid(f"launch spec {name} must be 64 lowercase hex digits")
    if not _is_hex(obj["config_hash"], 32):
        raise Invalid("launch spec config_hash must be 32 lowercase hex digits")
    _text(obj["kernel"], "kernel", 255)
    _text(obj["triton_version"], "triton_version", 32)
    spec = _text(obj["spec"], "spec", None)
    if hashlib.sha256(spec.encode()).hexdigest() != obj["spec_hash"]:
        raise Invalid(f"launch spec_hash {obj['spec_hash'][:16]}... does not match its spec")
    if type(_loads(spec.encode())) is not dict:
        raise Invalid("launch spec 'spec' must be a JSON object (Triton's serialised specialisation)")
    if (obj["source_hash"], obj["target_digest"]) not in pairs:
        raise Invalid("launch spec for a kernel and target that no problem in this file has")
    if seen is not None:  # pass 1; pass 2 re-reads a file that hashes the same
        key = hashlib.sha256(f"{obj['source_hash']}{obj['target_digest']}{obj['spec_hash']}".encode()).digest()
        if key in seen:
            raise Invalid(f"duplicate launch spec {obj['spec_hash'][:16]}...")
        seen.add(key)
    return launch_spec_row(*launch_spec_from_json(obj))
