#!/usr/bin/env python3
"""Fleet load on one PostgreSQL (issue 18): simulated worker starts, directly and through PgBouncer.

    python scripts/bench_fleet.py [--starts 1000] [--concurrency 200] [--procs 4] [--json out.json]

A simulated worker start issues exactly the store calls a real start of the bundled kernel makes:
the bench records them from a real warm start (``tunecache.cli.demo``'s child, bucket 1, with the Store
methods wrapped: open the store and check the schema, prefetch each kernel's problems and launch
specs, then the deferred flush of hit counts and per-kernel counters) and replays them with the same
arguments. The proof gates the figures: one untraced real start and one simulated start against
a private PostgreSQL with ``pg_stat_statements`` preloaded, whose statements and call counts
(including the driver's first-connect queries and BEGIN/COMMIT/ROLLBACK) must be equal, else the
run exits 1 naming the statements that differ, before measuring anything. ``--prove-only`` stops
after the proof; ``--no-prove`` skips it (the figures are then unproven).

Everything is loopback and bounded: a private cluster (tests/faults/pgcluster.py: initdb on a free
port, PostgreSQL's default ``max_connections = 100``), a private PgBouncer (tests/pgbouncer.py:
transaction mode, pool 10), at most ``--starts`` starts per run and ``--max-seconds`` per phase.

Reported per target (direct with no pool, direct with the pool every worker used to keep open,
PgBouncer): starts per second, p50/p99 store time per start, peak server connections
(pg_stat_activity), errors, server CPU per start (the cluster's processes, from /proc), and bytes
per start (PgBouncer's SHOW STATS). Then the rolling-restart storm: every simulated worker misses
one new key at once and runs the autotuner's single flight against the store (host lock per
``--gpus-per-host``, lease, polling with the autotuner's back-off); exactly one must benchmark.
The load generator shares this machine's CPUs with the server: absolute rates are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "faults"))
sys.path.insert(0, str(ROOT / "scripts"))  # benchkit, fleet_worker: also where a test imports this module

from benchkit import gates, procs, records  # noqa: E402
from benchkit.timing import pct  # noqa: E402
from fleet_worker import child  # noqa: E402

#: The store calls a start makes, recorded by :func:`traced_start` (its schema check is open_store's).
TRACED = ("get", "get_many", "kernel_names", "get_kernel_problems", "get_specs", "specs_elsewhere")
TRACED += ("record_hits", "bump_stats", "record_miss")

TRACER = """
import json, sys
from tunecache.cli import demo
from tunecache.store import store as S
calls, depth = [], [0]
def plain(x):  # an argument as JSON holds it: a set (get_specs' signer slots) sorted
    return sorted(x) if isinstance(x, (set, frozenset)) else x
def wrap(name):
    f = getattr(S.Store, name)
    def w(self, *a, **k):
        if depth[0] == 0:
            calls.append([name, [plain(x) for x in a]])
        depth[0] += 1
        try:
            return f(self, *a, **k)
        finally:
            depth[0] -= 1
    setattr(S.Store, name, w)
for n in sys.argv[2].split(","):
    wrap(n)
