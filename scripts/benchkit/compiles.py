"""Triton's compiles and cache hits during a bench's start, counted through Triton's own compilation
listener (Triton 3.4-3.9): in this process (:func:`listen`), or in every process of a start, compile
workers included, through a ``sitecustomize.py`` on the children's PYTHONPATH (:data:`HOOK`,
:func:`write_hook`) that appends one line per event to ``BENCH_COMPILE_LOG`` (:func:`events`)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

HOOK = r"""
# Written by scripts/benchkit/compiles.py: counts Triton compiles in every process of a start.
import os, sys

def _listener(*, src=None, metadata=None, metadata_group=None, times=None, cache_hit=False, **_):
    path = os.environ.get("BENCH_COMPILE_LOG")
    if path:
        md = metadata if isinstance(metadata, dict) else {}
        with open(path, "a") as f:  # pid, compile or hit, the kernel's name and its Triton key
            f.write(f"{os.getpid()} {'hit' if cache_hit else 'compile'} {md.get('name', '?')} {md.get('hash', '?')}\n")

class _Loader:
    def __init__(self, loader):
        self._loader = loader
    def create_module(self, spec):
        return self._loader.create_module(spec)
    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            import triton.knobs
            triton.knobs.compilation.listener = _listener
        except Exception as e:
            sys.stderr.write(f"bench hook: no compile listener: {e!r}\n")

class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "triton":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None

if os.environ.get("BENCH_COMPILE_LOG"):
    sys.meta_path.insert(0, _Finder())
if os.environ.get("BENCH_TUNECACHE_LOG"):  # tunecache's debug lines of every process (leases: who waits on what)
    import logging
    _h = logging.FileHandler(os.environ["BENCH_TUNECACHE_LOG"])
    _h.setFormatter(logging.Formatter("%(created).3f %(process)d %(message)s"))
    logging.getLogger("tunecache").addHandler(_h)
    logging.getLogger("tunecache").setLevel(logging.DEBUG)
if os.environ.get("TUNECACHE_INSTALL"):  # what tunecache-install.pth does in site-packages
    try:
        __import__("_tunecache_startup")
    except ImportError as e:
        sys.stderr.write(f"bench hook: tunecache start-up hook not importable: {e!r}\n")
"""


def write_hook(folder: Path) -> Path:
    """``folder``/sitecustomize.py holding :data:`HOOK`; put ``folder`` first on a child's PYTHONPATH.
    The hook also imports tunecache's start-up hook where TUNECACHE_INSTALL is set, as the .pth of a
    ``pip install tunecache`` would (a folder on PYTHONPATH processes no .pth file), and writes
    tunecache's debug lines to ``BENCH_TUNECACHE_LOG`` where that is set. It shadows a
    distribution's own sitecustomize, in stock and tunecache starts alike."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(HOOK)
    return folder


def events(log: Path, since: int = 0) -> list[list[str]]:
    """The hook's lines (``pid compile|hit name key``) written after byte ``since`` of ``log``: one
    start's, where a host restarted on its own caches appends to its log."""
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(since)
        return [ln.split() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]


def tally(evs: list[list[str]]) -> dict[str, Any]:
    """Compiles and cache hits of :func:`events`' lines, the processes that compiled, and the
    compiles per kernel name."""
    return {
        "compiles": sum(e[1] == "compile" for e in evs),
        "hits": sum(e[1] == "hit" for e in evs),
        "compiling_processes": len({e[0] for e in evs if e[1] == "compile"}),
        "compiled": dict(collections.Counter(e[2] for e in evs if e[1] == "compile" and len(e) > 2)),
    }


def listen() -> dict[str, dict[str, int]]:
    """Count Triton's compiles in this process from now on, per kernel name, cache hits apart:
    ``{"compiles": {...}, "cache_hits": {...}}`` (filled as they happen). Install it before the
    kernels a bench counts are defined; :func:`stop` ends it."""
    from triton import knobs

    seen: dict[str, dict[str, int]] = {"compiles": {}, "cache_hits": {}}

    def listener(src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        d = seen["cache_hits" if cache_hit else "compiles"]
        name = str(getattr(src, "name", "?"))
        d[name] = d.get(name, 0) + 1

    knobs.compilation.listener = listener
    return seen


def stop() -> None:
    """No more counting in this process (:func:`listen`'s listener removed)."""
    from triton import knobs

    knobs.compilation.listener = None
