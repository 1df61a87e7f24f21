"""The suite's pool of Inductor's C++ builds: what each CPU test host would otherwise compile with gcc.

On the CPU, Inductor turns a graph into C++ and builds it with gcc: about 12 s of a 20 s fresh start
of tests/inductor_prog.py, in every host of every torch.compile test, although no test is about gcc
(a GPU host builds Triton kernels, which tunecache serves as ``triton_kernel`` entries). A host program
(tests/inductor_prog.py, scripts/inductor_child.py) calls :func:`share` first: its Inductor cache
directory gets the builds the pool holds, and the builds it made go into the pool at its end.

What is shared is exactly what Inductor would find on its own disk: a ``.cpp`` and its ``.so`` under
the name Inductor derives from the source and the compile command, so a build is only ever found by
the code it was built from. The FX graph, AOT autograd and autotune caches (what tunecache serves and
the tests count) are never shared. ``TEST_INDUCTOR_CPP_BUILDS`` names the pool (scripts/test: one per
run; conftest: one per pytest process otherwise); unset, nothing is shared. Not a TUNECACHE_ or
TORCHINDUCTOR_ name: the benches' hosts drop those from their environment.
"""

from __future__ import annotations

import atexit
import os
import shutil
import uuid
from pathlib import Path

ENV = "TEST_INDUCTOR_CPP_BUILDS"
_SUFFIXES = (".cpp", ".so")


def _builds(root: Path) -> list[Path]:
    """The C++ builds under an Inductor cache directory: ``XX/NAME.cpp`` and ``XX/NAME.so`` (XX two
    characters of NAME), never fxgraph/, aotautograd/ or anything else there."""
    return [p for p in root.glob("??/*") if p.is_file() and p.suffix in _SUFFIXES and p.parent.name == p.name[1:3]]


def _copy_missing(src: Path, dst: Path) -> int:
    """Copy ``src``'s builds to ``dst`` where ``dst`` lacks them, each file whole (written aside, then
    renamed: a process reading ``dst`` meanwhile never sees half a file); how many were copied."""
    n = 0
    for f in _builds(src):
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
    """In a host program, before torch.compile: seed this process's Inductor cache from the pool and
    keep what it builds at exit. Does nothing unless both the pool and TORCHINDUCTOR_CACHE_DIR are set."""
    pool, cache = os.environ.get(ENV), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not pool or not cache:
        return
    seed(Path(pool), Path(cache))
    atexit.register(keep, Path(cache), Path(pool))
