"""Import: an export file into a store, all of it or nothing (the format: :mod:`tunecache.exchange.format`).

Pass 1 (:func:`tunecache.exchange.validate.scan`) validates the whole file; pass 2 re-reads it and
turns each problem line into rows of the store's tables, written through the store's bulk load
(:meth:`tunecache.store.store.Store.bulk_load`) in one transaction.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from operator import itemgetter
from typing import Any

import orjson
from sqlalchemy.engine import Connection

from tunecache.errors import ImportFormatError, InterruptedAfterCommit, StoreReadOnlyError, UntrustedFileError
from tunecache.exchange import validate
from tunecache.exchange.format import (
    CONFLICT_POLICIES,
    MAX_LINE_BYTES,
    Progress,
    Rewind,
    Source,
    line_limits,
    open_source,
)
from tunecache.exchange.validate import Invalid, Scan, check_binary, check_inductor, check_spec
from tunecache.problem.identity import canonical_json
from tunecache.problem.model import CONFIG_COLUMNS, PROBLEM_COLUMNS, PROBLEM_FIELDS, TIMESTAMP_FIELDS
from tunecache.problem.target import TARGET_FIELDS, Target
from tunecache.store import load
from tunecache.store.bulk import BulkWriter
from tunecache.store.store import Store
from tunecache.trust import signing

log = logging.getLogger("tunecache")

WRITE_BATCH = 5000  # config rows per executemany / COPY flush
_SPEC_BATCH_BYTES = 8 << 20  # launch-spec text per batch of inserts (a spec line may be 4 MiB)

# A validated problem line, once _rows has added its columns to it, as a problems row and a config
# row as a configs row: by name, in the tables' order (tunecache.problem.model's row shape).
_PROBLEM_ROW = itemgetter(*PROBLEM_COLUMNS)
_CONFIG_ROW = itemgetter(*CONFIG_COLUMNS)
_PROBLEM_TIMESTAMPS = tuple(c for c in PROBLEM_COLUMNS if c in TIMESTAMP_FIELDS)
if set(TARGET_FIELDS) & set(PROBLEM_FIELDS):  # pragma: no cover - _rows adds the target's fields to a problem's
    raise AssertionError("a target field is also a problem field")


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
    binaries: int = 0  # in the file (version 3)
    binaries_new: int = 0  # of those, not stored before
    inductor_entries: int = 0  # torch.compile cache entries in the file (version 5)
    inductor_new: int = 0  # of those, added
    signed_by: str | None = None  # the key id of the file's (verified) signature
    dry_run: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def in_store(self) -> str:
        """What a committed import put in the store, in the words of the CLI's summary line."""
        return (
            f"{self.problems} problems ({self.configs} config rows): {self.new} new, {self.updated} updated, "
            f"{self.skipped} skipped, {self.conflicts} conflicts are in the store"
        )


