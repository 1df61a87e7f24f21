"""Winner choice and benchmark rounds as plain functions and values (tunecache/tuner/winner.py,
tunecache/tuner/measure.py): no store, no kernel, no Triton."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.tuner import winner
from tunecache.tuner.measure import Round, classify

GPU = Target("cuda", "sm90", "H200", 132, 232448, 32, "13000", "580.1", "13.0", "3.9")
OTHER_GPU = replace(GPU, device_name="H100", sm_count=114)
NEW_DRIVER = replace(GPU, driver_version="13010", driver_release="590.2")


def ok(h: str, ms: float) -> ConfigResult:
    return ConfigResult(h, {"kwargs": {"BLOCK": len(h)}}, median_ms=ms)


def failed(h: str) -> ConfigResult:
    return ConfigResult(h, {"kwargs": {}}, status="compile_error", failure={"error": "CompilationError"})


def problem(digest: str, key: list, target: Target = GPU, win: str | None = None, rows=(), updated=None) -> Problem:
    return Problem(
        digest=digest,
        kernel="m.k",
        source_hash="s",
        target=target,
        key_json=json.dumps(key),
        winner_config_hash=win,
        configs=list(rows),
        updated_at=updated,
    )


def test_choose_fastest_unless_a_config_within_tolerance_already_wins_more_keys():
    rows = {"a": ok("a", 1.00), "b": ok("b", 1.01), "c": ok("c", 1.50)}
    others = [problem("p1", [["N", 1]], win="b"), problem("p2", [["N", 2]], win="b"), problem("p3", [], win="a")]
    kw = dict(digest="me", target_digest=GPU.digest)
    assert winner.choose(rows, ["a", "b", "c"], [], tolerance=0.02, **kw) == "a"
    assert winner.choose(rows, ["a", "b", "c"], others, tolerance=0.02, **kw) == "b"
    assert winner.choose(rows, ["a", "b", "c"], others, tolerance=0.0, **kw) == "a"  # 0 disables
    # Winners of this very key, or of another target, are no reason to prefer a config.
    mine = [problem("me", [], win="b"), problem("q", [], target=OTHER_GPU, win="b")]
    assert winner.choose(rows, ["a", "b", "c"], mine * 3, tolerance=0.02, **kw) == "a"
    # Only this key's configs compete, and a failed one never wins.
    assert winner.choose({**rows, "a": failed("a")}, ["a", "c"], [], tolerance=0.02, **kw) == "c"
    assert winner.choose({"a": failed("a")}, ["a"], [], tolerance=0.02, **kw) is None


def test_stored_choice_is_the_stored_winner_while_it_is_a_current_config():
    p = problem("d", [], win="b", rows=[ok("a", 2.0), ok("b", 1.0), ok("c", 0.5)])
    assert winner.stored_choice(p, ["a", "b"]) == "b"
    assert winner.stored_choice(p, ["a", "c", "x"]) == "c"  # b was removed: the best stored current one
    assert winner.stored_choice(p, ["x", "y"]) == "x"  # none stored: the first


def test_nearest_prefers_same_other_values_then_closest_bucket_then_smaller():
    def key(b: int, dtype: str = "fp16") -> list:
        return [["B", b], ["dtype", dtype]]

    stored = [
        problem("d64", key(64), win="w64"),
        problem("d32", key(32), win="w32"),
        problem("d48bf", key(48, "bf16"), win="wbf"),
        problem("dgpu", key(48), target=OTHER_GPU, win="wother"),
        problem("dgone", key(47), win="removed"),
    ]
    hashes = ["w64", "w32", "wbf", "wother"]

    def near(b: int) -> str | None:
        return winner.nearest(stored, hashes, [b, "fp16"], target_digest=GPU.digest, bucket_index=0)

    assert near(56) == "w64"
    assert near(40) == "w32"
    assert near(48) == "w32"  # equidistant: the smaller bucket
    assert near(1000) == "w64"
    assert winner.nearest(stored, hashes, [48, "bf16"], target_digest=GPU.digest, bucket_index=0) == "wbf"
    assert winner.nearest(stored, ["nothing"], [48, "fp16"], target_digest=GPU.digest, bucket_index=0) is None
    assert winner.nearest([], hashes, [48, "fp16"], target_digest=GPU.digest, bucket_index=0) is None


def test_previous_driver_is_the_latest_same_target_but_for_the_driver():
    t0, t1 = dt.datetime(2025, 1, 1), dt.datetime(2025, 2, 1)
    older = problem("o1", [], target=GPU, updated=t0)
    newer = problem("o2", [], target=replace(GPU, driver_release="580.9"), updated=t1)
    elsewhere = problem("o3", [], target=replace(OTHER_GPU, driver_release="1"), updated=t1)
    same = problem("o4", [], target=NEW_DRIVER, updated=t1)  # the current driver: not a previous one
    assert winner.previous_driver([older, newer, elsewhere, same], NEW_DRIVER) is newer
    assert winner.previous_driver([older], NEW_DRIVER) is older
    assert winner.previous_driver([elsewhere, same], NEW_DRIVER) is None


def test_driver_change_prune_keeps_the_n_best_and_builds_whole_rows_for_the_rest():
    old = problem("o", [], rows=[ok("a", 3.0), ok("b", 1.0), ok("c", 2.0), failed("d"), ok("gone", 0.1)])
    configs = {h: {"kwargs": {"BLOCK": i}} for i, h in enumerate(["a", "b", "c", "d", "new"])}
    pr = winner.driver_change_prune(old, configs, 2)
    assert pr is not None and pr.keep == {"b", "c"} and pr.old is old
    assert pr.failed == {"d": old.config_map()["d"]}  # failed before: stays failed, no compile
    assert set(pr.pruned) == {"a", "new"}
    for h, r in pr.pruned.items():  # whole rows: the config itself, not patched in later
        assert r.status == "pruned" and r.config == configs[h] and "topk:2" in r.failure["reason"]
        assert "580.1" in r.failure["reason"]
    assert set(pr.skip) == {"a", "d", "new"}
    assert winner.driver_change_prune(old, {"x": {}}, 2) is None  # nothing ran ok before: benchmark all


def test_a_round_records_results_failures_and_its_pruned_rows():
    pruned = {"p": ConfigResult("p", {"kwargs": {"BLOCK": 8}}, status="pruned", failure={"reason": "topk"})}
    rnd = Round(known=dict(pruned), pruned=pruned)
    rnd.start_config()
    rnd.samples = 5
    assert rnd.measured("a", {"kwargs": {}}, [1.0, 0.9, 1.1]) == [1.0, 0.9, 1.1]
    rnd.start_config()
    assert rnd.samples == 0 and rnd.failure is None
    rnd.failure = classify(type("OutOfResources", (Exception,), {})("smem"))
    assert rnd.measured("b", {"kwargs": {}}, [float("inf")] * 3)[0] == float("inf")
    rnd.start_config()
    assert rnd.measured("c", {"kwargs": {}}, None, RuntimeError("boom"))[0] == float("inf")
    rnd.start_config()
    assert rnd.measured("s", {"kwargs": {}}, 2.5) == [2.5, 2.5, 2.5]  # a scalar benchmarker
    res = rnd.results
    assert res["a"].ok and res["a"].samples == 5 and res["a"].p20_ms == 0.9
    assert res["b"].status == "out_of_resources" and res["c"].status == "runtime_error"
    assert res["c"].failure["message"] == "boom"
    assert {r.config_hash for r in rnd.rows()} == {"a", "b", "c", "s", "p"}
    assert Round().rows() == []
