"""The first call of every tunecache Autotuner: does it reach tunecache's hooks?

A library's subclass of Triton's Autotuner may override ``run`` and return without calling
``Autotuner.run`` (its own cache, its own benchmark): then none of tunecache's hooks run, and the
kernel is silently not served. So the first call of each instance is observed (:class:`FirstCall`),
and such a kernel is counted in ``tunecache.coverage()`` as uncovered, warned about once, and its
first key recorded as a miss with reason ``uncovered``.

Kept apart from :mod:`tunecache.tuner.autotuner` (Triton's hooks, which set a :class:`FirstCall` on every
instance) and :mod:`tunecache.tuner.adoption` (``install()``, which builds on the autotuner): both need
it, and both need to name the class a tuner stands for (:func:`library_class`), which depends on
whether ``install()`` adopted it (:func:`mark_adopted`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache.process import counters

_adopted: weakref.WeakSet[Any] = weakref.WeakSet()  # adopted by install(): uninstall() releases them
_NOT_ENTERED = object()  # a first call's mark in ``nargs``, which Autotuner.run replaces at once


def mark_adopted(tuner: Any) -> None:
    """Record that ``install()`` adopted ``tuner`` (a plain Autotuner then stands for Autotuner)."""
    _adopted.add(tuner)


def unmark_adopted(tuner: Any) -> None:
    _adopted.discard(tuner)


def is_adopted(tuner: Any) -> bool:
    return tuner in _adopted


def adopted() -> list[Any]:
    """The Autotuners ``install()`` adopted and ``uninstall()`` would release."""
    return list(_adopted)


def library_class(tuner: Any) -> type:
    """The class ``tuner`` stands for: the library's class of an adopted instance (Triton's
    ``Autotuner`` for one that was a plain Autotuner), else its own class.

    An adopted instance's class is TunecacheAutotuner (it was a plain Autotuner) or a covering
    class that names the library's class in ``_tc_library_class``.
    """
    cls = type(tuner)
    return vars(cls).get("_tc_library_class", Autotuner if tuner in _adopted else cls)


class FirstCall:
    """An instance's first call, set as its ``run`` when tunecache's state is attached (removed at
    once): observes whether the call reached ``Autotuner.run``, i.e. tunecache's hooks. A subclass
    whose ``run`` returns without it is reported once, as ``name``, with why; ``on_uncovered(args,
    kwargs)`` then records the call's key. Given what it needs, so it reads no private attribute."""

    def __init__(self, tuner: Any, name: str, on_uncovered: Callable[[Any, Any], None]) -> None:
        self.tuner = tuner
        self.name = name
        self.on_uncovered = on_uncovered

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tuner = self.tuner
        if tuner.__dict__.pop("run", None) is None:  # another thread is observing the first call
            return tuner.run(*args, **kwargs)
        tuner.nargs = _NOT_ENTERED  # Autotuner.run sets nargs first thing
        ok = False
        try:
            out = tuner.run(*args, **kwargs)
            ok = True
            return out
        finally:
            entered = tuner.nargs is not _NOT_ENTERED
            if not entered:
                tuner.nargs = None
            if entered:
                counters.kernel_seen(self.name, library_class(tuner), covered=True)
            elif ok:
                cls = library_class(tuner)
                why = f"{cls.__module__}.{cls.__qualname__}.run returned without calling Autotuner.run"
                report_uncovered(self.name, cls, why)
                self.on_uncovered(args, kwargs)
            else:  # failed before reaching the base class: observe the next call
                tuner.__dict__.setdefault("run", self)


def report_uncovered(name: str, cls: type, why: str) -> None:
    """Count ``name`` as not served by tunecache in ``tunecache.coverage()``, and warn once."""
    counters.kernel_seen(name, cls, covered=False, why=why)
    counters.warn_once(
        name,
        "uncovered",
        "tunecache: %s (%s): not served by tunecache: %s. Its configs are chosen and benchmarked as "
        "that class does, and nothing is stored for it.",
        name,
        cls.__qualname__,
        why,
    )
