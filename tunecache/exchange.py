"""Export and import: move tuning results between stores as one versioned file.

A platform team tunes on one machine (or reads a fleet's shared store), exports, and imports the
file into another store: an image being built without a GPU, a second cluster, a laptop. The file
is data only: import parses JSON, checks every field and recomputes every hash; nothing in it is
ever executed (no pickle, no eval, no imports).

File format, version 2
======================

Version 2 is version 1 plus the winners' launch specs (below). Export writes version 2, or
version 1 with ``with_launch_specs=False`` (``tunecache export --no-launch-specs``) for a
tunecache that reads only version 1; import reads both.

`JSON Lines <https://jsonlines.org>`_ written with orjson, UTF-8, one object per line, every line
ending in ``\\n``. A path ending in ``.gz`` is gzip-compressed (import also recognises gzip by its
magic bytes, so ``-`` may carry either). No line may exceed :data:`MAX_LINE_BYTES` (4 MiB).

Line 1, the header. It may end with spaces before its newline: export reserves its room at the
start of a file and fills it in once the body's counts and hash are known. A compressed file is
then two gzip members (header, body), which every gzip reader concatenates.

=================  ==========================================================================
field              value
=================  ==========================================================================
format             ``"tunecache-export"``
version            ``2`` (or ``1``): the version of this format. An importer refuses others
tunecache          version of the tunecache that wrote the file (informational)
problems           number of problem lines that follow
configs            total number of config rows in them
body_sha256        hex sha256 of the exact bytes of every line after the header
created_at         ISO 8601 UTC time of the export
filters            the export's filters: ``kernel``, ``arch``, ``device``, ``driver``, ``since``
                   (string or null)
launch_specs       version 2 only: number of launch-spec lines after the problems
=================  ==========================================================================

Every following line is one problem, in digest order, with all its config rows (failed ones
included: they are what stops a later tuning from re-trying a config that cannot run):

====================  =====================================================================
field                 value
====================  =====================================================================
digest                64 hex: content address, recomputed on import from source_hash,
                      target and key (:func:`tunecache.identity.problem_digest`)
kernel                kernel name, ``module.qualname`` (at most 255 characters)
source_hash           64 hex: hash of the kernel source and the ``@jit`` functions it calls
target                object with every :class:`~tunecache.identity.Target` field: backend,
                      arch, device_name, driver_version, driver_release, cuda_runtime,
                      triton_version (strings); sm_count, max_shared_mem, warp_size (integers)
key                   the tuning key: a list of ``[name, value]`` pairs, value a scalar
batch_bucket          integer or null
winner_config_hash    32 hex, the hash of one of ``configs``, or null (no config ran)
winner_ms             finite number >= 0, or null
search_space_hash     64 hex (or empty): hash of the config hashes tried
tuning_seconds        finite number >= 0
host                  host that tuned it
created_at            ISO 8601 UTC date-time (naive, no offset)
updated_at            ISO 8601 UTC date-time
hit_count             integer >= 0
last_hit_at           ISO 8601 UTC date-time or null
configs               list of config rows, below, in config_hash order
====================  =====================================================================

A config row:

===========  ==============================================================================
field        value
===========  ==============================================================================
config_hash  32 hex, recomputed on import from ``config``
             (:func:`tunecache.identity.config_hash_of`)
config       ``{"kwargs": {name: scalar}, "num_warps", "num_stages", "num_ctas", "maxnreg":
             integer or null, "pre_hook": string (the hook's identity, never code) or null}``, plus
             ``"ir_override"`` (string: the IR file's name and content hash) in configs that have one
status       one of :data:`tunecache.model.STATUSES`
median_ms    finite number >= 0, or null (p20_ms and p80_ms likewise)
samples      integer >= 0
failure      object (why the config failed, e.g. ``{"resource": "shared", "required":
             300000, "limit": 232448}``) or null; nested at most 8 levels
host         host that measured it
measured_at  ISO 8601 UTC date-time
===========  ==============================================================================

After the problems (version 2), one line per launch spec: what Triton compiled a winner with, so
that the importing store's first start loads the winners' binaries before its first launches
(:mod:`tunecache.preload`), e.g. an image built by import. Only the specs of a kernel source and
target that has an exported problem are written, ordered by (source_hash, target_digest,
spec_hash). Import validates them always and adds them only when asked (``with_launch_specs``,
``tunecache import --launch-specs``), whatever ``on_conflict`` says (a spec already stored is
kept). A spec carries no code (the kernel is always the importing process's own) but it does
steer what Triton compiles and under which cache key, which import cannot verify without a GPU:
add specs only from a file trusted like the store itself, such as your own export.

==============  ===========================================================================
field           value
==============  ===========================================================================
kernel          kernel name (at most 255 characters)
source_hash     64 hex: the kernel source of a problem in this file
target_digest   64 hex: :attr:`tunecache.identity.Target.digest` of that problem's target
spec_hash       64 hex, recomputed on import: sha256 of ``spec``
config_hash     32 hex: the config it was compiled with
kernel_hash     64 hex: Triton's hash of the compiled binary
triton_version  the Triton version that compiled it (at most 32 characters)
spec            string: Triton's serialised specialisation, a JSON object
==============  ===========================================================================

Unknown fields, missing fields, ``true`` where an integer is expected, NaN or Infinity (not
JSON), a duplicate digest, config hash or launch spec: each is an error naming the line. A later
format adds fields by raising ``version``.

Import
======

Pass 1 reads the whole file once, validates every line and hashes the body, holding only one
line at a time (plus a digest per problem and a 32-byte hash per launch spec): memory is bounded
by the work, not by the file, also for a small ``.gz`` of thousands of 4 MiB lines. Nothing is
written if any line is bad. Pass 2 re-reads the file (the launch-spec lines too, when they are to
be added, a few at a time) and writes in ONE transaction, so readers see all of it or none of it; it re-hashes the
body and rolls back if the file changed in between. ``on_conflict`` decides what happens to a
digest the store already has: ``keep`` the stored one, ``replace`` it (its config rows too), or
take the incoming one only if its winner is ``faster``. A conflict is a digest stored with a
different winner. Problems imported resolve their recorded capture/offline misses.

While pass 2 runs, other writers wait: SQLite's write lock (up to ``TUNECACHE_SQLITE_BUSY_MS``,
so a 100k-problem import, ~20 s here, is best run when the fleet is not tuning), PostgreSQL's
``LOCK TABLE problems``. Readers carry on, except that a large PostgreSQL import also makes
readers of ``configs`` wait (see :class:`_PgWriter`). Timing on 100k problems: docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import hashlib
import logging
import math
import os
import queue
import re
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.errors import ImportFormatError, StoreError, StoreReadOnlyError, TunecacheError
from tunecache.identity import CONFIG_FIELDS, canonical_json, config_hash_of, problem_digest
from tunecache.model import STATUSES, utcnow
from tunecache.store import Store, _reason, _scrub, _where, configs, launch_specs, misses, problems
from tunecache.target import TARGET_FIELDS, Target

log = logging.getLogger("tunecache")

FORMAT_NAME = "tunecache-export"
FORMAT_VERSION = 2
#: Versions import reads: 1 (problems only) and 2 (problems, then the winners' launch specs).
READABLE_VERSIONS = (1, 2)
#: Longest line import accepts (newline included). A problem with 12 configs takes about 4 KiB; the
#: limit leaves room for ~10,000 configs per problem while keeping a hostile file's memory bounded.
#: Export refuses to write a longer line, so every export can be imported.
MAX_LINE_BYTES = 4 << 20
MAX_FAILURE_DEPTH = 8
CONFLICT_POLICIES = ("keep", "replace", "faster")
GZIP_LEVEL = 3  # level 6 halves the speed for ~10% smaller files; exports are read and written once

#: ``progress(phase, done, total)``: phase is "export", "validate" or "write"; counts are problems.
Progress = Callable[[str, int, int], None]
Source = str | os.PathLike[str] | IO[bytes]

_EXPORT_BATCH = 2000
_WRITE_BATCH = 5000  # config rows per executemany / COPY flush
_SPEC_BATCH_BYTES = 8 << 20  # launch-spec text per batch of inserts (a spec line may be 4 MiB)
_LOOKUP_CHUNK = 2000  # digests per IN (...) when checking what the store already has
_PG_FK_REBUILD_MIN = 50_000  # config rows from which a PostgreSQL import re-validates the foreign key once

_HEADER_FIELDS_V1 = ("format", "version", "tunecache", "problems", "configs", "body_sha256", "created_at", "filters")
_HEADER_FIELDS = (*_HEADER_FIELDS_V1, "launch_specs")
_SPEC_FIELDS = (
    "kernel",
    "source_hash",
    "target_digest",
    "spec_hash",
    "config_hash",
    "kernel_hash",
    "triton_version",
    "spec",
)
_SPEC_SET = frozenset(_SPEC_FIELDS)
_FILTER_FIELDS = ("kernel", "arch", "device", "driver", "since")
_PROBLEM_FIELDS = (
    "digest",
    "kernel",
    "source_hash",
    "target",
    "key",
    "batch_bucket",
    "winner_config_hash",
    "winner_ms",
    "search_space_hash",
    "tuning_seconds",
    "host",
    "created_at",
    "updated_at",
    "hit_count",
    "last_hit_at",
    "configs",
)
_CONFIG_ROW_FIELDS = (
    "config_hash",
    "config",
    "status",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "samples",
    "failure",
    "host",
    "measured_at",
)
_CONFIG_FIELDS = ("kwargs", *CONFIG_FIELDS, "pre_hook")
_PROBLEM_SET = frozenset(_PROBLEM_FIELDS)
_CONFIG_ROW_SET = frozenset(_CONFIG_ROW_FIELDS)
_N_CONFIG_ROW_FIELDS = len(_CONFIG_ROW_FIELDS)
_CONFIG_SET = frozenset(_CONFIG_FIELDS)
_TARGET_SET = frozenset(TARGET_FIELDS)
_TARGET_INT = frozenset(f for f in TARGET_FIELDS if problems.c[f].type.python_type is int)
_STATUS_SET = frozenset(STATUSES)
_INT_MAX = 2**31 - 1  # the Integer columns are 32-bit on PostgreSQL and MySQL
_HEX = re.compile(r"[0-9a-f]*")

# Columns in the order import writes them and export reads them: the tables' own order, so the
# schema in tunecache.store stays the one place that lists them.
_P_COLS = tuple(c.name for c in problems.c)
_C_COLS = tuple(c.name for c in configs.c)


@dataclass
class ImportSummary:
    """What an import did (or, with ``dry_run``, would do). ``problems``/``configs`` count the file."""

    new: int = 0
    updated: int = 0
    skipped: int = 0
    conflicts: int = 0
    problems: int = 0
    configs: int = 0
    launch_specs: int = 0  # in the file (version 2)
    launch_specs_new: int = 0  # of those, not stored before
    dry_run: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


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
    """
    t0 = time.perf_counter()
    filters = {"kernel": kernel, "arch": arch, "device": device, "driver": driver, "since": since}
    created = utcnow().isoformat()
    version = FORMAT_VERSION if with_launch_specs else 1

    def header(n_problems: int, n_configs: int, n_specs: int, sha: str) -> bytes:
        h = {
            "format": FORMAT_NAME,
            "version": version,
            "tunecache": _version(),
            "problems": n_problems,
            "configs": n_configs,
            "body_sha256": sha,
            "created_at": created,
            "filters": {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in filters.items()},
        }
        if with_launch_specs:
            h["launch_specs"] = n_specs
        return orjson.dumps(h)

    path = None if _is_stream(out) else Path(os.fspath(out))  # type: ignore[arg-type]
    if compress is None:
        compress = path is not None and path.suffix == ".gz"
    if path is None:
        with tempfile.TemporaryFile(prefix=".tunecache-export-") as body:
            n_problems, n_configs, n_specs, sha = _write_body(store, body, filters, progress, with_launch_specs)
            body.seek(0)
            target = sys.stdout.buffer if out == "-" else out
            line = header(n_problems, n_configs, n_specs, sha) + b"\n"
            size = _emit(target, line, body, compress)  # type: ignore[arg-type]
        where = "-" if out == "-" else str(getattr(out, "name", "<stream>"))
    else:
        if not path.parent.is_dir():
            raise TunecacheError(f"cannot export to {path}: directory {path.parent} does not exist")
        slot = len(header(2**63 - 1, 2**63 - 1, 2**63 - 1, "0" * 64)) + 1  # no final header can be longer
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make the export private to its writer
            with os.fdopen(fd, "w+b") as f:
                reserved = _header_block(b"", slot, compress)
                f.write(reserved)
                if compress:
                    with gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                        n_problems, n_configs, n_specs, sha = _write_body(
                            store,
                            gz,  # type: ignore[arg-type]
                            filters,
                            progress,
                            with_launch_specs,
                        )
                else:
                    n_problems, n_configs, n_specs, sha = _write_body(store, f, filters, progress, with_launch_specs)
                size = f.tell()
                block = _header_block(header(n_problems, n_configs, n_specs, sha), slot, compress)
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
        "version": version,
        "bytes": size,
        "compressed": compress,
        "body_sha256": sha,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    log.info("tunecache: exported %d problems (%d configs) to %s", n_problems, n_configs, where)
    return summary


