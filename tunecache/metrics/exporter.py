"""Where tunecache's metrics show: the server's own ``/metrics``, with no code (issue 47).

Inference servers export Prometheus metrics from prometheus_client's default registry (SGLang, vLLM
with one API server) or, under ``PROMETHEUS_MULTIPROC_DIR``, from the files its multiprocess mode
writes per process (vLLM with several). The first time a process opens a store (a kernel's
background prefetch, torch.compile's first lookup), :func:`start` puts tunecache's metrics
(:mod:`tunecache.metrics.families`) where that server looks, if prometheus_client is installed and
``TUNECACHE_METRICS`` is not 0:

- single process: one :class:`Collector` in the default registry, which reads the counters when
  Prometheus scrapes, and only then;
- multiprocess mode (prometheus_client's own choice, made from ``PROMETHEUS_MULTIPROC_DIR`` when it
  was imported): a custom collector is not summed across processes, so the values are mirrored into
  prometheus_client counters of this process's files (:mod:`tunecache.metrics.mirror`).

``TUNECACHE_METRICS_PORT`` makes the first process that gets the port serve ``/metrics`` itself
(the default registry, or in multiprocess mode the sum of the directory), for a program that
serves none. Nothing here is imported by ``import tunecache``, and prometheus_client is imported by
the first :func:`start` only (some 20-50 ms beside torch and Triton, off the main thread where a
kernel's prefetch opens the store): never on the launch path. A failure is one warning, never an
exception into the caller.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from tunecache import counters, forks, settings
from tunecache.errors import ConfigurationError
from tunecache.metrics import families

log = logging.getLogger("tunecache")

_lock = threading.Lock()
_started: int | None = None  # the pid that ran start() (a forked child starts again: its mirror thread)
_registered: Any = None  # the registry our Collector is in (inherited across fork, as the registry is)
_served: tuple[str, int] | None = None  # the address this process tree serves /metrics on


def start() -> None:
    """Export tunecache's metrics in this process (see the module docstring); cheap after the first
    call in a process. Never raises."""
    global _started
    if _started == os.getpid():
        return
    with _lock:
        if _started == os.getpid():
            return
        _started = os.getpid()
        try:
            _start()
        except Exception as e:  # noqa: BLE001 - metrics never break a kernel or a compile
            log.warning("tunecache: metrics not exported: %r", e)


def _start() -> None:
    try:
        if not settings.get("TUNECACHE_METRICS"):
            return
        listen = settings.get("TUNECACHE_METRICS_PORT")
    except ConfigurationError:
        settings.usable()  # its one warning names the bad value
        return
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        log.debug("tunecache: prometheus_client is not installed: no metrics (pip install 'tunecache[metrics]')")
        return
    if multiprocess():
        from tunecache.metrics import mirror

        mirror.begin()
    else:
        register()
    if listen is not None:
        serve(*listen)


def multiprocess() -> bool:
    """Whether prometheus_client runs in its multiprocess mode in this process: decided by
    prometheus_client when it is imported (``PROMETHEUS_MULTIPROC_DIR`` set then), not by the
    variable now. A directory set after that import is warned about: prometheus_client keeps its
    values in memory, and so does tunecache."""
    from prometheus_client import values

    on = values.ValueClass is not values.MutexValue
    if not on and os.environ.get("PROMETHEUS_MULTIPROC_DIR") and counters.first_time("metrics", "late dir"):
        log.warning(
            "tunecache: PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported; its metrics and "
            "tunecache's stay in this process (set it before the process starts)"
        )
    return on


class Collector:
    """tunecache's metrics, read from its counters when the registry is collected (a scrape)."""

    def describe(self) -> Iterator[Any]:
        """The families without values: what ``register`` checks names with, reading nothing."""
        return iter(_families({}))

    def collect(self) -> Iterator[Any]:
        return iter(_families(families.now()))


def _families(samples: dict[families.Key, float]) -> list[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    out = []
    for f in families.FAMILIES:
        cls = CounterMetricFamily if f.kind == families.COUNTER else GaugeMetricFamily
        m = cls(f.name, f.help, labels=list(f.labels))
        for (name, labels), v in samples.items():
            if name == f.name:
                m.add_metric(list(labels), v)
        out.append(m)
    return out


def register(registry: Any = None) -> None:
    """Put a :class:`Collector` in ``registry`` (default: prometheus_client's), once per process tree."""
    global _registered
    from prometheus_client import REGISTRY

    registry = registry if registry is not None else REGISTRY
    if _registered is registry:
        return
    registry.register(Collector())
    _registered = registry


def serve(host: str, port: int) -> None:
    """Serve ``/metrics`` on ``host:port`` from a thread of this process (``TUNECACHE_METRICS_PORT``):
    the default registry, or in multiprocess mode the sum of the directory, this process's own
    values synced first. A port another process holds (every process of a server inherits the
    variable; the first to open a store serves) is said at debug level."""
    global _served
    if _served is not None:
        return  # this process, or the parent it was forked from, serves it (the socket is the parent's)
    from prometheus_client import REGISTRY, start_http_server

    registry = REGISTRY
    if multiprocess():
        from prometheus_client import CollectorRegistry
        from prometheus_client import multiprocess as mp

        from tunecache.metrics import mirror

        registry = CollectorRegistry()
        registry.register(mirror.SyncFirst())  # collected first: this process's values are in its files
        mp.MultiProcessCollector(registry)
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        log.debug("tunecache: /metrics not served on %s:%d here: %s", host, port, e)
        return
    _served = (host, port)
    log.info("tunecache: serving /metrics on %s:%d", host, port)


def fork_locks() -> dict[str, Any]:
    """This module's lock, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"metrics.start_lock": _lock}


def _after_fork_in_child() -> None:
    """A child's lock is fresh; it starts again (in multiprocess mode, a mirror thread of its own)
    at its first store open. The registry and its collector, and the port, stay its parent's."""
    global _lock
    _lock = threading.Lock()


forks.register(__name__, _after_fork_in_child)
