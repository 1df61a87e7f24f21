"""The problem filters that ``ls``, ``export``, ``invalidate`` and ``gc`` share, as SQL conditions.

One vocabulary of filters (kernel, arch, device, driver, age, ...) for every command that selects
problems, so that ``ls --kernel k`` lists exactly what ``export --kernel k`` writes and ``invalidate
--kernel k`` deletes. Every value is a bound parameter; a kernel name may match its last dotted part.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from tunecache.store.schema import problems


def _like_escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def bound_to_no_driver(version: Any) -> Any:
    """Rows no driver is part of (driver version ""): a host module (Triton's C extensions, bound to
    the machine and Triton), a problem timed under the interpreter. No driver filter selects them:
    every driver loads them, and deleting them only makes each fresh host rebuild them."""
    return version == ""


def this_driver(version: Any, release: Any, driver: str) -> Any:
    """Rows of driver ``driver``: its CUDA driver version or its release (never a row bound to no driver)."""
    return sa.and_(sa.not_(bound_to_no_driver(version)), sa.or_(version == driver, release == driver))


def not_this_driver(version: Any, release: Any, current: str | tuple[str, str]) -> Any:
    """Rows of another driver than ``current``: its CUDA driver version, or (version, release). A
    driver update may keep the version (580.95.05 and 580.159.04 are both 13000), so the release is
    compared too where both are known; a row whose release is unknown ("") goes by its version. A
    row bound to no driver is of no other driver either (:func:`bound_to_no_driver`)."""
    v, r = (current, "") if isinstance(current, str) else current
    other = version != v if not r else sa.or_(version != v, sa.and_(release != r, release != ""))
    return sa.and_(sa.not_(bound_to_no_driver(version)), other)


def filter_clauses(
    *,
    kernel: str | None = None,
    arch: str | None = None,
    device: str | None = None,
    driver: str | None = None,
    not_driver: str | tuple[str, str] | None = None,
    no_driver: bool = False,
    since: dt.datetime | None = None,
    older_than: dt.datetime | None = None,
    no_hit_since: dt.datetime | None = None,
    source_hash: str | None = None,
    target_digest: str | None = None,
    key_json: str | None = None,
    digests: Sequence[str] | None = None,
) -> list[Any]:
    """SQL conditions on ``problems`` shared by ls, export, invalidate and gc; every value is a bound parameter."""
    w: list[Any] = []
    if kernel:
        # Full name, or the function name / qualname at the end of it.
        w.append(sa.or_(problems.c.kernel == kernel, problems.c.kernel.like("%." + _like_escape(kernel), escape="\\")))
    if arch:
        w.append(problems.c.arch == arch)
    if device:
        w.append(problems.c.device_name == device)
    if driver:
        w.append(this_driver(problems.c.driver_version, problems.c.driver_release, driver))
    if not_driver is not None:
        w.append(not_this_driver(problems.c.driver_version, problems.c.driver_release, not_driver))
    if no_driver:
        w.append(bound_to_no_driver(problems.c.driver_version))
    if since:
        w.append(problems.c.updated_at >= since)
    if older_than:
        w.append(problems.c.updated_at < older_than)
    if no_hit_since:
        w.append(sa.func.coalesce(problems.c.last_hit_at, problems.c.updated_at) < no_hit_since)
    if source_hash:
        w.append(problems.c.source_hash == source_hash)
    if target_digest:
        w.append(problems.c.target_digest == target_digest)
    if key_json:
        w.append(problems.c.key_json == key_json)
    if digests is not None:
        w.append(problems.c.digest.in_(list(digests)))
    return w
