"""A SQLite store as one file: its write-ahead log folded into the main file as writers close, read
through by a read-only open, and sealed for shipping.

In WAL mode (:mod:`tunecache.store.engine`) a commit goes to ``FILE-wal``; the rows reach the main
file at a checkpoint, which SQLite runs by itself when the last connection to the file closes (and
then deletes the log). A process that never closed its connections (a multiprocessing child leaves
by ``os._exit``; a kernel that a daemon thread still references at exit is never collected) left
every row in the log: a main file of 4 KiB beside it. An image that copied that file alone shipped
an empty store, and a read-only open (``immutable=1``, which ignores the log) found "no schema"
(issue 44). So:

- a writable store folds its log when it closes (:func:`fold_log`), and every process closes its
  writable SQLite stores as it ends (:mod:`tunecache.process.processend`, registered by the store);
- a read-only open reads a non-empty log beside the file (:func:`readonly_connect`) and, where the
  main file was copied without it, says how to fix that (:func:`missing_log_hint`);
- ``tunecache db seal`` folds and truncates the log where the store is writable, waiting for the
  processes that use it (:func:`seal`), so that the one file can be copied.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tunecache.errors import StoreError

log = logging.getLogger("tunecache")

_HEADER = 100  # a SQLite database file's header: bytes 18 and 19 are 2 in WAL mode
_warned: set[Path] = set()


def log_path(path: Path) -> Path:
    return Path(f"{path}-wal")


def log_bytes(path: Path) -> int:
    """The size of the write-ahead log beside ``path``; 0 where there is none."""
    try:
        return log_path(path).stat().st_size
    except OSError:
        return 0


def in_wal_mode(path: Path) -> bool:
    """Whether the main file says it is in WAL mode (its rows may then be in a log beside it)."""
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER)
    except OSError:
        return False
    return len(header) == _HEADER and header[18] == 2 and header[19] == 2


def fold_log(path: Path) -> None:
    """Fold the log beside ``path`` into the main file and truncate it, if no other connection needs
    it now: called once this process's own connections are closed (SQLite itself checkpoints and
    deletes the log when the last connection closes; this covers a connection of this process that
    could not be closed). Never waits: a checkpoint that would block another process's reader or
    writer does what it can and leaves the rest to the next process that closes. Never raises."""
    if log_bytes(path) == 0:
        return
    try:
        conn = sqlite3.connect(_uri(path, mode="rw"), uri=True, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error:
        log.debug("tunecache: folding the log of %s: skipped", path, exc_info=True)
    finally:
        conn.close()


def readonly_connect(path: Path) -> sqlite3.Connection:
    """A read-only connection to the store file ``path`` that reads every committed row, writing
    nothing beside it.

    - No log, or an empty one: ``immutable=1``: no locks, no files made (a read-only image).
    - A log and its ``-shm`` index beside it: a writer may be at work (another user's store):
      SQLite's own read-only protocol, which honours it.
    - A log and no index (a writer was killed, or the directory was copied after its writers
      ended, which delete the index): no writer is there, and none can make the index in a
      read-only directory, so the log is read into this connection's memory (exclusive locking
      mode on the lock-free VFS) and a warning says once how to fold it for good.
    """
    size = log_bytes(path)
    if size == 0:
        return sqlite3.connect(_uri(path, mode="ro", immutable=1), uri=True, check_same_thread=False)
    if Path(f"{path}-shm").exists():
        return sqlite3.connect(_uri(path, mode="ro"), uri=True, check_same_thread=False)
    conn = sqlite3.connect(_uri(path, mode="ro", vfs="unix-none"), uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # before the first read: the log index in memory
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        conn.close()
        raise StoreError(
            f"store {path} is read-only and {size} bytes of its rows are in {log_path(path)}, which cannot "
            f"be read here ({e}): run `tunecache --url sqlite:///{path} db seal` where it is writable, "
            "then ship that one file"
        ) from None
    if path not in _warned:
        _warned.add(path)
        log.warning(
            "tunecache: store %s is read-only and %d bytes of its rows are in %s beside it, read into memory by "
            "every process that opens it: run `tunecache --url sqlite:///%s db seal` where it is writable, "
            "then ship that one file",
            path,
            size,
            log_path(path),
            path,
        )
    return conn


def missing_log_hint(path: Path) -> str:
    """For a read-only store that has no tunecache schema: where its rows probably are. A main file
    in WAL mode with no log beside it was most likely copied alone from a store whose rows were
    still in its log (a writer of an older tunecache, or one that was killed)."""
    if not in_wal_mode(path) or log_bytes(path):
        return ""
    return (
        f"; its file is in WAL mode and no {log_path(path).name} is beside it: if it was copied alone, its rows "
        "stayed in the original's log: run `tunecache db seal` on the original, where it is writable, and copy "
        "that one file again"
    )


def seal(path: Path, busy_ms: int) -> dict[str, Any]:
    """Fold the whole log into the main file and truncate it, waiting up to ``busy_ms`` for the
    processes using the store to let go, then leave the file in rollback-journal mode where no
    other connection is open (any SQLite, read-only anywhere, then reads it; the next writer
    switches it back to WAL). Returns what the file holds. Raises :class:`StoreError` where a
    process kept the log busy."""
    before = log_bytes(path)
    conn = sqlite3.connect(_uri(path, mode="rw"), uri=True, timeout=busy_ms / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise StoreError(
                f"cannot seal {path}: another process kept reading or writing it for {busy_ms / 1000:.0f} s "
                f"({done} of {frames} log frames folded); run `tunecache db seal` again once it is done"
            )
        try:
            conn.execute("PRAGMA busy_timeout=0")
            mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        except sqlite3.OperationalError:  # another connection is open: its log stays, empty
            mode = "wal"
    finally:
        conn.close()
    return {"path": str(path), "bytes": path.stat().st_size, "log_bytes_folded": before, "journal_mode": mode}


def _uri(path: Path, **params: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"file:{quote(str(path))}?{query}"
