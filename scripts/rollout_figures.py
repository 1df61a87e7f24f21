"""What a fleet's hosts amount to (scripts/bench_rollout.py): the fleet's figures, the targets and the table.

``fleet_figures`` sums one fleet's host results (benchmarks per key, keys led per host, the most
benchmarks in progress at once, the slowest host, the last one ready); ``time_targets`` and
``checks`` judge the results against issue 35/36's targets; ``markdown`` writes bench_rollout.md. A
module of its own: pure functions of the results' dicts, apart from the processes that produce them.
"""

from __future__ import annotations

import collections
import json
import statistics
from typing import Any

from benchkit import records


def per_key(hosts: list[dict[str, Any]]) -> dict[str, int]:
    """How many hosts benchmarked (or computed and put) each key, over the fleet."""
    c: collections.Counter[str] = collections.Counter()
    for h in hosts:
        c.update(set(h.get("benchmarked_keys", [])) | set(h.get("computed_keys", [])))
    return dict(c)


def most_at_once(hosts: list[dict[str, Any]]) -> int:
    """The most benchmarks (leads of a key) in progress at one moment over the fleet: 1 where the
    fleet benchmarks one key at a time, however many hosts it has."""
    # (time, +1) for a start, (time, -1) for an end: sorted, an end comes before a start at the same instant
    edges = sorted((t, 1 if i == 0 else -1) for h in hosts for lead in h.get("leads", []) for i, t in enumerate(lead))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def fleet_figures(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    keys = per_key(hosts)
    ok = [h for h in hosts if "error" not in h]
    slowest = max(ok, key=lambda h: h.get("first_output_s", 0), default=None)
    ready = [h for h in ok if "ready_s" in h]  # the sparse workload's: its whole warmup, every bucket
    last = max(ready, key=lambda h: h["ready_s"], default=None)
    return {
        "hosts": len(hosts),
        "failed_hosts": [h["host"] for h in hosts if "error" in h],
        "benchmarks": sum(h.get("benchmarks", 0) for h in ok),
        "compiles": sum(h.get("compiles", 0) for h in ok),
        "keys": len(keys),
        "keys_done_twice": sorted(k for k, n in keys.items() if n > 1),
        "most_per_key": max(keys.values(), default=0),
        "keys_led": {h["host"]: h["led"] for h in ok if "led" in h},  # how the fleet spread its keys
        "most_at_once": most_at_once(ok),
        "waits": sum(h.get("waits", 0) for h in ok),
        "waits_in_vain": sum(h.get("waits_in_vain", 0) for h in ok),
        "slowest_host": slowest and {"host": slowest["host"], "first_output_s": slowest.get("first_output_s")},
        "last_ready": last and {"host": last["host"], "ready_s": last["ready_s"]},
    }


def slowest_s(hosts: list[dict[str, Any]]) -> float | None:
    times = [h["first_output_s"] for h in hosts if "error" not in h and h.get("first_output_s")]
    return max(times) if times else None


def time_targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 35/36's targets on times, against the stock starts of this invocation: a cold fleet's
    slowest host within stock cold + 10%; a warm fleet's slowest within 1.5x stock warm."""
    out: dict[str, dict[str, Any]] = {}
    for workload, scen in results["scenarios"].items():
        st = results["stock"].get(workload) or {}
        for name, limit in (("cold", 1.1), ("warm", 1.5)):
            rec = scen.get(name)
            slowest = ((rec or {}).get("fleet") or {}).get("slowest_host") or {}
            lone = (st.get(name) or {}).get("first_output_s")
            together = (((st.get(f"fleet_{name}") or {}).get("fleet") or {}).get("slowest_host") or {}).get(
                "first_output_s"
            )
            if not slowest.get("first_output_s") or not (lone or together):
                continue
            fo = slowest["first_output_s"]
            t = {"slowest": slowest, "limit": limit}
            rounds = (rec or {}).get("rounds") or []
            if len(rounds) > 1:  # --warm-rounds: medians over the interleaved rounds
                med = {
                    k: statistics.median(v) if (v := [r[k] for r in rounds if r.get(k)]) else None
                    for k in ("fleet_warm_s", "stock_warm_s", "stock_fleet_warm_s")
                }
                fo, lone, together = med["fleet_warm_s"] or fo, med["stock_warm_s"], med["stock_fleet_warm_s"]
                t["medians_over_rounds"] = {**med, "rounds": len(rounds)}
            if lone:
                t["ratio_lone"] = round(fo / lone, 2)
            if together:  # like for like: judged against it
                t.update(over=f"the slowest of {len(st[f'fleet_{name}']['hosts'])} stock {name} hosts together",
                         ratio=round(fo / together, 2))  # fmt: skip
            else:
                t.update(over=f"stock {name}", ratio=t["ratio_lone"])
            t["met"] = t["ratio"] <= limit
            out[f"{workload} {name}"] = t
    return out


def checks(results: dict[str, Any], times: bool = False) -> list[str]:
    """The targets on counts (and with ``times``, on times); each miss as one line."""
    bad = [
        f"stock {w} {k}: {r['error'][-300:]}"
        for w, st in results["stock"].items()
        for k, r in st.items()
        if "error" in r
    ]
    if times:
        for what, t in results.get("time_targets", {}).items():
            if not t["met"]:
                bad.append(f"{what}: slowest host {t['ratio']}x {t['over']} (limit {t['limit']}x)")
    for workload, scen in results["scenarios"].items():
        for name, rec in scen.items():
            if "skipped" in rec:
                continue
            f = rec.get("fleet") or {}
            if f.get("failed_hosts"):
                bad.append(f"{workload} {name}: hosts failed: {f['failed_hosts']}")
            failing = [h["host"] for h in rec.get("hosts", []) if h.get("store_errors")]
            if failing and name != "trouble":
                bad.append(f"{workload} {name}: the store failed for {failing} (see their warnings)")
            said = {h["host"]: w for h in rec.get("hosts", []) for w in h.get("warnings", []) if " failed" in w}
            if said and name != "trouble":  # e.g. a filing that failed: the host went on without the store there
                first = next(iter(said.values()))[:200]
                bad.append(f"{workload} {name}: tunecache said something failed on {sorted(said)}: {first}")
            if f.get("waits_in_vain"):
                bad.append(f"{workload} {name}: {f['waits_in_vain']} waits on an entry that never landed")
            if name == "cold" and f.get("most_per_key", 0) > 1:
                bad.append(f"{workload} cold: keys done by more than one host: {f['keys_done_twice'][:5]}")
            stock_cold = ((results["stock"].get(workload) or {}).get("cold") or {}).get("benchmarks")
            if name == "cold" and stock_cold is not None and f.get("benchmarks", 0) > stock_cold:
                bad.append(f"{workload} cold: the fleet ran {f['benchmarks']} benchmarks, one stock start {stock_cold}")
            if name == "warm" and (f.get("benchmarks") or f.get("keys")):
                bad.append(f"{workload} warm: {f['benchmarks']} benchmarks, {f['keys']} keys computed")
            if name == "upgrade":
                for h in rec["fresh_hosts"]:
                    if h["benchmarks"] or h["compiles"]:
                        bad.append(f"{workload} upgrade: fresh host {h['host']}: {h['benchmarks']} benchmarks, "
                                   f"{h['compiles']} compiles")  # fmt: skip
                if f.get("most_per_key", 0) > 1:
                    bad.append(f"{workload} upgrade: keys benchmarked twice: {f['keys_done_twice'][:5]}")
            if name == "trust":
                if rec["signed_entries_lost"]:
                    bad.append(f"{workload} trust: signed entries evicted: {len(rec['signed_entries_lost'])}")
                if rec["problems_after"] < rec["problems_before"]:
                    bad.append(f"{workload} trust: problems lost")
                after = rec["fleet_after"]
                if after["benchmarks"] or after["keys"]:
                    bad.append(
                        f"{workload} trust: the fleet after the misconfigured host computed {after['keys']} keys"
                    )
            if name == "trouble":
                if rec["rows_lost"]:
                    bad.append(f"{workload} trouble: {rec['rows_lost']} rows lost")
                for part in ("restart", "down"):
                    if rec[part]["fleet"]["failed_hosts"]:
                        bad.append(f"{workload} trouble ({part}): hosts failed: {rec[part]['fleet']['failed_hosts']}")
    return bad


COLS = ("host", "version", "trust", "first_output_s", "x_stock_warm", "x_stock_cold", "ready_s", "led", "benchmarks",
        "compiles", "waits", "wait_s", "waits_in_vain", "entries_served", "binaries_served")  # fmt: skip


def markdown(results: dict[str, Any]) -> str:
    md = [f"# bench_rollout ({', '.join(f'{k} {v}' for k, v in results['meta'].items())})", ""]
    for workload, scen in results["scenarios"].items():
        st = results["stock"].get(workload) or {}
        sw, sc = (st.get("warm") or {}).get("first_output_s"), (st.get("cold") or {}).get("first_output_s")
        md += [f"## {workload}", "", f"stock cold first output {sc} s, stock warm {sw} s", ""]
        for name in ("fleet_cold", "fleet_warm"):
            if name in st:
                f = st[name]["fleet"]
                firsts = sorted(h.get("first_output_s") for h in st[name]["hosts"] if "error" not in h)
                md += [f"stock {name.replace('_', ' ')} ({f['hosts']} stock hosts together): first outputs {firsts} s,"
                       f" {f['benchmarks']} benchmarks, {f['compiles']} compiles", ""]  # fmt: skip
        for name, rec in scen.items():
            if "skipped" in rec:
                md += [f"### {name}: skipped ({rec['skipped']})", ""]
                continue
            parts = [(name, rec)] if "hosts" in rec else [(f"{name} {p}", rec[p]) for p in ("restart", "down")]
            for title, r in parts:
                md += [f"### {title}", "", f"fleet: {json.dumps(r['fleet'])}", ""]
                rows = []
                for h in r["hosts"]:
                    row = dict(h)
                    fo = h.get("first_output_s")
                    row["x_stock_warm"] = round(fo / sw, 2) if fo and sw else None
                    row["x_stock_cold"] = round(fo / sc, 2) if fo and sc else None
                    rows.append([row.get(c, "") for c in COLS])
                md += [*records.table(COLS, rows), ""]
            extra = {k: v for k, v in rec.items() if k not in ("hosts", "fleet", "restart", "down")}
            if extra:
                md += [f"{name}: {json.dumps(extra)}", ""]
    for w, why in results["skipped"].items():
        md += [f"- {w}: skipped: {why}"]
    for what, t in results.get("time_targets", {}).items():
        lone = f"; {t['ratio_lone']}x a lone stock start" if "ratio_lone" in t and t["ratio_lone"] != t["ratio"] else ""
        md.append(f"- {what}: slowest host {t['slowest']['host']} {t['ratio']}x {t['over']} "
                  f"(target <= {t['limit']}x: {'met' if t['met'] else 'MISSED'}{lone})")  # fmt: skip
    md += ["", "checks: " + ("all met" if not results["checks"] else "; ".join(results["checks"]))]
    return "\n".join(md) + "\n"
