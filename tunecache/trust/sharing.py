"""Sharing: whether what this process's Triton builds may leave the host.

Triton files a build under a key that covers the source, the target, the options and the
cache-invalidating environment (``get_cache_invalidating_env_vars``), but some of its knobs change
what a compile produces without entering that key: ``TRITON_KERNEL_OVERRIDE`` swaps in hand-edited
IR (``TRITON_OVERRIDE_DIR``), ``TRITON_KERNEL_DUMP`` adds version info to the LLVM IR it dumps,
``TRITON_MOCK_PTX_VERSION`` builds for a PTX version the host's ptxas does not have, a stage
inspection hook (``knobs.runtime.add_stages_inspection_hook``, proton's) rewrites the pipeline
(Triton 3.9 adds its key; older ones do not), and a sanitizer build
(``TRITON_INSTRUMENTATION_MODE``, an option only from 3.9). Such a build sits under the key every
other host computes for the stock build: filed in the store it would become the fleet's code.

So every path that hands a build of this process to the store asks :func:`builds_shareable`: the
Triton cache seam of torch.compile (:mod:`tunecache.inductor.tritoncache`), the tuner's binary
upload (:func:`tunecache.binaries.binaries.upload`), heal (:mod:`tunecache.tuner.heal`) and the
tuner's write of a miss's timings (measured on such builds, they would pick the fleet's winner). It is
asked after a compile or a tuning, never on the launch path; knobs set at run time count from then.
``TRITON_ALWAYS_COMPILE`` is not among them: it rebuilds the same bytes under the same key.

The Triton cache seam also asks :func:`unfiled_reason` of each kernel Triton puts into its cache:
bytes tunecache placed there (a stored binary or entry, :func:`not_built_here`) were not built by
this process and are never filed, nor signed, again; kernels compiled inside a benchmark
(tunecache's own, whose winners' binaries the tuner uploads itself, and the candidates of
Inductor's ``select_algorithm``, whose winner the stored graph bundles) are not what a fresh host
needs. Coordinate-descent variants are filed: torch re-runs that search at each start and a fresh
host compiles every variant it tries (the module docstring of :mod:`tunecache.inductor.tritoncache`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator

log = logging.getLogger("tunecache")

_said: set[str] = set()  # the reasons logged in this process (once each)
_local = threading.local()  # .why: what this thread writes into Triton's cache now, if not its own build

#: Inductor's modules that compile candidates only to benchmark them (max-autotune's select_algorithm).
_BENCHMARK_MODULES = ("/torch/_inductor/select_algorithm.py", "/torch/_inductor/autotune_process.py")


def unshared_reason() -> str | None:
    """Why this process's Triton builds must stay on this host; None if they may be shared."""
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover - tunecache needs Triton
        return None
    comp = getattr(knobs, "compilation", None)
    if getattr(comp, "override", False):
        return "TRITON_KERNEL_OVERRIDE is set (kernels built from the IR in TRITON_OVERRIDE_DIR)"
    if getattr(comp, "dump_ir", False):
        return "TRITON_KERNEL_DUMP is set (kernels built for dumping)"
    if getattr(getattr(knobs, "nvidia", None), "mock_ptx_version", None):
        return "TRITON_MOCK_PTX_VERSION is set"
    if getattr(getattr(knobs, "runtime", None), "add_stages_inspection_hook", None) is not None:
        return "a Triton stage inspection hook is set (knobs.runtime.add_stages_inspection_hook)"
    if getattr(comp, "instrumentation_mode", "") or os.environ.get("TRITON_INSTRUMENTATION_MODE"):
        return "TRITON_INSTRUMENTATION_MODE is set (an instrumented build)"
    return None


def builds_shareable() -> bool:
    """Whether this process's Triton builds may go to the store; says once per reason why not."""
    why = unshared_reason()
    if why is None:
        return True
    if why not in _said:
        _said.add(why)
        log.warning(
            "tunecache: %s: Triton's cache key does not cover it, so nothing this process builds is shared "
            "(no torch.compile Triton kernel entry, no binary, no launch spec healed, no timing of a miss); stored "
            "binaries are not placed into its Triton cache either",
            why,
        )
    return False


@contextlib.contextmanager
def not_built_here(why: str) -> Iterator[None]:
    """What this thread puts into Triton's cache inside is not a build to file: ``why`` says what it
    is ("placed from the store", "a tunecache benchmark")."""
    before = getattr(_local, "why", None)
    _local.why = why
    try:
        yield
    finally:
        _local.why = before


def unfiled_reason() -> str | None:
    """Why the kernel Triton just put into its cache on this thread is not filed in the store; None
    if it may be (after a compile, never on the launch path: it walks the stack)."""
    why = getattr(_local, "why", None)
    if why is not None:
        return str(why)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.replace(os.sep, "/").endswith(_BENCHMARK_MODULES):
            return "a candidate of Inductor's select_algorithm benchmark"
        frame = frame.f_back
    return None


__all__ = ["builds_shareable", "not_built_here", "unfiled_reason", "unshared_reason"]
