"""The patch ``install()`` puts on Triton's ``Autotuner`` base class (its ``__init__`` and ``run``).

The start-up hook (``_tunecache_startup``) applies it right after Triton's package finished
initialising, from inside whichever import reached Triton first: possibly a tunecache module
that is itself half-imported (``from tunecache import autotune`` imports Triton from
``tunecache.tuner.decorator``). So this module imports nothing of tunecache's, and nothing of Triton's
at import time. It is the bottom of the tuner, never a caller of what is above it: what the patched
methods call, :func:`tunecache.tuner.adoption.covering_init` and ``covering_run``, is handed to
:func:`cover` when that module is imported. The start-up hook, which cannot import it yet, hands
:func:`patch` a function that imports it, called at the first patched call that finds nothing covering it.
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
_covering: dict[str, Callable[..., Any]] = {}  # name -> what cover() was handed (adoption's covering_*)
_load: list[Callable[[], object]] = []  # what patch() was handed to import the module that covers them
NAMES = ("__init__", "run")


class NotCoveredError(LookupError):
    """A patched method was called with nothing to call: neither :func:`cover` nor ``patch(load=...)`` ran."""


def _autotuner() -> type:
    from triton.runtime.autotuner import Autotuner

    return Autotuner


def original(name: str) -> Callable[..., Any]:
    """Triton's own ``Autotuner.<name>``, patched or not: what tunecache's own calls go to."""
    with LOCK:
        return _triton.get(name) or getattr(_autotuner(), name)


def cover(name: str, fn: Callable[..., Any]) -> None:
    """What the patched ``Autotuner.<name>`` calls (with the instance and the call's arguments)."""
    if name not in NAMES:
        raise ValueError(f"Autotuner.{name} is not patched (only {', '.join(NAMES)})")
    _covering[name] = fn


def _resolve(name: str) -> Callable[..., Any]:
    """The covering function of a patched call made before :func:`cover`: loaded now."""
    for load in list(_load):
        load()
    fn = _covering.get(name)
    if fn is None:
        raise NotCoveredError(f"tunecache: Autotuner.{name} is patched, but nothing covers it")
    return fn


def _patched(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    """``base``'s stand-in, looking like it (name, docstring, signature, ``__wrapped__``) to code
    that inspects it; one dict lookup more than the covering function itself."""

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return (_covering.get(name) or _resolve(name))(self, *args, **kwargs)

    functools.update_wrapper(patched, base)
    return patched


def patch(load: Callable[[], object] | None = None) -> None:
    """Patch ``Autotuner.__init__`` and ``run`` (idempotent). ``load``: imports what will :func:`cover`
    them, called at the first patched call that finds nothing there (the start-up hook's, which runs
    inside Triton's import, where tunecache's own modules may be half-imported)."""
    autotuner = _autotuner()  # outside the lock: this import may run the start-up hook, which patches
    with LOCK:
        if load is not None and load not in _load:
            _load.append(load)
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


__all__ = ["LOCK", "NAMES", "NotCoveredError", "cover", "original", "patch", "patched", "restore"]
