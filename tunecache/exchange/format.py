"""The export file format: its specification, limits, and reading a file's lines.

Export and import move tuning results between stores as one versioned file.

A platform team tunes on one machine (or reads a fleet's shared store), exports, and imports the
file into another store: an image being built without a GPU, a second cluster, a laptop. The file
is data only: import parses JSON, checks every field and recomputes every hash; nothing in it is
ever executed (no pickle, no eval, no imports).

The package: :mod:`~tunecache.exchange.format` (this specification, its limits, reading a file's
lines), :mod:`~tunecache.exchange.validate` (every check of a line; import's pass 1),
:mod:`~tunecache.exchange.export` and :mod:`~tunecache.exchange.importer`; the database-specific
bulk writes are the store's (:meth:`tunecache.store.store.Store.bulk_load`). The fields of a problem, a
config row and a launch spec are :mod:`tunecache.problem.model`'s JSON shape, which ``tunecache ls --json``
and ``show --json`` print too.

File format, version 2 (and 3)
==============================

Version 2 is version 1 plus the winners' launch specs (below). Export writes version 2, or
version 1 with ``with_launch_specs=False`` (``tunecache export --no-launch-specs``) for a
tunecache that reads only version 1, or version 3 (below) with binaries or a signature; import
reads all three.

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
launch_specs       version 2 and 3: number of launch-spec lines after the problems
binaries           version 3 only: number of binary lines after the launch specs
signed_by          version 3 only: key id of the signature on the last line, or null
=================  ==========================================================================

Every following line is one problem, in digest order, with all its config rows (failed ones
included: they are what stops a later tuning from re-trying a config that cannot run):

====================  =====================================================================
field                 value
====================  =====================================================================
digest                64 hex: content address, recomputed on import from source_hash,
                      target and key (:func:`tunecache.problem.identity.problem_digest`)
kernel                kernel name, ``module.qualname`` (at most 255 characters)
source_hash           64 hex: hash of the kernel source and the ``@jit`` functions it calls
target                object with every :class:`~tunecache.problem.target.Target` field: backend,
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
             (:func:`tunecache.problem.configidentity.config_hash_of`)
config       ``{"kwargs": {name: scalar}, "num_warps", "num_stages", "num_ctas", "maxnreg":
             integer or null, "pre_hook": string (the hook's identity, never code) or null}``, plus
             ``"ir_override"`` (string: the IR file's name and content hash) in configs that have one
status       one of :data:`tunecache.problem.model.STATUSES`
median_ms    finite number >= 0, or null (p20_ms and p80_ms likewise)
samples      integer >= 0
failure      object (why the config failed, e.g. ``{"resource": "shared", "required":
             300000, "limit": 232448}``) or null; nested at most 8 levels
host         host that measured it
measured_at  ISO 8601 UTC date-time
===========  ==============================================================================

After the problems (version 2), one line per launch spec: what Triton compiled a winner with, so
that the importing store's first start loads the winners' binaries before its first launches
(:mod:`tunecache.binaries.preload`), e.g. an image built by import. Only the specs of a kernel source and
target that has an exported problem are written, ordered by (source_hash, target_digest,
spec_hash). Import validates them always and adds them only when asked (``with_launch_specs``,
``tunecache import --launch-specs``), whatever ``on_conflict`` says (a spec already stored is
kept). A spec carries no code (the kernel is always the importing process's own) but it does
steer what Triton compiles and under which cache key, which import cannot verify without a GPU:
so import adds them only from a file signed by a trusted key (version 3, below), or with
``trust_unsigned`` (``--trust-unsigned``) for a file trusted like the store itself.

==============  ===========================================================================
field           value
==============  ===========================================================================
kernel          kernel name (at most 255 characters)
source_hash     64 hex: the kernel source of a problem in this file
target_digest   64 hex: :attr:`tunecache.problem.target.Target.digest` of that problem's target
spec_hash       64 hex, recomputed on import: sha256 of ``spec``
config_hash     32 hex: the config it was compiled with
kernel_hash     64 hex: Triton's hash of the compiled binary
triton_version  the Triton version that compiled it (at most 32 characters)
spec            string: Triton's serialised specialisation, a JSON object
==============  ===========================================================================

Version 3: binaries and a signature
-----------------------------------

Version 3 is version 2 plus two header fields, ``binaries`` (the number of binary lines after the
launch specs) and ``signed_by`` (the key id of the signature, or null), the binary lines, and, when
signed, one last line. ``tunecache export --binaries`` and ``--sign KEY`` write it; a plain export
stays version 2, byte for byte what it was.

A binary line is what Triton's compile cache holds for one winner's specialisation
(:mod:`tunecache.binaries.binaries`), for every binary a launch spec in the file references, ordered by
``triton_key``:

==============  ===========================================================================
field           value
==============  ===========================================================================
kernel          kernel name of the launch spec that references it
source_hash     64 hex: that launch spec's kernel source
triton_key      64 hex: Triton's cache key of the specialisation, the spec's ``kernel_hash``
sha256          64 hex, recomputed on import: :func:`tunecache.problem.model.binary_sha256`
name            the file-name stem Triton gives it: a kernel name, ``[A-Za-z_][A-Za-z0-9_]*``
ext             ``cubin`` (CUDA) or ``hsaco`` (HIP): the metadata's backend's binary
triton_version  the Triton that compiled it
metadata        string: the metadata JSON file as Triton wrote it; its ``hash`` must be ``triton_key``
binary          string: the binary file, base64 (at most 2.5 MiB before encoding)
==============  ===========================================================================

The signature line, only when ``signed_by`` is not null, is not part of the body (nor of
``body_sha256``): ``{"signature": {"algorithm": "ed25519", "key_id": 16 hex, "public_key": base64
of the 32-byte key, "value": base64 of the signature}}``. It signs ``tunecache-export-signature-1\n``
followed by the header line exactly as written (its padding and newline included, uncompressed).
The header holds the body's sha256, so the signature covers every byte before it: a byte changed
anywhere fails the import. Import checks the signature of every signed file; ``import --binaries``
and ``--launch-specs`` further require that its key is one of ``TUNECACHE_TRUSTED_KEYS``, unless
``--trust-unsigned`` (:mod:`tunecache.trust.signing`). Where ``TUNECACHE_TRUSTED_KEYS`` is set, every
import, of results too, needs a file signed by one of them, unless ``--trust-unsigned``: a file
whose signature line was cut off is then an unsigned file, and refused.

Version 4: row signatures
-------------------------

Version 4 is version 3 whose launch spec and binary lines have one more field, ``signature``: the
row signature its maker stored with it (``ed25519:<base64 public key>:<base64 signature>``, see
:mod:`tunecache.trust.trust` for what it covers), or null for a row stored unsigned. Export writes
version 4 wherever it wrote version 3, and only rows the exporting process trusts
(:mod:`tunecache.trust.trust`: signed by a trusted key or the signing key of the export, or from a store
trusted as a whole): a file signature never vouches for a row that no trusted key made. Import
stores each row with its signature; a process places or preloads it only if the signature
verifies against one of its own trusted keys (or its store is trusted as a whole).

Version 5: torch.compile's cache entries
----------------------------------------

Version 5 is version 4 plus one header field, ``inductor_entries`` (the number of lines after the
binary lines, before the signature line), and those lines: the entries of torch.compile's remote
caches (:mod:`tunecache.inductor`), in (cache, key, target) order. ``tunecache export --inductor``
writes it; without ``--inductor`` an export is what it was. Import reads versions 1 to 5 and adds
the entries only when asked (``with_inductor``, ``import --inductor``); as for binaries, a file
with entries must then be signed by a trusted key, or imported with ``--trust-unsigned``. Only
entries the exporting process trusts are written, with their row signatures, and an entry whose
line would pass :data:`MAX_LINE_BYTES` is left out (counted, logged): the importing host compiles it.

==============  ===========================================================================
field           value
==============  ===========================================================================
cache           ``autotune``, ``bundled_autotune``, ``fx_graph``, ``aot_autograd`` or ``triton_kernel``
key             Inductor's key (a string, at most 4096 characters)
target_digest   64 hex: the target the entry is bound to (:func:`tunecache.inductor.entries.inductor_target`)
target          object of strings: backend, arch, device_name, driver_version, driver_release,
                torch_version, triton_version (driver_release may be absent: files written before
                it was recorded; the entry's release is then unknown)
sha256          64 hex, recomputed on import: sha256 of the value's bytes
value           string: the bytes Inductor stored, base64
signature       its maker's row signature, or null (unsigned)
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
readers of ``configs`` wait (see :class:`tunecache.store.bulk.PgBulkWriter`). Timing on 100k problems:
docs/benchmarks/store.md.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tunecache.errors import ImportFormatError, TunecacheError
from tunecache.problem.configidentity import CONFIG_FIELDS

FORMAT_NAME = "tunecache-export"
#: The version a plain export writes (problems and launch specs).
FORMAT_VERSION = 2
#: The first version with binaries and a signature (3).
BINARIES_VERSION = 3
#: The version an export with binaries or a signature writes (``export --binaries``, ``--sign``):
#: version 3 whose launch spec and binary lines carry their row signatures.
SIGNED_ROWS_VERSION = 4
#: The version an export with torch.compile's cache entries writes (``export --inductor``).
INDUCTOR_VERSION = 5
#: Versions import reads: 1 (problems only), 2 (problems, then the winners' launch specs), 3
#: (then their binaries, and a signature), 4 (with row signatures) and 5 (then torch.compile's entries).
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: Longest line import accepts (newline included). A problem with 12 configs takes about 4 KiB; the
#: limit leaves room for ~10,000 configs per problem while keeping a hostile file's memory bounded.
#: Export refuses to write a longer line, so every export can be imported.
MAX_LINE_BYTES = 4 << 20
#: Longest torch.compile entry line (version 5): an FX graph of max-autotune bundles its kernels'
#: binaries and passes 4 MiB. Only the lines the header places in the entries' section may be
#: this long; the rest of a file keeps :data:`MAX_LINE_BYTES`.
MAX_INDUCTOR_LINE_BYTES = 64 << 20
MAX_FAILURE_DEPTH = 8
CONFLICT_POLICIES = ("keep", "replace", "faster")
GZIP_LEVEL = 3  # level 6 halves the speed for ~10% smaller files; exports are read and written once
#: Problems per export query, and per progress report of export and validation.
BATCH = 2000

#: ``progress(phase, done, total)``: phase is "export", "validate" or "write"; counts are problems.
Progress = Callable[[str, int, int], None]
Source = str | os.PathLike[str] | IO[bytes]

HEADER_FIELDS_V1 = ("format", "version", "tunecache", "problems", "configs", "body_sha256", "created_at", "filters")
HEADER_FIELDS = (*HEADER_FIELDS_V1, "launch_specs")
HEADER_FIELDS_V3 = (*HEADER_FIELDS, "binaries", "signed_by")
HEADER_FIELDS_V5 = (*HEADER_FIELDS_V3, "inductor_entries")
#: The fields of a torch.compile cache entry line (version 5), in order.
INDUCTOR_FIELDS = ("cache", "key", "target_digest", "target", "sha256", "value", "signature")
#: What a file written before the driver release was recorded may leave out of an entry's target.
INDUCTOR_TARGET_OPTIONAL = frozenset({"driver_release"})
MAX_INDUCTOR_KEY = 4096
#: The fields of a version 3 file's signature object (its last line, when signed).
SIGNATURE_FIELDS = ("algorithm", "key_id", "public_key", "value")
FILTER_FIELDS = ("kernel", "arch", "device", "driver", "since")
#: A config object's fields (plus ``ir_override`` in configs that have one).
CONFIG_OBJECT_FIELDS = ("kwargs", *CONFIG_FIELDS, "pre_hook")


def tunecache_version() -> str:
    """This tunecache's version, as the header's ``tunecache`` field gives it."""
    from tunecache import __version__

    return __version__


def is_stream(x: Any) -> bool:
    """``"-"`` (stdin or stdout) or a file object rather than a path."""
    return x == "-" or hasattr(x, "read") or hasattr(x, "write")


@contextlib.contextmanager
def open_source(src: Source) -> Iterator[tuple[Rewind, bool]]:
    """A rewindable reader over ``src`` and whether it is gzip; stdin and pipes are spooled to disk."""
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
        yield Rewind(f, start), named_gz or magic == b"\x1f\x8b"


def line_limits(max_line: int, first_entry: int, n_entries: int) -> Callable[[int], int]:
    """The longest line import accepts at each line number: ``max_line``, and for the ``n_entries``
    torch.compile entry lines from line ``first_entry`` on, :data:`MAX_INDUCTOR_LINE_BYTES`."""
    wide = max(max_line, MAX_INDUCTOR_LINE_BYTES)
    end = first_entry + n_entries
    return lambda n: wide if first_entry <= n < end else max_line


class Rewind:
    """The file and where the export starts in it (a caller's stream need not be at 0)."""

    def __init__(self, f: IO[bytes], start: int) -> None:
        self.f, self.start = f, start

    def lines(self, gz: bool, max_line: int | Callable[[int], int]) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) for every line, reading at most ``max_line + 1`` bytes per line
        (``max_line`` may be a function of the line number: :func:`line_limits`).

        A line with no newline at the end of the file is a cut-off file (export ends every line
        with one); a longer line is rejected as soon as the limit is passed, so a 2 GB line never
        sits in memory.
        """
        limit = max_line if callable(max_line) else (lambda _n, m=max_line: m)
        self.f.seek(self.start)
        # GzipFile's own small buffer, not a bigger one: a truncated .gz then fails at the line it
        # cuts (or within 8 KiB of it), not a megabyte earlier.
        reader: Any = gzip.GzipFile(fileobj=self.f, mode="rb") if gz else self.f
        lineno = 0
        while True:
            lineno += 1
            most = limit(lineno)
            try:
                line = reader.readline(most + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise ImportFormatError(lineno, f"gzip error: {e} (corrupt or truncated .gz file)") from None
            if not line:
                return
            if len(line) > most:
                raise ImportFormatError(
                    lineno, f"line longer than {most} bytes, the most import accepts: corrupted, or not an export"
                )
            if line[-1:] != b"\n":
                raise ImportFormatError(
                    lineno, "truncated file: the last line has no newline (the file was cut short while copying?)"
                )
            yield lineno, line
