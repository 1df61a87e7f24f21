"""The suite's pool of Inductor's C++ builds: what each CPU test host would otherwise compile with gcc.

On the CPU, Inductor turns a graph into C++ and builds it with gcc: about 12 s of a 20 s fresh start
of tests/inductor_prog.py, in every host of every torch.compile test, although no test is about gcc
(a GPU host builds Triton kernels, which tunecache serves as ``triton_kernel`` entries). A host program
(tests/inductor_prog.py, scripts/inductor_child.py) calls :func:`share` first: its Inductor cache
directory gets the builds the pool holds; while it runs, a build it is about to make is taken from
the pool where another host put it meanwhile, and each build it makes goes into the pool at once (a
fleet's hosts start together: one that waited for another's torch.compile entry finds that host's
builds, instead of every host of a cold fleet building the same C++), and at its end.

What is shared is exactly what Inductor would find on its own disk: a ``.cpp`` and its ``.so`` under
the name Inductor derives from the source and the compile command, so a build is only ever found by
the code it was built from. The FX graph, AOT autograd and autotune caches (what tunecache serves and
the tests count) are never shared. ``TEST_INDUCTOR_CPP_BUILDS`` names the pool (scripts/test: one per
run; conftest: one per pytest process otherwise); unset, nothing is shared. Not a TUNECACHE_ or
TORCHINDUCTOR_ name: the benches' hosts drop those from their environment.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

ENV = "TEST_INDUCTOR_CPP_BUILDS"
_SUFFIXES = (".cpp", ".so")


def _builds(root: Path) -> list[Path]:
    """The C++ builds under an Inductor cache directory: ``XX/NAME.cpp`` and ``XX/NAME.so`` (XX two
    characters of NAME), never fxgraph/, aotautograd/ or anything else there."""
    return [p for p in root.glob("??/*") if p.is_file() and p.suffix in _SUFFIXES and p.parent.name == p.name[1:3]]


def _copy_missing(src: Path, dst: Path, only: Path | None = None) -> int:
    """Copy ``src``'s builds (or ``only`` of them) to ``dst`` where ``dst`` lacks them, each file whole
    (written aside, then renamed: a process reading ``dst`` meanwhile never sees half a file); how many
    were copied."""
    n = 0
    for f in [only] if only is not None else _builds(src):
        to = dst / f.parent.name / f.name
        if not to.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            tmp = to.with_name(f".{uuid.uuid4().hex}.tmp")
            shutil.copy2(f, tmp)
            os.replace(tmp, to)
            n += 1
    return n


def seed(pool: Path, cache: Path) -> int:
    """Copy the pool's builds into an Inductor cache directory where missing; how many."""
    return _copy_missing(pool, cache)


def keep(cache: Path, pool: Path) -> int:
    """Add an Inductor cache directory's builds that the pool lacks; how many."""
    return _copy_missing(cache, pool)


def share() -> None:
    """In a host program, before torch.compile: seed this process's Inductor cache from the pool, take
    a build from the pool where another host put it meanwhile, and keep what it builds at once and at
    exit. Does nothing unless both the pool and TORCHINDUCTOR_CACHE_DIR are set."""
    pool, cache = os.environ.get(ENV), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not pool or not cache:
        return
    seed(Path(pool), Path(cache))
    atexit.register(keep, Path(cache), Path(pool))
    if _AtBuild.MODULE in sys.modules:
        _wrap(sys.modules[_AtBuild.MODULE], Path(pool), Path(cache))
    else:
        sys.meta_path.insert(0, _AtBuild(Path(pool), Path(cache)))


def _take(pool: Path, target: Path) -> bool:
    """Copy the pool's build of ``target`` (an Inductor ``XX/NAME.so``) to it where the pool has it."""
    found = pool / target.parent.name / target.name
    if not found.is_file():
        return False
    return _copy_missing(pool, target.parent.parent, only=found) > 0 or target.exists()


def _wrap(cpp_builder: Any, pool: Path, cache: Path) -> None:
    """Inductor's C++ build (``CppBuilder.build``: every build, the vector ISA checks' too) wrapped:
    where the pool holds the build's output under Inductor's name in this cache, it is taken from
    there; else it is built, and goes into the pool at once."""
    real = cpp_builder.CppBuilder.build
    root = cache.resolve()

    def build(self: Any) -> None:
        target = Path(self.get_target_file_path())
        named = target.suffix in _SUFFIXES and target.parent.name == target.name[1:3]
        if not (named and target.parent.parent.resolve() == root):
            return real(self)  # an intermediate object, or a build elsewhere: not the pool's
        if _take(pool, target):
            return None
        real(self)
        if target.is_file():
            _copy_missing(cache, pool, only=target)
        return None

    cpp_builder.CppBuilder.build = build


class _AtBuild(importlib.abc.MetaPathFinder):
    """Wraps ``torch._inductor.cpp_builder.CppBuilder.build`` (:func:`_wrap`) once the program imports
    that module, never earlier: finds nothing itself, wraps the loader the other finders give (as
    _tunecache_startup.py does), and leaves ``sys.meta_path`` once the module ran (a find_spec probe
    that imports nothing does not use it up)."""

    MODULE = "torch._inductor.cpp_builder"

    def __init__(self, pool: Path, cache: Path) -> None:
        self.pool, self.cache = pool, cache

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _AtBuild) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        _wrap(module, self.finder.pool, self.finder.cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
