"""Target: the machine a result was measured on, detected without pynvml.

:func:`detect_target` describes the device (backend, arch, name, SM count, shared memory, warp size,
driver...), or a CPU target under the interpreter or without a GPU. :attr:`Target.digest` hashes
the fields that change timings (``DIGEST_TARGET_FIELDS``; :mod:`tunecache.problem.identity` says why each
is there); :func:`hostname` names the host, which is not part of any key.

:func:`machine_target` finds the same target without importing torch or Triton (about 2 s), for
commands that only show it or decide whether a GPU is there (``tunecache info``, ``demo``, ``warm``).
"""

from __future__ import annotations

import ast
import ctypes
import functools
import importlib.util
import os
import platform
import socket
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from tunecache import settings
from tunecache.errors import ConfigurationError
from tunecache.problem.identity import DIGEST_VERSION, canonical_json, sha256_hex

#: Target fields that enter the problem digest (see the module docstring for why).
DIGEST_TARGET_FIELDS = (
    "backend",
    "arch",
    "device_name",
    "sm_count",
    "max_shared_mem",
    "warp_size",
    "driver_version",
    "driver_release",
    "triton_version",
)


@dataclass(frozen=True)
class Target:
    backend: str  # cuda | hip | cpu (the interpreter)
    arch: str  # sm90, gfx942, interpreter
    device_name: str
    sm_count: int
    max_shared_mem: int
    warp_size: int
    driver_version: str  # numeric, e.g. "13000" from cuDriverGetVersion
    driver_release: str  # e.g. "580.159.04" from /proc/driver/nvidia/version
    cuda_runtime: str
    triton_version: str  # major.minor

    def digest_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DIGEST_TARGET_FIELDS}

    @functools.cached_property
    def digest(self) -> str:
        """Hash of the timing-relevant fields: problems of one kernel on one target share it."""
        return sha256_hex(canonical_json({"v": DIGEST_VERSION, **self.digest_fields()}))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TARGET_FIELDS = tuple(f.name for f in fields(Target))


def _triton_minor() -> str:
    try:
        import triton

        parts = triton.__version__.split(".")
        return ".".join(parts[:2])
    except Exception:  # noqa: BLE001 - no Triton: still describe the machine
        return "none"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _cuda_driver_version() -> str:
    cuda = _libcuda()
    v = ctypes.c_int(0)
    if cuda is not None and cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
        return str(v.value)
    return ""


def _nvidia_release() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return ""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..."
    for tok in text.split():
        if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
            return tok
    return ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _apply_override(t: Target) -> Target:
    """``TUNECACHE_TARGET_OVERRIDE`` (a JSON object) replaces detected fields.

    For simulations and tests (e.g. "what does a driver upgrade miss?"), never for production.
    """
    data = settings.get("TUNECACHE_TARGET_OVERRIDE")
    if not data:
        return t
    unknown = set(data) - set(TARGET_FIELDS)
    if unknown:
        raise ConfigurationError(
            f"TUNECACHE_TARGET_OVERRIDE has unknown fields {sorted(unknown)}; known: {TARGET_FIELDS}"
        )
    fields = {}
    for k, v in data.items():
        kind = type(getattr(t, k))
        try:
            fields[k] = kind(v)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"TUNECACHE_TARGET_OVERRIDE field {k!r} must be {kind.__name__}, not {str(v)[:40]!r}"
            ) from None
    return replace(t, **fields)


def detect_target(device: int | None = None) -> Target:
    """Describe the device tuning runs on; a CPU target under the interpreter or without a GPU."""
    return _apply_override(_detect(device, interpreting()))


@functools.lru_cache(maxsize=16)
def _detect(device: int | None, interp: bool) -> Target:
    triton_version = _triton_minor()
    torch = None
    if not interp:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    if torch is not None and torch.cuda.is_available():
        dev = torch.cuda.current_device() if device is None else device
        props = torch.cuda.get_device_properties(dev)
        hip = getattr(torch.version, "hip", None)
        max_smem = 0
        try:
            from triton.runtime.driver import driver

            max_smem = int(driver.active.utils.get_device_properties(dev)["max_shared_mem"])
        except Exception:  # noqa: BLE001 - fall back to torch's (non opt-in) figure
            max_smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
        if hip:
            return Target(
                backend="hip",
                arch=str(getattr(props, "gcnArchName", "gfx")).split(":")[0],
                device_name=props.name,
                sm_count=int(props.multi_processor_count),
                max_shared_mem=max_smem,
                warp_size=int(getattr(props, "warp_size", 64) or 64),
                driver_version=str(hip),
                driver_release="",
                cuda_runtime=str(hip),
                triton_version=triton_version,
            )
        return Target(
            backend="cuda",
            arch=f"sm{props.major}{props.minor}",
            device_name=props.name,
            sm_count=int(props.multi_processor_count),
            max_shared_mem=max_smem,
            warp_size=int(getattr(props, "warp_size", 32) or 32),
            driver_version=_cuda_driver_version(),
            driver_release=_nvidia_release(),
            cuda_runtime=str(torch.version.cuda or ""),
            triton_version=triton_version,
        )
    return _cpu_target(triton_version)