out = demo._child(sys.argv[1], [1])
print(json.dumps({"start": out, "plan": calls}))
"""


def traced_start(url: str) -> tuple[dict, list[list[Any]]]:
    """A real warm start of the bundled kernel (``tunecache.cli.demo``'s child, bucket 1) with the store
    calls it makes recorded (wrapping Store methods changes no SQL)."""
    env = procs.child_env(TUNECACHE_URL=url, TRITON_INTERPRET="1")
    out = procs.run_json(procs.python("-c", TRACER, url, ",".join(TRACED)), "the traced start", env=env, timeout=600)
    return out["start"], out["plan"]


# ---- the driver --------------------------------------------------------------------------------------


def run_children(args: dict, n: int, timeout: float) -> list[dict]:
    """``n`` processes (scripts/fleet_worker.py's :func:`child`) sharing ``args['starts']`` starts (or
    storm workers) and ``threads``, started together; each one's result."""
    cmds = []
    for i in range(n):
        a = {**args, "threads": args["threads"] // n + (i < args["threads"] % n)}
        a["starts"] = args["starts"] // n + (i < args["starts"] % n)
        cmds.append(procs.python(__file__, "--child", json.dumps(a)))
    env = procs.child_env(PYTHONPATH=str(ROOT / "tests"))
    out = []
    for d in procs.run_together(cmds, envs=[env] * n, timeout=timeout):
        failed = {"times": [], "errors": [f"child exit {d.rc}: {d.stderr[-500:]}"], "results": []}
        out.append(d.result() if d.ok else failed)
    return out


class Monitor:
    """Samples the server's connections to one database (pg_stat_activity) every 20 ms."""

    def __init__(self, admin_url: str, database: str) -> None:
        import sqlalchemy as sa

        self.engine = sa.create_engine(admin_url, pool_size=1)
        self.database = database
        self.peak = 0
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import sqlalchemy as sa

        q = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d")
        with self.engine.connect() as c:
            c.execution_options(isolation_level="AUTOCOMMIT")
            while not self._stop.is_set():
                n = c.execute(q, {"d": self.database}).scalar()
                self.samples.append(n)
                self.peak = max(self.peak, n)
                time.sleep(0.02)

    def __enter__(self) -> Monitor:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.engine.dispose()


def cluster_cpu_s(postmaster_pid: int | None, extra_pids: tuple[int, ...] = ()) -> float:
    """CPU seconds used so far by a PostgreSQL cluster (the postmaster, its reaped children, its live
    children) and ``extra_pids`` (PgBouncer): continuous across backends that exit."""
    if postmaster_pid is None:
        return float("nan")
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> list[str] | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None

    total = 0
    s = stat(postmaster_pid)
    if s:
        total += sum(int(x) for x in s[11:15])  # utime stime cutime cstime
    for d in os.listdir("/proc"):
        if d.isdigit():
            c = stat(int(d))
            if c and int(c[1]) == postmaster_pid:
                total += int(c[11]) + int(c[12])
    for pid in extra_pids:
        c = stat(pid)
        if c:
            total += int(c[11]) + int(c[12])
    return total / tick


def statements(admin_url: str, dbname: str) -> dict[str, int]:
    """pg_stat_statements of one database: normalized query -> calls."""
    import sqlalchemy as sa

    e = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    with e.connect() as c:
        rows = c.execute(
            sa.text(
                "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = :d"
            ),
            {"d": dbname},
        ).all()
    e.dispose()
    out: dict[str, int] = {}
    for q, n in rows:
        out[" ".join(q.split())] = out.get(" ".join(q.split()), 0) + int(n)
    return out


def reset_statements(admin_url: str) -> None:
    import sqlalchemy as sa

    e = sa.create_engine(admin_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    with e.connect() as c:
        c.exec_driver_sql("SELECT pg_stat_statements_reset()")
    e.dispose()


def prove(url: str, admin: str, dbname: str, plan: list[list[Any]]) -> dict[str, Any]:
    """One untraced real start and one simulated start: their statements and call counts."""
    reset_statements(admin)
    real_start(url)  # untraced
    real = statements(admin, dbname)
    reset_statements(admin)
    one = {"mode": "start", "url": url, "plan": plan, "starts": 1, "threads": 1}
    run_children({**one, "start_at": time.time(), "max_seconds": 60}, 1, 120)
    sim = statements(admin, dbname)
    return {
        "statements": len(real),
        "calls": sum(real.values()),
        "equal": real == sim,
        "only_real": {q: n for q, n in real.items() if sim.get(q) != n},
        "only_simulated": {q: n for q, n in sim.items() if real.get(q) != n},
        "real": real,
    }


def real_start(url: str) -> dict:
    env = procs.child_env(TUNECACHE_URL=url, TRITON_INTERPRET="1")
    cmd = procs.python("-m", "tunecache.cli.demo", json.dumps({"url": url, "buckets": [1]}))
    return procs.run_json(cmd, "the real start", env=env, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=1000, help="simulated starts per target")
    ap.add_argument("--concurrency", type=int, default=200, help="simulated workers starting at once")
    ap.add_argument("--procs", type=int, default=4, help="load-generator processes")
    ap.add_argument("--storm-workers", type=int, default=200)
    ap.add_argument("--gpus-per-host", type=int, default=8)
    ap.add_argument("--bench-seconds", type=float, default=3.0, help="the storm's benchmark")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="bound per phase")
    ap.add_argument("--pool-size", type=int, default=10, help="PgBouncer server pool")
    ap.add_argument("--no-prove", action="store_true", help="measure without proving the simulated start")
    ap.add_argument("--prove-only", action="store_true", help="prove the simulated start, measure nothing")
    ap.add_argument("--drop-call", type=int, default=None, help=argparse.SUPPRESS)  # tests: a replay that lacks a call
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return

    from pgbouncer import PgBouncer
    from pgcluster import PgCluster, private_cluster_available

    from tunecache.store.engine import resolve_url

    why = private_cluster_available()
    if why:
        sys.exit(f"bench_fleet needs a private PostgreSQL cluster: {why}")
    cluster = PgCluster()
    bouncer = None
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} CPUs (load generator, PgBouncer and PostgreSQL share them)"}
    report.update(records.meta(cpu=True, versions=False))
    try:
        cluster.init()
        with open(cluster.data / "postgresql.conf", "a") as f:
            f.write("shared_preload_libraries = 'pg_stat_statements'\nmax_connections = 100\n")
        cluster.start()
        postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
        url = cluster.create_database()
        dbname = resolve_url(url).database
        admin = cluster.url("postgres")
        import sqlalchemy as sa

        e = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with e.connect() as c:  # its view, in the admin database, covers every database
            c.exec_driver_sql("CREATE EXTENSION pg_stat_statements")
        e.dispose()
        bouncer = PgBouncer("127.0.0.1", cluster.port, pool_size=a.pool_size).start()
        bouncer_pid = int((bouncer.base / "pgbouncer.pid").read_text().split()[0])
        burl = bouncer.through(url)

        print("seeding: one real start of the bundled kernel tunes bucket 1 ...", file=sys.stderr)
        seed = real_start(url)
        warm, plan = traced_start(url)
        report["seed"] = {"benchmarks": seed["benchmarks"], "warm_benchmarks": warm["benchmarks"]}
        report["plan"] = [m for m, _ in plan]

        if a.drop_call is not None:  # a replay that lacks one query of the real start: the proof must fail
            del plan[a.drop_call]
        if not a.no_prove:
            report["prove"] = prove(url, admin, dbname, plan)
            equal = report["prove"]["equal"]
            print(f"prove: real start == simulated start: {equal}", file=sys.stderr)
            # The simulated start is not the real one: every figure measured with it would be wrong.
            diff = {k: report["prove"][k] for k in ("only_real", "only_simulated")}
            why = f"the simulated start does not issue the real start's statements: {json.dumps(diff)}"
            proof = gates.Gate("bench_fleet")
            proof.expect(equal, f"proof failed, no load measured: {why}")
            proof.enforce()
            if a.prove_only:
                print(json.dumps(report, indent=2, default=str))
                return

        targets = [
            ("direct, no pool (TUNECACHE_POOL_SIZE=0)", url, 0),
            ("direct, pool kept (TUNECACHE_POOL_SIZE=2, as before)", url, 2),
            (f"PgBouncer transaction mode, pool {a.pool_size}", burl, 0),
        ]
        report["starts"] = []
        for name, turl, pool in targets:
            print(f"load: {name} ...", file=sys.stderr)
            stats0 = _bouncer_totals(bouncer)
            cpu0 = cluster_cpu_s(postmaster, (bouncer_pid,))
            args = {
                "mode": "start",
                "url": turl,
                "plan": plan,
                "starts": a.starts,
                "threads": a.concurrency,
                "pool_size": pool,
                "start_at": time.time() + 4.0,
                "max_seconds": a.max_seconds,
            }
            with Monitor(admin, dbname) as mon:
                outs = run_children(args, a.procs, a.max_seconds + 60)
            cpu = cluster_cpu_s(postmaster, (bouncer_pid,)) - cpu0
            stats1 = _bouncer_totals(bouncer)
            times = [t for o in outs for t in o["times"]]
            errors = [e for o in outs for e in o["errors"]]
            wall = max((o.get("end", 0) for o in outs), default=0) - args["start_at"]
            row = {
                "target": name,
                "starts": len(times),
                "errors": len(errors),
                "first_errors": sorted(set(errors))[:3],
                "starts_per_s": round(len(times) / wall, 1) if wall > 0 else None,
                "p50_ms": round(pct(times, 0.5) * 1e3, 1),
                "p99_ms": round(pct(times, 0.99) * 1e3, 1),
                "peak_server_connections": mon.peak,
                "server_cpu_ms_per_start": round(cpu / max(1, len(times)) * 1e3, 2),
            }
            if turl == burl and len(times):
                row["bytes_per_start"] = round((stats1 - stats0) / len(times))
            report["starts"].append(row)
            print(json.dumps(row), file=sys.stderr)

        report["storm"] = []
        for name, turl in (("direct", url), (f"PgBouncer pool {a.pool_size}", burl)):
            print(f"storm: {name} ...", file=sys.stderr)
            digest = uuid.uuid4().hex + uuid.uuid4().hex
            reset_statements(admin)
            args = {
                "mode": "storm",
                "url": turl,
                "digest": digest,
                "starts": a.storm_workers,
                "threads": a.storm_workers,
                "gpus_per_host": a.gpus_per_host,
                "bench_s": a.bench_seconds,
                "start_at": time.time() + 4.0,
                "max_seconds": a.max_seconds,
            }
            with Monitor(admin, dbname) as mon:
                outs = run_children(args, a.procs, a.max_seconds + 60)
            calls = statements(admin, dbname)
            res = [r for o in outs for r in o["results"]]
            errors = [e for o in outs for e in o["errors"]]
            row = {
                "target": name,
                "workers": a.storm_workers,
                "hosts": max(1, a.storm_workers // a.gpus_per_host),
                "benchmarks": sum(r["benchmarks"] for r in res),
                "served": len(res),
                "errors": len(errors),
                "first_errors": sorted(set(errors))[:3],
                "bench_seconds": a.bench_seconds,
                "last_served_s": round(max((r["seconds"] for r in res), default=float("nan")), 2),
                "statements": sum(calls.values()),  # BEGIN/COMMIT/ROLLBACK included
                "statements_per_worker": round(sum(calls.values()) / max(1, len(res)), 1),
                "peak_server_connections": mon.peak,
            }
            report["storm"].append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()
    print(json.dumps(report, indent=2, default=str))
    if a.json:
        records.write(Path(a.json), report)


def _bouncer_totals(bouncer: Any) -> int:
    """Bytes PgBouncer received from and sent to clients so far, all databases but its own."""
    rows = bouncer.show("STATS")
    return sum(int(r["total_received"]) + int(r["total_sent"]) for r in rows if r["database"] != "pgbouncer")


if __name__ == "__main__":
    main()
