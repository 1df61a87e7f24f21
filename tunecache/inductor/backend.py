"""Backend: tunecache as a ``torch._inductor.remote_cache.RemoteCacheBackend``, one class per cache.

Inductor's remote caches (``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache``,
``RemoteFxGraphCache``, ``RemoteAOTAutogradCache``) each build their backend from the class-level
``backend_override_cls`` when it is set (torch >= 2.5); :mod:`tunecache.inductor.enable` sets it to
the classes made here. The bytes they hand over are Inductor's JSON, stored as they are: nothing
Inductor generates is changed. Importing this module imports ``torch._inductor.remote_cache``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch._inductor import remote_cache

from tunecache.inductor.entries import InductorStore, default

#: Inductor's cache class -> the kind tunecache files its entries under.
CACHE_CLASSES = {
    "RemoteAutotuneCache": "autotune",
    "RemoteBundledAutotuneCache": "bundled_autotune",
    "RemoteFxGraphCache": "fx_graph",
    "RemoteAOTAutogradCache": "aot_autograd",
}


class TunecacheBackend(remote_cache.RemoteCacheBackend):  # type: ignore[misc,type-arg]
    """The store as one Inductor cache's backend (``kind``); never raises into Inductor."""

    kind = ""
    entries: InductorStore | None = None  # None: the process's default (TUNECACHE_URL)

    def __init__(self) -> None:  # torch's base __init__ differs across versions; this is all it sets
        self._name = f"backend:{type(self).__name__}"

    def _get(self, key: str) -> bytes | None:
        return (self.entries or default()).get(self.kind, key)

    def _put(self, key: str, data: bytes) -> None:
        (self.entries or default()).put(self.kind, key, data)


if getattr(remote_cache.RemoteCacheBackend.get, "__isabstractmethod__", False):  # pragma: no cover - torch < 2.6
    # Older torch: the backend's public get/put are the abstract methods.
    TunecacheBackend.get = TunecacheBackend._get  # type: ignore[method-assign]
    TunecacheBackend.put = TunecacheBackend._put  # type: ignore[method-assign]


def backend_cls(kind: str, entries: InductorStore | None = None) -> Callable[[], Any]:
    """A backend class for Inductor cache ``kind`` (what ``backend_override_cls`` is set to)."""
    name = "Tunecache" + "".join(p.title() for p in kind.split("_")) + "Backend"
    return type(name, (TunecacheBackend,), {"kind": kind, "entries": entries})


__all__ = ["CACHE_CLASSES", "TunecacheBackend", "backend_cls"]
