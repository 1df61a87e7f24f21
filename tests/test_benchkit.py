"""The benches' harness (scripts/benchkit): children started and timed, their results read back,
JSON records, markdown tables, the ``--check`` gate, Triton's compile log. Real processes."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import compiles, gates, memory, procs, records, timing  # noqa: E402


def test_a_child_runs_with_its_environment_and_is_timed() -> None:
    code = "import json, os, time; time.sleep(0.3); print('noise'); print(json.dumps({'v': os.environ['BK_V']}))"
    done = procs.run(procs.python("-c", code), env=procs.child_env(BK_V="seven"))
    assert done.ok and done.rc == 0
    assert done.result() == {"v": "seven"}
    assert done.wall_s >= 0.3


def test_a_childs_result_is_its_last_line_with_the_prefix() -> None:
    out = 'RESULT {"a": 1}\nother\nRESULT {"a": 2}\ntrailing text\n'
    assert procs.last_json(out, "RESULT ") == {"a": 2}
    assert procs.last_json("nothing here\n", "RESULT ") is None
    assert procs.last_json('{"b": 1}\n\n') == {"b": 1}


def test_a_failed_child_the_bench_needs_says_why() -> None:
    code = "import sys; sys.stderr.write('the reason\\n'); sys.exit(3)"
    with pytest.raises(procs.ChildFailed, match=r"the step failed \(exit 3\):\nthe reason") as e:
        procs.run_json(procs.python("-c", code), "the step")
    assert e.value.done.rc == 3
    with pytest.raises(procs.ChildFailed, match="no result line"):
        procs.run_json(procs.python("-c", "print('no json')"), "the step", prefix="RESULT ")


def test_a_child_past_its_timeout_is_killed() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run(procs.python("-c", "import time; time.sleep(60)"), timeout=0.5)
    t = time.perf_counter()
    fast, slow = procs.run_together(
        [procs.python("-c", "print(1)"), procs.python("-c", "import time; time.sleep(60)")], timeout=2
    )
    assert time.perf_counter() - t < 30
    assert fast.ok and fast.result() == 1
    assert slow.timed_out and not slow.ok


def test_children_started_together_run_at_the_same_time(tmp_path: Path) -> None:
    """Each child waits for the other's file: only children running at once both finish."""
    code = textwrap.dedent(
        """
        import pathlib, sys, time
        me, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
        me.touch()
        deadline = time.time() + 30
        while not other.exists() and time.time() < deadline:
            time.sleep(0.01)
        print(int(other.exists()))
        """
    )
    a, b = tmp_path / "a", tmp_path / "b"
    done = procs.run_together([procs.python("-c", code, a, b), procs.python("-c", code, b, a)], timeout=60)
    assert [d.result() for d in done] == [1, 1]
    got = procs.at_once([lambda: 1, lambda: 1 / 0])
    assert got[0] == 1 and isinstance(got[1], ZeroDivisionError)


def test_a_childs_environment_drops_and_orders_what_it_is_told() -> None:
    base = {"TUNECACHE_URL": "x", "TRITON_CACHE_DIR": "y", "KEEP": "1", "PYTHONPATH": "/inherited"}
    env = procs.child_env(base=base, drop=("TUNECACHE_", "TRITON_"), before=["/hook"], after=["/root"], NEW="2")
    assert env == {"KEEP": "1", "NEW": "2", "PYTHONPATH": "/hook:/inherited:/root"}
    assert procs.child_env(base={"A": "1"}) == {"A": "1"}  # no PYTHONPATH made up
    assert procs.child_env(base=base, before=["/hook"], PYTHONPATH="/only")["PYTHONPATH"] == "/only"


def test_timing_per_call_percentiles_and_rounds() -> None:
    calls = []
    cpu_ns, wall_ns = timing.per_call(lambda: calls.append(1), 1000)
    assert len(calls) == 1000 and cpu_ns > 0 and wall_ns > 0
    assert timing.pct([5, 1, 4, 2, 3], 0.5) == 3 and timing.pct([1, 2], 0.99) == 2
    assert timing.pct([], 0.5) != timing.pct([], 0.5)  # nan
    assert timing.quantile([1.0, 2.0, 3.0], 50) == 2.0
    s = timing.spread_ms([i / 1000 for i in range(1, 11)])
    assert s == {"median_ms": 5.5, "p10_ms": 2.0, "p90_ms": 10.0, "runs": 10}
    assert timing.rounds("abc", 3, "rotate") == [list("abc"), list("bca"), list("cab")]
    assert timing.rounds("ab", 3, "alternate") == [list("ab"), list("ba"), list("ab")]
    assert timing.rounds("ab", 2) == [list("ab"), list("ab")]
    with pytest.raises(ValueError, match="unknown order"):
        timing.rounds("ab", 2, "sideways")