def import_(
    store: Store | Callable[[], Store] | None,
    src: Source,
    *,
    dry_run: bool = False,
    on_conflict: str = "keep",
    progress: Progress | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    with_launch_specs: bool = False,
    with_binaries: bool = False,
    trust_unsigned: bool = False,
    with_inductor: bool = False,
) -> ImportSummary:
    """Import an export file (path, ``"-"`` or binary file) into ``store``: all of it, or nothing.

    Every line is validated before anything is written (see the module docstring); a bad file
    raises :class:`ImportFormatError` naming the line and leaves the store as it was.
    ``on_conflict`` handles digests the store already has: ``keep`` (skip), ``replace``, or
    ``faster`` (replace when the incoming winner is faster). ``dry_run`` validates and counts.
    ``with_launch_specs`` also adds the file's launch specs (validated either way): they steer
    which specialisations Triton compiles and loads at the next start, so only for a file trusted
    like the store itself (your own export, e.g. during an image build). ``with_binaries`` also adds
    the file's compiled binaries (and its launch specs): code that every GPU of the fleet will run.
    Both require a file signed by a key of ``TUNECACHE_TRUSTED_KEYS``, else raise
    :class:`UntrustedFileError` before anything is written, unless ``trust_unsigned``; so does any
    import where ``TUNECACHE_TRUSTED_KEYS`` is set. Rows keep their makers' signatures
    (:mod:`tunecache.trust.trust` decides at each start what is placed). ``with_inductor`` also adds the
    file's torch.compile cache entries (version 5): compiled graphs are code, so it needs a signed
    file as ``with_binaries`` does; an entry already stored is kept unless ``on_conflict`` is replace.

    ``store`` may also be a callable that opens (creates) it, called only once the file validated
    and passed the trust check, so that a bad file leaves no new store behind; or, for a dry run,
    None: there is no store yet, and every problem of the file would be new.
    """
    if on_conflict not in CONFLICT_POLICIES:
        raise ValueError(f"on_conflict must be one of {', '.join(CONFLICT_POLICIES)}, not {on_conflict!r}")
    if store is None and not dry_run:
        raise ValueError("import: no store to import into (None is for a dry run)")
    if isinstance(store, Store) and store.readonly and not dry_run:  # say so before minutes of validation
        raise StoreReadOnlyError(f"import: store {store.masked_url} is opened read-only")
    with_launch_specs = with_launch_specs or with_binaries  # a binary is placed for its launch specs
    trusted = None if trust_unsigned else signing.trusted_keys()  # a bad entry: now
    t0 = time.perf_counter()
    with open_source(src) as (reader, gz):
        scan = validate.scan(reader, gz, max_line_bytes, progress)
        log.debug("tunecache: import validated %d lines in %.2fs", scan.lines, time.perf_counter() - t0)
        _check_trust(scan, trusted, with_launch_specs, with_binaries, with_inductor and scan.inductor > 0)
        summary = ImportSummary(
            problems=len(scan.problems),
            configs=scan.configs,
            launch_specs=scan.specs,
            binaries=scan.binaries,
            inductor_entries=scan.inductor,
            signed_by=scan.signed_by,
            dry_run=dry_run,
        )
        if store is not None and not isinstance(store, Store):
            store = store()  # the file is good: now the store may be created
        if store is None:
            summary.new = len(scan.problems)
        elif dry_run:
            with store.snapshot("import (dry run)") as conn:
                _decide(conn, scan, on_conflict, summary)
        else:
            if store.readonly:
                raise StoreReadOnlyError(f"import: store {store.masked_url} is opened read-only")
            writer: BulkWriter | None = None
            try:
                with store.bulk_load("import") as writer:  # it takes its locks before _decide reads
                    _write_all(
                        store,
                        writer,
                        scan,
                        reader,
                        gz,
                        max_line_bytes,
                        on_conflict,
                        summary,
                        progress,
                        with_launch_specs,
                        with_binaries,
                        with_inductor,
                    )
                    t_commit = time.perf_counter()
            except KeyboardInterrupt:
                if writer is not None and writer.committed:  # Ctrl-C as the connection closed: it is in
                    raise InterruptedAfterCommit(f"after the import committed: {summary.in_store()}") from None
                raise
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


def _write_all(
    store: Store,
    writer: BulkWriter,
    scan: Scan,
    reader: Rewind,
    gz: bool,
    max_line_bytes: int,
    on_conflict: str,
    summary: ImportSummary,
    progress: Progress | None,
    with_launch_specs: bool,
    with_binaries: bool,
    with_inductor: bool,
) -> None:
    """Pass 2 inside the load's transaction: decide, then write what was decided."""
    conn = writer.conn
    write, delete = _decide(conn, scan, on_conflict, summary)
    add_specs: Callable[[list[dict[str, Any]]], int] | None = None
    add_bins: Callable[[list[dict[str, Any]]], int] | None = None
    if with_launch_specs and scan.specs:  # additive, whatever the conflict policy
        add_specs = partial(store.add_specs, conn)
    if with_binaries and scan.binaries:
        add_bins = partial(store.add_binaries, conn)
    add_ind: Callable[[list[Any]], int] | None = None
    if with_inductor and scan.inductor:
        add_ind = partial(store.add_inductor, conn, replace=on_conflict == "replace")
    summary.launch_specs_new, summary.binaries_new, summary.inductor_new = _apply(
        conn, writer, reader, gz, max_line_bytes, scan, write, delete, add_specs, add_bins, progress, add_ind
    )


