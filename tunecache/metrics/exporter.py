"""Where tunecache's metrics show: the server's own ``/metrics``, with no code (issue 47).

Inference servers export Prometheus metrics from prometheus_client's default registry or, under
``PROMETHEUS_MULTIPROC_DIR``, from the files its multiprocess mode writes per process (SGLang with
``--enable-metrics``; vLLM with several API servers, or whenever the variable is set). The first time
a process opens a store (a kernel's background prefetch, torch.compile's first lookup), :func:`start`
puts tunecache's metrics (:mod:`tunecache.metrics.families`) where that server looks, if
prometheus_client is installed and ``TUNECACHE_METRICS`` is not 0:

- single process: one :class:`Collector` in the default registry, which reads the counters when
  Prometheus scrapes, and only then;
- multiprocess mode (prometheus_client's own choice, made from ``PROMETHEUS_MULTIPROC_DIR`` when it
  was imported): a custom collector is not summed across processes, so the values are mirrored into
  prometheus_client counters of this process's files (:mod:`tunecache.metrics.mirror`).

tunecache never imports prometheus_client first, unless it is asked to serve
(``TUNECACHE_METRICS_PORT``) or the multiprocess directory was set before the process started:
prometheus_client decides its mode once, at its first import, and SGLang's launcher defines its
kernels, then sets the directory, then imports it (the mode would have been decided without the
directory, SGLang's own metrics lost with tunecache's). Otherwise a finder waits for the program's
own import of prometheus_client and exports right after it. ``TUNECACHE_METRICS_PORT`` makes the
first process that gets the port serve ``/metrics`` itself (the default registry, or in
multiprocess mode the sum of the directory). Nothing here is imported by ``import tunecache``;
nothing runs on the launch path. A failure is one warning, never an exception into the caller.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from tunecache import extras, settings
from tunecache.errors import ConfigurationError
from tunecache.metrics import families
from tunecache.process import counters, forks

log = logging.getLogger("tunecache")

_lock = threading.Lock()  # start()'s decision, and the export itself; never held while importing
_started: int | None = None  # the pid that ran start() (a forked child starts again: its mirror thread)
_exported: int | None = None  # the pid whose metrics are registered or mirrored
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
            now, listen = _decide()
        except Exception as e:  # noqa: BLE001 - metrics never break a kernel or a compile
            log.warning("tunecache: metrics not exported: %r", e)
            return
    if now:
        _export(listen)


def _decide() -> tuple[bool, tuple[str, int] | None]:
    """Whether to export now, and where to serve. Now where prometheus_client is imported already,
    its multiprocess directory was set before this process started, or ``TUNECACHE_METRICS_PORT``
    asks for a server; else as soon as the program imports prometheus_client (a finder watches for
    it), never before: its mode is decided by its first import, and a server that sets
    ``PROMETHEUS_MULTIPROC_DIR`` after defining its kernels (SGLang's launcher sets it just before
    it imports prometheus_client) would find it decided without."""
    try:
        if not settings.get("TUNECACHE_METRICS"):
            return False, None
        listen = settings.get("TUNECACHE_METRICS_PORT")
    except ConfigurationError:
        settings.usable()  # its one warning names the bad value
        return False, None
    if "prometheus_client" in sys.modules:
        return True, listen
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        if listen is not None:
            missing = extras.missing(ModuleNotFoundError(name="prometheus_client"))
            log.warning("tunecache: TUNECACHE_METRICS_PORT is set, but %s", missing)
        return False, None
    if listen is not None or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return True, listen
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return False, None


def _export(listen: tuple[str, int] | None) -> None:
    """Register (or mirror) the metrics in this process, once, and serve them where ``listen`` says.
    Never raises. prometheus_client is imported before the lock is taken: a thread that imports it
    meanwhile holds its module's import lock and exports from there (:class:`_Loader`)."""
    global _exported
    try:
        import prometheus_client.multiprocess  # noqa: F401 - imported (or waited for) outside the lock

        with _lock:
            if _exported != os.getpid():
                if multiprocess():
                    from tunecache.metrics import mirror

                    mirror.begin()
                else:
                    register()
                _exported = os.getpid()
            if listen is not None:
                serve(*listen)
    except Exception as e:  # noqa: BLE001 - metrics never break a kernel, a compile or an import
        log.warning("tunecache: metrics not exported: %r", e)


class _Loader:
    """prometheus_client's own loader, then :func:`_export`; every other attribute is the loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # the module keeps its own loader
        self._loader.exec_module(module)
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _export(None)  # the program imported it: its mode is its own (a forked child's: the child's)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: wraps the loader that the other finders find for prometheus_client (as
    the start-up hook, ``_tunecache_startup``, does for Triton)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "prometheus_client":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


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