def test_a_record_round_trips_through_its_json_file(tmp_path: Path) -> None:
    rec = records.Record(tmp_path / "out" / "bench.json", meta=records.meta(cpu=True))
    rec["figures"] = {"ready_s": 0.25, "when": dt.datetime(2026, 12, 7), "where": tmp_path}
    rec.save()
    back = records.read(rec.path)
    assert back["figures"] == {"ready_s": 0.25, "when": "2026-12-07 00:00:00", "where": str(tmp_path)}
    assert back["meta"]["device"] == "cpu" and back["meta"]["date"].endswith("UTC")
    assert {"python", "cpus"} <= set(back["meta"])
    rec["more"] = 1  # saved again after a later step: the file has both
    assert records.read(rec.save()) == {**back, "more": 1}


def test_a_markdown_table() -> None:
    assert records.table(["a", "b"], [[1, "x"], [2.5, None]], align="lr") == [
        "| a | b |",
        "| --- | ---: |",
        "| 1 | x |",
        "| 2.5 | None |",
    ]


def test_a_gate_with_a_miss_exits_1_only_when_checked(capsys: pytest.CaptureFixture[str]) -> None:
    gate = gates.Gate("bench_x")
    assert gate.expect(True, "never said") and gate.met and gate.verdict() == "all met"
    gate.enforce()  # nothing missed: no exit
    assert not gate.expect(0.9 <= 0.5, "ratio 0.9 (limit 0.5)")
    gate.add(["another miss"])
    gate.enforce(enabled=False)  # reported, not checked
    with pytest.raises(SystemExit) as e:
        gate.enforce()
    assert e.value.code == 1
    assert capsys.readouterr().err == "bench_x: ratio 0.9 (limit 0.5)\nbench_x: another miss\n"
    assert gate.verdict() == "ratio 0.9 (limit 0.5); another miss"


def test_a_bench_with_check_exits_1_and_still_writes_its_record(tmp_path: Path) -> None:
    """A bench's --check as a process sees it: exit 1, the misses on stderr, the record written."""
    script = tmp_path / "bench_toy.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import argparse, sys
            from pathlib import Path
            sys.path.insert(0, {str(ROOT / "scripts")!r})
            from benchkit import gates, records
            ap = argparse.ArgumentParser()
            gates.add_check_flag(ap, "the ratio target")
            a = ap.parse_args()
            gate = gates.Gate("bench_toy")
            gate.expect(1.3 <= 1.1, "ratio 1.3 (limit 1.1)")
            records.write(Path({str(tmp_path / "toy.json")!r}), {{"checks": gate.misses}})
            gate.enforce(a.check)
            """
        )
    )
    plain = procs.run(procs.python(script))
    assert plain.rc == 0 and plain.stderr == ""
    checked = procs.run(procs.python(script, "--check"))
    assert checked.rc == 1 and checked.stderr == "bench_toy: ratio 1.3 (limit 1.1)\n"
    assert records.read(tmp_path / "toy.json") == {"checks": ["ratio 1.3 (limit 1.1)"]}


def test_a_restarted_hosts_compiles_are_its_own_starts_only(tmp_path: Path) -> None:
    """A host restarted on its own caches (the rolling upgrade) appends to its compile log: each start
    counts the lines it wrote (run BD counted an upgraded host's earlier starts with its own)."""
    log = tmp_path / "compiles.log"
    log.write_text("1 compile _split_stage k1\n1 compile _merge_stage k2\n1 hit _merge_stage k2\n")
    since = log.stat().st_size
    with log.open("a") as f:
        f.write("2 hit _split_stage k1\n2 compile _merge_stage k3\n3 compile _merge_stage k4\n")
    evs = compiles.events(log, since)
    assert [e[1:3] for e in evs] == [["hit", "_split_stage"], ["compile", "_merge_stage"], ["compile", "_merge_stage"]]
    assert compiles.tally(evs) == {"compiles": 2, "hits": 1, "compiling_processes": 2, "compiled": {"_merge_stage": 2}}
    assert len(compiles.events(log)) == 6 and compiles.events(tmp_path / "none") == []


def test_the_hook_installs_the_compile_listener_in_a_child(tmp_path: Path) -> None:
    hook = compiles.write_hook(tmp_path / "hook")
    code = "import triton.knobs as k; print(k.compilation.listener.__name__)"
    env = procs.child_env(before=[hook], BENCH_COMPILE_LOG=str(tmp_path / "log"), TRITON_INTERPRET="1")
    done = procs.run(procs.python("-c", code), env=env, cwd=tmp_path)
    assert done.ok and done.stdout.strip() == "_listener", done.stderr[-2000:]


def test_peak_rss_is_the_childs_own_not_its_large_parents() -> None:
    big = bytearray(300 << 20)  # this process: over 300 MB resident
    big[::4096] = b"x" * len(big[::4096])
    code = "import sys; sys.path.insert(0, sys.argv[1]); from benchkit import memory; print(memory.peak_rss_mb())"
    child = procs.run_json(procs.python("-c", code, ROOT / "scripts"), "a small child")
    assert memory.peak_rss_mb() > 300
    assert 0 < child < 150, child
