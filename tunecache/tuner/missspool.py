"""The local miss spool: where a miss goes when the store cannot record it.

A read-only image (a SQLite file on a read-only root filesystem, a PostgreSQL login that may only
read) serves from a store that takes no writes, so a key it falls back on (offline mode, a CUDA
graph capture) cannot land in the store's ``misses`` table, which is where ``tunecache misses``
looks. Such misses are appended instead to a small JSON-lines file on this host
(``TUNECACHE_MISS_SPOOL``, default ``misses.jsonl`` in the user cache dir), one line per miss,
tagged with the store it missed in; ``tunecache misses`` reads the lines of the store it is pointed
at next to the store's own. One ``O_APPEND`` write per line, so concurrent processes do not
interleave. Written once per missed key and process (never on the launch path).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any

from tunecache import settings
from tunecache.problem.model import Problem, miss_fields, utcnow
from tunecache.problem.target import hostname
from tunecache.process import counters

log = logging.getLogger("tunecache")

#: A spool this large takes no more lines (a host missing keys for months should not fill its disk).
MAX_BYTES = 8 << 20


def path() -> Path:
    """The spool file: ``TUNECACHE_MISS_SPOOL``, else ``misses.jsonl`` in the user cache dir."""
    configured = settings.get("TUNECACHE_MISS_SPOOL")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tunecache")) / "misses.jsonl"


def append(problem: Problem, reason: str, store: str) -> bool:
    """Add one miss of ``problem`` in ``store`` (its masked URL); False where the spool cannot be
    written (a read-only home, a full spool): the caller then says so in the log."""
    p = path()
    line = json.dumps(
        {
            "store": store,
            **miss_fields(problem, reason),
            "host": hostname(),
            "seen": utcnow().isoformat(),
        },
        separators=(",", ":"),
    )
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size >= MAX_BYTES:
                return False
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        log.debug("tunecache: miss spool %s not writable: %s", p, e)
        return False
    counters.count(None, None, spooled_misses=1)
    return True


def read(store: str) -> list[dict[str, Any]]:
    """The spooled misses of ``store`` (its masked URL), one row per digest and reason, shaped as
    the store's own ``misses`` rows (count, first and last seen, the host that saw it last)."""
    try:
        text = path().read_text(errors="replace")
    except OSError:
        return []
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            m = json.loads(line)
            if m.get("store") != store:
                continue
            k = (m["digest"], m["reason"])
            seen = dt.datetime.fromisoformat(m["seen"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn or foreign line: skip it, keep the rest
        row = rows.get(k)
        if row is None:
            fields = ("digest", "reason", "kernel", "source_hash", "target_digest", "key_json", "host")
            rows[k] = {**{f: m.get(f) for f in fields}, "count": 1, "first_seen": seen, "last_seen": seen}
        else:
            row["count"] += 1
            if seen >= row["last_seen"]:
                row["last_seen"], row["host"] = seen, m.get("host")
            row["first_seen"] = min(row["first_seen"], seen)
    out = sorted(rows.values(), key=lambda r: r["last_seen"], reverse=True)
    return sorted(out, key=lambda r: r["kernel"] or "")  # as the store lists them: by kernel, newest first


__all__ = ["MAX_BYTES", "append", "path", "read"]
