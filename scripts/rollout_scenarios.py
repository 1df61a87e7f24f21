"""The scenarios of scripts/bench_rollout.py, each a fleet of :class:`rollout_fleet.Fleet` hosts on a
store: a cold fleet, a warm one, a rolling upgrade, mixed trust, the store in trouble, and the stock
starts of the same invocation that the times are judged against (see bench_rollout's docstring).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from benchkit import ROOT
from rollout_figures import fleet_figures, per_key, slowest_s
from rollout_fleet import Fleet

EDITS = ("comment", "code")


def run_scenarios(fl: Fleet, workload: str) -> dict[str, Any]:
    a, n = fl.a, fl.a.hosts
    out: dict[str, Any] = {}
    scen = a.scenarios
    log = lambda s: print(f"[{workload}] {s}", file=sys.stderr, flush=True)  # noqa: E731

    def record(name: str, hosts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        out[name] = {"fleet": fleet_figures(hosts), "hosts": hosts, **extra}
        f = out[name]["fleet"]
        log(f"{name}: {f['benchmarks']} benchmarks, {f['keys']} keys, most per key {f['most_per_key']}, "
            f"keys led {f['keys_led']}, at once {f['most_at_once']}, waits {f['waits']} (in vain "
            f"{f['waits_in_vain']}), slowest {f['slowest_host']}, last ready {f['last_ready']}")  # fmt: skip
        return out[name]

    fleet_url = None
    if "cold" in scen or "warm" in scen:
        url = fleet_url = fl.store(f"{workload}-fleet")
        if "cold" in scen:
            log(f"cold fleet: {n} hosts, empty store")
            record("cold", fl.fleet(workload, url, fl.fresh(n, "cold")))
            out["cold"]["store_size"] = fl.size(url)  # what one model costs the store
        else:
            log("seeding the store: one host")
            fl.fleet(workload, url, fl.fresh(1, "seed"))

        if "warm" in scen:
            log(f"warm fleet: {n} fresh hosts")
            rec = record("warm", fl.fleet(workload, url, fl.fresh(n, "warm")))
            if a.warm_rounds > 1:
                rec["rounds"] = warm_rounds(fl, workload, url, rec["hosts"], log)

    if "upgrade" in scen and workload == "sparse":
        url = fl.store(f"{workload}-upgrade")
        hosts = fl.fresh(n, "up")
        log("upgrade: the fleet on v1")
        fl.fleet(workload, url, hosts)
        steps = []
        for edit in EDITS:
            for h in hosts[: (n + 1) // 2]:  # half the fleet (of 3, 2), one restart at a time (same host, same caches)
                log(f"upgrade: {h['host']} restarts on the {edit} edit")
                steps += fl.fleet(workload, url, [{**h, "version": edit}])
        log("upgrade: a fresh host of each version")
        fresh = fl.fleet(workload, url, [{"host": f"fresh-{v}", "dirs": fl.dirs(f"fresh-{v}"), "version": v}
                                         for v in ("v1", *EDITS)])  # fmt: skip
        rec = record("upgrade", steps + fresh)
        rec["fresh_hosts"] = [{"host": h["host"], "benchmarks": h.get("benchmarks"), "compiles": h.get("compiles"),
                               "compiled": h.get("compiled")} for h in fresh]  # fmt: skip
        rec["per_edit_benchmarked_keys"] = {
            e: len({k for h in steps if h["version"] == e for k in h.get("benchmarked_keys", [])}) for e in EDITS
        }

    if "trust" in scen:
        if fleet_url is None:
            fleet_url = fl.store(f"{workload}-trust")
            log("trust: a signed fleet fills the store")
            fl.fleet(workload, fleet_url, fl.fresh(1, "signed"))
        url = fleet_url  # the signed fleet's store
        before = fl.rows(url)
        hosts = fl.fresh(n, "trust")
        hosts[-1]["trust"] = a.bad_host
        log(f"trust: {n} fresh hosts, {hosts[-1]['host']} with {a.bad_host}")
        res = fl.fleet(workload, url, hosts)
        after = fl.rows(url)
        signed_before = {e for e in before["inductor"] if e.endswith(":1")}
        rec = record("trust", res)
        rec["signed_entries_before"] = len(signed_before)
        rec["signed_entries_lost"] = sorted(signed_before - set(after["inductor"]))
        rec["problems_before"], rec["problems_after"] = before["problems"], after["problems"]
        log("trust: the fleet again after the misconfigured host")
        rec["fleet_after"] = fleet_figures(fl.fleet(workload, url, fl.fresh(1, "trust-after")))

    if "trouble" in scen and workload == "sparse":
        out["trouble"] = store_trouble(fl, workload, log)
    for name in ("upgrade", "trouble"):
        if name in scen and workload != "sparse":
            out[name] = {"skipped": "run with the sparse workload only (an edited kernel source; rows to lose)"}
    return out


def warm_rounds(fl: Fleet, workload: str, url: str, first: list[dict[str, Any]], log: Any) -> list[dict[str, Any]]:
    """``--warm-rounds``: the warm fleet again with new fresh hosts, each round after the lone stock
    host restarted once more (and the stock fleet, with ``--stock-fleet``), interleaved so that the
    machine's drift hits both sides; the time targets then judge the medians over rounds."""
    st = fl.results["stock"].get(workload) or {}
    rounds = [
        {
            "stock_warm_s": (st.get("warm") or {}).get("first_output_s"),
            "stock_fleet_warm_s": ((st.get("fleet_warm") or {}).get("fleet") or {})
            .get("slowest_host", {})
            .get("first_output_s"),
            "fleet_warm_s": slowest_s(first),
        }
    ]
    for r in range(1, fl.a.warm_rounds):
        one: dict[str, Any] = {}
        if workload in fl.stock_dirs:
            one["stock_warm_s"] = fl.host(workload, "stock-warm", fl.stock_dirs[workload], None).get("first_output_s")
        if workload in fl.stock_fleet:
            again = [{**h, "host": f"{h['host']}-warm{r}"} for h in fl.stock_fleet[workload]]
            one["stock_fleet_warm_s"] = slowest_s(fl.fleet(workload, None, again))
        one["fleet_warm_s"] = slowest_s(fl.fleet(workload, url, fl.fresh(fl.a.hosts, f"warm{r}")))
        log(f"warm round {r + 1}: {one}")
        rounds.append(one)
    return rounds


