"""Engine: store URLs (defaults, parsing, masking) and the SQLAlchemy engine for each backend.

SQLite settings, set explicitly on every connection (see also docs/images.md):

=================  ===========  ==================================================================
pragma             value        why
=================  ===========  ==================================================================
journal_mode       WAL          readers never block the one writer, so 16 workers can read while
                                one writes a benchmark result
busy_timeout       30000 ms     a writer waits for the lock instead of failing
                                (``TUNECACHE_SQLITE_BUSY_MS``)
synchronous        NORMAL       durable at every checkpoint; a power cut can lose the last commits,
                                never corrupt the file. Results can be re-measured, so the fsync per
                                commit of FULL is not worth its cost
foreign_keys       ON           config rows go with their problem
write transactions BEGIN        takes the write lock up front: a deferred transaction that reads
                   IMMEDIATE    then writes can fail with SQLITE_BUSY without waiting
=================  ===========  ==================================================================

Driver errors become :class:`~tunecache.errors.StoreError` with the install hint that exists.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from tunecache import settings
from tunecache.errors import StoreError, StoreNotFoundError, StoreReadOnlyError, driver_message
from tunecache.store.sqlitefile import readonly_connect

# --------------------------------------------------------------------------------------------
# URLs and errors
# --------------------------------------------------------------------------------------------


def default_url() -> str:
    import platformdirs

    path = Path(platformdirs.user_cache_dir("tunecache")) / "tunecache.sqlite3"
    return f"sqlite:///{path}"


def resolve_url(url: str | URL | None = None) -> URL:
    """The SQLAlchemy URL to use: argument, then ``TUNECACHE_URL``, then the per-user SQLite file.

    ``postgresql://`` and ``mysql://`` without a driver pick psycopg 3 and PyMySQL, the drivers the
    extras install.
    """
    raw = url if url is not None else (settings.get("TUNECACHE_URL") or default_url())
    try:
        u = raw if isinstance(raw, URL) else _parse_url(str(raw))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreError(
            f"malformed store URL {mask_raw(str(raw))!r}: expected e.g. sqlite:////path/tunecache.sqlite3 "
            "or postgresql://user@host/db"
        ) from None
    drivers = {
        "postgresql": "postgresql+psycopg",
        "postgres": "postgresql+psycopg",
        "mysql": "mysql+pymysql",
        "mariadb": "mariadb+pymysql",
    }
    if u.drivername in drivers:
        u = u.set(drivername=drivers[u.drivername])
    return u


# ``scheme://user:password@host...`` where the password holds a raw '@': RFC 3986 forbids it, yet
# generated passwords have one often enough, and SQLAlchemy (like libpq) then ends the password at
# the FIRST '@' and takes the rest of it for the host, which every message would print. The
# userinfo ends at the LAST '@' instead (a raw '@' in a path or query after a password must then
# be written %40).
_PASSWORD_WITH_AT = re.compile(r"(?P<head>[\w+.-]+://)(?P<user>[^:/@\s]*):(?P<pw>.*@.*)@(?P<rest>[^@]*)", re.S)


def _parse_url(raw: str) -> URL:
    m = _PASSWORD_WITH_AT.fullmatch(raw)
    if m is None:
        return make_url(raw)
    return make_url(m["head"] + m["user"] + "@" + m["rest"]).set(password=unquote(m["pw"]))


def mask_url(u: URL | str) -> str:
    """The URL to print: the password (however spelled) replaced by ``***``."""
    if isinstance(u, str):
        try:
            u = _parse_url(u)
        except (ArgumentError, ValueError):
            return mask_raw(u)
    return mask_raw(u.render_as_string(hide_password=True))


def mask_raw(text: str) -> str:
    """Hide ``user:password@`` in any URL-looking text; the userinfo ends at the LAST '@' of the
    URL (a password may hold '@', ':', '/', '?' or '#'), so at worst more than the password is hidden."""
    return re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", text)


def scrub(text: str, u: URL) -> str:
    """``text`` (a driver's message) with the store's password hidden, as given or URL-encoded."""
    text = mask_raw(text)
    if u.password:
        pw = str(u.password)
        for spelling in sorted({pw, quote(pw, safe=""), quote(pw)}, key=len, reverse=True):
            text = text.replace(spelling, "***")
    return text


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------


def sqlite_path(u: URL) -> Path | None:
    db = u.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def sqlite_writable(path: Path) -> bool:
    """Whether this process may write the store file ``path`` (and its directory, where SQLite
    writes its WAL): by permission, and by mode. A file with no write bit (444) or a directory with
    none (555) is read-only whoever runs it: root may write anything, yet an image that marks its
    store read-only means it for the root user of most containers too."""
    parent = path.parent
    if path.exists():
        return _writable(path) and _writable(parent)
    probe = parent
    while not probe.exists():
        probe = probe.parent
    return _writable(probe)


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def sqlite_os_cause(u: URL, reason: str) -> str:
    """The cause SQLite does not name: "unable to open database file" and "disk I/O error" say
    nothing of a missing permission or a full disk. Returns " (...)" or ""."""
    path = sqlite_path(u)
    if path is None or not any(s in reason for s in ("unable to open", "disk I/O error", "disk is full")):
        return ""
    causes = []
    try:
        path.stat()
        if not os.access(path, os.R_OK):
            causes.append(f"permission denied: uid {os.geteuid()} cannot read {path}")
    except PermissionError:
        causes.append(f"permission denied: uid {os.geteuid()} cannot enter {path.parent}")
    except OSError:
        pass
    try:
        st = os.statvfs(path.parent)
        if st.f_bavail * st.f_frsize < 64 * 1024:
            causes.append(f"no space left on the device of {path.parent}: {st.f_bavail * st.f_frsize} bytes free")
    except OSError:
        pass
    return f" ({'; '.join(causes)})" if causes else ""


def make_engine(u: URL, readonly: bool) -> Engine:
    if u.get_backend_name() == "sqlite":
        path = sqlite_path(u)
        busy_ms = settings.get("TUNECACHE_SQLITE_BUSY_MS")
        if readonly and path is not None:
            engine = sa.create_engine(
                "sqlite://",
                creator=lambda: readonly_connect(path),  # its rows in the log too (sqlitefile)
                poolclass=sa.pool.StaticPool,
            )
        else:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(u, connect_args={"check_same_thread": False, "timeout": busy_ms / 1000})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            if not readonly:
                _set_wal(cur, busy_ms)
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Writes take the write lock up front; reads run in autocommit (one statement each),
            # except a snapshot (Store.snapshot): a deferred BEGIN, whose first read fixes what
            # every later statement sees (WAL keeps it while writers commit).
            opts = conn.get_execution_options()
            if opts.get("tunecache_write"):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif opts.get("tunecache_snapshot"):
                conn.exec_driver_sql("BEGIN")

        return engine
    connect_args: dict[str, Any] = {}
    timeout = settings.get("TUNECACHE_CONNECT_TIMEOUT")
    backend = u.get_backend_name()
    if backend == "postgresql":
        connect_args["connect_timeout"] = timeout
        connect_args["application_name"] = "tunecache"
        if u.get_driver_name() == "psycopg":
            # No server-side prepared statements: psycopg prepares a query after 5 runs on a
            # connection, and behind a transaction pooler (PgBouncer before 1.21) the next
            # transaction may run on a server connection where it does not exist. A store
            # runs few queries per connection, so preparing saves nothing worth that.
            connect_args["prepare_threshold"] = None
    elif backend in ("mysql", "mariadb"):
        connect_args["connect_timeout"] = timeout
    # Connections kept between operations. 0 (the default): none; each operation connects and
    # closes, so a worker holds no server connection once its start is done nor across a
    # benchmark, and a fleet costs connections only while it queries (see docs/scaling.md).
    pool_size = settings.get("TUNECACHE_POOL_SIZE")
    pool: dict[str, Any] = (
        {"poolclass": sa.pool.NullPool}
        if pool_size == 0
        else {"pool_size": pool_size, "max_overflow": 4, "pool_pre_ping": True}
    )
    try:
        return sa.create_engine(u, connect_args=connect_args, **pool)
    except (NoSuchModuleError, ModuleNotFoundError) as e:
        raise _driver_error(u, e) from None


def store_error(what: str, e: Exception, u: URL) -> StoreError:
    """A driver error of ``what`` on the store at ``u`` as a StoreError: the host named, the password
    hidden, and the typed error a caller can act on (a missing database, a read-only store)."""
    reason = scrub(driver_message(e), u)
    if u.get_backend_name() == "sqlite":
        reason += sqlite_os_cause(u, reason)
    missing = re.search(r"database \"([^\"]+)\" does not exist|Unknown database '([^']+)'", reason)
    if missing:
        name = missing.group(1) or missing.group(2)
        return StoreNotFoundError(
            f"{what} failed: database {name!r} does not exist on {u.host or 'localhost'} "
            f"({mask_url(u)}): create it (CREATE DATABASE {name}), then run `tunecache db upgrade`"
        )
    if "readonly database" in reason or "read-only" in reason:
        return StoreReadOnlyError(f"{what} failed: store {mask_url(u)} is read-only ({reason})")
    if isinstance(e, DBAPIError) and e.connection_invalidated or "connect" in reason.lower():
        # the same failure whatever was first asked of the store: name where it tried, not what for
        where = f"{u.host or 'localhost'}{f':{u.port}' if u.port else ''}"
        return StoreError(f"cannot connect to the store at {where} ({mask_url(u)}): {reason}")
    return StoreError(f"{what} failed on {mask_url(u)}: {reason}")


#: backend -> (the extra that installs its driver, that driver)
_EXTRAS = {"postgresql": ("postgres", "psycopg"), "mysql": ("mysql", "pymysql"), "mariadb": ("mysql", "pymysql")}
SUPPORTED_URLS = (
    "sqlite:////path/file.sqlite3, postgresql://user@host/db (pip install '.[postgres]' in the tunecache checkout), "
    "mysql:// or mariadb://user@host/db (pip install '.[mysql]' in the tunecache checkout)"
)


def _driver_error(u: URL, e: Exception) -> StoreError:
    """Suggest only what exists: a real extra for a known backend, the supported schemes otherwise."""
    backend = u.get_backend_name()
    if backend not in _EXTRAS:
        return StoreError(
            f"unsupported store URL scheme {u.drivername!r} ({mask_url(u)}); tunecache supports {SUPPORTED_URLS}"
        )
    extra, driver = _EXTRAS[backend]
    if u.get_driver_name() == driver:
        return StoreError(
            f"no database driver for {mask_url(u)} ({driver_message(e)}): "
            f"pip install '.[{extra}]' in the tunecache checkout"
        )
    return StoreError(
        f"no database driver {u.get_driver_name()!r} for {mask_url(u)} ({driver_message(e)}): install it, or use "
        f"{backend}:// ({driver}: pip install '.[{extra}]' in the tunecache checkout)"
    )


def _set_wal(cur: sqlite3.Cursor, busy_ms: int) -> None:
    """``PRAGMA journal_mode=WAL``, retried up to the busy timeout.

    Switching a new file to WAL needs its exclusive lock, and while another connection holds the
    write lock (or is switching too) SQLite answers "database is locked" at once, without calling
    its busy handler, because waiting could deadlock. Processes opening a fresh store together hit
    exactly that; once the file is in WAL mode the statement takes no lock.
    """
    deadline = time.monotonic() + busy_ms / 1000
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