def _check_trust(
    scan: Scan,
    trusted: dict[str, bytes] | None,
    with_launch_specs: bool,
    with_binaries: bool,
    with_graphs: bool = False,
) -> None:
    """Refuse, before anything is written, a file that no trusted key signed when it is to install
    launch specs or binaries, or when ``TUNECACHE_TRUSTED_KEYS`` is set at all (results included: a
    signed file whose signature line was cut off is then refused, not imported as unsigned).
    ``trusted`` None: the caller passed ``trust_unsigned``. The signature itself was verified by the
    scan; trust is decided by the whole public key, never by its id."""
    what = "binaries and launch specs" if with_binaries else "launch specs" if with_launch_specs else "results"
    if with_graphs:  # torch.compile entries: compiled graphs are code, as binaries are
        what = "torch.compile entries" if what == "results" else f"{what} and torch.compile entries"
        with_launch_specs = True
    if trusted is None:
        if scan.signed_by is None and with_launch_specs:
            log.warning("tunecache: importing %s from an unsigned file (--trust-unsigned)", what)
        return
    if not with_launch_specs and not trusted:
        return  # results only, and this host trusts no key: any export file may bring results
    if scan.signed_by is None:
        why = (
            "TUNECACHE_TRUSTED_KEYS is set, so every import needs a file signed by one of its keys"
            if trusted
            else "they steer or are the code every GPU runs"
        )
        raise UntrustedFileError(
            f"refusing to import {what} from an unsigned file: {why}. Sign it (`tunecache export --sign KEY`) and "
            "list the public key in TUNECACHE_TRUSTED_KEYS, or pass --trust-unsigned for a file you trust like your "
            "own store; nothing was imported"
        )
    if scan.signed_key not in trusted.values():
        raise UntrustedFileError(
            f"refusing to import {what}: the file is signed by key {scan.signed_by}, which is not in "
            f"TUNECACHE_TRUSTED_KEYS ({', '.join(sorted(trusted)) or 'empty'}); nothing was imported"
        )


def _decide(conn: Connection, scan: Scan, on_conflict: str, summary: ImportSummary) -> tuple[set[str], list[str]]:
    """Which incoming digests to write and which stored ones to delete first, from what is stored."""
    stored = load.stored_winners(conn, [p[0] for p in scan.problems])
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


def _apply(
    conn: Connection,
    writer: BulkWriter,
    reader: Rewind,
    gz: bool,
    max_line: int,
    scan: Scan,
    write: set[str],
    delete: list[str],
    add_specs: Callable[[list[dict[str, Any]]], int] | None,
    add_bins: Callable[[list[dict[str, Any]]], int] | None,
    progress: Progress | None,
    add_ind: Callable[[list[Any]], int] | None = None,
) -> tuple[int, int, int]:
    """Pass 2, inside the import's transaction: delete what is replaced, insert, drop resolved misses,
    with ``add_specs`` add the launch specs and with ``add_bins`` the binaries. Returns how many
    launch specs and binaries were new, and how many torch.compile entries ``add_ind`` added."""
    load.delete_problems(conn, delete)
    load.drop_misses(conn, write)
    t0 = time.perf_counter()
    specs_new = bins_new = ind_new = 0
    if write or add_specs is not None or add_ind is not None:
        writer.prepare(sum(n for digest, _, _, n in scan.problems if digest in write))
        sha = hashlib.sha256()

        def put(
            p_rows: list[tuple[Any, ...]],
            c_rows: list[tuple[Any, ...]],
            s_rows: list[dict[str, Any]],
            b_rows: list[dict[str, Any]],
            i_rows: list[Any],
        ) -> None:
            nonlocal specs_new, bins_new, ind_new
            writer.write(p_rows, c_rows)
            if i_rows and add_ind is not None:
                ind_new += add_ind(i_rows)
            if s_rows and add_specs is not None:
                specs_new += add_specs(s_rows)
            if b_rows and add_bins is not None:
                bins_new += add_bins(b_rows)

        n = len(scan.problems)
        pairs = scan.pairs if add_specs is not None else None
        refs = scan.refs if add_bins is not None else None
        with _Pipeline(put, threaded=writer.threaded) as pipe:
            for done, p_rows, c_rows, s_rows, b_rows, i_rows in _row_batches(
                reader.lines(gz, line_limits(max_line, 2 + n + scan.specs + scan.binaries, scan.inductor)),
                write,
                writer.timestamp,
                sha,
                n,
                pairs,
                scan.specs,
                refs,
                n + scan.specs + scan.binaries + scan.inductor,
                scan.row_signatures,
                scan.inductor,
                add_ind is not None,
            ):
                pipe.put(p_rows, c_rows, s_rows, b_rows, i_rows)
                if progress is not None:
                    progress("write", min(done, n), n)
        if sha.hexdigest() != scan.sha:
            raise ImportFormatError(1, "the file changed while it was being imported; nothing was written")
    t1 = time.perf_counter()
    writer.finish()
    log.debug("tunecache: import wrote rows in %.2fs, finished in %.2fs", t1 - t0, time.perf_counter() - t1)
    return specs_new, bins_new, ind_new


