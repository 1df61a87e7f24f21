"""Interpreter start-up hook of tunecache (``tunecache-install.pth`` imports this where
``TUNECACHE_INSTALL`` or ``TUNECACHE_INDUCTOR`` is set).

With ``TUNECACHE_INSTALL`` set, every Python process serves every Triton Autotuner it builds from the
store, with no code change: servers, their spawned tensor-parallel workers, scripts. This module
only puts a finder on ``sys.meta_path``; it never imports Triton, torch or tunecache. When something
imports ``triton``, the finder calls ``tunecache.install()`` right after Triton's package finished
initialising, before any library can build an Autotuner from it. When something imports
``torch._inductor.remote_cache`` (torch.compile's first compile), it calls
``tunecache.inductor.enable.activate()``, which makes the store the backend of Inductor's remote
caches if ``TUNECACHE_INDUCTOR`` says so: a process that never compiles never loads torch._inductor.
``TUNECACHE_INDUCTOR`` alone sets up only that second hook: torch.compile's caches come from the
store, Triton's Autotuners stay as they are (it did nothing at all before, silently: issue 44).

Unset (the default) they cost two environment lookups in the .pth line, which then imports nothing:
that line and the checks below are the only reads of a ``TUNECACHE_*`` variable outside
``tunecache.settings``, for speed (importing ``tunecache`` costs about 0.2 s; even importing this
module, ~2 ms), and tests/test_settings.py allows exactly these. The values are parsed by
``tunecache.settings`` when the hook runs: ``TUNECACHE_INSTALL=0`` installs nothing.
"""

from __future__ import annotations

import os
import sys

# No other import: ``typing`` alone would cost every Python process ~8 ms (measured: scripts/bench_library.py).


class _Loader:
    """The module's own loader, then its hook; every other attribute is the wrapped loader's."""

    def __init__(self, loader: object, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # the module keeps Triton's loader
        self._loader.exec_module(module)
        # Used up here, where the module ran, not when a finder was asked: ``importlib.util.find_spec``
        # probes (torch's logging, libraries checking for Triton) ask without importing.
        hook = _pending.pop(self._name, None)
        if not _pending:
            _remove()
        if hook is not None:
            hook()

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: wraps the loader of each watched module that the other finders find."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is _finder:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _Finder()
_pending: dict = {}  # module name -> the hook to run once it is imported


def _remove() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _install() -> None:
    """``tunecache.install()`` if ``TUNECACHE_INSTALL`` says so; a failure is logged, never raised:
    a broken start-up hook must not break every import of Triton.

    This runs inside whichever import reached Triton first, possibly a half-imported tunecache
    module (``from tunecache import autotune``): only ``tunecache.tuner.basepatch``, which needs no other
    tunecache module, is imported here, not ``tunecache.tuner.decorator``; the patch imports what it
    calls (:func:`_covering`) at its first call, once every import has finished."""
    try:
        from tunecache import settings
        from tunecache.tuner import basepatch

        if settings.usable() and settings.get("TUNECACHE_INSTALL"):  # a bad value: one warning, stock Triton
            basepatch.patch(load=_covering)
            _check_keys()
    except Exception as e:  # noqa: BLE001
        import logging

        logging.getLogger("tunecache").warning("tunecache: TUNECACHE_INSTALL: not installed: %r", e)


def _covering() -> None:
    """Import ``tunecache.tuner.adoption``, which hands the patch what it calls (``basepatch.cover``)."""
    import tunecache.tuner.adoption  # noqa: F401


def _check_keys() -> None:
    """A trusted-keys or signing-key file that cannot be read: one line now, at start, not at the
    first import or lookup (``tunecache.trust.signing`` needs only the settings). Never raises."""
    try:
        from tunecache.trust import signing

        signing.warn_key_files()
    except Exception as e:  # noqa: BLE001
        import logging

        logging.getLogger("tunecache").warning("tunecache: checking the key files failed: %r", e)


def _install_inductor() -> None:
    """``tunecache.inductor.enable.activate()`` (which reads ``TUNECACHE_INDUCTOR``); never raises."""
    try:
        from tunecache.inductor import enable

        enable.activate()
        _check_keys()
    except Exception as e:  # noqa: BLE001
        import logging

        logging.getLogger("tunecache").warning("tunecache: TUNECACHE_INDUCTOR: not enabled: %r", e)


def activate(triton: bool = True) -> None:
    """Install when Triton is imported (unless ``triton`` is False), and hook torch.compile's remote
    caches when Inductor's are (each at once if it is imported already)."""
    hooks = (("triton", _install),) if triton else ()
    for name, hook in (*hooks, ("torch._inductor.remote_cache", _install_inductor)):
        if name in sys.modules:
            hook()
        else:
            _pending[name] = hook
    if _pending and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


if os.environ.get("TUNECACHE_INSTALL"):
    activate()
elif os.environ.get("TUNECACHE_INDUCTOR"):
    activate(triton=False)
