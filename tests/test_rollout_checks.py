"""The parts of scripts/bench_rollout.py that decide what its fleets report (issue 36), checked
without a fleet: its checks, its put counter, its upgrade's edits, its count of waits in vain."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_a_failure_tunecache_reports_on_a_host_fails_the_check() -> None:
    """A host that went on without the store somewhere (runs BB-BD: the bench's own wrapper broke
    every host-module filing, and only a warning said so) is a failed check, not a footnote."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import rollout_figures

    said = "tunecache: filing a host module failed (TypeError('...')); Triton goes on as without a store"
    host = {"host": "cold-0", "warnings": [said], "store_errors": 0}
    results = {"stock": {}, "scenarios": {"inductor:default": {"cold": {"fleet": {}, "hosts": [host]}}}}
    assert any("failed on ['cold-0']" in c and "host module" in c for c in rollout_figures.checks(results))
    host["warnings"] = ["tunecache: a note that is no failure"]
    assert rollout_figures.checks(results) == []


def test_the_benchs_put_counter_passes_a_host_modules_target_on_and_counts_it_apart() -> None:
    """Runs BB-BD filed no host module: the bench's put counter took no target, so every host module's
    put raised inside the bench (and tunecache, rightly, went on without the store)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import inductor_child

    calls: list[tuple[Any, ...]] = []
    by_kind: dict[str, int] = {}
    put_keys: list[str] = []
    put = inductor_child.counting_put(lambda self, *a, **kw: calls.append((a, kw)), by_kind, put_keys)
    target = ("digest", {"machine": "x86_64"})
    put(None, "triton_kernel", "k1", json.dumps({"name": "cuda_utils"}).encode(), target)
    put(None, "triton_kernel", "k2", json.dumps({"name": "add_kernel"}).encode())
    assert calls[0] == (("triton_kernel", "k1", json.dumps({"name": "cuda_utils"}).encode(), target), {})
    assert by_kind == {"host_module_put": 1, "triton_kernel_put": 1} and len(put_keys) == 1


@pytest.mark.parametrize("edit", ["comment", "code"])
def test_an_upgrade_edits_the_split_stage_every_host_runs(edit: str, tmp_path: Path) -> None:
    """On an sm90 GPU with an fp8 cache the split stage is the Hopper module's (run BD edited only the
    portable one: its 'code edit' changed a kernel no GPU host launched). Each module's copy differs
    from the original by one line, inside its split stage, and still parses."""
    import ast
    import importlib.util

    sys.path.insert(0, str(ROOT / "scripts"))
    import rollout_host

    paths = rollout_host.edited_source(tmp_path, edit)
    assert list(paths) == ["tunecache.kernels.sparse_decode_sm90", "tunecache.kernels.sparse_decode"]
    for name, path in paths.items():
        before = Path(importlib.util.find_spec(name).origin).read_text().splitlines()
        after = Path(path).read_text().splitlines()
        added = [i for i, line in enumerate(after) if i >= len(before) or line != before[i]][:1]
        assert len(after) == len(before) + 1 and after[: added[0]] + after[added[0] + 1 :] == before
        fn = next(
            n
            for n in ast.walk(ast.parse("\n".join(after)))
            if isinstance(n, ast.FunctionDef) and n.name == rollout_host.SPLIT_STAGES[name]
        )
        assert fn.lineno < added[0] + 1 <= fn.end_lineno  # inside the split stage's body


@pytest.mark.parametrize("benchmarks_in_lead", [0, 1])
def test_a_wait_is_in_vain_only_where_the_waiter_then_benchmarks(benchmarks_in_lead: int) -> None:
    """CI of 2026-12-06: a waiter took the lease just after the holder released it, found the result
    stored and benchmarked nothing (each key was benchmarked once), yet the bench counted a wait in
    vain, since it counted every lead after a wait."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import rollout_host

    ran, waits = {"benchmarks": 0}, [0]
    flights: dict[str, Any] = {"benchmarked": [], "leads": [], "wait_s": 0.0, "in_vain": 0}

    def lead(lease: Any) -> str:
        ran["benchmarks"] += benchmarks_in_lead  # 0: the holder's result was there when the lease came
        return "winner"

    def run(store: Any, digest: str, *, lead: Any, **kwargs: Any) -> Any:
        waits[0] += 1  # another host held the lease: this one waited, then took the lease
        return lead(object())

    timed = rollout_host.timed_run(run, ran, flights, lambda: waits[0])
    assert timed(None, "d1", lead=lead, kernel="k") == "winner"
    assert flights["in_vain"] == benchmarks_in_lead
    assert flights["benchmarked"] == ["d1"] * benchmarks_in_lead and flights["wait_s"] >= 0