def _row_batches(
    lines: Iterator[tuple[int, bytes]],
    write: set[str],
    ts: Callable[[str | None], Any],
    sha: Any,
    n_problems: int,
    spec_pairs: set[tuple[str, str]] | None,
    n_specs: int = 0,
    bin_refs: set[bytes] | None = None,
    n_body: int | None = None,
    row_signatures: bool = False,
    n_inductor: int = 0,
    with_inductor: bool = False,
) -> Iterator[
    tuple[int, list[tuple[Any, ...]], list[tuple[Any, ...]], list[dict[str, Any]], list[dict[str, Any]], list[Any]]
]:
    """Database rows of the problems to write, in batches; every body line (valid: pass 1) goes into
    ``sha``, the launch-spec lines after the ``n_problems`` problems and the binary lines after the
    ``n_specs`` specs too (a signature line after them, not). With ``spec_pairs`` (the problems'
    kernels and targets) the spec lines become launch_specs rows, and with ``bin_refs`` (the specs'
    kernel hashes) the binary lines binaries rows, in batches of at most ``_SPEC_BATCH_BYTES`` of
    line text: memory stays a few lines whatever the file holds. The last ``n_inductor`` body lines
    are torch.compile entries, which become :class:`~tunecache.problem.model.InductorEntry` with ``with_inductor``.

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
    b_rows: list[dict[str, Any]] = []
    i_rows: list[Any] = []
    s_bytes = 0
    done = 0
    if n_body is None:
        n_body = n_problems + n_specs
    n_spec_end = n_problems + n_specs
    n_bin_end = n_body - n_inductor
    for lineno, line in lines:
        done += 1
        if done > n_body:
            continue  # the signature line of a signed file: not part of the body
        sha.update(line)
        try:
            if done > n_problems:
                if done > n_bin_end:
                    if not with_inductor:
                        continue
                    i_rows.append(check_inductor(loads(line), None))
                elif done > n_spec_end:
                    if bin_refs is None:
                        continue
                    b_rows.append(check_binary(loads(line), bin_refs, None, row_signatures))
                else:
                    if spec_pairs is None:
                        continue
                    s_rows.append(check_spec(loads(line), spec_pairs, None, row_signatures))
                s_bytes += len(line)
                if s_bytes >= _SPEC_BATCH_BYTES or len(s_rows) + len(b_rows) + len(i_rows) >= WRITE_BATCH:
                    yield done, p_rows, c_rows, s_rows, b_rows, i_rows
                    p_rows, c_rows, s_rows, b_rows, i_rows, s_bytes = [], [], [], [], [], 0
                continue
            if not write:
                continue
            obj = loads(line)
            digest = obj["digest"]
            if digest not in write:
                continue
            p_row, c_row = _rows(obj, digest, ts, targets, canon)
        except (ValueError, KeyError, TypeError, AttributeError, Invalid):  # valid in pass 1: rewritten since
            raise ImportFormatError(
                lineno, "the file changed while it was being imported; nothing was written"
            ) from None
        p_rows.append(p_row)
        c_rows.extend(c_row)
        if len(c_rows) >= WRITE_BATCH or len(p_rows) >= WRITE_BATCH:
            yield done, p_rows, c_rows, s_rows, b_rows, i_rows
            p_rows, c_rows, s_rows, b_rows, i_rows, s_bytes = [], [], [], [], [], 0
    if p_rows or s_rows or b_rows or i_rows:
        yield done, p_rows, c_rows, s_rows, b_rows, i_rows


def _rows(
    obj: dict[str, Any],
    digest: str,
    ts: Callable[[str | None], Any],
    targets: dict[tuple[Any, ...], str],
    canon: dict[str, str],
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """One problem line (validated) as a problems row and its configs rows, in the tables' column order.

    The line's dicts get the columns that are not fields (the target's, the JSON texts) and are read
    by name with itemgetters: as fast as tuples written out by hand, 1.2M rows per 100k problems.
    """
    t = obj["target"]
    tkey = tuple(t[f] for f in TARGET_FIELDS)
    tdigest = targets.get(tkey)
    if tdigest is None:
        tdigest = targets[tkey] = Target(**t).digest
    obj.update(t)
    obj["target_digest"] = tdigest
    obj["key_json"] = canonical_json(obj["key"])
    for f in _PROBLEM_TIMESTAMPS:
        obj[f] = ts(obj[f])
    dumps, sort, row_of = orjson.dumps, orjson.OPT_SORT_KEYS, _CONFIG_ROW
    c_rows = []
    for r in obj["configs"]:
        h = r["config_hash"]  # pass 1 checked it is the hash of this config
        cjs = canon.get(h)
        if cjs is None:
            cjs = dumps(r["config"], option=sort).decode()
            if len(canon) < 100_000:
                canon[h] = cjs
        f = r["failure"]
        if f is not None:
            r["failure"] = dumps(f, option=sort).decode()
        r["digest"], r["config_json"], r["measured_at"] = digest, cjs, ts(r["measured_at"])
        c_rows.append(row_of(r))
    return _PROBLEM_ROW(obj), c_rows


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
