"""Deferral: a walk over many tuning keys skips, for now, a key another process is benchmarking.

A fleet that starts cold walks the same keys in the same order (a server's warmup, largest batch
bucket first): with single flight alone, one host leads each key and the others wait on it key by
key, so the fleet warms no faster than one host. Inside :func:`defer_busy`, a launch whose key
misses the store and whose benchmark another live process holds (its lease in the store, or on
this host its lock) raises :class:`~tunecache.errors.Busy` at once instead of waiting: before
anything is launched or benchmarked, with nothing cached, no lease taken and no wait or miss
counted. The walk moves on to the next key (which this process may lead while the other benchmarks
its own), and launches the deferred keys again at the end, outside the context, where they are
served by then or wait as always (at most ``TUNECACHE_WAIT_SECONDS``)::

    deferred = []
    with tunecache.defer_busy():
        for b in buckets:
            try:
                run(b)
            except tunecache.Busy:
                deferred.append(b)
    for b in deferred:
        run(b)

Nothing else changes inside the context: a stored key is served, a key nobody holds is benchmarked
here, and where tunecache is off (``TUNECACHE_MODE=off``), read-only, offline, capturing or the
kernel is not tunecache's, nothing raises. The flag is a context variable: it holds for the thread
(or task) that entered the context, never for another.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import NoReturn

from tunecache.errors import Busy

log = logging.getLogger("tunecache")

_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("tunecache_defer_busy", default=False)


@contextlib.contextmanager
def defer_busy() -> Iterator[None]:
    """Inside: a launch whose key another live process is benchmarking raises :class:`Busy` instead
    of waiting for it (see the module's documentation)."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)


def deferring() -> bool:
    """Whether this thread (or task) is inside :func:`defer_busy`."""
    return _DEFER.get()


def busy(kernel: str, key: str) -> NoReturn:
    """Defer a launch of ``kernel`` whose tuning key ``key`` another process is benchmarking."""
    log.debug("tunecache: %s: another process is benchmarking %s; deferred", kernel, key)
    raise Busy(kernel, key)


__all__ = ["Busy", "busy", "defer_busy", "deferring"]
