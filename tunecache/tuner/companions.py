"""Companions: the plain ``@triton.jit`` kernels a process launches next to its tuned ones.

A library launches plain kernels (a merge stage, a recurrent step) beside its autotuned ones. A
restart that resolves every tuned kernel from the store and preloads their winners still pays each
plain kernel's first launch: Triton hashes its source, reads its binary and loads it (12 ms of
fla-core's 21 ms restart overhead on the H200 was one such kernel, run W). No code names them, so
tunecache watches Triton's ``jit_post_compile_hook``: Triton calls it once per specialisation it
compiles or loads, never on the launch path. Each plain kernel compiled in a process is filed as a
companion of the tuned kernel that process resolved last (:func:`tunecache.binaries.binaries.record_companions`,
in the background): stored, exported, placed and dropped with that kernel's results. The restart's
preload (:func:`load`) then loads them with the tuned kernel's winners. A tuned kernel's own compiles
go to :mod:`tunecache.tuner.heal` (a readwrite process watches them even with ``TUNECACHE_COMPANIONS=0``).

Observation only: the hook changes nothing Triton compiles or runs, chains to a hook that was set
before, and :func:`unwatch` (``uninstall()``) puts that one back. A preloaded companion goes through
the same checks as a winner (:func:`tunecache.binaries.preload.load`): a binary other than the recorded one
is dropped, never launched.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from tunecache import settings
from tunecache.binaries import binaries, preload
from tunecache.problem.identity import module_imported
from tunecache.problem.model import COMPANION_CONFIG, LaunchSpec
from tunecache.process import counters, forks
from tunecache.tuner import background, heal

log = logging.getLogger("tunecache")

_lock = threading.Lock()
# Keyed by id, never by the JITFunction: Triton hashes one by its ``cache_key``, which read while its
# module still imports freezes a key without the helpers defined below it (docs/reliability.md, Trust 1).
_tuned: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # under tunecache's tuners
_pending: dict[int, Any] = {}  # plain JITFunctions compiled since the last recording (ordered)
_last: weakref.ref[Any] | None = None  # the tuner whose key this process resolved last
_installed: list[Any] = []  # [the hook set before ours] while ours is set
_filing: list[bool] = [False]  # [whether plain kernels are filed (TUNECACHE_COMPANIONS)] while ours is set


def _knobs() -> Any | None:
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover - Triton < 3.4 has no knobs
        return None
    return getattr(knobs, "runtime", None)


def watch() -> None:
    """Start watching Triton's compiles (idempotent; when a tuner attaches): for plain kernels, and
    for the tuned kernels' compiles that :mod:`tunecache.tuner.heal` records."""
    runtime = _knobs()
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return
    with _lock:
        _filing[0] = bool(settings.get("TUNECACHE_COMPANIONS"))
        if _installed or not (_filing[0] or heal.enabled()):
            return
        _installed.append(runtime.jit_post_compile_hook)
        runtime.jit_post_compile_hook = _on_compile


def unwatch() -> None:
    """Put back the hook that was set before :func:`watch` (unless someone replaced ours since)."""
    runtime = _knobs()
    with _lock:
        if not _installed:
            return
        previous = _installed.pop()
        if runtime is not None and runtime.jit_post_compile_hook is _on_compile:
            runtime.jit_post_compile_hook = previous
        _pending.clear()


def watching() -> bool:
    runtime = _knobs()
    return runtime is not None and getattr(runtime, "jit_post_compile_hook", None) is _on_compile


def register_tuned(fn: Any) -> None:
    """``fn`` (an autotuner's kernel, maybe under Heuristics) is tuned: never a companion."""
    jf = preload.jit_function(fn)
    if jf is not None:
        _tuned[id(jf)] = jf


def _on_compile(**kwargs: Any) -> Any:
    """Triton's ``jit_post_compile_hook``: note a plain kernel's compile, or hand a tuned one's to
    :mod:`tunecache.tuner.heal` (a manual warm-up or a preload is not a launch). Cheap and never raises;
    the hook set before ours runs first."""
    previous = _installed[0] if _installed else None
    out = previous(**kwargs) if previous is not None else None
    try:
        info = kwargs.get("fn")
        jf = getattr(info, "jit_function", None)
        if jf is None or kwargs.get("is_manual_warmup"):
            return out
        if _tuned.get(id(jf)) is jf:
            heal.compiled(jf)  # a stored winner's binary under a Triton key the store may lack
        elif _filing[0]:
            with _lock:
                _pending[id(jf)] = jf
                tuner = _last() if _last is not None else None
            if tuner is not None:
                background.submit(functools.partial(_record, tuner))
    except Exception as e:  # noqa: BLE001 - must never fail a compile
        log.debug("tunecache: companion not noted: %r", e)
    return out


