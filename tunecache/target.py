"""Target: the machine a result was measured on, detected without pynvml.

:func:`detect_target` describes the device (backend, arch, name, SM count, shared memory, warp size,
driver...), or a CPU target under the interpreter or without a GPU. :attr:`Target.digest` hashes
the fields that change timings (``DIGEST_TARGET_FIELDS``; :mod:`tunecache.identity` says why each
is there); :func:`hostname` names the host, which is not part of any key.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import socket
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tunecache import settings
from tunecache.errors import ConfigurationError
from tunecache.identity import DIGEST_VERSION, canonical_json, sha256_hex

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
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
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


def hostname() -> str:
    return settings.get("TUNECACHE_HOST_ID") or socket.gethostname()
