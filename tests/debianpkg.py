"""What the tests' private servers share: a free loopback port, and Debian's package of a server
installed when missing (PgBouncer for tests/pgbouncer.py, Prometheus for tests/prometheusserver.py),
as CI runs on a fresh machine; elsewhere a clear error, and the test fails rather than skips."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

INSTALL_TIMEOUT_S = 600


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def found(binary: str) -> str | None:
    """``binary`` on PATH, or where Debian puts it (/usr/sbin, /usr/bin: root's PATH is not everyone's)."""
    return shutil.which(binary) or next(
        (f"{d}/{binary}" for d in ("/usr/sbin", "/usr/bin") if os.path.exists(f"{d}/{binary}")), None
    )


def ensure_installed(package: str, binary: str | None = None) -> str:
    """The path of ``binary`` (default: the package's name); installs Debian's ``package`` when it is
    missing, waiting up to INSTALL_TIMEOUT_S for another apt-get's dpkg lock. Raises RuntimeError."""
    binary = binary or package
    path = found(binary)
    if path:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"{binary} is not installed and cannot be installed here: apt-get install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:  # another apt-get may hold the dpkg lock for a while
        r = subprocess.run(
            ["apt-get", "install", "-y", "-qq", package], env=env, capture_output=True, text=True, timeout=300
        )
        if r.returncode == 0:
            break
        last = r.stderr[-1000:]
        if "Unable to locate package" in last:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        else:
            time.sleep(5)
    path = found(binary)
    if not path:
        raise RuntimeError(f"apt-get install {package} failed: {last}")
    return path
