"""The patch ``install()`` puts on Triton's ``Autotuner`` base class (its ``__init__`` and ``run``).

The start-up hook (``_tunecache_startup``) applies it right after Triton's package finished
initialising, from inside whichever import reached Triton first: possibly a tunecache module
that is itself half-imported (``from tunecache import autotune`` imports Triton from
``tunecache.tuner.decorator``). So this module imports nothing of tunecache's, and nothing of Triton's
at import time; the patched methods find :func:`tunecache.tuner.adoption.covering_init` and
``covering_run`` at their first call, when every import has finished.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

#: Held while the patch is applied or removed (``uninstall()`` holds it while it releases tuners too).
LOCK = threading.RLock()
_MISSING = object()
_replaced: dict[str, Any] = {}  # name -> what Autotuner's own __dict__ held (restored by restore())
_triton: dict[str, Callable[..., Any]] = {}  # name -> Triton's own method, as first found
_covering: dict[str, Callable[..., Any]] = {}  # name -> tunecache.tuner.adoption's covering_*, once imported
NAMES = ("__init__", "run")


def _autotuner() -> type:
    from triton.runtime.autotuner import Autotuner

    return Autotuner


def original(name: str) -> Callable[..., Any]:
    """Triton's own ``Autotuner.<name>``, patched or not: what tunecache's own calls go to."""
    with LOCK:
        return _triton.get(name) or getattr(_autotuner(), name)


def _resolve(name: str) -> Callable[..., Any]:
    from tunecache.tuner import adoption

    fn = _covering[name] = getattr(adoption, "covering_" + name.strip("_"))
    return fn


def _patched(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    """``base``'s stand-in, looking like it (name, docstring, signature, ``__wrapped__``) to code
    that inspects it; one dict lookup more than the covering function itself."""

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return (_covering.get(name) or _resolve(name))(self, *args, **kwargs)

    functools.update_wrapper(patched, base)
    return patched


def patch() -> None:
    """Patch ``Autotuner.__init__`` and ``run`` (idempotent)."""
    autotuner = _autotuner()  # outside the lock: this import may run the start-up hook, which patches
    with LOCK:
        if _replaced:
            return
        for name in NAMES:
            base = getattr(autotuner, name)
            _triton.setdefault(name, base)
            _replaced[name] = autotuner.__dict__.get(name, _MISSING)
            setattr(autotuner, name, _patched(name, base))


def restore() -> bool:
    """Put Autotuner's own ``__init__`` and ``run`` back (the very objects); False if not patched."""
    with LOCK:
        if not _replaced:
            return False
        autotuner = _autotuner()
        for name, base in _replaced.items():
            if base is _MISSING:
                delattr(autotuner, name)
            else:
                setattr(autotuner, name, base)
        _replaced.clear()
        return True


def patched() -> bool:
    return bool(_replaced)


__all__ = ["LOCK", "NAMES", "original", "patch", "patched", "restore"]
