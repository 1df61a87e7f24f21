"""Bulk loading: many problems and config rows into the store in one transaction, the fastest way
each database takes them (an import of 100k problems, 1.2M config rows).

Reached through :meth:`tunecache.store.store.Store.bulk_load`, which opens the write transaction and
hands over a :class:`BulkWriter`. Rows are tuples in the order of
:data:`tunecache.problem.model.PROBLEM_COLUMNS` and :data:`tunecache.problem.model.CONFIG_COLUMNS`, the tables'
own order; timestamps are passed through :attr:`BulkWriter.timestamp` (ISO 8601 text in, what the
driver takes out) so that the common case is never parsed. Timing: docs/benchmarks/store.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.errors import driver_message
from tunecache.problem.model import CONFIG_COLUMNS, PROBLEM_COLUMNS, parse_timestamp

log = logging.getLogger("tunecache")

#: Config rows from which a PostgreSQL load into an empty store re-validates the foreign key once.
PG_FK_REBUILD_MIN = 50_000


def bulk_writer(conn: Connection, dialect: str) -> BulkWriter:
    """The writer for this database, on the caller's write transaction; it takes its locks now."""
    if dialect == "postgresql":
        return PgBulkWriter(conn)
    return BulkWriter(conn, dialect)


# ``YYYY-MM-DDTHH:MM:SS[.ffffff]`` with no offset: what export writes, passed on without parsing.
_PLAIN_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?", re.ASCII)


def _ts_sqlite(v: str | None) -> str | None:
    """SQLAlchemy's SQLite storage format: ``YYYY-MM-DD HH:MM:SS.ffffff``, compared as text by filters."""
    if v is None:
        return None
    if _PLAIN_TS.fullmatch(v):
        return f"{v[:10]} {v[11:]}" if len(v) == 26 else f"{v[:10]} {v[11:]}.000000"
    return parse_timestamp(v).isoformat(" ", "microseconds")  # type: ignore[union-attr]


def _ts_postgresql(v: str | None) -> str | dt.datetime | None:
    """PostgreSQL parses ISO 8601 itself; an offset must be applied here (a timestamp column drops it)."""
    if v is None or _PLAIN_TS.fullmatch(v):
        return v
    return parse_timestamp(v)


class BulkWriter:
    """executemany through the driver, skipping SQLAlchemy's per-row parameter processing.

    On SQLite the load holds the write lock (BEGIN IMMEDIATE) and has checked which digests
    exist inside it, so plain INSERTs cannot collide. For the load's connection only, SQLite
    gets a 128 MiB page cache (the default 2 MiB spills the growing indexes to the WAL again and
    again) and skips the ``status IN (...)`` CHECK, which the caller must have enforced on every
    row (import's pass 1 does); both are restored by :meth:`close`. Together they halve SQLite's
    time for 1.2M rows. MySQL uses INSERT IGNORE: a row a concurrent writer stored meanwhile wins.
    """

    #: Whether :meth:`write` may run in a thread of its own while the caller builds the next batch.
    threaded = False
    #: Set once the load's transaction committed (by :meth:`Store.bulk_load`): a Ctrl-C after it
    #: interrupted nothing that was undone.
    committed = False

    def __init__(self, conn: Connection, dialect: str) -> None:
        self.conn = conn
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        verb = "INSERT IGNORE" if dialect in ("mysql", "mariadb") else "INSERT"
        p_cols, c_cols = PROBLEM_COLUMNS, CONFIG_COLUMNS
        self.p_sql = f"{verb} INTO problems ({', '.join(p_cols)}) VALUES ({', '.join([mark] * len(p_cols))})"
        self.c_sql = f"{verb} INTO configs ({', '.join(c_cols)}) VALUES ({', '.join([mark] * len(c_cols))})"
        #: ISO 8601 text (or None) -> the value this driver takes for a timestamp column.
        self.timestamp: Callable[[str | None], Any] = _ts_sqlite if dialect == "sqlite" else parse_timestamp
        self.restore: list[str] = []
        if dialect == "sqlite":
            for pragma, value in (("cache_size", -(128 << 10)), ("ignore_check_constraints", 1)):
                before = conn.exec_driver_sql(f"PRAGMA {pragma}").scalar()
                self.restore.append(f"PRAGMA {pragma}={int(before)}")
                conn.exec_driver_sql(f"PRAGMA {pragma}={value}")

    def prepare(self, n_configs: int) -> None:
        """Called once before the first write with the number of config rows to come."""

    def write(self, p_rows: list[tuple[Any, ...]], c_rows: list[tuple[Any, ...]]) -> None:
        """Insert problems rows, then configs rows (of those problems or of earlier batches)."""
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


class PgBulkWriter(BulkWriter):
    """PostgreSQL: COPY, several times faster than multi-row INSERTs, from a second thread.

    ``LOCK TABLE problems IN SHARE ROW EXCLUSIVE MODE`` first: concurrent writers wait (readers do
    not), so the digests found stored are exactly those stored, and COPY cannot hit a duplicate.
    PostgreSQL checks a foreign key with one query per inserted row, 13 s of 22 s for 1.2M config
    rows; a large load (>= :data:`PG_FK_REBUILD_MIN` rows) into an EMPTY store therefore drops
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
        if n_configs < PG_FK_REBUILD_MIN:
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
            log.info("tunecache: import keeps per-row foreign key checks (%s)", driver_message(e))
            return
        self.fks = [(quote(name), definition) for name, definition in fks]

    def write(self, p_rows: list[tuple[Any, ...]], c_rows: list[tuple[Any, ...]]) -> None:
        with self.raw.cursor() as cur:
            for table, cols, rows in (("problems", PROBLEM_COLUMNS, p_rows), ("configs", CONFIG_COLUMNS, c_rows)):
                if rows:
                    with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                        for row in rows:
                            copy.write_row(row)

    def finish(self) -> None:
        for name, definition in self.fks:
            self.conn.exec_driver_sql(f"ALTER TABLE configs ADD CONSTRAINT {name} {definition}")