def _cpu_target(triton_version: str) -> Target:
    """This machine's CPU: kernels run under the Triton interpreter."""
    return Target(
        backend="cpu",
        arch="interpreter",
        device_name=_cpu_name(),
        sm_count=os.cpu_count() or 1,
        max_shared_mem=0,
        warp_size=1,
        driver_version="",
        driver_release="",
        cuda_runtime="",
        triton_version=triton_version,
    )


def machine_target() -> Target:
    """The target :func:`detect_target` finds in a process of this machine, without importing torch
    or Triton: Triton's version read from its package's source, torch's build (CPU, CUDA or ROCm)
    from its ``version.py``, and the GPU's fields from the CUDA driver through ctypes, the attributes
    torch's and Triton's device properties come from (device 0, a fresh process's current device).
    Where that cannot be told so (a ROCm build, a driver call that fails), it is :func:`detect_target`."""
    return _apply_override(_machine(interpreting()))


def gpu_visible() -> bool:
    """Whether torch finds a GPU here (``torch.cuda.is_available()``), told without importing torch."""
    return _machine(False).backend != "cpu"


@functools.lru_cache(maxsize=2)
def _machine(interp: bool) -> Target:
    triton_version = _source_value("triton", "__init__.py", "__version__")
    if triton_version is None:
        triton_version = _triton_minor()  # no source to read (a zipped or frozen Triton): import it
    elif triton_version != "none":
        triton_version = ".".join(triton_version.split(".")[:2])
    if interp or importlib.util.find_spec("torch") is None:
        return _cpu_target(triton_version)
    if _source_value("torch", "version.py", "hip") not in (None, "none"):
        return _detect(None, interp)  # ROCm: no driver read here, torch says
    runtime = _source_value("torch", "version.py", "cuda")
    if runtime in (None, "none"):
        return _cpu_target(triton_version)  # a CPU build of torch: torch.cuda.is_available() is False
    try:
        found = _cuda_device(runtime)
    except _Unreadable:
        return _detect(None, interp)
    if found is None:
        return _cpu_target(triton_version)
    return Target(
        backend="cuda",
        **found,
        driver_version=_cuda_driver_version(),
        driver_release=_nvidia_release(),
        cuda_runtime=runtime,
        triton_version=triton_version,
    )


def _source_value(package: str, filename: str, name: str) -> str | None:
    """The value assigned to ``name`` at the top of ``package``'s ``filename``, read without importing
    the package: "none" where the package is not installed or the value is None; None where it
    cannot be read so."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return "none"
    if spec is None:
        return "none"
    for root in spec.submodule_search_locations or ():
        try:
            tree = ast.parse(Path(root, filename).read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError):  # not a literal: cannot be read so
                    return None
                return "none" if value is None else str(value)
    return None


_CU_ATTRS = {"warp_size": 10, "sm_count": 16, "major": 75, "minor": 76, "smem_optin": 97, "smem_oversized": 150}


class _Unreadable(Exception):
    """The driver did not answer a call that should not fail: torch is asked instead."""


def _cuda_device(runtime: str) -> dict[str, Any] | None:
    """Device 0 as torch and Triton see it, from libcuda: its fields; None where torch finds no GPU
    (no driver, no device, or a driver older than torch's CUDA major version ``runtime``)."""
    cuda = _libcuda()
    if cuda is None:
        return None
    n, version, dev = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
        return None
    try:
        major = int(runtime.split(".")[0])
    except ValueError:
        raise _Unreadable(runtime) from None
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value // 1000 < major:
        return None
    name = ctypes.create_string_buffer(256)
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cuda.cuDeviceGetName(name, len(name), dev) != 0:
        raise _Unreadable("device 0")
    attrs = {}
    for key, attr in _CU_ATTRS.items():
        v = ctypes.c_int(0)
        if cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) != 0:
            if key == "smem_oversized":
                continue  # an older driver: only sm107 reads it
            raise _Unreadable(key)
        attrs[key] = v.value
    # Triton's get_device_properties: the oversized figure on sm107, the opt-in one elsewhere.
    smem_key = "smem_oversized" if (attrs["major"], attrs["minor"]) == (10, 7) else "smem_optin"
    if smem_key not in attrs:
        raise _Unreadable(smem_key)
    return {
        "arch": f"sm{attrs['major']}{attrs['minor']}",
        "device_name": name.value.decode(errors="replace"),
        "sm_count": attrs["sm_count"],
        "max_shared_mem": attrs[smem_key],
        "warp_size": attrs["warp_size"],
    }


def _libcuda() -> Any:
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(lib)
        except OSError:
            continue
    return None


def hostname() -> str:
    return settings.get("TUNECACHE_HOST_ID") or socket.gethostname()
