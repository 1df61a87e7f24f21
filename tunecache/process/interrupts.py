"""Ctrl-C held across a commit, so that what a command reports about it is true.

A SIGINT that lands while a transaction commits, or while its connection is handed back after the
commit, raises KeyboardInterrupt from inside the driver or the pool: the caller cannot tell whether
the rows are in the store. :func:`held` records such a SIGINT instead and raises it once the
commit's outcome is known, so an import interrupted at that moment says it committed (issue 38).

A command whose outcome one commit decides (``tunecache import``) opens a :func:`settled` scope
around all its work: a hold taken inside it (the commit's) is handed to the scope when the commit
succeeded, and lasts until the scope ends, so that a Ctrl-C anywhere after the commit (as the load
returns, as the summary is printed, as the store closes) is recorded, never raised into code that
would take it for a failure: the command reports what was committed and then says it was
interrupted (issue 44). Before the commit, Ctrl-C interrupts as always.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


class _Hold:
    """SIGINT recorded instead of raised, from :meth:`take` until :meth:`release`."""

    def __init__(self) -> None:
        self.previous: Any = None
        self.asked = False  # take() was called: the commit began
        self.taken = False
        self.pending = False

    def take(self) -> None:
        """Start recording SIGINT; nothing off the main thread, or where SIGINT is not Python's
        default handler (a program's own, ignored, or a hold already taken)."""
        self.asked = True
        if self.taken or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        self.previous = signal.signal(signal.SIGINT, self._record)
        self.taken = True

    def _record(self, signum: int, frame: object) -> None:
        self.pending = True

    def release(self) -> bool:
        """Stop recording (the previous handler back); whether a SIGINT came."""
        if self.taken:
            signal.signal(signal.SIGINT, self.previous)
            self.taken = False
        return self.pending


class Settled:
    """What a :func:`settled` scope learns: whether the commit that decides it happened, and whether
    a Ctrl-C came after it."""

    def __init__(self) -> None:
        self.hold: _Hold | None = None

    @property
    def committed(self) -> bool:
        return self.hold is not None

    @property
    def interrupted(self) -> bool:
        return self.hold is not None and self.hold.pending


_scopes: list[Settled] = []  # the settled() scopes open in the main thread, innermost last


@contextlib.contextmanager
def held() -> Iterator[Callable[[], None]]:
    """Yield ``hold()``: once called, a SIGINT is recorded rather than raised until the block ends;
    then, if one came and the block raised nothing, KeyboardInterrupt is raised. Inside a
    :func:`settled` scope, a block that raised nothing hands its hold to the scope instead: SIGINT
    stays recorded until the scope ends. Off the main thread, or where SIGINT is not Python's
    default handler, ``hold()`` does nothing."""
    hold = _Hold()
    try:
        yield hold.take
    except BaseException:
        hold.release()  # no commit to report: a Ctrl-C recorded goes with the error
        raise
    scope = _scopes[-1] if _scopes and threading.current_thread() is threading.main_thread() else None
    if hold.asked and scope is not None and scope.hold is None:
        scope.hold = hold  # the commit is done: the scope's command says so, whatever comes now
        return
    if hold.release():
        raise KeyboardInterrupt()


@contextlib.contextmanager
def settled() -> Iterator[Settled]:
    """A command's scope whose outcome one commit decides (see the module docstring). It yields a
    :class:`Settled`; a SIGINT recorded after the commit is only reported by ``interrupted``, and
    one that comes once the command said so is dropped as the scope ends."""
    scope = Settled()
    main = threading.current_thread() is threading.main_thread()  # elsewhere no hold is taken
    if main:
        _scopes.append(scope)
    try:
        yield scope
    finally:
        if main:
            _scopes.remove(scope)
        if scope.hold is not None:
            scope.hold.release()
