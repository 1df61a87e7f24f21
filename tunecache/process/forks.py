"""The one fork registry: every module's fork hooks, run by the single ``os.register_at_fork`` call.

Servers define their kernels (starting tunecache's threads), then fork workers. A lock that a
parent's thread held at the fork stays taken forever in the child, whose copy of that thread does
not exist; so each module that owns locks, threads or pooled connections resets them in the child.
They register here by name rather than each calling :func:`os.register_at_fork`: a name registers
once (a module imported twice, e.g. re-run by a test, does not reset twice), the hooks run in a
known order, and one test (tests/test_fork.py) covers them all. No module but this one calls
``os.register_at_fork`` (tests/test_fork.py checks the source).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

Hook = Callable[[], None]

_before: dict[str, Hook] = {}
_after_in_parent: dict[str, Hook] = {}
_after_in_child: dict[str, Hook] = {}
_lock = threading.Lock()  # guards registration only; never taken around a fork


def register(
    name: str,
    after_in_child: Hook | None = None,
    *,
    before: Hook | None = None,
    after_in_parent: Hook | None = None,
) -> None:
    """Run these hooks at every fork of this process, as :func:`os.register_at_fork` would.

    Registering a ``name`` again replaces its hooks (and keeps its place in the order). As with
    ``os.register_at_fork``, the ``before`` hooks run in reverse order of registration, the after
    hooks in order.
    """
    with _lock:
        for table, fn in ((_before, before), (_after_in_parent, after_in_parent), (_after_in_child, after_in_child)):
            if fn is None:
                table.pop(name, None)
            else:
                table[name] = fn


def registered() -> dict[str, dict[str, Hook]]:
    """A copy of the hooks by moment (``before``, ``after_in_parent``, ``after_in_child``), by name, in
    registration order."""
    with _lock:
        return {
            "before": dict(_before),
            "after_in_parent": dict(_after_in_parent),
            "after_in_child": dict(_after_in_child),
        }


def _run(hooks: list[Hook]) -> None:
    """Every hook runs even if one raises; the first error is raised last (Python prints it, as it
    does for a failing ``os.register_at_fork`` callback)."""
    error: BaseException | None = None
    for fn in hooks:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the other modules' resets must still run
            error = error or e
    if error is not None:
        raise error


def _run_before() -> None:
    _run(list(_before.values())[::-1])


def _run_after_in_parent() -> None:
    _run(list(_after_in_parent.values()))


def _run_after_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent's thread may have been registering at the fork
    _run(list(_after_in_child.values()))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_run_before, after_in_parent=_run_after_in_parent, after_in_child=_run_after_in_child)