def _header_block(header: bytes, slot: int, compress: bool) -> bytes:
    """The header line padded with spaces to ``slot`` bytes; gzip'd as stored blocks (a fixed size)."""
    line = header + b" " * (slot - 1 - len(header)) + b"\n"
    return gzip.compress(line, compresslevel=0, mtime=0) if compress else line


def _version() -> str:
    from tunecache import __version__

    return __version__


def _is_stream(x: Any) -> bool:
    return x == "-" or hasattr(x, "read") or hasattr(x, "write")


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


def _emit(f: IO[bytes], header: bytes, body: IO[bytes], compress: bool) -> int:
    """Header line then body into ``f`` (through gzip if asked); return the bytes written."""
    counter = _CountingWriter(f)
    if compress:
        with gzip.GzipFile(filename="", fileobj=counter, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:  # type: ignore[arg-type]
            gz.write(header)
            shutil.copyfileobj(body, gz, 1 << 20)
    else:
        counter.write(header)
        shutil.copyfileobj(body, counter, 1 << 20)
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


_TIMESTAMPS = ("created_at", "updated_at", "last_hit_at", "measured_at")


def _select_cols(table: sa.Table, names: Sequence[str], raw_timestamps: bool) -> list[Any]:
    """Columns to export; on SQLite the timestamps come as stored text (see :func:`_iso_from_sqlite`)."""
    cols = [table.c[n] for n in names if n != "target_digest"]
    if raw_timestamps:
        cols = [sa.type_coerce(c, sa.String).label(c.name) if c.name in _TIMESTAMPS else c for c in cols]
    return cols


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


_N_TARGET = len(TARGET_FIELDS)


def _write_body(
    store: Store, body: IO[bytes], filters: dict[str, Any], progress: Progress | None, with_specs: bool
) -> tuple[int, int, int, str]:
    """Stream problems in digest order, a batch at a time with its config rows, as JSON lines.

    Keyset pagination (digest > last) over the primary keys: no per-problem query, no server-side
    cursor, and every batch is one indexed range (or IN list when filtered). The whole export
    reads in one transaction, a consistent snapshot on SQLite (WAL), PostgreSQL and MySQL.
    """
    where = _where(**filters)
    sha = hashlib.sha256()
    n_problems = n_configs = 0
    dumps, fragment, newline = orjson.dumps, orjson.Fragment, orjson.OPT_APPEND_NEWLINE
    sqlite = store.dialect == "sqlite"
    ts: Callable[[Any], Any] = _iso_from_sqlite if sqlite else (lambda v: v)
    p_select, c_select = _select_cols(problems, _P_COLS, sqlite), _select_cols(configs, _C_COLS, sqlite)
    with store.snapshot("export") as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(problems).where(*where)).scalar_one()
        last = ""
        while True:
            prows = conn.execute(
                sa.select(*p_select)
                .where(*where, problems.c.digest > last)
                .order_by(problems.c.digest)
                .limit(_EXPORT_BATCH)
            ).all()
            if not prows:
                break
            first, last = prows[0][0], prows[-1][0]
            # Unfiltered, every digest in [first, last] is in this batch: one range scan. Filtered, a
            # batch may be spread over the whole key space: an IN list.
            cond = configs.c.digest.in_([r[0] for r in prows]) if where else configs.c.digest.between(first, last)
            crows = conn.execute(
                sa.select(*c_select).where(cond).order_by(configs.c.digest, configs.c.config_hash)
            ).all()
            by_digest: dict[str, list[dict[str, Any]]] = {}
            for c in crows:
                lst = by_digest.get(c[0])
                if lst is None:
                    lst = by_digest[c[0]] = []
                lst.append(
                    {
                        "config_hash": c[1],
                        "config": fragment(c[2]),
                        "status": c[3],
                        "median_ms": c[4],
                        "p20_ms": c[5],
                        "p80_ms": c[6],
                        "samples": c[7],
                        "failure": None if c[8] is None else fragment(c[8]),
                        "host": c[9],
                        "measured_at": ts(c[10]),
                    }
                )
            for r in prows:
                rows = by_digest.get(r[0], [])
                i = 3 + _N_TARGET
                line = dumps(
                    {
                        "digest": r[0],
                        "kernel": r[1],
                        "source_hash": r[2],
                        "target": dict(zip(TARGET_FIELDS, r[3:i])),
                        "key": fragment(r[i]),
                        "batch_bucket": r[i + 1],
                        "winner_config_hash": r[i + 2],
                        "winner_ms": r[i + 3],
                        "search_space_hash": r[i + 4],
                        "tuning_seconds": r[i + 5],
                        "host": r[i + 6],
                        "created_at": ts(r[i + 7]),
                        "updated_at": ts(r[i + 8]),
                        "hit_count": r[i + 9],
                        "last_hit_at": ts(r[i + 10]),
                        "configs": rows,
                    },
                    option=newline,
                )
                if len(line) > MAX_LINE_BYTES:
                    raise TunecacheError(
                        f"problem {r[0][:16]} ({r[1]}) has {len(rows)} config rows, a {len(line)}-byte line; "
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
            s = launch_specs.c
            of_exported = sa.exists().where(
                problems.c.source_hash == s.source_hash, problems.c.target_digest == s.target_digest, *where
            )
            cols = (s.kernel, s.source_hash, s.target_digest, s.spec_hash, s.config_hash, s.kernel_hash)
            q = sa.select(*cols, s.triton_version, s.spec_json).where(of_exported)
            for row in conn.execute(q.order_by(s.source_hash, s.target_digest, s.spec_hash)):
                line = dumps(dict(zip(_SPEC_FIELDS, row)), option=newline)
                if len(line) > MAX_LINE_BYTES:  # pragma: no cover - a spec is a few KiB
                    raise TunecacheError(f"launch spec {row[3][:16]} of {row[0]} is a {len(line)}-byte line")
                body.write(line)
                sha.update(line)
                n_specs += 1
    return n_problems, n_configs, n_specs, sha.hexdigest()


# --------------------------------------------------------------------------------------------
# Reading a file
# --------------------------------------------------------------------------------------------


class _Bad(Exception):
    """A validation failure inside one line; the caller adds the line number."""


@contextlib.contextmanager
def _open_source(src: Source) -> Iterator[tuple[IO[bytes], bool]]:
    """A seekable binary file over ``src`` and whether it is gzip; stdin and pipes are spooled to disk."""
    with contextlib.ExitStack() as stack:
        named_gz = False
        if src == "-" or hasattr(src, "read"):
            stream: IO[bytes] = sys.stdin.buffer if src == "-" else src  # type: ignore[assignment]
            seekable = False
            with contextlib.suppress(AttributeError, OSError, ValueError):
                seekable = stream.seekable() and stream is not sys.stdin.buffer
            if seekable:
                f = stream
            else:  # two passes need to read it twice
                f = stack.enter_context(tempfile.TemporaryFile(prefix=".tunecache-import-"))
                shutil.copyfileobj(stream, f, 1 << 20)
                f.seek(0)
            named_gz = str(getattr(stream, "name", "")).endswith(".gz")
        else:
            path = Path(os.fspath(src))  # type: ignore[arg-type]
            if path.is_dir():
                raise TunecacheError(f"cannot import {path}: it is a directory")
            f = stack.enter_context(open(path, "rb"))  # noqa: SIM115 - closed by the ExitStack
            named_gz = path.suffix == ".gz"
        start = f.tell()
        magic = f.read(2)
        f.seek(start)
        yield _Rewind(f, start), named_gz or magic == b"\x1f\x8b"


class _Rewind:
    """The file and where the export starts in it (a caller's stream need not be at 0)."""

    def __init__(self, f: IO[bytes], start: int) -> None:
        self.f, self.start = f, start

    def lines(self, gz: bool, max_line: int) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) for every line, reading at most ``max_line + 1`` bytes per line.

        A line with no newline at the end of the file is a cut-off file (export ends every line
        with one); a longer line is rejected as soon as the limit is passed, so a 2 GB line never
        sits in memory.
        """
        self.f.seek(self.start)
        # GzipFile's own small buffer, not a bigger one: a truncated .gz then fails at the line it
        # cuts (or within 8 KiB of it), not a megabyte earlier.
        reader: Any = gzip.GzipFile(fileobj=self.f, mode="rb") if gz else self.f
        lineno = 0
        while True:
            lineno += 1
            try:
                line = reader.readline(max_line + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise ImportFormatError(lineno, f"gzip error: {e} (corrupt or truncated .gz file)") from None
            if not line:
                return
            if len(line) > max_line:
                raise ImportFormatError(
                    lineno, f"line longer than {max_line} bytes, the most import accepts: corrupted, or not an export"
                )
            if line[-1:] != b"\n":
                raise ImportFormatError(
                    lineno, "truncated file: the last line has no newline (the file was cut short while copying?)"
                )
            yield lineno, line


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        if line.strip() == b"":
            raise _Bad("empty line: every line must be one JSON object") from None
        hint = " (NaN and Infinity are not JSON numbers)" if b"NaN" in line or b"Infinity" in line else ""
        raise _Bad(f"not valid JSON: {e.msg} at column {e.colno}{hint}") from None


def _tname(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(v), type(v).__name__
    )


def _check_fields(obj: Any, allowed: frozenset[str], order: Sequence[str], what: str) -> None:
    if type(obj) is not dict:
        raise _Bad(f"{what} must be a JSON object, got {_tname(obj)}")
    if obj.keys() != allowed:
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise _Bad(f"unknown field{'s' if len(unknown) > 1 else ''} in {what}: {', '.join(map(repr, unknown))}")
        missing = [f for f in order if f not in obj]
        raise _Bad(f"missing field{'s' if len(missing) > 1 else ''} in {what}: {', '.join(map(repr, missing))}")


def _check_header(obj: Any) -> dict[str, Any]:
    if type(obj) is not dict or obj.get("format") != FORMAT_NAME:
        if type(obj) is dict and "digest" in obj:
            raise _Bad(
                f'missing header: line 1 is a problem; a {FORMAT_NAME} file starts with {{"format": '
                f'"{FORMAT_NAME}", "version": {FORMAT_VERSION}, ...}} (was its start cut off?)'
            )
        raise _Bad(f'not a tunecache export: line 1 must be the header {{"format": "{FORMAT_NAME}", ...}}')
    version = obj.get("version")
    if type(version) is not int:
        raise _Bad(f"header field 'version' must be an integer, got {_tname(version)}")
    if version not in READABLE_VERSIONS:
        raise _Bad(
            f"unsupported format version {version}: this tunecache ({_version()}) reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
            + ("; upgrade tunecache to import this file" if version > FORMAT_VERSION else "")
        )
    fields = _HEADER_FIELDS_V1 if version == 1 else _HEADER_FIELDS
    _check_fields(obj, frozenset(fields), fields, "the header")
    if version == 1:
        obj = {**obj, "launch_specs": 0}
    for name in ("problems", "configs", "launch_specs"):
        v = obj[name]
        if type(v) is not int or v < 0:
            raise _Bad(f"header field {name!r} must be a non-negative integer, got {v!r}")
    if not _is_hex(obj["body_sha256"], 64):
        raise _Bad("header field 'body_sha256' must be 64 lowercase hex digits")
    for name in ("tunecache", "created_at"):
        if type(obj[name]) is not str:
            raise _Bad(f"header field {name!r} must be a string, got {_tname(obj[name])}")
    filters = obj["filters"]
    if type(filters) is not dict or not set(filters) <= set(_FILTER_FIELDS):
        raise _Bad(f"header field 'filters' must be an object with keys among {', '.join(_FILTER_FIELDS)}")
    if any(v is not None and type(v) is not str for v in filters.values()):
        raise _Bad("header field 'filters' must map to strings or null")
    return obj


def _is_hex(v: Any, n: int) -> bool:
    return type(v) is str and len(v) == n and _HEX.fullmatch(v) is not None


def _text(v: Any, name: str, limit: int | None) -> str:
    if type(v) is not str:
        raise _Bad(f"{name} must be a string, got {_tname(v)}")
    if limit is not None and len(v) > limit:
        raise _Bad(f"{name} is {len(v)} characters long; the store's limit is {limit}")
    return v


def _int(v: Any, name: str, nullable: bool = False) -> int | None:
    if type(v) is int and 0 <= v <= _INT_MAX:
        return v
    if v is None and nullable:
        return None
    if type(v) is int:
        raise _Bad(f"{name} must be between 0 and {_INT_MAX}, got {v}")
    raise _Bad(f"{name} must be an integer{' or null' if nullable else ''}, got {_tname(v)}")


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
        raise _Bad(f"{name} must be a number{' or null' if nullable else ''}, got {_tname(v)}")
    raise _Bad(f"{name} must be finite and non-negative, got {v!r}")


def _ts(v: Any, name: str, nullable: bool = False) -> dt.datetime | None:
    if v is None and nullable:
        return None
    if type(v) is not str:
        raise _Bad(f"{name} must be an ISO 8601 date-time string{' or null' if nullable else ''}, got {_tname(v)}")
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError:
        raise _Bad(f"{name} is not an ISO 8601 date-time: {v[:40]!r}") from None
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
            raise _Bad(f"{name} must be a JSON object, got {_tname(cfg)}")
        canon = orjson.dumps(cfg, option=orjson.OPT_SORT_KEYS)
        h = self.config_hashes.get(canon)
        if h is None:
            if "ir_override" in cfg:  # optional: only configs that replace their IR carry it
                if type(cfg["ir_override"]) is not str:
                    raise _Bad(f"{name}.ir_override must be a string (the IR file's name and hash)")
                _check_fields({k: v for k, v in cfg.items() if k != "ir_override"}, _CONFIG_SET, _CONFIG_FIELDS, name)
            else:
                _check_fields(cfg, _CONFIG_SET, _CONFIG_FIELDS, name)
            kwargs = cfg["kwargs"]
            if type(kwargs) is not dict:
                raise _Bad(f"{name}.kwargs must be an object, got {_tname(kwargs)}")
            for k, v in kwargs.items():
                if not _scalar(v):
                    raise _Bad(f"{name}.kwargs[{k!r}] must be a scalar, got {_tname(v)}")
            for f in CONFIG_FIELDS:
                v = cfg[f]
                if v is not None and (type(v) is not int or abs(v) > _INT_MAX):
                    raise _Bad(f"{name}.{f} must be an integer or null, got {_tname(v)}")
            if cfg["pre_hook"] is not None and type(cfg["pre_hook"]) is not str:
                raise _Bad(f"{name}.pre_hook must be a string (the hook's identity) or null")
            h = config_hash_of(cfg)
            if len(self.config_hashes) < 100_000:
                self.config_hashes[canon] = h
        return h

    def problem(self, obj: Any) -> tuple[str, str | None, float | None, int]:
        """Validate one problem line; return (digest, winner hash, winner ms, config rows)."""
        _check_fields(obj, _PROBLEM_SET, _PROBLEM_FIELDS, "a problem")
        digest = obj["digest"]
        if not _is_hex(digest, 64):
            raise _Bad("digest must be 64 lowercase hex digits")
        _text(obj["kernel"], "kernel", 255)
        if not _is_hex(obj["source_hash"], 64):
            raise _Bad("source_hash must be 64 lowercase hex digits")
        target = self.target(obj["target"])
        key = obj["key"]
        if type(key) is not list:
            raise _Bad(f"key must be a list of [name, value] pairs, got {_tname(key)}")
        for pair in key:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or not _scalar(pair[1]):
                raise _Bad(f"key must be a list of [name, scalar] pairs, got {orjson.dumps(pair).decode()[:60]}")
        _int(obj["batch_bucket"], "batch_bucket", nullable=True)
        winner = obj["winner_config_hash"]
        winner_ms = _ms(obj["winner_ms"], "winner_ms")
        ssh = obj["search_space_hash"]
        if not (ssh == "" or _is_hex(ssh, 64)):
            raise _Bad("search_space_hash must be 64 lowercase hex digits (or empty)")
        _ms(obj["tuning_seconds"], "tuning_seconds", nullable=False)
        _text(obj["host"], "host", 255)
        _ts(obj["created_at"], "created_at")
        _ts(obj["updated_at"], "updated_at")
        _int(obj["hit_count"], "hit_count")
        _ts(obj["last_hit_at"], "last_hit_at", nullable=True)
        rows = obj["configs"]
        if type(rows) is not list:
            raise _Bad(f"configs must be a list, got {_tname(rows)}")
        seen: set[str] = set()
        self.config_rows(rows, seen)
        if winner is not None and winner not in seen:
            if not _is_hex(winner, 32):
                raise _Bad("winner_config_hash must be 32 lowercase hex digits or null")
            raise _Bad(f"winner_config_hash {winner} is not the hash of any of this problem's configs")
        expected = problem_digest(obj["source_hash"], target, canonical_json(key))
        if digest != expected:
            raise _Bad(
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
                _check_fields(row, _CONFIG_ROW_SET, _CONFIG_ROW_FIELDS, f"configs[{i}]")
            try:
                cfg, given, status = row["config"], row["config_hash"], row["status"]
                m, lo, hi, n = row["median_ms"], row["p20_ms"], row["p80_ms"], row["samples"]
                failure, host, measured = row["failure"], row["host"], row["measured_at"]
            except KeyError:  # ten fields, but not the right ten
                _check_fields(row, _CONFIG_ROW_SET, _CONFIG_ROW_FIELDS, f"configs[{i}]")
                raise
            h = cache.get(dumps(cfg, option=sort)) if type(cfg) is dict else None
            if h is None:
                h = self.config_hash(cfg, f"configs[{i}].config")
            if given != h:
                if not _is_hex(given, 32):
                    raise _Bad(f"configs[{i}].config_hash must be 32 lowercase hex digits")
                raise _Bad(
                    f"configs[{i}].config_hash {given} does not match its config (hash {h}): edited or corrupted"
                )
            if h in seen:
                raise _Bad(f"configs[{i}]: config {h} appears twice")
            seen.add(h)
            if status not in _STATUS_SET:
                raise _Bad(f"configs[{i}].status {str(status)[:40]!r} is not one of {', '.join(STATUSES)}")
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
                    raise _Bad(f"configs[{i}].failure must be an object or null, got {_tname(failure)}")
                if not _depth_ok(failure, MAX_FAILURE_DEPTH):
                    raise _Bad(f"configs[{i}].failure nests deeper than {MAX_FAILURE_DEPTH} levels")
            if type(host) is not str or len(host) > 255:
                _text(host, f"configs[{i}].host", 255)
            try:
                parse_ts(measured)
            except (TypeError, ValueError):
                _ts(measured, f"configs[{i}].measured_at")


# --------------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------------


@dataclass
class _Scan:
    header: dict[str, Any]
    sha: str
    lines: int
    problems: list[tuple[str, str | None, float | None, int]]  # digest, winner hash, winner ms, config rows
    configs: int
    specs: int  # launch-spec lines (version 2), validated; pass 2 re-reads them if they are to be added
    pairs: set[tuple[str, str]]  # (source_hash, target digest) of the problems, which specs must belong to


def _scan(reader: _Rewind, gz: bool, max_line: int, progress: Progress | None) -> _Scan:
    """Pass 1: validate every line and hash the body, one line in memory at a time.

    What it keeps is bounded by the work, not by the file: a few hashes per problem, 48 bytes per
    launch spec (to refuse duplicates), never a line. A launch-spec line may be 4 MiB of text that
    gzip shrinks a thousandfold; pass 2 re-reads them only when they are to be added.
    """
    header: dict[str, Any] | None = None
    sha = hashlib.sha256()
    seen: dict[str, int] = {}
    found: list[tuple[str, str | None, float | None, int]] = []
    n_found_specs = 0
    pairs: set[tuple[str, str]] = set()  # (source_hash, target digest) of the problems
    seen_specs: set[bytes] = set()
    n_configs = 0
    validator = _Validator()
    lineno = 0
    announced = n_specs = 0
    for lineno, line in reader.lines(gz, max_line):
        try:
            obj = _loads(line)
            if header is None:
                header = _check_header(obj)
                announced, n_specs = header["problems"], header["launch_specs"]
                continue
            if len(found) >= announced:
                if n_found_specs >= n_specs:
                    raise _Bad(
                        f"more lines than the {announced} problems and {n_specs} launch specs the header announces"
                    )
                _check_spec(obj, pairs, seen_specs)
                n_found_specs += 1
                sha.update(line)
                continue
            digest, winner, winner_ms, n = validator.problem(obj)
            pairs.add((obj["source_hash"], validator.target(obj["target"]).digest))
        except _Bad as e:
            raise ImportFormatError(lineno, str(e)) from None
        if digest in seen:
            raise ImportFormatError(lineno, f"duplicate problem {digest[:16]}..., also on line {seen[digest]}")
        seen[digest] = lineno
        sha.update(line)
        found.append((digest, winner, winner_ms, n))
        n_configs += n
        if progress is not None and len(found) % _EXPORT_BATCH == 0:
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
    if n_configs != header["configs"]:
        raise ImportFormatError(1, f"the header announces {header['configs']} config rows but the file has {n_configs}")
    digest = sha.hexdigest()
    if digest != header["body_sha256"]:  # almost always an edited body line: blame those, not the header
        raise ImportFormatError(
            2,
            f"sha256 {digest[:16]}... does not match the header's body_sha256 {header['body_sha256'][:16]}...: "
            "one of these lines was edited or corrupted after export (the checksum cannot tell which); "
            "export the file again",
            last=lineno,
        )
    if progress is not None:
        progress("validate", len(found), announced)
    return _Scan(header, digest, lineno, found, n_configs, n_found_specs, pairs)


def _check_spec(obj: Any, pairs: set[tuple[str, str]], seen: set[bytes] | None) -> dict[str, Any]:
    """Validate one launch-spec line (version 2); return its launch_specs row values.

    A spec only tells Triton which specialisation of a kernel this store already knows to compile;
    the kernel's code always comes from the importing process, and a preload whose binary differs
    from ``kernel_hash`` is dropped (tunecache.preload). Still, every field is checked, the hash
    recomputed, and a spec must belong to a kernel and target of this file's problems.
    """
    _check_fields(obj, _SPEC_SET, _SPEC_FIELDS, "a launch spec")
    for name in ("source_hash", "target_digest", "spec_hash", "kernel_hash"):
        if not _is_hex(obj[name], 64):
            raise _Bad(f"launch spec {name} must be 64 lowercase hex digits")
    if not _is_hex(obj["config_hash"], 32):
        raise _Bad("launch spec config_hash must be 32 lowercase hex digits")
    _text(obj["kernel"], "kernel", 255)
    _text(obj["triton_version"], "triton_version", 32)
    spec = _text(obj["spec"], "spec", None)
    if hashlib.sha256(spec.encode()).hexdigest() != obj["spec_hash"]:
        raise _Bad(f"launch spec_hash {obj['spec_hash'][:16]}... does not match its spec")
    if type(_loads(spec.encode())) is not dict:
        raise _Bad("launch spec 'spec' must be a JSON object (Triton's serialised specialisation)")
    if (obj["source_hash"], obj["target_digest"]) not in pairs:
        raise _Bad("launch spec for a kernel and target that no problem in this file has")
    if seen is not None:  # pass 1; pass 2 re-reads a file that hashes the same
        key = hashlib.sha256(f"{obj['source_hash']}{obj['target_digest']}{obj['spec_hash']}".encode()).digest()
        if key in seen:
            raise _Bad(f"duplicate launch spec {obj['spec_hash'][:16]}...")
        seen.add(key)
    row = {f: obj[f] for f in _SPEC_FIELDS if f != "spec"}  # the file's names are the columns'
    row["spec_json"] = spec
    return row


def import_(
    store: Store,
    src: Source,
    *,
    dry_run: bool = False,
    on_conflict: str = "keep",
    progress: Progress | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    with_launch_specs: bool = False,
) -> ImportSummary:
    """Import an export file (path, ``"-"`` or binary file) into ``store``: all of it, or nothing.

    Every line is validated before anything is written (see the module docstring); a bad file
    raises :class:`ImportFormatError` naming the line and leaves the store as it was.
    ``on_conflict`` handles digests the store already has: ``keep`` (skip), ``replace``, or
    ``faster`` (replace when the incoming winner is faster). ``dry_run`` validates and counts.
    ``with_launch_specs`` also adds the file's launch specs (validated either way): they steer
    which specialisations Triton compiles and loads at the next start, so only for a file trusted
    like the store itself (your own export, e.g. during an image build).
    """
    if on_conflict not in CONFLICT_POLICIES:
        raise ValueError(f"on_conflict must be one of {', '.join(CONFLICT_POLICIES)}, not {on_conflict!r}")
    if store.readonly and not dry_run:  # say so before minutes of validation, not after
        raise StoreReadOnlyError(f"import: store {store.masked_url} is opened read-only")
    t0 = time.perf_counter()
    with _open_source(src) as (reader, gz):
        scan = _scan(reader, gz, max_line_bytes, progress)
        log.debug("tunecache: import validated %d lines in %.2fs", scan.lines, time.perf_counter() - t0)
        summary = ImportSummary(
            problems=len(scan.problems), configs=scan.configs, launch_specs=scan.specs, dry_run=dry_run
        )
        if dry_run:
            with store.snapshot("import (dry run)") as conn:
                _decide(conn, scan, on_conflict, summary)
        else:
            with store._write("import") as conn, _driver_errors(store):
                writer = _writer(store, conn)  # takes its locks before _decide reads
                try:
                    write, delete = _decide(conn, scan, on_conflict, summary)
                    # Launch specs are additive, whatever the conflict policy.
                    add_specs = partial(store._add_specs, conn) if with_launch_specs and scan.specs else None
                    summary.launch_specs_new = _apply(
                        conn, writer, reader, gz, max_line_bytes, scan, write, delete, add_specs, progress
                    )
                finally:
                    writer.close()
                t_commit = time.perf_counter()
            log.debug("tunecache: import committed in %.2fs", time.perf_counter() - t_commit)
    summary.seconds = round(time.perf_counter() - t0, 3)
    log.info(
        "tunecache: import%s of %d problems: %d new, %d updated, %d skipped, %d conflicts",
        " (dry run)" if dry_run else "",
        summary.problems,
        summary.new,
        summary.updated,
        summary.skipped,
        summary.conflicts,
    )
    return summary


def _decide(conn: Connection, scan: _Scan, on_conflict: str, summary: ImportSummary) -> tuple[set[str], list[str]]:
    """Which incoming digests to write and which stored ones to delete first, from what is stored."""
    stored: dict[str, tuple[str | None, float | None]] = {}
    if conn.execute(sa.select(problems.c.digest).limit(1)).first() is not None:
        digests = [p[0] for p in scan.problems]
        for i in range(0, len(digests), _LOOKUP_CHUNK):
            q = sa.select(problems.c.digest, problems.c.winner_config_hash, problems.c.winner_ms).where(
                problems.c.digest.in_(digests[i : i + _LOOKUP_CHUNK])
            )
            stored.update((d, (w, ms)) for d, w, ms in conn.execute(q))
    write: set[str] = set()
    delete: list[str] = []
    for digest, winner, winner_ms, _ in scan.problems:
        old = stored.get(digest)
        if old is None:
            summary.new += 1
            write.add(digest)
            continue
        if old[0] != winner:
            summary.conflicts += 1
        take = on_conflict == "replace" or (
            on_conflict == "faster" and winner_ms is not None and (old[1] is None or winner_ms < old[1])
        )
        if take:
            summary.updated += 1
            write.add(digest)
            delete.append(digest)
        else:
            summary.skipped += 1
    return write, delete


@contextlib.contextmanager
def _driver_errors(store: Store) -> Iterator[None]:
    """Raw driver calls (COPY) bypass SQLAlchemy's error wrapping: give them the store's wording."""
    dbapi_error = getattr(store.engine.dialect.dbapi, "Error", ())
    try:
        yield
    except dbapi_error as e:
        raise StoreError(f"import failed on {store.masked_url}: {_scrub(_reason(e), store.url)}") from None


def _apply(
    conn: Connection,
    writer: _Writer,
    reader: _Rewind,
    gz: bool,
    max_line: int,
    scan: _Scan,
    write: set[str],
    delete: list[str],
    add_specs: Callable[[list[dict[str, Any]]], int] | None,
    progress: Progress | None,
) -> int:
    """Pass 2, inside the import's transaction: delete what is replaced, insert, drop resolved misses,
    and with ``add_specs`` add the launch specs. Returns how many launch specs were new."""
    for i in range(0, len(delete), _LOOKUP_CHUNK):
        chunk = delete[i : i + _LOOKUP_CHUNK]
        conn.execute(sa.delete(configs).where(configs.c.digest.in_(chunk)))
        conn.execute(sa.delete(problems).where(problems.c.digest.in_(chunk)))
    missed = set(conn.execute(sa.select(misses.c.digest)).scalars()) & write
    if missed:
        conn.execute(sa.delete(misses).where(misses.c.digest.in_(sorted(missed))))
    t0 = time.perf_counter()
    specs_new = 0
    if write or add_specs is not None:
        writer.prepare(sum(n for digest, _, _, n in scan.problems if digest in write))
        sha = hashlib.sha256()

        def put(p_rows: list[tuple[Any, ...]], c_rows: list[tuple[Any, ...]], s_rows: list[dict[str, Any]]) -> None:
            nonlocal specs_new
            writer.write(p_rows, c_rows)
            if s_rows and add_specs is not None:
                specs_new += add_specs(s_rows)

        n = len(scan.problems)
        pairs = scan.pairs if add_specs is not None else None
        with _Pipeline(put, threaded=writer.threaded) as pipe:
            for done, p_rows, c_rows, s_rows in _row_batches(
                reader.lines(gz, max_line), write, writer.timestamp, sha, n, pairs
            ):
                pipe.put(p_rows, c_rows, s_rows)
                if progress is not None:
                    progress("write", min(done, n), n)
        if sha.hexdigest() != scan.sha:
            raise ImportFormatError(1, "the file changed while it was being imported; nothing was written")
    t1 = time.perf_counter()
    writer.finish()
    log.debug("tunecache: import wrote rows in %.2fs, finished in %.2fs", t1 - t0, time.perf_counter() - t1)
    return specs_new


def _row_batches(
    lines: Iterator[tuple[int, bytes]],
    write: set[str],
    ts: Callable[[str | None], Any],
    sha: Any,
    n_problems: int,
    spec_pairs: set[tuple[str, str]] | None,
) -> Iterator[tuple[int, list[tuple[Any, ...]], list[tuple[Any, ...]], list[dict[str, Any]]]]:
    """Database rows of the problems to write, in batches; every line (valid: pass 1) goes into ``sha``,
    the launch-spec lines after the ``n_problems`` problems too. With ``spec_pairs`` (the problems'
    kernels and targets) those lines become launch_specs rows, in batches of at most
    ``_SPEC_BATCH_BYTES`` of spec text: memory stays a few lines whatever the file holds.

    Timings go in as parsed (an int in a Double column reads back as a float); JSON columns get
    canonical JSON, the form ``Store.put`` writes.
    """
    next(lines)  # the header, validated in pass 1
    loads = orjson.loads
    targets: dict[tuple[Any, ...], str] = {}
    canon: dict[str, str] = {}
    p_rows: list[tuple[Any, ...]] = []
    c_rows: list[tuple[Any, ...]] = []
    s_rows: list[dict[str, Any]] = []
    s_bytes = 0
    done = 0
    for lineno, line in lines:
        sha.update(line)
        done += 1
        try:
            if done > n_problems:
                if spec_pairs is None:
                    continue
                s_rows.append(_check_spec(loads(line), spec_pairs, None))
                s_bytes += len(line)
                if s_bytes >= _SPEC_BATCH_BYTES or len(s_rows) >= _WRITE_BATCH:
                    yield done, p_rows, c_rows, s_rows
                    p_rows, c_rows, s_rows, s_bytes = [], [], [], 0
                continue
            if not write:
                continue
            obj = loads(line)
            digest = obj["digest"]
            if digest not in write:
                continue
            p_row, c_row = _rows(obj, digest, ts, targets, canon)
        except (ValueError, KeyError, TypeError, AttributeError, _Bad):  # valid in pass 1: rewritten since
            raise ImportFormatError(
                lineno, "the file changed while it was being imported; nothing was written"
            ) from None
        p_rows.append(p_row)
        c_rows.extend(c_row)
        if len(c_rows) >= _WRITE_BATCH or len(p_rows) >= _WRITE_BATCH:
            yield done, p_rows, c_rows, s_rows
            p_rows, c_rows, s_rows, s_bytes = [], [], [], 0
    if p_rows or s_rows:
        yield done, p_rows, c_rows, s_rows


def _rows(
    obj: dict[str, Any],
    digest: str,
    ts: Callable[[str | None], Any],
    targets: dict[tuple[Any, ...], str],
    canon: dict[str, str],
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """One problem line (validated) as a problems row and its configs rows, in _P_COLS/_C_COLS order."""
    t = obj["target"]
    tkey = tuple(t[f] for f in TARGET_FIELDS)
    tdigest = targets.get(tkey)
    if tdigest is None:
        tdigest = targets[tkey] = Target(**t).digest
    p_row = (
        digest,
        obj["kernel"],
        obj["source_hash"],
        tdigest,
        *tkey,
        canonical_json(obj["key"]),
        obj["batch_bucket"],
        obj["winner_config_hash"],
        obj["winner_ms"],
        obj["search_space_hash"],
        obj["tuning_seconds"],
        obj["host"],
        ts(obj["created_at"]),
        ts(obj["updated_at"]),
        obj["hit_count"],
        ts(obj["last_hit_at"]),
    )
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    c_rows = []
    for r in obj["configs"]:
        h = r["config_hash"]  # pass 1 checked it is the hash of this config
        cjs = canon.get(h)
        if cjs is None:
            cjs = dumps(r["config"], option=sort).decode()
            if len(canon) < 100_000:
                canon[h] = cjs
        f = r["failure"]
        c_rows.append(
            (
                digest,
                h,
                cjs,
                r["status"],
                r["median_ms"],
                r["p20_ms"],
                r["p80_ms"],
                r["samples"],
                None if f is None else dumps(f, option=sort).decode(),
                r["host"],
                ts(r["measured_at"]),
            )
        )
    return p_row, c_rows


class _Pipeline:
    """Build rows in this thread while another writes the previous batch.

    psycopg waits for the server with the GIL released, so on two cores parsing the next batch
    overlaps with PostgreSQL inserting this one. The queue is short: memory stays at a few batches.
    The connection is used by the writer thread only until ``__exit__`` joins it. sqlite3 takes
    the GIL back after every row, which turns a second thread into a convoy: SQLite writes inline.
    """

    def __init__(self, write: Callable[..., None], threaded: bool) -> None:
        self.write = write
        self.queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.thread = (
            threading.Thread(target=self._run, name="tunecache-import-writer", daemon=True) if threaded else None
        )

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.write(*item)
                except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                    self.error = e

    def put(self, *batch: Any) -> None:
        """Hand one batch (the arguments of ``write``) to the writer."""
        if self.thread is None:
            self.write(*batch)
            return
        if self.error is not None:
            raise self.error
        self.queue.put(batch)

    def __enter__(self) -> _Pipeline:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self.thread is None:
            return
        self.queue.put(None)
        self.thread.join()  # before any rollback: the writer must be off the connection
        if self.error is not None and exc_type is None:
            raise self.error


def _naive(v: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(v)
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo is not None else t


# ``YYYY-MM-DDTHH:MM:SS[.ffffff]`` with no offset: what export writes, passed on without parsing.
_PLAIN_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?", re.ASCII)


def _ts_sqlite(v: str | None) -> str | None:
    """SQLAlchemy's SQLite storage format: ``YYYY-MM-DD HH:MM:SS.ffffff``, compared as text by filters."""
    if v is None:
        return None
    if _PLAIN_TS.fullmatch(v):
        return f"{v[:10]} {v[11:]}" if len(v) == 26 else f"{v[:10]} {v[11:]}.000000"
    return _naive(v).isoformat(" ", "microseconds")


