"""Scenario 8: a stored winner that no longer compiles, written by another process, met by a fresh one.

tests/test_autotuner.py::test_poisoned_stored_winner_is_marked_and_retuned covers one process; here
the row comes from another process's store write, and the callers are fresh processes.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import triton
from faultlib import check_ok, collect, fault_report_fixture, log_lines, spawn  # noqa: F401

from tunecache.problem.configidentity import config_identity
from tunecache.problem.model import pick_winner
from tunecache.store.opening import open_store
from tunecache.store.schema import configs, problems

SIZES = [64, 100]


def _worker_configs() -> list:
    return [triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128, 256) for w in (1, 2)]


@pytest.mark.slow
def test_poisoned_winner_from_another_process_is_marked_and_replaced(store_url, fault_report):
    # 1. Another process tunes and stores.
    a = collect(spawn("kernel", {"url": store_url, "sizes": SIZES}), 240)
    check_ok(a)
    s = open_store(store_url)
    stored = {p.batch_bucket or p.key_json: p for p in s.find_problems(with_configs=True)}
    assert len(stored) == len(SIZES)
    # 2. The row of size 64 is poisoned: its fastest config becomes one that cannot compile here
    #    (BLOCK=3, not a power of two), as if measured on another target or by older Triton.
    victim = next(p for p in stored.values() if '["N",64]' in p.key_json)
    cfgs = _worker_configs()
    idx = next(i for i, c in enumerate(cfgs) if config_identity(c)[1] != victim.winner_config_hash)
    bad = triton.Config({"BLOCK": 3}, num_warps=cfgs[idx].num_warps)
    bad_json, bad_hash = config_identity(bad)
    old_hash = config_identity(cfgs[idx])[1]
    with s.engine.begin() as c:
        c.execute(
            sa.update(configs)
            .where(configs.c.digest == victim.digest, configs.c.config_hash == old_hash)
            .values(config_hash=bad_hash, config_json=bad_json, median_ms=1e-4, p20_ms=1e-4, p80_ms=1e-4)
        )
        c.execute(
            sa.update(problems)
            .where(problems.c.digest == victim.digest)
            .values(winner_config_hash=bad_hash, winner_ms=1e-4)
        )
    other = next(p for p in stored.values() if p.digest != victim.digest)
    # 3. A fresh process with the poisoned config in its list launches: no failure reaches it.
    b = collect(spawn("poisoned", {"url": store_url, "bad_index": idx, "sizes": [64]}), 240)
    check_ok(b)
    assert b["used"]["64"]["kwargs"]["BLOCK"] != 3
    assert b["stats"]["poisoned"] == 1 and b["stats"]["benchmarks"] == 0
    warnings = log_lines(b)
    assert len(warnings) == 1 and "failed on this target" in warnings[0] and bad_hash[:12] in warnings[0], warnings
    # 4. The row is marked and its winner re-picked among the configs that work; the other row is untouched.
    fixed = s.get(victim.digest)
    row = fixed.config_map()[bad_hash]
    assert row.status in ("compile_error", "runtime_error") and row.failure and row.median_ms is None
    assert fixed.winner_config_hash == pick_winner(fixed.configs).config_hash != bad_hash
    assert s.get(other.digest).winner_config_hash == other.winner_config_hash
    # 5. The next fresh process launches the good winner straight away: no warning, nothing re-tuned.
    c = collect(spawn("poisoned", {"url": store_url, "bad_index": idx, "sizes": [64]}), 240)
    check_ok(c)
    assert not log_lines(c)
    assert c["stats"]["poisoned"] == 0 and c["stats"]["benchmarks"] == 0 and c["stats"]["hits"] == 1
    assert c["used"] == b["used"]
    s.close()
    fault_report.update(
        backend=store_url.split(":", 1)[0].split("+", 1)[0],
        processes=3,
        poisoned_rows=1,
        marked_status=row.status,
        warnings_first_start=len(warnings),
        warnings_next_start=0,
        benchmarks_after_poison=b["stats"]["benchmarks"] + c["stats"]["benchmarks"],
    )
