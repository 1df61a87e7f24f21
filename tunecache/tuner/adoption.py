"""Every Autotuner of the process: what ``install()`` does to the Autotuners other code builds.

Libraries build autotuners that never go through ``triton.autotune``: their own subclasses of
Autotuner (fla's CachedAutotuner, with its own ``run`` that calls ``super().run``), constructed
directly. ``install()`` patches the base class's ``__init__`` and ``run`` with :func:`covering_init`
and :func:`covering_run`, which adopt every instance: its class becomes one with TunecacheAutotuner
between the library's class and Autotuner, so the library's own methods still run first and every
``super()`` call they make, and Triton's own calls of the hooks, reach tunecache. ``uninstall()``
:func:`release`\\ s them.

Kept apart from :mod:`tunecache.tuner.autotuner` (the hooks themselves), which knows nothing of this.
Importing this module hands :func:`covering_init` and :func:`covering_run` to the patch
(:func:`tunecache.tuner.basepatch.cover`), which lies below every module that uses it.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache import settings
from tunecache.problem.identity import kernel_name
from tunecache.process import counters
from tunecache.settings import current_mode
from tunecache.tuner import background, basepatch
from tunecache.tuner.autotuner import BASE_INIT, BASE_RUN, TunecacheAutotuner, attach, detach
from tunecache.tuner.firstcall import is_adopted, library_class, mark_adopted, report_uncovered, unmark_adopted

_covering: dict[type, type] = {}
_adopt_lock = threading.RLock()


def own_names() -> frozenset[str]:
    """The names a library's class must not define itself: those TunecacheAutotuner adds to
    Triton's Autotuner (its and its mixins' methods and class attributes, and the instance
    attributes it declares), derived from the class so that no list is kept by hand. Triton's own
    hooks (``run``, ``prune_configs``...) a library may override: its ``super()`` calls reach tunecache's."""
    ours = [k for k in TunecacheAutotuner.__mro__ if not issubclass(Autotuner, k)]  # with its mixins
    names = {n for k in ours for n in vars(k)} | set(inspect.get_annotations(TunecacheAutotuner))
    return frozenset(n for n in names if not (n.startswith("__") and n.endswith("__")) and not hasattr(Autotuner, n))


_OURS = own_names()


def covering_class(cls: type) -> type:
    """The class an instance of ``cls`` gets when adopted: TunecacheAutotuner for Triton's own
    Autotuner; for a library's subclass, one of the same name with TunecacheAutotuner under it
    (``cls``'s methods first, then tunecache's, then Triton's). Raises TypeError naming what
    stands in the way."""
    if issubclass(cls, TunecacheAutotuner):
        return cls
    if cls is Autotuner:
        return TunecacheAutotuner
    with _adopt_lock:
        got = _covering.get(cls)
        if got is None:
            clash = sorted({n for k in cls.__mro__ if not issubclass(Autotuner, k) for n in _OURS if n in vars(k)})
            if clash:
                raise TypeError(f"it defines {', '.join(clash)}, which tunecache's hooks use")
            ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_tc_library_class": cls}
            got = _covering[cls] = type(cls.__name__, (cls, TunecacheAutotuner), ns)
        return got


def adopt(tuner: Any) -> bool:
    """Make an Autotuner built by other code a tunecache one (once); False, reported, where its class
    cannot take tunecache's hooks."""
    with _adopt_lock:
        if isinstance(tuner, TunecacheAutotuner):
            return True
        if "_tc_declined" in vars(tuner):
            return False
        cls = type(tuner)
        try:
            tuner.__class__ = covering_class(cls)
        except TypeError as e:
            tuner._tc_declined = True
            report_uncovered(kernel_name(tuner.fn), cls, str(e))
            return False
        attach(tuner)
        mark_adopted(tuner)
        return True


def covering_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """``Autotuner.__init__`` while installed: Triton's own, then adoption (not in mode "off", nor
    while a setting is bad: a library's import never fails for tunecache's sake)."""
    BASE_INIT(self, *args, **kwargs)
    if isinstance(self, TunecacheAutotuner):
        return  # its own __init__ attaches
    if not settings.usable() or current_mode() == "off":
        self._tc_declined = True
        return
    adopt(self)


def covering_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Autotuner.run`` while installed. Reached only by instances not adopted at construction: built
    before ``install()`` (adopted now, mid-call, and served from here on) or declined (Triton's run)."""
    declined = "_tc_declined" in vars(self)
    if not declined and not settings.usable():
        self._tc_declined = declined = True  # Triton's own from now on, as in mode "off"
    if not declined and adopt(self):
        self.__dict__.pop("run", None)  # this call reached the base class: covered
        counters.kernel_seen(self._tc_name, library_class(self), covered=True)
        return TunecacheAutotuner.run(self, *args, **kwargs)
    return BASE_RUN(self, *args, **kwargs)


def release(tuner: Any) -> None:
    """Undo :func:`adopt` (``uninstall()``): Triton's class and ``cache_results`` back; in-memory
    resolutions (``cache``) stay, as Triton keeps them. Tunecache's private ``_tc_*`` state stays
    inert (a background prefetch may still hold it)."""
    with _adopt_lock:
        if not is_adopted(tuner):
            return
        cls = library_class(tuner)
        unmark_adopted(tuner)
        detach(tuner)
        tuner.__class__ = cls
        background.unregister(tuner)


basepatch.cover("__init__", covering_init)
basepatch.cover("run", covering_run)

__all__ = ["adopt", "covering_class", "covering_init", "covering_run", "release"]
