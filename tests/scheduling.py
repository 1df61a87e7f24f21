"""How the suite is split between xdist workers, in what order, and what the quick tier leaves out.

- A test file that defines a module-scoped fixture (one expensive build, several tests that read
  it) is one unit: its tests run on one worker, in file order, and the fixture is built once, as in
  a serial run. Every other test is a unit of its own, which any worker may run.
- Under xdist, the longest work goes first (longest-processing-time-first), so no worker starts a
  three-minute test while the others are idle at the end. The weights are the measured seconds in
  tests/durations.json (``python tests/profiling.py --durations FILE...`` rewrites it); a test
  missing there (a new one) weighs the median.
- ``--quick`` (scripts/test --quick) keeps the tests whose unit weighs at most ``QUICK_SECONDS`` and
  are not marked slow (a test not measured yet is kept): the edit-run loop. CI runs everything.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = Path(__file__).with_name("durations.json")
_MODULE_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope=["']module["']""")
QUICK_SECONDS = 2.0


def load_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


@functools.cache
def grouped(path: str) -> bool:
    """Whether the test file defines a module-scoped fixture: then all its tests are one unit."""
    try:
        return _MODULE_FIXTURE.search((ROOT / path).read_text()) is not None
    except OSError:
        return False


def scope(nodeid: str) -> str:
    """The scheduling unit of a test: its file where :func:`grouped`, else the test itself."""
    path = nodeid.split("::")[0]
    return path if grouped(path) else nodeid


def units(items: Iterable[pytest.Item]) -> list[list[pytest.Item]]:
    """The items as scheduling units, in collection order."""
    out: dict[str, list[pytest.Item]] = {}
    for item in items:
        out.setdefault(scope(item.nodeid), []).append(item)
    return list(out.values())


def scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's scheduler for ``-n N`` (its default ``--dist load``): each unit of :func:`scope` goes
    to one worker, whole; any other ``--dist`` is left to xdist. (xdist's own ``loadgroup`` cannot
    group under pytest 9.2: it renames ``item._nodeid``, which pytest no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Units(config, log)


def arrange(config: pytest.Config, items: list[pytest.Item], parallel: bool) -> None:
    """Group, select (``--quick``) and, under xdist, order the items in place."""
    durations = load_durations()
    default = statistics.median(durations.values()) if durations else 1.0

    def weight(unit: list[pytest.Item]) -> float:
        return sum(durations.get(i.nodeid, default) for i in unit)

    us = units(items)
    if config.getoption("quick"):
        keep, drop = [], []
        for u in us:
            slow = any(i.get_closest_marker("slow") for i in u)
            measured = sum(durations.get(i.nodeid, 0.0) for i in u)  # a new test is quick until measured
            (drop if slow or measured > QUICK_SECONDS else keep).append(u)
        if drop:
            config.hook.pytest_deselected(items=[i for u in drop for i in u])
        us = keep
    if parallel:
        us.sort(key=weight, reverse=True)  # stable: a unit keeps its file order
    items[:] = [i for u in us for i in u]
