"""How the suite is split between xdist workers, in what order, and what the quick tier leaves out.

- The tests of a module that share a module-scoped fixture (one expensive build, several tests that
  read it) are one xdist group: they run on one worker, in file order, and the fixture is built once,
  as in a serial run. Every other test may run on any worker.
- Under xdist, the longest work goes first (longest-processing-time-first), so no worker starts a
  three-minute test while the others are idle at the end. The weights are the measured seconds in
  tests/durations.json (``python tests/profiling.py --durations FILE...`` rewrites it); a test
  missing there (a new one) weighs the median.
- ``--quick`` (scripts/test --quick) keeps the tests whose unit weighs at most ``QUICK_SECONDS`` and
  are not marked slow: the edit-run loop. CI runs everything.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
QUICK_SECONDS = 2.0


def load_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def module_group(item: pytest.Item) -> str | None:
    """The module and the module-scoped fixtures the test uses, if any: the tests that share these
    run together, and each fixture is built once for them."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = sorted(name for name, defs in info.name2fixturedefs.items() if defs and defs[-1].scope == "module")
    return f"{item.nodeid.split('::')[0]}:{','.join(shared)}" if shared else None


def units(items: Iterable[pytest.Item]) -> list[list[pytest.Item]]:
    """The items as scheduling units, in collection order: one per group, one per other test."""
    out: list[list[pytest.Item]] = []
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        g = module_group(item)
        if g is None:
            out.append([item])
        elif g in groups:
            groups[g].append(item)
        else:
            groups[g] = [item]
            out.append(groups[g])
    return out


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
            (drop if slow or weight(u) > QUICK_SECONDS else keep).append(u)
        if drop:
            config.hook.pytest_deselected(items=[i for u in drop for i in u])
        us = keep
    if parallel:
        for u in us:
            if len(u) > 1:
                for i in u:
                    i.add_marker(pytest.mark.xdist_group(module_group(i)))
        us.sort(key=weight, reverse=True)  # stable: a group keeps its file order
    items[:] = [i for u in us for i in u]