def _ts_postgresql(v: str | None) -> str | dt.datetime | None:
    """PostgreSQL parses ISO 8601 itself; an offset must be applied here (a timestamp column drops it)."""
    if v is None or _PLAIN_TS.fullmatch(v):
        return v
    return _naive(v)


def _ts_any(v: str | None) -> dt.datetime | None:
    return None if v is None else _naive(v)


def _writer(store: Store, conn: Connection) -> _Writer:
    if store.dialect == "postgresql":
        return _PgWriter(conn)
    return _Writer(conn, store.dialect)


class _Writer:
    """executemany through the driver, skipping SQLAlchemy's per-row parameter processing.

    On SQLite the import holds the write lock (BEGIN IMMEDIATE) and has checked which digests
    exist inside it, so plain INSERTs cannot collide. For the import's connection only, SQLite
    gets a 128 MiB page cache (the default 2 MiB spills the growing indexes to the WAL again and
    again) and skips the ``status IN (...)`` CHECK, which pass 1 has already enforced on every
    row; both are restored by :meth:`close`. Together they halve SQLite's time for 1.2M rows.
    MySQL uses INSERT IGNORE: a row a concurrent writer stored meanwhile wins, as with ``keep``.
    """

    threaded = False

    def __init__(self, conn: Connection, dialect: str) -> None:
        self.conn = conn
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        verb = "INSERT IGNORE" if dialect in ("mysql", "mariadb") else "INSERT"
        self.p_sql = f"{verb} INTO problems ({', '.join(_P_COLS)}) VALUES ({', '.join([mark] * len(_P_COLS))})"
        self.c_sql = f"{verb} INTO configs ({', '.join(_C_COLS)}) VALUES ({', '.join([mark] * len(_C_COLS))})"
        self.timestamp: Callable[[str | None], Any] = _ts_sqlite if dialect == "sqlite" else _ts_any
        self.restore: list[str] = []
        if dialect == "sqlite":
            for pragma, value in (("cache_size", -(128 << 10)), ("ignore_check_constraints", 1)):
                before = conn.exec_driver_sql(f"PRAGMA {pragma}").scalar()
                self.restore.append(f"PRAGMA {pragma}={int(before)}")
                conn.exec_driver_sql(f"PRAGMA {pragma}={value}")

    def prepare(self, n_configs: int) -> None:
        """Called once before the first write with the number of config rows to come."""

    def write(self, p_rows: list[tuple[Any, ...]], c_rows: list[tuple[Any, ...]]) -> None:
        if p_rows:
            self.conn.exec_driver_sql(self.p_sql, p_rows)  # type: ignore[arg-type]
        if c_rows:
            self.conn.exec_driver_sql(self.c_sql, c_rows)  # type: ignore[arg-type]

    def finish(self) -> None:
        """Last statements inside the transaction."""

    def close(self) -> None:
        """Undo the connection settings before it goes back to the pool (SQLite takes them in a transaction)."""
        for stmt in self.restore:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self.conn.exec_driver_sql(stmt)


