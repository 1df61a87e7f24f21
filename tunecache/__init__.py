"""tunecache: a shared, content-addressed store of Triton autotuning results.

    import tunecache
    @tunecache.autotune(configs=[...], key=["B", "N"], bucket={"B": tunecache.buckets.sglang})
    @triton.jit
    def kernel(...): ...

Restarts resolve every tuning key from the store (``TUNECACHE_URL``, default a per-user SQLite
file) instead of benchmarking. docs/ (the documentation site) says the modes, fleets and the CLI.
"""

from __future__ import annotations

__version__ = "0.1.0"

import tunecache.process.summary  # noqa: F401 - registers the TUNECACHE_SUMMARY line (at process end)
from tunecache import buckets
from tunecache.errors import (
    Busy,
    CaptureMissError,
    ConfigurationError,
    SchemaError,
    StoreError,
    StoreNotFoundError,
    StoreReadOnlyError,
    TunecacheError,
)
from tunecache.problem.model import ConfigResult, Problem
from tunecache.process.counters import coverage, preload_skips, reset_stats, stats
from tunecache.process.writeback import flush
from tunecache.store.opening import open_store
from tunecache.store.store import Store

__all__ = [
    "__version__",
    "autotune",
    "install",
    "uninstall",
    "open_store",
    "stats",
    "coverage",
    "preload_skips",
    "reset_stats",
    "flush",
    "buckets",
    "defer_busy",
    "Store",
    "Problem",
    "ConfigResult",
    "Busy",
    "CaptureMissError",
    "ConfigurationError",
    "SchemaError",
    "StoreError",
    "StoreNotFoundError",
    "StoreReadOnlyError",
    "TunecacheError",
    "TunecacheAutotuner",
    "load_winners",
]

# name -> the module that defines it
_LAZY = {
    "autotune": "tunecache.tuner.decorator",
    "install": "tunecache.tuner.decorator",
    "uninstall": "tunecache.tuner.decorator",
    "load_winners": "tunecache.tuner.decorator",
    "TunecacheAutotuner": "tunecache.tuner.autotuner",
    "current_mode": "tunecache.settings",
    "defer_busy": "tunecache.tuner.deferral",
}


def __getattr__(name: str):
    # Importing triton costs ~1 s; the CLI's export/import/ls never need it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tunecache' has no attribute {name!r}")
