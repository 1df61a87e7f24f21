"""The export's reading queries: problems with their configs in key order, launch specs, binaries.

Kept in the store layer (the only one that writes SQL) so that :mod:`tunecache.exchange.export`
keeps only the file format. Every function reads on the export's Connection (one snapshot) and
yields plain rows in key order, in batches, so that an export of millions of rows holds one batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from tunecache.problem.model import LAUNCH_SPEC_COLUMNS, TIMESTAMP_FIELDS
from tunecache.store.filters import filter_clauses
from tunecache.store.schema import binaries, configs, inductor_entries, launch_specs, problems
from tunecache.store.signers import not_larger

#: Binaries read per query (each up to 2.5 MiB).
BINARY_CHUNK = 50
#: torch.compile entries read per query (an FX graph may be megabytes), and their bytes at most;
#: their keys and sizes are read this many at a time first.
INDUCTOR_CHUNK = 50
INDUCTOR_CHUNK_BYTES = 8 << 20
INDUCTOR_HEADS = 1000


def _select_cols(table: sa.Table, names: Sequence[str], raw_timestamps: bool) -> list[Any]:
    """Columns to export; with ``raw_timestamps`` (SQLite) the timestamps come as stored text."""
    cols = [table.c[n] for n in names]
    if raw_timestamps:
        cols = [sa.type_coerce(c, sa.String).label(c.name) if c.name in TIMESTAMP_FIELDS else c for c in cols]
    return cols


def count_problems(conn: Connection, **filters: Any) -> int:
    """How many problems the filters select."""
    return conn.execute(sa.select(sa.func.count()).select_from(problems).where(*filter_clauses(**filters))).scalar_one()


def problem_batches(
    conn: Connection,
    problem_cols: Sequence[str],
    config_cols: Sequence[str],
    raw_timestamps: bool,
    batch: int,
    **filters: Any,
) -> Iterator[tuple[list[Row], list[Row]]]:
    """``(problem rows, their config rows)`` of the selected problems, ``batch`` problems at a time,
    by digest (configs by digest, config hash); ``problem_cols``/``config_cols`` name the columns, in
    order, and must include ``digest``.

    Keyset pagination (digest > last) over the primary keys: no per-problem query, no server-side
    cursor, and every batch is one indexed range (or IN list when filtered).
    """
    where = filter_clauses(**filters)
    p_select = _select_cols(problems, problem_cols, raw_timestamps)
    c_select = _select_cols(configs, config_cols, raw_timestamps)
    p_digest = list(problem_cols).index("digest")
    last = ""
    while True:
        prows = conn.execute(
            sa.select(*p_select).where(*where, problems.c.digest > last).order_by(problems.c.digest).limit(batch)
        ).all()
        if not prows:
            return
        first, last = prows[0][p_digest], prows[-1][p_digest]
        # Unfiltered, every digest in [first, last] is in this batch: one range scan. Filtered, a
        # batch may be spread over the whole key space: an IN list.
        cond = configs.c.digest.in_([r[p_digest] for r in prows]) if where else configs.c.digest.between(first, last)
        crows = conn.execute(sa.select(*c_select).where(cond).order_by(configs.c.digest, configs.c.config_hash)).all()
        yield prows, crows


def launch_spec_rows(conn: Connection, **filters: Any) -> Iterator[Row]:
    """The launch specs (``LAUNCH_SPEC_COLUMNS`` and the signature) of every (kernel source, target)
    that has a selected problem, in key order."""
    s = launch_specs.c
    of_exported = sa.exists().where(
        problems.c.source_hash == s.source_hash, problems.c.target_digest == s.target_digest, *filter_clauses(**filters)
    )
    q = sa.select(*(s[c] for c in LAUNCH_SPEC_COLUMNS), s.signature).where(of_exported)
    q = q.where(not_larger(launch_specs, s.spec_json))
    yield from conn.execute(q.order_by(s.source_hash, s.target_digest, s.spec_hash, s.created_at.desc(), s.signer))


def binary_rows(conn: Connection, triton_keys: Sequence[str], cols: Sequence[str]) -> Iterator[Row]:
    """The stored binaries of ``triton_keys`` (sorted), columns ``cols``, a few at a time."""
    b = binaries.c
    for i in range(0, len(triton_keys), BINARY_CHUNK):
        q = sa.select(*(b[c] for c in cols)).where(b.triton_key.in_(triton_keys[i : i + BINARY_CHUNK]))
        q = q.where(not_larger(binaries, b.metadata, b.binary))
        yield from conn.execute(q.order_by(b.triton_key, b.created_at.desc(), b.signer))


def inductor_rows(conn: Connection) -> Iterator[Any]:
    """Every torch.compile cache entry (tunecache.inductor), in (kind, key hash, target) order, read
    in pages: the keys and sizes of :data:`INDUCTOR_HEADS` entries, then their rows a few at a time
    (:data:`INDUCTOR_CHUNK`, :data:`INDUCTOR_CHUNK_BYTES`), each a range of the primary key. One query
    for them all held every entry in memory on PostgreSQL, whose driver fetches a whole result."""
    e = inductor_entries.c
    order = (e.kind, e.key_hash, e.target_digest, e.signer)  # several signers' rows of one entry
    after: list[Any] = []
    while True:
        # Sized by the database (the size column is anyone's to write); none larger than a row of code.
        small = not_larger(inductor_entries, e.value)
        q = sa.select(*order, sa.func.length(e.value)).where(*after, small).order_by(*order).limit(INDUCTOR_HEADS)
        heads = conn.execute(q).all()
        if not heads:
            return
        for first, last in _inductor_chunks(heads):
            span = (sa.tuple_(*order) >= sa.tuple_(*first), sa.tuple_(*order) <= sa.tuple_(*last))
            yield from conn.execute(sa.select(inductor_entries).where(*span, small).order_by(*order)).mappings()
        after = [sa.tuple_(*order) > sa.tuple_(*heads[-1][:4])]


def _inductor_chunks(heads: Sequence[Row]) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """(first key, last key) of consecutive runs of ``heads`` (key and size, in key order) of at most
    :data:`INDUCTOR_CHUNK` entries and :data:`INDUCTOR_CHUNK_BYTES` (one entry when it is larger)."""
    start, n, size = 0, 0, 0
    for i, h in enumerate(heads):
        if n and (n == INDUCTOR_CHUNK or size + h[4] > INDUCTOR_CHUNK_BYTES):
            yield tuple(heads[start][:4]), tuple(heads[i - 1][:4])
            start, n, size = i, 0, 0
        n += 1
        size += h[4]
    yield tuple(heads[start][:4]), tuple(heads[-1][:4])
