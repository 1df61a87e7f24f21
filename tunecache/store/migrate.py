"""Bringing a store's schema to head: the Alembic revisions of ``migrations/``, run on tunecache's own
connection.

Kept apart from :mod:`tunecache.store.store` (queries and writes) because migrating is a different job with
its own hazards: two threads, processes or hosts may open one fresh store at once, and only the first
may migrate; a store migrated by a newer tunecache must be refused and left alone, never downgraded.
The revision is read with plain SQL from the table Alembic keeps, so reading it costs no Alembic import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.errors import SchemaError
from tunecache.process import forks
from tunecache.store.engine import sqlite_path
from tunecache.store.schema import SCHEMA_HEAD, SCHEMA_REVISIONS
from tunecache.store.sqlitefile import missing_log_hint


class Migratable(Protocol):
    """What migrating needs of a store (a :class:`tunecache.store.store.Store`): named here, so that this
    module, which the store calls, does not import the store back."""

    url: Any
    engine: Any
    dialect: str
    readonly: bool

    @property
    def masked_url(self) -> str: ...

    def revision(self) -> str | None: ...

    def upgrade(self, revision: str = "head") -> Any: ...


log = logging.getLogger("tunecache")


def alembic_config(conn: Connection | None = None) -> Any:
    from importlib.resources import files

    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(files("tunecache.migrations")))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    return SCHEMA_HEAD


def known_revisions() -> set[str]:
    return set(SCHEMA_REVISIONS)


def current_revision(conn: Connection) -> str | None:
    """The stamped revision, read with plain SQL (the table Alembic keeps)."""
    insp = sa.inspect(conn)
    if not insp.has_table("alembic_version"):
        return None
    rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    if len(rows) > 1:
        raise SchemaError(f"the store has {len(rows)} schema heads {rows}; it was migrated by another tool")
    return rows[0] if rows else None


def check_schema(store: Migratable, migrate: bool) -> None:
    """Migrate to head if allowed, refuse a schema newer than this code, never downgrade."""
    head = head_revision()
    current = store.revision()
    if current == head:
        return
    if current is not None and current not in known_revisions():
        raise SchemaError(
            f"store {store.masked_url} has schema revision {current}, newer than this tunecache "
            f"(head {head}); upgrade tunecache. The store was not changed."
        )
    if not migrate or store.readonly:
        if current is None and store.readonly:
            path = sqlite_path(store.url) if store.dialect == "sqlite" else None
            hint = missing_log_hint(path) if path is not None else ""
            raise SchemaError(f"store {store.masked_url} is read-only and has no tunecache schema{hint}")
        if store.readonly:
            raise SchemaError(
                f"read-only store {store.masked_url} is at revision {current}; head is "
                f"{head}. Run `tunecache db upgrade` where it is writable."
            )
        raise SchemaError(
            f"store {store.masked_url} is at revision {current}, head is {head}: run `tunecache db upgrade`"
        )
    store.upgrade()


def check_target(revision: str) -> None:
    """Refuse a revision this tunecache does not have before anything is locked or touched."""
    if revision != "head" and revision not in known_revisions():
        raise SchemaError(f"unknown schema revision {revision!r}; this tunecache has {', '.join(SCHEMA_REVISIONS)}")


_alembic_lock = threading.Lock()


@contextlib.contextmanager
def in_process_lock() -> Iterator[None]:
    """One migration at a time in this process: Alembic's ``context`` and ``op`` are process globals,
    so two threads migrating (even different stores) run each other's DDL on each other's connections."""
    with _alembic_lock:
        yield


@contextlib.contextmanager
def cross_process_lock(store: Migratable) -> Iterator[None]:
    """One migration at a time per store across processes: a file lock beside a SQLite file (none
    where its directory is not writable, so none could migrate),
    ``GET_LOCK`` on MySQL/MariaDB; PostgreSQL's advisory lock is taken by :func:`apply`, inside
    the migration transaction.

    The SQLite lock file lives only while a migration runs: its holder removes it before letting go,
    so no store keeps an empty ``.migrate.lock`` beside it. A process that was waiting on the removed
    file, and one that makes a new file meanwhile, may then both go on: harmless, as each migrates
    in a ``BEGIN IMMEDIATE`` transaction (SQLite's write lock) that reads the revision again first
    (:func:`apply`), so the second finds the store migrated. The file lock only spares waiters
    SQLite's busy timeout during a long migration."""
    if store.dialect == "sqlite":
        path = sqlite_path(store.url)
        if path is not None and not os.access(path.parent, os.W_OK):
            # No lock file can be made here, and no migration either: SQLite's own error says why.
            yield
            return
        if path is not None:
            from filelock import FileLock

            lock_path = str(path) + ".migrate.lock"
            with FileLock(lock_path, timeout=120):
                try:
                    yield
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(lock_path)
            return
    if store.dialect in ("mysql", "mariadb"):
        with store.engine.connect() as c:
            c.exec_driver_sql("SELECT GET_LOCK('tunecache_migrate', 120)")
            try:
                yield
            finally:
                c.exec_driver_sql("SELECT RELEASE_LOCK('tunecache_migrate')")
        return
    yield  # PostgreSQL: pg_advisory_xact_lock inside the migration transaction


def apply(store: Migratable, conn: Connection, revision: str) -> None:
    """Run the migrations to ``revision`` in the write transaction ``conn``, under the locks above;
    a store another process already brought to head is left as it is."""
    from alembic import command

    if store.dialect == "postgresql":
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7283105331)")
    before = current_revision(conn)
    if before == head_revision() and revision == "head":
        return
    if before is not None and before not in known_revisions():
        raise SchemaError(
            f"store {store.masked_url} has schema revision {before}, newer than this tunecache; refusing to touch it"
        )
    command.upgrade(alembic_config(conn), revision)
    log.info("tunecache: migrated %s from %s to %s", store.masked_url, before, revision)


def _after_fork_in_child() -> None:
    """A lock that a parent's thread held at the fork (a migration in flight) stays taken forever in
    the child, whose copy of that thread does not exist: the child starts with a fresh one."""
    global _alembic_lock
    _alembic_lock = threading.Lock()


forks.register(__name__, _after_fork_in_child)