class _PgWriter(_Writer):
    """PostgreSQL: COPY, several times faster than multi-row INSERTs, from a second thread.

    ``LOCK TABLE problems IN SHARE ROW EXCLUSIVE MODE`` first: concurrent writers wait (readers do
    not), so the digests found stored are exactly those stored, and COPY cannot hit a duplicate.
    PostgreSQL checks a foreign key with one query per inserted row, 13 s of 22 s for 1.2M config
    rows; a large import (>= ``_PG_FK_REBUILD_MIN`` rows) into an EMPTY store therefore drops
    configs' foreign key inside the transaction and adds it back before commit, which validates
    every row in one join. Into a store that has rows (a live fleet's), per-row checks are kept.
    DDL is transactional: a failure or crash restores the constraint; no other session ever sees
    the table without it, but readers of configs wait for the commit (the drop locks the table).
    A role that does not own the table keeps the per-row checks.
    """

    threaded = True

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn, "postgresql")
        self.timestamp = _ts_postgresql
        self.raw = conn.connection.driver_connection
        self.fks: list[tuple[str, str]] = []
        conn.exec_driver_sql("LOCK TABLE problems IN SHARE ROW EXCLUSIVE MODE")

    def prepare(self, n_configs: int) -> None:
        conn = self.conn
        if n_configs < _PG_FK_REBUILD_MIN:
            return
        # Only into an empty store (an image build, a new region): dropping the key locks configs
        # until commit, and workers restarting against a live shared store must never wait on that.
        if conn.exec_driver_sql("SELECT EXISTS (SELECT 1 FROM configs)").scalar():
            return
        fks = [
            (str(name), str(definition))
            for name, definition in conn.exec_driver_sql(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'configs'::regclass AND contype = 'f'"
            )
        ]
        quote = conn.dialect.identifier_preparer.quote
        try:
            with conn.begin_nested():
                for name, _ in fks:
                    conn.exec_driver_sql(f"ALTER TABLE configs DROP CONSTRAINT {quote(name)}")
        except sa.exc.DBAPIError as e:
            log.info("tunecache: import keeps per-row foreign key checks (%s)", _reason(e))
            return
        self.fks = [(quote(name), definition) for name, definition in fks]

    def write(self, p_rows: list[tuple[Any, ...]], c_rows: list[tuple[Any, ...]]) -> None:
        with self.raw.cursor() as cur:
            for table, cols, rows in (("problems", _P_COLS, p_rows), ("configs", _C_COLS, c_rows)):
                if rows:
                    with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                        for row in rows:
                            copy.write_row(row)

    def finish(self) -> None:
        for name, definition in self.fks:
            self.conn.exec_driver_sql(f"ALTER TABLE configs ADD CONSTRAINT {name} {definition}")
