"""``tunecache`` with a Ctrl-C that lands right after its first write transaction commits, while the
connection is handed back: what a user's Ctrl-C does at that moment, made deterministic. Run as
``python tests/interrupt_after_commit.py ARGS`` (the CLI's arguments). With ``TC_INTERRUPT_AT=insert``
the Ctrl-C lands instead at the first insert of a problem row, before the commit."""

from __future__ import annotations

import os
import signal

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import Pool

_armed: list[bool] = []
_loading: list[bool] = []


@event.listens_for(sa.engine.Engine, "commit")
def _on_commit(conn: sa.engine.Connection) -> None:
    if _loading:  # the commit of a load of problems (an import's), not of a migration's
        _loading.clear()
        _armed.append(True)


@event.listens_for(Pool, "checkin")
def _on_checkin(dbapi_conn: object, record: object) -> None:
    # the load committed: the user's Ctrl-C arrives as the connection closes
    if _armed and os.environ.get("TC_INTERRUPT_AT", "commit") == "commit":
        _armed.clear()
        os.kill(os.getpid(), signal.SIGINT)


@event.listens_for(sa.engine.Engine, "before_cursor_execute")
def _on_execute(conn: object, cursor: object, statement: str, *args: object) -> None:
    if statement.startswith(("INSERT INTO problems", "LOCK TABLE problems")):  # SQLite's load, PostgreSQL's
        _loading.append(True)
        if os.environ.get("TC_INTERRUPT_AT") == "insert":
            os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    from tunecache.cli import main

    main(prog_name="tunecache")