def resolved(tuner: Any) -> None:
    """``tuner`` resolved a tuning key (a miss, never the launch path): plain kernels compiled from
    now on, and those compiled before any tuner resolved, are filed with it."""
    global _last
    with _lock:
        _last = weakref.ref(tuner)
        waiting = bool(_pending)
    if waiting:
        try:
            background.submit(functools.partial(_record, tuner))
        except RuntimeError:  # the interpreter is shutting down: nothing is filed, nothing fails
            pass


def _record(tuner: Any) -> None:
    """Background: file every pending plain kernel's specialisations with ``tuner``'s kernel."""
    with _lock:
        jfs = list(_pending.values())
        _pending.clear()
    if not jfs:
        return
    try:
        store = tuner.companion_store()
        if store is None or store.readonly:
            return
        n = binaries.record_companions(tuner, *jfs, store=store)
        log.debug(
            "tunecache: %s: %d plain kernels filed as companions (%d binaries new)", tuner.kernel_name, len(jfs), n
        )
    except Exception as e:  # noqa: BLE001 - best effort: their first launch loads them as before
        log.debug("tunecache: companions of %s not recorded: %r", getattr(tuner, "kernel_name", tuner), e)


def find(name: str) -> Any | None:
    """The JITFunction Triton names ``name`` (``module.qualname``), if its module is imported (never
    imports one) and finished importing (its source may be hashed on this thread)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        obj: Any = mod
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        jf = preload.jit_function(obj) if obj is not None else None
        if jf is not None and getattr(jf, "_fn_name", None) == name and module_imported(jf):
            return jf
    return None


def may_appear(name: str) -> bool:
    """Whether the kernel Triton names ``name`` may still be defined in this process: its library is
    imported, and its module is not, or still imports. False for a library this process never
    imported, and for a module that finished importing without it (a renamed kernel)."""
    parts = name.split(".")
    if parts[0] not in sys.modules:
        return False
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        spec = getattr(mod, "__spec__", None)
        if spec is None or getattr(spec, "_initializing", True) is not False:
            return True  # still importing
        return i < len(parts) - 1  # a package imported: the kernel's module may be imported later
    return True


def load(specs: Iterable[LaunchSpec], device: int) -> tuple[int, int]:
    """Preload the companion kernels among ``specs`` onto ``device``; returns (loaded, skipped).
    Host modules (also companions) are left alone. A kernel whose module has not finished importing
    (a library that touches CUDA while it imports) is tried again in the background, as a tuned
    kernel's preload is (``background.retry``), and counted in ``stats()`` when it loads."""
    by_name = _by_name(specs)
    loaded, skipped, waiting = _load(by_name, device)
    if waiting:
        background.retry(functools.partial(_load_later, waiting, device))
    return loaded, skipped


def _load_later(waiting: dict[str, list[LaunchSpec]], device: int) -> bool:
    loaded, _, still = _load(waiting, device)
    if loaded:
        counters.count(None, None, preloaded=loaded)  # skips: counted by reason in preload.load
    waiting.clear()
    waiting.update(still)
    return not waiting


def _load(by_name: dict[str, list[LaunchSpec]], device: int) -> tuple[int, int, dict[str, list[LaunchSpec]]]:
    loaded = skipped = 0
    waiting = {}
    for name, mine in by_name.items():
        jf = find(name)
        if jf is None:
            if may_appear(name):
                waiting[name] = mine
            continue
        n, k = preload.load(jf, mine, device)
        loaded, skipped = loaded + n, skipped + k
    return loaded, skipped, waiting


def _by_name(specs: Iterable[LaunchSpec]) -> dict[str, list[LaunchSpec]]:
    by_name: dict[str, list[LaunchSpec]] = {}
    for s in specs:
        if s.config_hash != COMPANION_CONFIG:
            continue
        try:
            name = json.loads(s.spec_json).get("name")
        except ValueError:
            continue
        if isinstance(name, str):
            by_name.setdefault(name, []).append(s)
    return by_name


def fork_locks() -> dict[str, Any]:
    """This module's lock, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"companions.lock": _lock}


def _after_fork_in_child() -> None:
    # A lock a parent's thread held at the fork would stay taken in the child, and a launch that
    # resolves a key takes it. The parent's pending kernels are the parent's to file.
    global _lock
    _lock = threading.Lock()
    _pending.clear()


forks.register(__name__, _after_fork_in_child)


def forget() -> None:
    """Forget what this process noted (for tests)."""
    global _last
    with _lock:
        _pending.clear()
        _last = None
