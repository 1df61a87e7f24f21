"""SQLite write transactions and ``fork()``: a fork waits for the writes in flight, new writes wait
for the fork.

SQLite keeps the lock state of all of a process's connections to a file in process memory. A child
forked in the middle of a write (a migration, a flush of hit counts) inherits a ghost connection that
holds the write lock forever: each of the child's writes then waits out the busy timeout and fails.
Servers that fork their workers after tunecache started (gunicorn, multiprocessing's fork) hit it, so
the gate is registered with :func:`tunecache.process.forks.register` on import. :class:`tunecache.store.store.Store`
passes every SQLite write through :func:`writing`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from tunecache.process import forks


class SqliteForkGate:
    """A fork waits for the SQLite write transactions in flight in this process, and new ones wait
    for the fork. The wait is bounded (``FORK_WAIT_S``): a fork never hangs on it.
    """

    FORK_WAIT_S = 10.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._forking = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def before_fork(self) -> None:
        deadline = time.monotonic() + self.FORK_WAIT_S
        with self._cond:
            self._forking = True
            while self._active and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        self.__init__()  # the writers it counted are the parent's threads


GATE = SqliteForkGate()


def writing() -> contextlib.AbstractContextManager[None]:
    """The context of one SQLite write transaction of this process."""
    return GATE.writing()


forks.register(
    __name__,
    GATE.after_fork_in_child,
    before=GATE.before_fork,
    after_in_parent=GATE.after_fork_in_parent,
)
