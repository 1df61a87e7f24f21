"""Export: a store's problems, with every config row and the winners' launch specs, as one file.

The format is :mod:`tunecache.exchange.format`'s; each line is :mod:`tunecache.problem.model`'s JSON shape,
built here straight from the rows (by named offsets into the model's column lists) rather than
through :class:`~tunecache.problem.model.Problem` objects: an export of 100k problems, 1.2M config rows,
spends most of its time in exactly this loop (docs/benchmarks/store.md).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import gzip
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from tunecache.errors import TunecacheError
from tunecache.exchange.format import (
    BATCH,
    FORMAT_NAME,
    FORMAT_VERSION,
    GZIP_LEVEL,
    INDUCTOR_VERSION,
    MAX_INDUCTOR_LINE_BYTES,
    MAX_LINE_BYTES,
    SIGNED_ROWS_VERSION,
    Progress,
    Source,
    is_stream,
    tunecache_version,
)
from tunecache.problem.model import (
    BINARY_FIELDS_SIGNED,
    CONFIG_ROW_COLUMNS,
    INDUCTOR_TARGET_FIELDS,
    LAUNCH_SPEC_COLUMNS,
    LAUNCH_SPEC_FIELDS,
    LAUNCH_SPEC_FIELDS_SIGNED,
    PROBLEM_COLUMNS,
    Binary,
    InductorEntry,
    LaunchSpec,
    utcnow,
)
from tunecache.problem.target import TARGET_FIELDS
from tunecache.store import dump
from tunecache.store.store import Store
from tunecache.trust import trust
from tunecache.trust.signing import Signer

log = logging.getLogger("tunecache")

# The columns export reads: a problem's but the target's digest (the file has the target itself);
# a config row's, then its digest. Lines are built by these named offsets, as dict literals: at
# 1.2M config rows, dict(zip(fields, row)) plus conversions costs 5% of the export (measured).
_P_READ = tuple(c for c in PROBLEM_COLUMNS if c != "target_digest")
_C_READ = (*CONFIG_ROW_COLUMNS, "digest")
_P = {c: i for i, c in enumerate(_P_READ)}
_C = {c: i for i, c in enumerate(_C_READ)}
_P_DIGEST, _P_KERNEL, _P_SOURCE, _P_KEY = _P["digest"], _P["kernel"], _P["source_hash"], _P["key_json"]
_P_TARGET = slice(_P[TARGET_FIELDS[0]], _P[TARGET_FIELDS[-1]] + 1)
_P_BUCKET, _P_WINNER, _P_WINNER_MS = _P["batch_bucket"], _P["winner_config_hash"], _P["winner_ms"]
_P_SPACE, _P_TUNING, _P_HOST = _P["search_space_hash"], _P["tuning_seconds"], _P["host"]
_P_CREATED, _P_UPDATED, _P_HITS, _P_LAST_HIT = _P["created_at"], _P["updated_at"], _P["hit_count"], _P["last_hit_at"]
_C_HASH, _C_CONFIG, _C_STATUS, _C_DIGEST = _C["config_hash"], _C["config_json"], _C["status"], _C["digest"]
_C_MEDIAN, _C_P20, _C_P80, _C_SAMPLES = _C["median_ms"], _C["p20_ms"], _C["p80_ms"], _C["samples"]
_C_FAILURE, _C_HOST, _C_MEASURED = _C["failure"], _C["host"], _C["measured_at"]
_S_HASH, _S_KERNEL = LAUNCH_SPEC_COLUMNS.index("spec_hash"), LAUNCH_SPEC_COLUMNS.index("kernel")
_S_SOURCE, _S_KERNEL_HASH = LAUNCH_SPEC_COLUMNS.index("source_hash"), LAUNCH_SPEC_COLUMNS.index("kernel_hash")
_S_CONFIG, _S_VERSION = LAUNCH_SPEC_COLUMNS.index("config_hash"), LAUNCH_SPEC_COLUMNS.index("triton_version")
_S_TARGET, _S_SPEC = LAUNCH_SPEC_COLUMNS.index("target_digest"), LAUNCH_SPEC_COLUMNS.index("spec_json")
_B_READ = ("triton_key", "sha256", "name", "ext", "triton_version", "metadata", "binary", "signature")


def export(
    store: Store,
    out: Source,
    *,
    kernel: str | None = None,
    arch: str | None = None,
    device: str | None = None,
    driver: str | None = None,
    since: dt.datetime | None = None,
    compress: bool | None = None,
    progress: Progress | None = None,
    with_launch_specs: bool = True,
    with_binaries: bool = False,
    signer: Signer | None = None,
    with_inductor: bool = False,
) -> dict[str, Any]:
    """Write the matching problems, with every config row, to ``out`` (a path, ``"-"`` or a binary file).

    With ``with_launch_specs`` (version 2) the winners' launch specs of the exported kernels and
    targets follow the problems, so that the importing store preloads them at its first start;
    without, the file is version 1, which every tunecache imports.

    The header needs the counts and the body's hash. A path gets a header line reserved at its
    start, filled in (padded with spaces) once the body is written; a stream gets the body through
    a temporary file first. A path is written next to itself and renamed into place, so an
    interrupted export never leaves a half file under the real name. ``compress`` defaults to
    "the path ends in .gz". Returns a summary: problems, configs, bytes, body_sha256, seconds.

    ``with_binaries`` adds the compiled binaries the exported launch specs reference, and
    ``signer`` signs the file (both write version 4, see :mod:`tunecache.exchange.format`): each
    launch spec and binary line then carries its row signature, and only rows this process trusts
    (:mod:`tunecache.trust.trust`, with ``signer``'s own key trusted) are written, so that a file signature
    never vouches for a row no trusted key made. The summary's ``untrusted`` counts those left out.

    ``with_inductor`` adds torch.compile's cache entries (all of them: the problem filters do not
    apply), as version 5, each with its row signature; only those this process trusts, and only
    those whose line fits :data:`MAX_LINE_BYTES` (the summary's ``inductor_too_large`` counts the
    others).
    """
    t0 = time.perf_counter()
    filters = {"kernel": kernel, "arch": arch, "device": device, "driver": driver, "since": since}
    created = utcnow().isoformat()
    if (with_binaries or signer is not None) and not with_launch_specs:
        raise ValueError("binaries and signatures come with launch specs: drop --no-launch-specs")
    if with_inductor and not with_launch_specs:
        raise ValueError("torch.compile entries come with launch specs (format 5): drop --no-launch-specs")
    v3 = with_binaries or signer is not None or with_inductor
    version = (
        INDUCTOR_VERSION if with_inductor else SIGNED_ROWS_VERSION if v3 else FORMAT_VERSION if with_launch_specs else 1
    )
    counts: dict[str, int] = {"binaries": 0, "untrusted": 0, "inductor": 0, "inductor_too_large": 0}
    vouch = None
    if v3:
        vouch = trust.policy(store)
        if signer is not None and not vouch.whole:
            vouch = dataclasses.replace(vouch, keys=vouch.keys | {signer.raw_public})

    def header(n_problems: int, n_configs: int, n_specs: int, sha: str) -> bytes:
        h = {
            "format": FORMAT_NAME,
            "version": version,
            "tunecache": tunecache_version(),
            "problems": n_problems,
            "configs": n_configs,
            "body_sha256": sha,
            "created_at": created,
            "filters": {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in filters.items()},
        }
        if with_launch_specs:
            h["launch_specs"] = n_specs
        if v3:
            h["binaries"] = counts["binaries"]
            h["signed_by"] = signer.key_id if signer is not None else None
        if with_inductor:
            h["inductor_entries"] = counts["inductor"]
        return orjson.dumps(h)

    def trailer(header_line: bytes) -> bytes:
        """The signature line (empty when unsigned) of the file whose header line is ``header_line``."""
        if signer is None:
            return b""
        return orjson.dumps({"signature": signer.sign(header_line)}, option=orjson.OPT_APPEND_NEWLINE)

    def body(f: IO[bytes]) -> tuple[int, int, int, str]:
        n_problems, n_configs, n_specs, n_bins, sha = _write_body(
            store, f, filters, progress, with_launch_specs, with_binaries, vouch, counts, with_inductor
        )
        counts["binaries"] = n_bins
        return n_problems, n_configs, n_specs, sha

    path = None if is_stream(out) else Path(os.fspath(out))  # type: ignore[arg-type]
    if compress is None:
        compress = path is not None and path.suffix == ".gz"
    if path is not None and path.exists() and not path.is_file() and not path.is_dir():
        # A device or a pipe (/dev/null, a FIFO): written through, as a stream. Renaming a file over it,
        # as a path gets, would replace the device node itself.
        with open(path, "wb") as stream:
            return export(
                store,
                stream,
                kernel=kernel,
                arch=arch,
                device=device,
                driver=driver,
                since=since,
                compress=compress,
                progress=progress,
                with_launch_specs=with_launch_specs,
                with_binaries=with_binaries,
                signer=signer,
                with_inductor=with_inductor,
            ) | {"path": str(path)}
    if path is None:
        with tempfile.TemporaryFile(prefix=".tunecache-export-") as tmp:
            n_problems, n_configs, n_specs, sha = body(tmp)  # type: ignore[arg-type]
            tmp.seek(0)
            target = sys.stdout.buffer if out == "-" else out
            line = header(n_problems, n_configs, n_specs, sha) + b"\n"
            size = _emit(target, line, tmp, compress, trailer(line))  # type: ignore[arg-type]
        where = "-" if out == "-" else str(getattr(out, "name", "<stream>"))
    else:
        if path.is_dir():
            raise TunecacheError(f"cannot export to {path}: {path} is a directory; give a file name")
        if not path.parent.is_dir():
            why = "is not a directory" if path.parent.exists() else "does not exist"
            raise TunecacheError(f"cannot export to {path}: {path.parent} {why}")
        slot = len(header(2**63 - 1, 2**63 - 1, 2**63 - 1, "0" * 64)) + 1  # no final header can be longer
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make the export private to its writer
            with os.fdopen(fd, "w+b") as f:
                reserved = _header_block(_header_line(b"", slot), compress)
                f.write(reserved)
                if compress:
                    with gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                        n_problems, n_configs, n_specs, sha = body(gz)  # type: ignore[arg-type]
                else:
                    n_problems, n_configs, n_specs, sha = body(f)
                line = _header_line(header(n_problems, n_configs, n_specs, sha), slot)
                sig = trailer(line)
                if sig:  # after the body: a gzip member of its own when compressed
                    f.write(gzip.compress(sig, compresslevel=GZIP_LEVEL, mtime=0) if compress else sig)
                size = f.tell()
                block = _header_block(line, compress)
                if len(block) != len(reserved):  # pragma: no cover - stored deflate blocks have fixed sizes
                    raise TunecacheError("internal error: the export header does not fit its reserved space")
                f.seek(0)
                f.write(block)
            os.replace(tmp_name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        where = str(path)
    summary = {
        "path": where,
        "problems": n_problems,
        "configs": n_configs,
        "launch_specs": n_specs,
        "binaries": counts["binaries"],
        "untrusted": counts["untrusted"],
        "inductor_entries": counts["inductor"],
        "inductor_too_large": counts["inductor_too_large"],
        "signed_by": signer.key_id if signer is not None else None,
        "version": version,
        "bytes": size,
        "compressed": compress,
        "body_sha256": sha,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    log.info("tunecache: exported %d problems (%d configs) to %s", n_problems, n_configs, where)
    return summary


def _header_line(header: bytes, slot: int) -> bytes:
    """The header line padded with spaces to ``slot`` bytes: what a signature signs."""
    return header + b" " * (slot - 1 - len(header)) + b"\n"


def _header_block(line: bytes, compress: bool) -> bytes:
    """The padded header line as written: gzip'd as stored blocks (a fixed size) when compressing."""
    return gzip.compress(line, compresslevel=0, mtime=0) if compress else line


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (other threads create files too)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _emit(f: IO[bytes], header: bytes, body: IO[bytes], compress: bool, trailer: bytes = b"") -> int:
    """Header line, body, then the signature line if any, into ``f`` (through gzip if asked);
    return the bytes written."""
    counter = _CountingWriter(f)
    if compress:
        with gzip.GzipFile(filename="", fileobj=counter, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:  # type: ignore[arg-type]
            gz.write(header)
            shutil.copyfileobj(body, gz, 1 << 20)
            gz.write(trailer)
    else:
        counter.write(header)
        shutil.copyfileobj(body, counter, 1 << 20)
        counter.write(trailer)
    counter.flush()
    return counter.count


class _CountingWriter:
    """A write-only stream that counts what passes through (the size of a compressed export)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.count = 0

    def write(self, b: Any) -> int:
        n = self.f.write(b)
        n = len(b) if n is None else n
        self.count += n
        return n

    def flush(self) -> None:
        self.f.flush()


def _iso_from_sqlite(v: str | None) -> str | None:
    """SQLAlchemy's SQLite text ``YYYY-MM-DD HH:MM:SS.ffffff`` as orjson writes the datetime it holds.

    Parsing 1.3M timestamps into datetimes only to print them again costs 15% of SQLite's export;
    the output is byte-identical to PostgreSQL's, whose driver returns datetimes.
    """
    if v is None:
        return None
    if len(v) == 26 and v[10] == " " and v[19] == ".":
        return f"{v[:10]}T{v[11:19]}" if v.endswith(".000000") else f"{v[:10]}T{v[11:]}"
    return dt.datetime.fromisoformat(v).isoformat()  # any other form SQLite may hold


def _untrusted(vouch: trust.Policy, what: str, name: str, counts: dict[str, int] | None, row: Any, *where: str) -> bool:
    """Whether ``vouch`` refuses ``row`` (a LaunchSpec with its source and target, or a Binary): then
    it is counted and named in the log, and left out of the file."""
    why = vouch.spec(where[0], where[1], row) if isinstance(row, LaunchSpec) else vouch.binary(row)
    if why is None:
        return False
    if counts is not None:
        counts["untrusted"] += 1
    log.warning("tunecache: export: %s %s left out: %s", what, name, why)
    return True


def _write_body(
    store: Store,
    body: IO[bytes],
    filters: dict[str, Any],
    progress: Progress | None,
    with_specs: bool,
    with_binaries: bool = False,
    vouch: trust.Policy | None = None,
    counts: dict[str, int] | None = None,
    with_inductor: bool = False,
) -> tuple[int, int, int, int, str]:
    """Stream problems in digest order, a batch at a time with its config rows, as JSON lines.

    With ``vouch`` (version 4) the launch spec and binary lines carry their row signatures, and
    rows it does not vouch for are left out (counted in ``counts["untrusted"]``).

    Keyset pagination (digest > last) over the primary keys: no per-problem query, no server-side
    cursor, and every batch is one indexed range (or IN list when filtered). The whole export
    reads in one transaction, a consistent snapshot on SQLite (WAL), PostgreSQL and MySQL.
    """
    sha = hashlib.sha256()
    n_problems = n_configs = 0
    dumps, fragment, newline = orjson.dumps, orjson.Fragment, orjson.OPT_APPEND_NEWLINE
    sqlite = store.dialect == "sqlite"
    ts: Callable[[Any], Any] = _iso_from_sqlite if sqlite else (lambda v: v)
    with store.snapshot("export") as conn:
        total = dump.count_problems(conn, **filters)
        for prows, crows in dump.problem_batches(conn, _P_READ, _C_READ, sqlite, BATCH, **filters):
            by_digest: dict[str, list[dict[str, Any]]] = {}
            for c in crows:
                lst = by_digest.get(c[_C_DIGEST])
                if lst is None:
                    lst = by_digest[c[_C_DIGEST]] = []
                f = c[_C_FAILURE]
                lst.append(
                    {  # CONFIG_ROW_FIELDS, in order (tests/test_exchange.py checks it)
                        "config_hash": c[_C_HASH],
                        "config": fragment(c[_C_CONFIG]),
                        "status": c[_C_STATUS],
                        "median_ms": c[_C_MEDIAN],
                        "p20_ms": c[_C_P20],
                        "p80_ms": c[_C_P80],
                        "samples": c[_C_SAMPLES],
                        "failure": None if f is None else fragment(f),
                        "host": c[_C_HOST],
                        "measured_at": ts(c[_C_MEASURED]),
                    }
                )
            for r in prows:
                rows = by_digest.get(r[_P_DIGEST], [])
                line = dumps(
                    {  # PROBLEM_FIELDS, in order (tests/test_exchange.py checks it)
                        "digest": r[_P_DIGEST],
                        "kernel": r[_P_KERNEL],
                        "source_hash": r[_P_SOURCE],
                        "target": dict(zip(TARGET_FIELDS, r[_P_TARGET])),
                        "key": fragment(r[_P_KEY]),
                        "batch_bucket": r[_P_BUCKET],
                        "winner_config_hash": r[_P_WINNER],
                        "winner_ms": r[_P_WINNER_MS],
                        "search_space_hash": r[_P_SPACE],
                        "tuning_seconds": r[_P_TUNING],
                        "host": r[_P_HOST],
                        "created_at": ts(r[_P_CREATED]),
                        "updated_at": ts(r[_P_UPDATED]),
                        "hit_count": r[_P_HITS],
                        "last_hit_at": ts(r[_P_LAST_HIT]),
                        "configs": rows,
                    },
                    option=newline,
                )
                if len(line) > MAX_LINE_BYTES:
                    raise TunecacheError(
                        f"problem {r[_P_DIGEST][:16]} ({r[_P_KERNEL]}) has {len(rows)} config rows, a "
                        f"{len(line)}-byte line; "
                        f"import accepts at most {MAX_LINE_BYTES}. Export it with a filter that leaves it out "
                        "(--kernel) or delete its stale configs."
                    )
                body.write(line)
                sha.update(line)
                n_configs += len(rows)
            n_problems += len(prows)
            if progress is not None:
                progress("export", n_problems, total)
        n_specs = 0
        if with_specs:
            # The specs of every (kernel source, target) that has an exported problem, in key order.
            refs: dict[str, tuple[str, str]] = {}  # kernel_hash -> (kernel, source_hash) of its first spec
            written: tuple[str, str, str] | None = None  # one line per spec: the newest its signers vouch for
            for row in dump.launch_spec_rows(conn, **filters):
                ident = (row[_S_SOURCE], row[_S_TARGET], row[_S_HASH])
                if ident == written:
                    continue
                if hashlib.sha256(row[_S_SPEC].encode()).hexdigest() != row[_S_HASH]:
                    if counts is not None:
                        counts["untrusted"] += 1
                    log.warning("tunecache: export: launch spec %s left out: its hash is not its text's", ident[2][:12])
                    continue
                if vouch is not None:
                    spec = LaunchSpec(
                        row[_S_HASH], row[_S_CONFIG], row[_S_KERNEL_HASH], row[_S_SPEC], row[_S_VERSION], row[-1]
                    )
                    where = (row[_S_SOURCE], row[_S_TARGET])
                    if _untrusted(vouch, "launch spec", row[_S_HASH][:12], counts, spec, *where):
                        continue
                    line = dumps(dict(zip(LAUNCH_SPEC_FIELDS_SIGNED, row)), option=newline)
                else:
                    line = dumps(dict(zip(LAUNCH_SPEC_FIELDS, row[:-1])), option=newline)
                refs.setdefault(row[_S_KERNEL_HASH], (row[_S_KERNEL], row[_S_SOURCE]))
                written = ident
                if len(line) > MAX_LINE_BYTES:  # pragma: no cover - a spec is a few KiB
                    raise TunecacheError(
                        f"launch spec {row[_S_HASH][:16]} of {row[_S_KERNEL]} is a {len(line)}-byte line"
                    )
                body.write(line)
                sha.update(line)
                n_specs += 1
        n_bins = 0
        if with_binaries and with_specs:
            # The binaries those specs reference, in key order, a few at a time (each up to 2.5 MiB).
            done = ""  # one line per key: the newest row its signers vouch for
            for key, digest, name, ext, version, md, data, sig in dump.binary_rows(conn, sorted(refs), _B_READ):
                if key == done:
                    continue
                kernel_name, source = refs[key]
                binary = Binary(key, digest, name, ext, version, bytes(md), bytes(data), sig)
                if vouch is not None and _untrusted(vouch, "binary", f"{key[:12]} ({name})", counts, binary):
                    continue
                obj = dict(zip(BINARY_FIELDS_SIGNED, (kernel_name, source, key, digest, name, ext, version)))
                obj["metadata"] = binary.metadata.decode()
                obj["binary"] = base64.b64encode(binary.binary).decode()
                obj["signature"] = sig
                done = key
                line = dumps(obj, option=newline)
                if len(line) > MAX_LINE_BYTES:
                    raise TunecacheError(
                        f"binary {key[:16]} of {kernel_name} is a {len(line)}-byte line; import accepts at most "
                        f"{MAX_LINE_BYTES}: delete it (it is stored over TUNECACHE_BINARY_MAX_BYTES)"
                    )
                body.write(line)
                sha.update(line)
                n_bins += 1
        if with_inductor and counts is not None:
            counts["inductor"] = _write_inductor(conn, body, sha, vouch, counts)
    return n_problems, n_configs, n_specs, n_bins, sha.hexdigest()


def _write_inductor(conn: Any, body: IO[bytes], sha: Any, vouch: trust.Policy | None, counts: dict[str, int]) -> int:
    """torch.compile's cache entries as version 5 lines (format.py); returns how many were written."""
    n, done = 0, ("", "", "")  # one line per entry: the first of its signers' rows this process vouches for
    for r in dump.inductor_rows(conn):
        target = {k: r[k] for k in INDUCTOR_TARGET_FIELDS}
        entry = InductorEntry(
            r["kind"], r["key"], r["target_digest"], bytes(r["value"]), target, r["signature"], r["sha256"]
        )
        if (entry.kind, entry.key_hash, entry.target_digest) == done:
            continue
        why = vouch.inductor(entry) if vouch is not None else None
        if r["key_hash"] != entry.key_hash:  # filed under another key than its own: served nowhere
            why = "it is filed under another key's hash"
        if why is not None:
            counts["untrusted"] += 1
            log.warning("tunecache: export: torch.compile %s entry %s left out: %s", entry.kind, entry.key[:40], why)
            continue
        line = orjson.dumps(
            {
                "cache": entry.kind,
                "key": entry.key,
                "target_digest": entry.target_digest,
                "target": target,
                "sha256": entry.sha256,
                "value": base64.b64encode(entry.value).decode(),
                "signature": entry.signature,
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )
        if len(line) > MAX_INDUCTOR_LINE_BYTES:
            counts["inductor_too_large"] += 1
            log.warning(
                "tunecache: export: torch.compile %s entry %s left out: %d bytes, over the %d of a line",
                entry.kind,
                entry.key[:40],
                len(line),
                MAX_INDUCTOR_LINE_BYTES,
            )
            continue
        body.write(line)
        sha.update(line)
        done = (entry.kind, entry.key_hash, entry.target_digest)
        n += 1
    return n
