"""Enable: make tunecache the backend of torch.compile's remote caches, and turn those caches on.

The seam is each cache class's ``backend_override_cls`` (torch >= 2.5): a class attribute Inductor
reads whenever it builds a remote cache, whichever code path builds it, with no subclass or module
attribute of torch replaced. A cache the user turned off (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=0``,
``torch._inductor.config.fx_graph_remote_cache = False``...) stays off: only the unset ones (None,
torch's default) are turned on, and only for the caches whose backend was set here, except the
bundled autotune cache (:data:`SWITCHED_ON` says why), which is backed but left as the user set it.

With ``TUNECACHE_INSTALL`` and ``TUNECACHE_INDUCTOR`` set, the start-up hook calls :func:`activate`
when a process first imports ``torch._inductor.remote_cache`` (Inductor's compile workers too);
processes that never compile never import torch._inductor because of tunecache.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tunecache import settings
from tunecache.inductor import leases
from tunecache.inductor.entries import InductorStore, default

log = logging.getLogger("tunecache")

#: The config switch (module, attribute) that turns each cache on.
SWITCHES = {
    "autotune": ("torch._inductor.config", "autotune_remote_cache"),
    "bundled_autotune": ("torch._inductor.config", "bundled_autotune_remote_cache"),
    "fx_graph": ("torch._inductor.config", "fx_graph_remote_cache"),
    "aot_autograd": ("torch._functorch.config", "enable_remote_autograd_cache"),
}

#: The caches enable() turns on where unset. Not the bundled autotune cache: Inductor puts a graph's
#: bundle when the graph is compiled, before coordinate-descent tuning at the first launch changes
#: some kernels' best configs, and a bundle hit then hands a fresh host the pre-search configs (so it
#: searches again: run AS, docs/benchmarks/torch-compile.md); the per-kernel autotune entries are put after that
#: search. Its switch is also part of Inductor's FX graph key, which then differs from stock's. A
#: user who turns it on gets it backed by the store all the same.
SWITCHED_ON = ("autotune", "fx_graph", "aot_autograd")

_switched: dict[tuple[str, str], Any] = {}  # the switches enable() turned on, and their values before


def enable(entries: InductorStore | None = None, *, switch_on: bool = True) -> list[str]:
    """Make tunecache the backend of every Inductor remote cache this torch has; with ``switch_on``,
    turn on those not set either way. With ``TUNECACHE_INDUCTOR_KERNELS`` (the default), Triton's
    compile cache in this process is backed by the store too (:mod:`tunecache.inductor.tritoncache`).
    Returns the kinds of cache now backed by tunecache (empty on a
    torch without the seam, < 2.5, which is logged)."""
    import importlib

    from torch._inductor import remote_cache

    from tunecache.inductor.backend import CACHE_CLASSES, backend_cls

    done = []
    for cls_name, kind in CACHE_CLASSES.items():
        cls = getattr(remote_cache, cls_name, None)
        if cls is None or not hasattr(cls, "backend_override_cls"):
            continue
        cls.backend_override_cls = backend_cls(kind, entries)
        done.append(kind)
        module, attr = SWITCHES[kind]
        if switch_on and kind in SWITCHED_ON:
            try:
                config = importlib.import_module(module)
            except ImportError:  # pragma: no cover - a torch without it
                continue
            if getattr(config, attr, False) is None:
                _switched.setdefault((module, attr), None)
                setattr(config, attr, True)
    if done:
        leases.watch_compiles()  # a lease taken in a compile ends with it (see tunecache.inductor.leases)
    if done:  # the store opened while torch traces, not at the first lookup of the compile
        warm = (entries or default()).warm
        threading.Thread(target=warm, name="tunecache-inductor-warm", daemon=True).start()
    if done and settings.get("TUNECACHE_INDUCTOR_KERNELS"):
        from tunecache.inductor import tritoncache

        tritoncache.install(entries)
    if not done:
        import torch

        log.warning(
            "tunecache: TUNECACHE_INDUCTOR: torch %s has no remote cache backend seam (torch >= 2.5 has); "
            "torch.compile runs without tunecache",
            torch.__version__,
        )
    return done


def disable() -> None:
    """Undo :func:`enable` (tests): torch's own backends, and the switches it turned on unset again."""
    import importlib

    from torch._inductor import remote_cache

    from tunecache.inductor.backend import CACHE_CLASSES

    for cls_name in CACHE_CLASSES:
        cls = getattr(remote_cache, cls_name, None)
        # Only ours (they have a kind), not a test's mock.
        if cls is not None and getattr(getattr(cls, "backend_override_cls", None), "kind", None):
            cls.backend_override_cls = None
    from tunecache.inductor import tritoncache

    tritoncache.uninstall()
    for (module, attr), before in list(_switched.items()):
        setattr(importlib.import_module(module), attr, before)
    _switched.clear()


def activate() -> None:
    """What the start-up hook runs when torch._inductor.remote_cache is imported: :func:`enable` if
    ``TUNECACHE_INDUCTOR`` says so. Never raises (a bad setting: one warning, stock Inductor)."""
    try:
        if settings.usable() and settings.get("TUNECACHE_INDUCTOR"):
            enable()
    except Exception as e:  # noqa: BLE001 - a broken hook must not break torch.compile
        log.warning("tunecache: TUNECACHE_INDUCTOR: not enabled: %r", e)


__all__ = ["SWITCHES", "activate", "disable", "enable"]
