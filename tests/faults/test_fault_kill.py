"""Scenario 1: kill -9 of benchmarking processes while 16 workers warm 36 buckets on PostgreSQL."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import sqlalchemy as sa
from faultlib import check_ok, collect, fault_report_fixture, log_lines, reap, spawn, wait_until  # noqa: F401

import tunecache
from tunecache.store.opening import open_store
from tunecache.store.schema import configs, leases, problems

N_WORKERS = 16
KILLS = 3
LEASE_S = 5.0
BENCH_SLEEP_S = 0.25  # per config: a key takes 6 x 0.25 s, long enough to be killed in the middle
N_CONFIGS = 6


def _snapshot(engine: sa.Engine) -> list[tuple[str, str | None, int]]:
    """(digest, winner, number of config rows) of every problem, in one statement."""
    q = (
        sa.select(problems.c.digest, problems.c.winner_config_hash, sa.func.count(configs.c.config_hash))
        .select_from(problems.outerjoin(configs, configs.c.digest == problems.c.digest))
        .group_by(problems.c.digest, problems.c.winner_config_hash)
    )
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(q)]


def _check_whole(rows: list[tuple[str, str | None, int]]) -> None:
    """No partial problem: a winner iff all config rows, and never a problem with only some rows."""
    for digest, winner, n in rows:
        assert (winner is not None) == (n == N_CONFIGS), f"partial problem {digest[:12]}: winner={winner} rows={n}"
        assert n == N_CONFIGS, f"problem {digest[:12]} has {n} of {N_CONFIGS} config rows"


@pytest.mark.slow
@pytest.mark.fleet
def test_kill_9_of_benchmarking_workers_16x36_on_postgresql(pg_url, tmp_path, fault_report):
    sizes = sorted(tunecache.buckets.SGLANG_CAPTURE_SIZES, reverse=True)
    open_store(pg_url).close()  # the schema exists: a concurrent first start is scenario 4
    status = tmp_path / "status"
    status.mkdir()
    go = tmp_path / "go"
    env = {
        "TUNECACHE_LEASE_SECONDS": str(LEASE_S),
        "TUNECACHE_WAIT_SECONDS": "120",
        "TUNECACHE_FAULTS_BENCH_SLEEP": str(BENCH_SLEEP_S),
        "TUNECACHE_FAULTS_STATUS_DIR": str(status),
        "TUNECACHE_FAULTS_GO": str(go),
    }

    def order(i: int) -> list[int]:
        # Servers of a fleet do not warm in lock step: each worker takes the keys in its own order,
        # so ~13 keys are benchmarked at once and every worker meets keys that others are holding.
        return random.Random(i).sample(sizes, len(sizes))

    workers = {
        i: spawn("warm", {"url": pg_url, "sizes": order(i), "start_at": 0, "n_configs": N_CONFIGS}, env)
        for i in range(N_WORKERS)
    }
    pids = {p.pid: i for i, p in workers.items()}
    engine = open_store(pg_url).engine
    restarted = []
    try:
        wait_until(lambda: all((status / str(p.pid)).exists() for p in workers.values()), 180, what="16 workers ready")
        go.touch()
        t_go = time.time()
        rng = random.Random(os.getpid())
        kills: list[dict] = []
        snapshots = rows_checked = 0
        resolved_at: dict[str, float] = {}
        end = time.monotonic() + 120
        while time.monotonic() < end:
            rows = _snapshot(engine)
            _check_whole(rows)
            snapshots += 1
            rows_checked += len(rows)
            for d, _, _ in rows:
                resolved_at.setdefault(d, time.time())
            # Kill when 1/4, 1/2 and 3/4 of the keys are done: early, in the middle, and late.
            if len(kills) < KILLS and len(rows) >= (len(kills) + 1) * len(sizes) // (KILLS + 1):
                with engine.connect() as c:
                    held = {r.pid: r.digest for r in c.execute(sa.select(leases.c.pid, leases.c.digest))}
                candidates = [
                    pid
                    for pid, i in pids.items()
                    if workers[i].poll() is None and pid in held and (status / str(pid)).read_text() == "bench"
                ]
                if candidates:
                    victim = rng.choice(candidates)
                    os.kill(victim, signal.SIGKILL)
                    workers[pids[victim]].wait(timeout=30)
                    kills.append({"pid": victim, "digest": held[victim], "at": time.time(), "done": len(rows)})
                    # A supervisor restarts the crashed server (same order). Niced: on a 2-core CI
                    # machine its start-up (importing torch) would otherwise starve the survivors.
                    args = {"url": pg_url, "sizes": order(pids[victim]), "start_at": 0, "n_configs": N_CONFIGS}
                    restarted.append(spawn("warm", args, env, prefix=["nice", "-n", "15"]))
            if all(p.poll() is not None for p in workers.values()) and len(rows) == len(sizes):
                break
            time.sleep(0.1)
        assert len(kills) == KILLS, f"only {len(kills)} benchmarking holders could be killed"
        killed = {k["pid"] for k in kills}
        # Generous: what is bounded is when each one finished (below), not how long collecting takes.
        survivors = [collect(p, 180) for p in workers.values() if p.pid not in killed]
        again = [collect(p, 240) for p in restarted]
        last_kill = max(k["at"] for k in kills)
        for r in survivors + again:
            check_ok(r)
            assert r["flushed"] and r["pending_puts"] == 0, r["stderr"][-3000:]
            assert r["stats"]["store_errors"] == 0
        # Survivors finish within lease expiry + 10 s of the last kill.
        late = [r["finished"] - last_kill for r in survivors]
        slowest = max(survivors, key=lambda r: r["finished"])
        assert max(late) <= LEASE_S + 10, (
            f"survivors finished {max(late):.1f}s after the last kill (kills at "
            f"{[round(k['at'] - t_go, 1) for k in kills]}s); slowest: {slowest['timeline']}"
        )
        # Every key the victims held was completed by someone else, within lease expiry + 10 s.
        rows = _snapshot(engine)
        _check_whole(rows)
        rows_checked += len(rows)
        assert len(rows) == len(sizes)
        for k in kills:
            assert k["digest"] in resolved_at, "a killed holder's key was never completed"
            assert resolved_at[k["digest"]] - k["at"] <= LEASE_S + 10
        # Each key was tuned to the end exactly once, by one process (victims' finished keys count,
        # their interrupted benchmark does not), and each victim's lease was taken over exactly once.
        finished = survivors + again
        tuned: dict[int, list[tuple[int, int]]] = {}
        for journal in status.glob("*.done"):
            for line in journal.read_text().splitlines():
                n, count = map(int, line.split())
                tuned.setdefault(n, []).append((int(journal.stem), count))
        assert sorted(tuned) == sorted(sizes)
        assert all(len(v) == 1 and v[0][1] == N_CONFIGS for v in tuned.values()), tuned
        by_victims = sum(c for v in tuned.values() for pid, c in v if pid in killed)
        assert sum(r["stats"]["benchmarks"] for r in finished) + by_victims == len(sizes) * N_CONFIGS
        # Each victim's orphaned lease was taken over exactly once (by a survivor, a restarted server,
        # or a later victim: their logs up to the kill are read too), at once: its process is gone.
        dead = [collect(workers[pids[k["pid"]]], 30) for k in kills]
        lines = [m for r in finished + dead for m in log_lines(r) if "took over" in m]
        assert len(lines) == KILLS, (kills, lines)
        for k in kills:
            assert sum(f":{k['pid']}:" in m and "its process is gone" in m for m in lines) == 1, (k, lines)
        takeovers = sum(r["stats"]["lease_takeovers"] for r in finished)  # the counter agrees with the log
        assert takeovers == sum(len([m for m in log_lines(r) if "took over" in m]) for r in finished)
        # The whole fleet (restarted servers included) launches the same stored winner per key.
        stored = open_store(pg_url).find_problems(with_configs=True)
        assert len(stored) == len(sizes) and all(p.winner is not None and p.winner.ok for p in stored)
        winners = {tuple(sorted(r["winners"].items())) for r in finished}
        assert len(winners) == 1
        fault_report.update(
            workers=N_WORKERS,
            keys=len(sizes),
            configs_per_key=N_CONFIGS,
            kills=len(kills),
            restarted=len(restarted),
            lease_seconds=LEASE_S,
            bench_sleep_per_config=BENCH_SLEEP_S,
            kill_times_s=[round(k["at"] - t_go, 1) for k in kills],
            keys_done_at_kills=[k["done"] for k in kills],
            takeover_after_kill_s=[round(resolved_at[k["digest"]] - k["at"], 1) for k in kills],
            survivors_done_after_last_kill_s=round(max(late), 1),
            benchmarks_total=sum(r["stats"]["benchmarks"] for r in finished) + by_victims,
            keys_tuned_by_victims_before_kill=sum(1 for v in tuned.values() if v[0][0] in killed),
            lease_takeovers=len(lines),
            snapshots=snapshots,
            rows_checked=rows_checked,
            run_s=round(max(r["finished"] for r in finished) - t_go, 1),
        )
    finally:
        reap([*workers.values(), *restarted])
        engine.dispose()


@pytest.mark.slow
@pytest.mark.fleet
def test_sixteen_processes_flush_counters_at_once_without_deadlock_or_loss(store_url, tmp_path, fault_report):
    """The deferred writes of a fleet (hit counts on the same rows, per-kernel counters) all land."""
    from builders import problem, results

    n_procs, rounds, n_problems = 16, 10, 36
    s = open_store(store_url)
    for i in range(n_problems):
        s.put(problem(i), results())
    s.close()
    status = tmp_path / "status"
    status.mkdir()
    go = status / "go"
    env = {"TUNECACHE_FAULTS_STATUS_DIR": str(status), "TUNECACHE_FAULTS_GO": str(go)}
    procs = [spawn("counters", {"url": store_url, "start_at": 0, "rounds": rounds}, env) for _ in range(n_procs)]
    try:
        wait_until(lambda: all((status / str(p.pid)).exists() for p in procs), 120, what="flushers ready")
        go.touch()
        out = [collect(p, 180) for p in procs]
    finally:
        reap(procs)
    for r in out:
        check_ok(r)  # includes: no StoreError (a deadlock) in any flush
    s = open_store(store_url)
    hits = {p.digest: p.hit_count for p in s.find_problems()}
    stats = {r["kernel"]: r for r in s.kernel_counters()}
    s.close()
    assert set(hits.values()) == {n_procs * rounds}  # every increment of every row, none lost
    assert {k: (v["hits"], v["bench_seconds"]) for k, v in stats.items()} == {
        k: (n_procs * rounds, n_procs * rounds * 0.5) for k in ("k.a", "k.b", "k.c")
    }
    fault_report.update(
        backend=store_url.split(":", 1)[0].split("+", 1)[0],
        processes=n_procs,
        rounds=rounds,
        rows=n_problems,
        increments_checked=n_procs * rounds * (n_problems + 3),
        lost=0,
        deadlocks=0,
    )
