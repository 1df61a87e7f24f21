"""A circuit breaker per store server: a database that accepts connections and never answers costs
a process one connect timeout, not one per kernel, per background prefetch and per deferred write.

A library defines hundreds of autotuners; each opens its store in the background when it is
defined and again at its first launch, deferred writes are retried every few seconds, and the exit
waits for all of them. Against a server that never answers, every one of those attempts waits out
``TUNECACHE_CONNECT_TIMEOUT``: minutes in all. So every connection attempt to a database server
passes through :func:`attempt` (:class:`tunecache.store.store.Store` opens each connection in it). An
attempt that fails after waiting (half the connect timeout or more) opens the breaker of that
server's URL: for ``BACKOFF_S`` every attempt of the process fails at once with
:class:`StoreOfflineError`, which every caller already handles as "store unavailable" (tune in this
process, queue the results). After the back-off one attempt goes through (half-open) while the
others still fail at once; a connection closes the breaker, a stalled failure opens it again.

A prompt failure (connection refused, a wrong password) leaves the breaker closed: trying again
costs nothing, and a restarted server is used again as soon as it answers. SQLite files have none.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from tunecache import settings
from tunecache.errors import StoreOfflineError, driver_message
from tunecache.process import counters, forks
from tunecache.store.engine import scrub

#: How long a server that did not answer is left alone before one attempt tries it again.
BACKOFF_S = 30.0
#: A failed attempt that took this fraction of the connect timeout or more waited for an answer.
STALLED_FRACTION = 0.5

log = logging.getLogger("tunecache")


@dataclass
class _Open:
    until: float  # monotonic: no attempt before this
    reason: str  # the stalled failure that opened it
    probing: bool = False  # the half-open attempt is in flight


_lock = threading.Lock()
_open: dict[str, _Open] = {}  # by key_of(url); absent: closed


def key_of(url: URL) -> str | None:
    """The breaker of ``url``: one per server URL (password hidden), None for a SQLite file."""
    if url.get_backend_name() == "sqlite":
        return None
    return url.render_as_string(hide_password=True)


def check(url: URL) -> None:
    """Raise :class:`StoreOfflineError` if an attempt on ``url`` would be refused now (so that a
    caller skips building what the attempt needs)."""
    key = key_of(url)
    if key is None:
        return
    with _lock:
        st = _open.get(key)
        if st is not None and (st.probing or time.monotonic() < st.until):
            raise _offline(key, st)


@contextlib.contextmanager
def attempt(url: URL) -> Iterator[None]:
    """Around one connection attempt to ``url``: refused at once while its breaker is open; a
    failure that waited for an answer opens it; a connection closes it."""
    key = key_of(url)
    if key is None:
        yield
        return
    with _lock:
        st = _open.get(key)
        if st is not None:
            if st.probing or time.monotonic() < st.until:
                raise _offline(key, st)
            st.probing = True  # the half-open attempt: the others still fail at once
    t0 = time.monotonic()
    try:
        yield
    except Exception as e:
        _failed(key, url, e, time.monotonic() - t0)
        raise
    except BaseException:  # interrupted: no verdict on the server; the next caller tries
        with _lock:
            st = _open.get(key)
            if st is not None:
                st.probing = False
        raise
    with _lock:
        if _open.pop(key, None) is not None:
            log.info("tunecache: store %s answers again", key)


def _failed(key: str, url: URL, e: Exception, waited: float) -> None:
    timeout = settings.get("TUNECACHE_CONNECT_TIMEOUT")
    with _lock:
        if waited < STALLED_FRACTION * timeout:  # answered (a refusal): trying again costs nothing
            _open.pop(key, None)
            return
        reason = f"no answer within {waited:.1f} s ({scrub(driver_message(e), url)})"
        _open[key] = _Open(time.monotonic() + BACKOFF_S, reason)
    counters.count(None, None, breaker_opened=1)
    log.info("tunecache: store %s: %s; not tried again for %.0f s", key, reason, BACKOFF_S)


def open_now() -> int:
    """How many servers' breakers are open in this process now (half-open included: closed only by
    a connection), for the ``tunecache_store_breaker_open`` gauge (:mod:`tunecache.metrics`)."""
    with _lock:
        return len(_open)


def _offline(key: str, st: _Open) -> StoreOfflineError:
    when = "another thread is trying it now" if st.probing else f"tried again in {st.until - time.monotonic():.0f} s"
    return StoreOfflineError(
        f"store {key} is offline: {st.reason}; {when}. Meanwhile kernels are tuned in this process and "
        "their results are written once it answers; check the server or TUNECACHE_URL"
    )


def reset() -> None:
    """Close every breaker of this process (tests: each starts with none open)."""
    with _lock:
        _open.clear()


def fork_locks() -> dict[str, Any]:
    """This module's lock, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"breaker.lock": _lock}


def _after_fork_in_child() -> None:
    """A forked child starts with every breaker closed and a fresh lock: a half-open attempt in
    flight belongs to a parent's thread, which does not exist there, and the child is a process of
    its own, which finds out about the server with (at most) one connect timeout of its own."""
    global _lock
    _lock = threading.Lock()
    _open.clear()


forks.register(__name__, _after_fork_in_child)
