"""``tunecache`` with a Ctrl-C that lands right after its first write transaction commits, while the
connection is handed back: what a user's Ctrl-C does at that moment, made deterministic. Run as
``python tests/interrupt_after_commit.py ARGS`` (the CLI's arguments)."""

from __future__ import annotations

import os
import signal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import Pool

_armed: list[bool] = []


@event.listens_for(sa.engine.Engine, "commit")
def _on_commit(conn: sa.engine.Connection) -> None:
    if conn.get_execution_options().get("tunecache_write"):
        _armed.append(True)


@event.listens_for(Pool, "checkin")
def _on_checkin(dbapi_conn: object, record: object) -> None:
    if _armed:  # the transaction committed: the user's Ctrl-C arrives as the connection closes
        _armed.clear()
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    from tunecache.cli import main

    main(prog_name="tunecache")