def store_trouble(fl: Fleet, workload: str, log: Any) -> dict[str, Any]:
    """A private PostgreSQL restarted during a cold rollout, then down during another."""
    sys.path[:0] = [str(ROOT / "tests" / "faults"), str(ROOT / "tests")]  # pgcluster, and debianpkg it imports
    from pgcluster import PgCluster, private_cluster_available

    why = private_cluster_available()
    if why:
        return {"skipped": f"no private PostgreSQL cluster: {why}"}
    n = fl.a.hosts
    cluster = PgCluster()
    try:
        cluster.init()
        cluster.start()
        url = cluster.create_database()
        from tunecache.store.opening import open_store

        open_store(url).close()  # the schema, before the fleet
        hosts = fl.fresh(n, "restart")
        log(f"trouble: {n} hosts, the database restarted after {fl.a.trouble_after}s")
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(res=fl.fleet(workload, url, hosts)))
        t.start()
        until_rows(url, 1, fl.a.trouble_after)  # the fleet is writing: the first key landed, others are being tuned
        down = cluster.stop("immediate")
        up = cluster.start()
        t.join()
        restart = box["res"]
        stored = fl.rows(url)
        keys = per_key(restart)
        from tunecache.store.opening import open_store as _open

        s = _open(url)
        try:
            missing = [k for k in keys if s.get(k) is None]
        finally:
            s.close()
        log(f"trouble: the database down while {n} hosts of the code edit start")
        before = fl.rows(url)
        hosts2 = fl.fresh(n, "down", version="code")
        box2: dict[str, Any] = {}
        t2 = threading.Thread(target=lambda: box2.update(res=fl.fleet(workload, url, hosts2)))
        t2.start()
        until_rows(url, before["problems"] + 1, fl.a.trouble_after)  # the new version's first key landed
        cluster.stop("immediate")
        t2.join()
        cluster.start()
        after = fl.rows(url)
        lost = max(0, before["problems"] - after["problems"]) + max(0, before["configs"] - after["configs"])
        rec = {
            "restart": {"fleet": fleet_figures(restart), "hosts": restart, "stop_s": down, "start_s": up},
            "down": {"fleet": fleet_figures(box2["res"]), "hosts": box2["res"]},
            "keys_benchmarked_not_stored": missing,
            # every bucket was tuned by some host, in a single flight or in process while the store was
            # restarting (then written when it was back): each must be stored
            "buckets_not_stored": max(0, len(fl.a.buckets) - stored["problems"]),
            "rows_lost": len(missing) + lost + max(0, len(fl.a.buckets) - stored["problems"]),
            "rows": {
                "after_restart": {k: stored[k] for k in ("problems", "configs")},
                "before_down": {k: before[k] for k in ("problems", "configs")},
                "after_down": {k: after[k] for k in ("problems", "configs")},
            },  # fmt: skip
        }
        log(f"trouble: rows lost {rec['rows_lost']}")
        return rec
    finally:
        cluster.destroy()


def until_rows(url: str, problems: int, at_most: float) -> None:
    """Wait until the store holds ``problems`` problems (or ``at_most`` seconds passed)."""
    from tunecache.store.opening import open_store

    deadline = time.monotonic() + at_most
    while time.monotonic() < deadline:
        s = open_store(url)
        try:
            if s.counts()["problems"] >= problems:
                return
        except Exception:  # noqa: BLE001 - the store may still be starting
            pass
        finally:
            s.close()
        time.sleep(0.1)


def stock(fl: Fleet, workload: str) -> dict[str, Any]:
    """Stock starts in this invocation: a cold host (empty caches), then it restarted (warm); with
    ``--stock-fleet``, also ``--hosts`` stock hosts started together, cold, then restarted together.

    The simulated hosts of a fleet share this machine's CPUs (Inductor's compile workers) and GPU; a
    lone stock start does not. The stock fleet has the same contention: the like-for-like baseline
    (``time_targets`` judges against it where it ran, and reports the lone start's ratio beside it)."""
    dirs = fl.stock_dirs[workload] = fl.dirs("stock")
    cold = fl.host(workload, "stock-cold", dirs, None)
    warm = fl.host(workload, "stock-warm", dirs, None)
    out: dict[str, Any] = {"cold": cold, "warm": warm}
    if fl.a.stock_fleet and fl.a.hosts > 1:
        specs = fl.stock_fleet[workload] = fl.fresh(fl.a.hosts, "stock-fleet")
        for name, hosts in (("fleet_cold", specs), ("fleet_warm", [{**h, "host": f"{h['host']}-warm"} for h in specs])):
            ran = fl.fleet(workload, None, hosts)  # url None: stock hosts
            out[name] = {"hosts": ran, "fleet": fleet_figures(ran)}
    return out
