"""Opening a store: connecting to a URL, creating and migrating it on first use, and the one shared
:class:`~tunecache.store.store.Store` per URL per process that the autotuner uses.

Kept apart from :mod:`tunecache.store.store` (what a store does) because deciding how to open one (a
read-only file, a reader role, a store that must already exist, whether to migrate) and keeping it
for the life of the process, across ``fork()``, is another job than querying it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from sqlalchemy.engine import URL

from tunecache import settings
from tunecache.errors import StoreError, StoreNotFoundError
from tunecache.process import forks
from tunecache.store import breaker
from tunecache.store.engine import make_engine, mask_url, resolve_url, sqlite_path, sqlite_writable
from tunecache.store.migrate import check_schema
from tunecache.store.sqlitefile import missing_log_hint
from tunecache.store.store import Store

_SQLITE_MAGIC = b"SQLite format 3\x00"  # the first bytes of every SQLite database file

_stores: dict[tuple[str, int], Store] = {}
_stores_lock = threading.Lock()


def connect(url: str | URL | None = None, *, readonly: bool | None = None, create: bool = True) -> Store:
    """A Store on ``url`` without touching the schema (``tunecache db`` uses this).

    ``readonly=None`` detects a read-only SQLite file or directory. ``create=False`` raises
    :class:`StoreNotFoundError` for a SQLite file that does not exist instead of creating it (and
    its directory), so that looking at a mistyped path leaves nothing behind.
    """
    u = resolve_url(url)
    try:
        if not create and u.get_backend_name() == "sqlite":
            path = sqlite_path(u)
            if path is not None:
                _check_sqlite_file(path)
        if readonly is None:
            readonly = False
            if u.get_backend_name() == "sqlite":
                path = sqlite_path(u)
                readonly = path is not None and not sqlite_writable(path)
                if readonly and path is not None and not path.exists():
                    raise StoreError(f"store {mask_url(u)} does not exist and its directory is not writable")
        return Store(u, make_engine(u, readonly), readonly)
    except OSError as e:  # e.g. a directory on the way that this user cannot enter
        raise StoreError(f"cannot open store {mask_url(u)}: {e.strerror or e}") from None


def check_directory(url: str | URL | None = None) -> None:
    """Raise :class:`StoreError` where ``url`` is a SQLite file whose directory does not exist: a
    command that creates a store there (``import``) then creates no directory (at ``/`` as root)."""
    u = resolve_url(url)
    path = sqlite_path(u) if u.get_backend_name() == "sqlite" else None
    if path is not None and not path.parent.is_dir():
        raise StoreError(
            f"no store at {path} and its directory {path.parent} does not exist; nothing was created: "
            f"create it first (mkdir -p {path.parent}) or check --url or TUNECACHE_URL"
        )


def remove_new_store(store: Store) -> None:
    """Remove a SQLite store this process has just created (its file and what SQLite and the
    migration lock made beside it) after a command that created it failed: it leaves nothing behind.
    Other backends: nothing (a database's tables are not this process's to drop)."""
    store.engine.dispose()
    path = sqlite_path(store.url) if store.dialect == "sqlite" else None
    if path is None:
        return
    store.readonly = True  # a later close() connects no more (to checkpoint), which would make the file again
    for p in (path, *(Path(f"{path}{tail}") for tail in ("-wal", "-shm", "-journal", ".migrate.lock"))):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _check_sqlite_file(path: Path) -> None:
    """Refuse, before SQLite touches it, what is not a store: opening writes a database header into
    an empty file and switches a database to WAL, so a look at the wrong path would change it."""
    if not path.exists():
        raise StoreNotFoundError(
            f"no store at {path}: nothing was stored there yet (a tuned kernel or `tunecache db upgrade` creates it)"
        )
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a tunecache store: point --url or TUNECACHE_URL at a file")
    with open(path, "rb") as f:
        header = f.read(len(_SQLITE_MAGIC))
    if not header:
        raise StoreNotFoundError(
            f"no store at {path}: it is an empty file, not a tunecache store; remove it, or run "
            "`tunecache db upgrade` to make it one"
        )
    if header != _SQLITE_MAGIC:
        raise StoreError(
            f"{path} is not a SQLite database, so not a tunecache store; left unchanged: check --url or TUNECACHE_URL"
        )


def open_store(
    url: str | URL | None = None, *, readonly: bool | None = None, migrate: bool | None = None, create: bool = True
) -> Store:
    """Open (and on first use create and migrate) the store at ``url`` or ``TUNECACHE_URL``.

    ``readonly=None`` detects a read-only SQLite file or directory, and a PostgreSQL login that may
    only SELECT (:meth:`Store.select_only`). ``migrate=None`` follows
    ``TUNECACHE_AUTO_MIGRATE`` (default on). ``create=False`` opens only a store that exists, with
    its schema (else :class:`StoreNotFoundError`): for readers, which must not create one. Raises
    :class:`StoreError` with a message naming the host (never the password) when the database
    cannot be reached.

    >>> import tempfile
    >>> from tunecache import ConfigResult, Problem
    >>> from tunecache.problem.target import Target
    >>> tmp = tempfile.TemporaryDirectory()
    >>> store = open_store(f"sqlite:///{tmp.name}/tunecache.sqlite3")
    >>> store.find_problems()
    []
    >>> cpu = Target("cpu", "interpreter", "CPU", 1, 0, 1, "0", "", "", "3.6")
    >>> rows = [ConfigResult("fast", {"num_warps": 4}, median_ms=0.5), ConfigResult("slow", {}, median_ms=0.9)]
    >>> store.put(Problem("d1", "mod.kern", "src1", cpu, '[["N",1024]]'), rows).winner_config_hash
    'fast'
    >>> [p.digest for p in store.find_problems(kernel="mod.kern")]
    ['d1']
    >>> store.close(); tmp.cleanup()
    """
    if migrate is None:
        migrate = settings.get("TUNECACHE_AUTO_MIGRATE")
    store = connect(url, readonly=readonly, create=create)
    try:
        if readonly is None and store.dialect == "postgresql" and store.select_only():
            store.readonly = True  # a reader role (tunecache db grant --reader): never attempt a write
        if not create and store.revision() is None:
            path = sqlite_path(store.url) if store.dialect == "sqlite" else None
            hint = missing_log_hint(path) if path is not None and store.readonly else ""
            raise StoreNotFoundError(
                f"no store at {store.masked_url}: it has no tunecache schema"
                + (hint or "; run `tunecache db upgrade` to create one")
            )
        check_schema(store, migrate=migrate)
    except BaseException:
        store.engine.dispose()
        raise
    return store


def shared_store(url: str | URL | None = None) -> Store:
    """One Store per URL per process (the autotuner's), opened lazily. While the server's breaker
    is open (it did not answer a moment ago), raises StoreOfflineError at once: a library's
    hundreds of kernels each ask, and none builds an engine for a server known not to answer."""
    u = resolve_url(url)
    key = (str(u), os.getpid())  # never share pooled connections across fork()
    with _stores_lock:
        s = _stores.get(key)
        if s is None:
            breaker.check(u)
            s = _stores[key] = open_store(url)
        return s


def reset_shared_stores() -> None:
    """Close and forget the shared stores: a test starts from none."""
    with _stores_lock:
        for s in _stores.values():
            with contextlib.suppress(Exception):
                s.engine.dispose()
        _stores.clear()


def _after_fork_in_child() -> None:
    """A forked child starts with a fresh lock and none of its parent's shared stores.

    A lock that a parent's thread held at the fork (the background prefetch opening a store holds
    ``_stores_lock`` for up to the connect timeout) stays taken forever in the child, whose copy of
    that thread does not exist. The parent's shared stores are forgotten: the child opens its own
    (their pooled connections were set aside by :mod:`tunecache.store.store`'s fork handler).
    """
    global _stores_lock
    _stores_lock = threading.Lock()
    _stores.clear()


forks.register(__name__, _after_fork_in_child)
