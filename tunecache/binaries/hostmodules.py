"""Host modules: the C extension modules Triton builds with the system's C compiler at first use.

Loading a cached kernel is not all a fresh host's Triton does before a launch. It also builds, with
gcc, and keeps in its cache directory: its driver utilities (``cuda_utils``, once per Triton install)
and, up to Triton 3.6, a launcher (``__triton_launcher``) for every distinct kernel signature. On the
H200 (Triton 3.6, GPU run S) those builds were most of what a fresh host with every binary placed
still spent before it was ready: the merge stage's launcher alone held its first launch 0.6 s.

So the tuning process also keeps these modules, as binaries of their own (backend ``"host"``): each
filed under the key Triton itself computes for it (``sha256(C source + platform_key())``, see
``triton.runtime.build.compile_module_from_src``), with metadata that names the module, the Python
extension suffix and the platform it was built for. A fresh host places one only where its own
Python and platform would look it up; Triton then loads it instead of building it, and if the module
does not load there (another C library, say) Triton logs it and builds it as it always did.

A host module is native code that every worker loads: it travels under the same rules as a kernel
binary (content hash, signed exports, :func:`tunecache.binaries.binaries.problems_of`), and only under the
two names Triton gives these modules.
"""

from __future__ import annotations

import hashlib
import json
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The modules Triton builds with the C compiler and keeps in its cache (nothing else is placed).
NAMES = ("__triton_launcher", "cuda_utils")
#: The ``ext`` of a host module's record, and the backend its metadata names.
EXT = "so"
BACKEND = "host"
_SUFFIX = re.compile(r"\.[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*\.so")


def ext_suffix() -> str:
    """This interpreter's extension-module suffix, which Triton appends to the module's name."""
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def _platform_key() -> Callable[[], str] | None:
    try:
        from triton.runtime import build
    except ImportError:  # pragma: no cover - every Triton from 3.4 to 3.9 has it
        return None
    return getattr(build, "platform_key", None)


def module_key(c_source: str) -> str | None:
    """The key under which Triton caches the module it builds from ``c_source``: its source and the
    platform, up to the Triton that still builds a launcher per signature (3.6). None where Triton
    keys its modules otherwise (3.9 adds the build's flags and library paths): nothing is recorded."""
    from triton.runtime import build

    platform_key = _platform_key()
    if platform_key is None or hasattr(build, "_get_cache_manager"):
        return None
    return hashlib.sha256((c_source + platform_key()).encode("utf-8")).hexdigest()


def _nvidia_driver() -> Any | None:
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return None
    return driver


def launcher_key(kernel: Any) -> str | None:
    """The cache key of the launcher Triton builds for the compiled ``kernel`` (a CompiledKernel),
    computed as ``CudaLauncher`` does; None where Triton builds none (3.7+ launch without one) or
    the kernel is not a CUDA one."""
    driver = _nvidia_driver()
    make_launcher = getattr(driver, "make_launcher", None)
    target = getattr(kernel.metadata, "target", None)
    if make_launcher is None or getattr(target, "backend", "cuda") != "cuda":
        return None
    src = kernel.src
    constants = src.constants if hasattr(src, "constants") else {}
    names = src.fn.arg_names
    constants = {((names.index(i),) if isinstance(i, str) else i): v for i, v in constants.items()}
    signature = dict(src.signature.items())
    tensordesc_meta = getattr(kernel.metadata, "tensordesc_meta", None)
    return module_key(make_launcher(constants, signature, tensordesc_meta))


def utils_key() -> str | None:
    """The cache key of Triton's CUDA driver utilities (built from its ``driver.c``)."""
    driver = _nvidia_driver()
    where = getattr(driver, "dirname", None)
    if where is None:
        return None
    try:
        return module_key(Path(where, "driver.c").read_text())
    except OSError:
        return None


def metadata(key: str, name: str) -> bytes:
    """A host module's metadata: what it is, and where it loads (its record's own, not Triton's)."""
    platform_key = _platform_key()
    md = {
        "hash": key,
        "host_module": name,
        "ext_suffix": ext_suffix(),
        "platform": platform_key() if platform_key else "",
        "target": {"backend": BACKEND},
    }
    return json.dumps(md, sort_keys=True).encode()


def file_name(name: str, md: dict[str, Any]) -> str:
    """The file Triton looks the module up under."""
    return f"{name}{md['ext_suffix']}"


def problems(name: str, md: dict[str, Any]) -> str | None:
    """Why a host module record must not be placed (its content hash is checked by the caller)."""
    if name not in NAMES:
        return f"{name!r} is not a module Triton builds"
    suffix = md.get("ext_suffix")
    if not isinstance(suffix, str) or len(suffix) > 64 or not _SUFFIX.fullmatch(suffix):
        return "its extension suffix is not a plain extension-module suffix"
    if not isinstance(md.get("platform"), str):
        return "its metadata names no platform"
    return None


def loads_here(md: dict[str, Any]) -> bool:
    """Would this host's Triton look the module up: the same extension suffix and platform."""
    platform_key = _platform_key()
    return md.get("ext_suffix") == ext_suffix() and platform_key is not None and md.get("platform") == platform_key()


__all__ = [
    "BACKEND",
    "EXT",
    "NAMES",
    "ext_suffix",
    "file_name",
    "launcher_key",
    "loads_here",
    "metadata",
    "module_key",
    "problems",
    "utils_key",
]
