"""Ctrl-C held across a commit, so that what a command reports about it is true.

A SIGINT that lands while a transaction commits, or while its connection is handed back after the
commit, raises KeyboardInterrupt from inside the driver or the pool: the caller cannot tell whether
the rows are in the store. :func:`held` records such a SIGINT instead and raises it once the
commit's outcome is known, so an import interrupted at that moment says it committed (issue 38).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def held() -> Iterator[Callable[[], None]]:
    """Yield ``hold()``: once called, a SIGINT is recorded rather than raised until the block ends;
    then, if one came and the block raised nothing, KeyboardInterrupt is raised. Off the main
    thread, or where SIGINT is not Python's default handler, ``hold()`` does nothing."""
    pending: list[bool] = []
    previous: list[Any] = []

    def record(signum: int, frame: object) -> None:
        pending.append(True)

    def hold() -> None:
        if previous or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        previous.append(signal.signal(signal.SIGINT, record))

    try:
        yield hold
    finally:
        if previous:
            signal.signal(signal.SIGINT, previous[0])
    if pending:
        raise KeyboardInterrupt()
