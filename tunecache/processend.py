"""A process's last words (write its queued counts, print its summary), on every way it ends.

The flusher (:mod:`tunecache.writeback`) writes what is queued ``FLUSH_DELAY_S`` after it is
queued, and atexit writes the rest. A multiprocessing child can end where neither happens, and pool
workers live shorter than that delay, so their hits, counters and ``kernel_stats`` rows were lost
(issue 27: after two runs ``tunecache stats`` said "kernels seen: 0", and ``gc`` took the problems
only they used for unused):

- started by fork, a child leaves by ``os._exit``: its atexit never runs, even at a normal end;
- ``with Pool() as p`` ends with ``terminate()``: SIGTERM, whose default action kills at once.

So the first time a multiprocessing child queues something (:func:`arm`, called by writeback, off
the launch path), it registers its last words with multiprocessing's own exit finalizers (run at a
child's normal end, under every start method), and, only where SIGTERM's handler is the default,
installs one that restores the default, says its last words and sends itself SIGTERM again: the
process still dies of SIGTERM, with the same status. A watchdog thread bounds it: whatever the last
words wait for (a hung store, a lock the interrupted code held), SIGTERM kills the process at most
:data:`TERM_BUDGET_S` later. A SIGTERM that comes while the process is already saying them (a pool
worker that read its stop sentinel just before ``terminate()``) lets them finish within that bound.
A handler the program set is left alone, and a process that never queues anything is not touched.

Known limit: Python runs a signal handler between bytecodes of the main thread, so a worker busy in
one long C call when SIGTERM comes dies when that call returns, not at once. A pool's ``__exit__``
terminates workers that wait for tasks, which wake at once.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from tunecache import forks

log = logging.getLogger("tunecache")

#: The longest a SIGTERM'd worker spends on its last words before it dies as it would have.
TERM_BUDGET_S = 1.0

_words: dict[str, tuple[int, Callable[[], None]]] = {}  # name -> (order, fn)
_armed = False  # this process is armed, or has nothing to arm (not a multiprocessing child)
_finalized = False  # multiprocessing's exit finalizers will say them
_saying = 0  # last words in progress (a count: a signal's handling may nest in a normal end's)


def at_end(name: str, fn: Callable[[], None], order: int) -> None:
    """Run ``fn`` as this process ends, however it ends; lower ``order`` first. Registering ``name``
    again replaces it (a module imported twice registers once)."""
    _words[name] = (order, fn)


def last_words() -> None:
    """Run every :func:`at_end` function, in order; one that raises does not stop the others, and
    none raises (this runs at interpreter exit and inside a signal's handling)."""
    global _saying
    _saying += 1
    try:
        for _, fn in sorted(_words.values(), key=lambda w: w[0]):
            try:
                fn()
            except Exception:  # noqa: BLE001 - never fail an exit
                log.debug("tunecache: %r at process end failed", fn, exc_info=True)
    finally:
        _saying -= 1


def arm() -> None:
    """In a multiprocessing child, make sure its last words are said at its end (see the module
    docstring). Cheap after the first call; call it when there is something to lose."""
    global _armed, _finalized
    if _armed:
        return
    mp = sys.modules.get("multiprocessing")  # a multiprocessing child has imported it to start
    if mp is None or mp.parent_process() is None:
        _armed = True
        return
    if not _finalized:
        _finalized = True
        from multiprocessing import util

        util.Finalize(None, last_words, exitpriority=0)  # run at every child's normal end (no atexit under fork)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers are set from the main thread: a later call from it arms
    _armed = True
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter: leave the signal as it is
        log.debug("tunecache: cannot watch SIGTERM here", exc_info=True)


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM in an armed child whose handler was the default: last words, then the default
    action; a watchdog sends the signal again :data:`TERM_BUDGET_S` later whatever they wait for."""
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM, the watchdog's included, kills at once
    threading.Thread(target=_kill_later, args=(signum,), name="tunecache-term-watchdog", daemon=True).start()
    if _saying:
        return  # interrupted a normal end's last words: let them finish, within the watchdog's bound
    last_words()
    os.kill(os.getpid(), signum)


def _kill_later(signum: int) -> None:
    time.sleep(TERM_BUDGET_S)
    os.kill(os.getpid(), signum)


def _after_fork_in_child() -> None:
    """A forked child decides again whether it is a multiprocessing child (set up after this hook)."""
    global _armed, _finalized, _saying
    _armed = _finalized = False
    _saying = 0


forks.register(__name__, _after_fork_in_child)
atexit.register(last_words)
