"""``tunecache`` with a Ctrl-C at an exact stage of an import, made deterministic: what a user's Ctrl-C
does at that moment. Run as ``python tests/interrupt_after_commit.py ARGS`` (the CLI's arguments);
``TC_INTERRUPT_AT`` names the stage (default ``commit``):

- ``insert``: at the first insert of a problem row, before the commit;
- ``commit``: right after the load's transaction commits, while its connection is handed back;
- ``returned``: once the load (``Store.bulk_load``) has returned, before the import returns;
- ``summary``: right after the command printed its summary line;
- ``close``: as the store's connections are closed (its WAL checkpointed), after the summary;
- ``exit``: in the process's last words at exit (:func:`tunecache.process.processend.at_end`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import click
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import Pool

AT = os.environ.get("TC_INTERRUPT_AT", "commit")

_armed: list[bool] = []
_loading: list[bool] = []
_committed: list[bool] = []


def _ctrl_c(stage: str) -> None:
    if stage == AT:
        os.kill(os.getpid(), signal.SIGINT)


@event.listens_for(sa.engine.Engine, "commit")
def _on_commit(conn: sa.engine.Connection) -> None:
    if _loading:  # the commit of a load of problems (an import's), not of a migration's
        _loading.clear()
        _armed.append(True)
        _committed.append(True)


@event.listens_for(Pool, "checkin")
def _on_checkin(dbapi_conn: object, record: object) -> None:
    # the load committed: the user's Ctrl-C arrives as the connection is handed back
    if _armed:
        _armed.clear()
        _ctrl_c("commit")


@event.listens_for(Pool, "close")
def _on_close(dbapi_conn: object, record: object) -> None:
    if _committed and AT == "close":  # a pooled connection closed after the load: the final close
        _committed.clear()
        _ctrl_c("close")


@event.listens_for(sa.engine.Engine, "before_cursor_execute")
def _on_execute(conn: object, cursor: object, statement: str, *args: object) -> None:
    # the first statement of a load of problems: SQLite's insert, PostgreSQL's lock
    if statement.startswith(("INSERT INTO problems", "LOCK TABLE problems")) and not _loading:
        _loading.append(True)
        _ctrl_c("insert")


def _hook_the_load() -> None:
    from tunecache.store.store import Store

    load = Store.bulk_load

    @contextlib.contextmanager
    def bulk_load(self: Store, what: str) -> Iterator[object]:
        with load(self, what) as writer:
            yield writer
        _ctrl_c("returned")

    Store.bulk_load = bulk_load  # type: ignore[method-assign]


def _hook_the_summary() -> None:
    echo = click.echo

    def echo_then_ctrl_c(message: object = None, *args: object, **kw: object) -> None:
        echo(message, *args, **kw)  # type: ignore[arg-type]
        if isinstance(message, str) and " problems (" in message and " new, " in message and not kw.get("err"):
            _ctrl_c("summary")

    click.echo = echo_then_ctrl_c  # type: ignore[assignment]


def _hook_the_exit() -> None:
    from tunecache.process import processend

    processend.at_end("tests.interrupt_after_commit", lambda: _ctrl_c("exit"), order=50)


if __name__ == "__main__":
    _hook_the_load()
    _hook_the_summary()
    _hook_the_exit()
    from tunecache.cli import main

    main(prog_name="tunecache")
