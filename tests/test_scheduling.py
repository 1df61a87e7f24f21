"""The suite's own scheduling (tests/scheduling.py): fleet tests spread out, nothing lost or reordered else."""

from __future__ import annotations

import pytest
import scheduling


class _Item:
    def __init__(self, name: str, fleet: bool) -> None:
        self.name, self.fleet = name, fleet

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "fleet" and self.fleet else None


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_fleet_units_are_spread_by_the_worker_count_and_nothing_is_lost(workers):
    units = [[_Item(f"f{i}", True)] for i in range(3)] + [[_Item(f"o{i}", False)] for i in range(7)]
    out = scheduling.spread_fleets(units, workers)
    names = [u[0].name for u in out]
    assert sorted(names) == sorted(u[0].name for u in units)
    assert [n for n in names if n.startswith("o")] == [f"o{i}" for i in range(7)]  # the others' order kept
    assert [n for n in names if n.startswith("f")] == ["f0", "f1", "f2"]
    where = [i for i, n in enumerate(names) if n.startswith("f")]
    assert all(b - a == max(workers - 1, 1) + 1 for a, b in zip(where, where[1:]))


def test_fleets_left_over_go_last():
    units = [[_Item("f0", True)], [_Item("f1", True)], [_Item("o0", False)]]
    assert [u[0].name for u in scheduling.spread_fleets(units, 4)] == ["f0", "o0", "f1"]
