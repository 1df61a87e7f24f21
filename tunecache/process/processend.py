"""A process's last words (write its queued counts, print its summary), on every way it ends.

The flusher (:mod:`tunecache.process.writeback`) writes what is queued ``FLUSH_DELAY_S`` after it is
queued, and atexit writes the rest. A multiprocessing child can end where neither happens, and pool
workers live shorter than that delay, so their hits, counters and ``kernel_stats`` rows were lost
(issue 27: after two runs ``tunecache stats`` said "kernels seen: 0", and ``gc`` took the problems
only they used for unused):

- started by fork, a child leaves by ``os._exit``: its atexit never runs, even at a normal end;
- ``with Pool() as p`` ends with ``terminate()``: SIGTERM, whose default action kills at once.

So the first time a multiprocessing child queues something (:func:`arm`, called by writeback, off
the launch path), it registers its last words with multiprocessing's own exit finalizers (run at a
child's normal end, under every start method), and, only where SIGTERM's handler is the default,
installs one that says its last words, restores the default and sends itself SIGTERM again: the
process still dies of SIGTERM, with the same status.

Python runs a signal's handler in the main thread only, and the kernel hands a SIGTERM to whichever
thread does not block it: to another thread whenever the main one blocks every signal for an
instant, as glibc does inside each ``pthread_create``. The main thread then hears of it only when
its current call returns, never for a pool worker waiting on its task queue's lock, which the
terminating parent holds: ``Pool.__exit__`` hung for good (CI; here 2 runs in 42, six at once), where
the default action had killed the worker whichever thread took the signal. So arming also starts a
watcher thread on the process's wakeup fd, which Python's C-level handler writes from any thread:
it wakes the main thread until the handler has begun and, whatever the last words wait for (a hung
store, a lock the interrupted code held), ends the process by SIGTERM's default action
:data:`TERM_BUDGET_S` after the signal. A SIGTERM that comes while the process is already saying
them (a pool worker that read its stop sentinel just before ``terminate()``) lets them finish
within that bound. A handler the program set is left alone, as is a program that uses the wakeup fd
itself (an asyncio loop's signal handlers: SIGTERM stays at its default there), and a process that
never queues anything is not touched.

Known limit: a main thread busy in one long C call when SIGTERM comes (no system call to
interrupt) says no last words; the watcher ends it at the budget.
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

from tunecache.process import forks

log = logging.getLogger("tunecache")

#: The longest a SIGTERM'd worker spends on its last words before it dies as it would have.
TERM_BUDGET_S = 1.0

_words: dict[str, tuple[int, Callable[[], None]]] = {}  # name -> (order, fn)
_armed = False  # this process is armed, or has nothing to arm (not a multiprocessing child)
_finalized = False  # multiprocessing's exit finalizers will say them
_saying = 0  # last words in progress (a count: a signal's handling may nest in a normal end's)
_term_begun = False  # the SIGTERM handler has begun (the watcher stops waking the main thread)
_wakeup: tuple[int, int] | None = None  # the watcher's pipe (read, write), the write end being the wakeup fd
_NUDGE_S = 0.05  # how often the watcher wakes a main thread that has not begun the handler


def at_end(name: str, fn: Callable[[], None], order: int) -> None:
    """Run ``fn`` as this process ends, however it ends; lower ``order`` first. Registering ``name``
    again replaces it (a module imported twice registers once)."""
    _words[name] = (order, fn)


def last_words() -> None:
    """Run every :func:`at_end` function, in order; one that raises does not stop the others, and
    none raises (this runs at interpreter exit and inside a signal's handling). A Ctrl-C cuts short
    the one being said (a flush waiting on a slow store), not the others, and prints no traceback:
    what the process had to say on stdout is said."""
    global _saying
    _saying += 1
    try:
        for _, fn in sorted(_words.values(), key=lambda w: w[0]):
            try:
                fn()
            except KeyboardInterrupt:  # Ctrl-C as the process ends: this word is cut short, quietly
                log.debug("tunecache: %r at process end interrupted", fn)
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
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and _watch():
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter: leave the signal as it is
        log.debug("tunecache: cannot watch SIGTERM here", exc_info=True)


def _watch() -> bool:
    """Start the thread that hears SIGTERM whichever thread the kernel hands it to (the process's
    wakeup fd, which Python's C-level handler writes from any thread). False, leaving SIGTERM at its
    default, where the program already uses the wakeup fd (an asyncio loop's signal handlers)."""
    global _wakeup
    r, w = os.pipe()
    os.set_blocking(w, False)  # the C handler never blocks on it
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        log.debug("tunecache: the wakeup fd is the program's; SIGTERM left at its default")
        return False
    _wakeup = (r, w)
    main = threading.main_thread().ident  # set: arm runs in the main thread
    threading.Thread(target=_hear, args=(r, main), name="tunecache-sigterm", daemon=True).start()
    return True


def _hear(fd: int, main: int) -> None:
    """The watcher: waits for SIGTERM's byte on the wakeup fd. Python runs a handler only in the
    main thread, and when another thread took the signal the main one hears of it only once its
    current call returns (a task's sleep, the lock of a pool's task queue: never). So it wakes the
    main thread until the handler has begun, and ends the process :data:`TERM_BUDGET_S` after the
    signal whatever the last words wait for."""
    try:
        while not (signal.SIGTERM in os.read(fd, 64) and signal.getsignal(signal.SIGTERM) is _on_sigterm):
            pass  # another signal's byte, or SIGTERM once the program took it over: not ours
    except OSError:
        return
    heard = time.monotonic()
    while time.monotonic() - heard < TERM_BUDGET_S:
        if not _term_begun:  # the main thread sleeps in a call
            signal.pthread_kill(main, signal.SIGTERM)
        time.sleep(_NUDGE_S)
    _die_now(signal.SIGTERM)


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM in an armed child whose handler was the default: last words, then the default
    action. A repeat (the watcher's wake-up) while they are said changes nothing."""
    global _term_begun
    if _term_begun:
        return
    _term_begun = True
    if _saying:
        return  # interrupted a normal end's last words: let them finish, within the watcher's bound
    last_words()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _die_now(signum: int) -> None:
    """From any thread: the signal's default action, now (Python sets handlers from the main
    thread only, so through the C API's ``PyOS_setsig``); SIGKILL where that is not to be had."""
    try:
        import ctypes

        setsig = ctypes.pythonapi.PyOS_setsig
        setsig.argtypes, setsig.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
        setsig(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
    except Exception:  # noqa: BLE001 - the process must end either way
        log.debug("tunecache: cannot restore SIGTERM's default from the watcher", exc_info=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _after_fork_in_child() -> None:
    """A forked child decides again whether it is a multiprocessing child (set up after this hook):
    the parent's watcher does not exist here, so its handler and wakeup fd are taken back."""
    global _armed, _finalized, _saying, _term_begun, _wakeup
    _armed = _finalized = _term_begun = False
    _saying = 0
    if _wakeup is not None:
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            held = signal.set_wakeup_fd(-1)
            if held != _wakeup[1]:
                signal.set_wakeup_fd(held)  # the program's since: put it back
        except (ValueError, OSError):
            log.debug("tunecache: cannot take SIGTERM's watch back in a forked child", exc_info=True)
        for fd in _wakeup:
            os.close(fd)
        _wakeup = None


forks.register(__name__, _after_fork_in_child)
atexit.register(last_words)
