"""Dependencies that may be missing: which extra of tunecache installs each, and the one line that
says what to install when one is.

psycopg, PyMySQL, matplotlib and cryptography are imported only where they are used (a
``postgresql://`` or ``mysql://`` store, ``tunecache report``, signatures), so an install without
their extra works until then; there the user gets this line, not a traceback. numpy is a plain
dependency (the Triton interpreter imports it, and a CPU machine runs every kernel under it) but an
environment assembled by hand (``pip install --no-deps``) can still lack it.
"""

from __future__ import annotations

import importlib

from tunecache.errors import MissingDependencyError

#: Top-level module -> the extra of pyproject.toml that installs it, and what needs it.
EXTRAS = {
    "psycopg": ("postgres", "PostgreSQL stores"),
    "pymysql": ("mysql", "MySQL and MariaDB stores"),
    "matplotlib": ("report", "the plots of tunecache report"),
    "cryptography": ("sign", "signatures: keygen, signed exports and rows"),
    "prometheus_client": ("metrics", "TUNECACHE_METRICS_PORT, tunecache's metrics"),
}
#: Top-level module -> what needs it, for dependencies every install brings.
REQUIRED = {"numpy": "the Triton interpreter (TRITON_INTERPRET=1: kernels on a machine without a GPU)"}


def install_line(module: str) -> str:
    """What to run for ``module``: its extra's install line, else a plain ``pip install``."""
    if module in EXTRAS:
        return f"pip install '.[{EXTRAS[module][0]}]' in the tunecache checkout"
    return f"pip install {module}"


def missing(e: BaseException) -> str | None:
    """One line for ``e`` where it says a dependency listed here is not installed; None otherwise
    (an error of the user's code, or of a module that is there but broken, stays as it is)."""
    if not isinstance(e, ModuleNotFoundError):
        return None
    name = (e.name or "").split(".")[0]
    if name in EXTRAS:
        return f"{name} is not installed ({EXTRAS[name][1]} need it): {install_line(name)}"
    if name in REQUIRED:
        return f"{name} is not installed, and {REQUIRED[name]} needs it: {install_line(name)}"
    return None


def require(module: str) -> None:
    """Import ``module`` now, before anything runs that needs it; :class:`MissingDependencyError`, one
    line naming what to install, where it cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(missing(e) or f"{module} cannot be imported: {e}") from None


__all__ = ["EXTRAS", "REQUIRED", "install_line", "missing", "require"]
