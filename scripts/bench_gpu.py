#!/usr/bin/env python3
"""GPU benchmarks and checks for issues 3 and 4, run on the H200 test machine in one go.

    python scripts/bench_gpu.py all --out DIR        # everything below; JSON + markdown in DIR
    python scripts/bench_gpu.py all --out DIR --quick   # a few buckets (also runs on a CPU, interpreted)

Every "start" is a fresh child process, like a server restart, and reports the time from its first
kernel launch until every batch bucket is ready (inputs are built before the clock starts, then a
pause of TC_BENCH_PAUSE_S, default 1 s, stands for the server loading its weights):

  stock-cold       stock triton.autotune (TUNECACHE_MODE=off), empty Triton cache
  stock-restart    stock triton.autotune, cubins cached: re-benchmarks everything
  tunecache-first  tunecache, cubins cached, empty store: benchmarks, writes the store
  tunecache-restart tunecache, cubins cached, store filled: zero benchmarks
  fixed            one fixed config, cubins cached: the floor (TUNECACHE_PRELOAD=0: a server
                   without tunecache has nothing that knows which binaries it will need)
  fresh-host       a new store imported from an export (with --launch-specs), EMPTY Triton cache: compiles winners only
  fresh-host-binaries  the same from a signed export with --binaries (imported with TUNECACHE_TRUSTED_KEYS):
                   the winners' binaries are placed into the empty Triton cache, so nothing is compiled
                   (every start counts Triton's compiles per kernel, cache hits apart: "compiles").
                   The tuning starts sign every row (TUNECACHE_SIGNING_KEY); this start checks each
                   row's signature against TUNECACHE_TRUSTED_KEYS (TUNECACHE_TRUST_STORE=no)
  fresh-host-untrusted the same store, the tuning key NOT trusted: nothing placed or preloaded, Triton
                   compiles; then every bucket checked against the fp32 reference in that store and cache
  winners-direct   the restart's winners launched with config= (no tuner): same kernels to load
  restart-profile  a tunecache restart under cProfile: where its time goes
  restart-series   TC_BENCH_ROUNDS (5) interleaved rounds of fixed / tunecache restart / winners
                   direct / tunecache restart with TUNECACHE_PRELOAD=0 / with TUNECACHE_PREFETCH=0
                   (TC_BENCH_SERIES picks):
                   medians and ratios to fixed (single starts differ by tens of ms)

TC_BENCH_PHASES=a,b,... runs only those phases; TC_BENCH_BUDGET_S stops starting new ones.

Then, in separate children: correctness of every bucket against the fp32 reference, capture
behaviour (a miss inside torch.cuda.graph falls back and replays correctly; every bucket captured
and replayed), per-launch cost of a resolved key (a plain @jit launch, a stock autotune hit, a tunecache
hit; TC_BENCH_PHASES=overhead runs only that), per-bucket kernel time and
bandwidth on gathered KV bytes, and the OutOfResources row recorded in the store.
The children live in scripts/gpu_children.py (``bench_gpu.py child KIND ARGS`` runs one).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchkit import procs, records, stores, timing
from gpu_children import CHILDREN, DEFAULT_FIXED


def spawn(kind: str, args: dict, env: dict, log) -> dict:
    """One child (:data:`gpu_children.CHILDREN`), its stderr in the log; its result with its process's
    wall time, or its error."""
    r = procs.run(procs.python(__file__, "child", kind, json.dumps(args)), env=env, timeout=560)
    log.write(f"--- {kind} {args.get('label', '')} rc={r.rc} wall={r.wall_s:.1f}s\n{r.stderr[-3000:]}\n")
    log.flush()
    if r.rc != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        return {"error": r.stderr[-1500:], "process_wall_s": r.wall_s}
    return {**r.result(), "process_wall_s": r.wall_s}


def cubins(cache_dir: str) -> int:
    return len(glob.glob(os.path.join(cache_dir, "**", "_split_stage*.cubin"), recursive=True)) or len(
        glob.glob(os.path.join(cache_dir, "**", "_split_stage*.json"), recursive=True)
    )


def run_all(out_dir: Path, quick: bool) -> dict:
    """Every phase, most important first; stops starting phases past TC_BENCH_BUDGET_S seconds and
    rewrites the JSON after each phase, so a run cut short still reports what it measured."""
    import torch

    from tunecache.buckets import SGLANG_CAPTURE_SIZES

    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tc-bench-"))
    cuda = torch.cuda.is_available()
    buckets = list(SGLANG_CAPTURE_SIZES) if not quick else [1, 8, 64]
    if not cuda:
        buckets = [1, 2, 4]
    budget = float(os.environ.get("TC_BENCH_BUDGET_S", "1e9"))
    base_env = procs.child_env(PYTHONUNBUFFERED="1")
    if not cuda:
        base_env["TRITON_INTERPRET"] = "1"
    cache1, cache2 = str(work / "triton-cache-1"), str(work / "triton-cache-2")
    url1, url2 = f"sqlite:///{work / 'store1.sqlite3'}", f"sqlite:///{work / 'store2.sqlite3'}"
    # The tuning starts sign what they store, as a fleet's tuning jobs would (docs/trust.md).
    key, other_key = stores.key_env(work / "signing-key"), stores.key_env(work / "other-key")
    env1 = {**base_env, "TRITON_CACHE_DIR": cache1, "TUNECACHE_URL": url1}
    env1["TUNECACHE_SIGNING_KEY"] = key["TUNECACHE_SIGNING_KEY"]
    r = records.Record(out_dir / "bench_gpu.json", buckets=len(buckets), **records.meta(), skipped=[])
    a = {"buckets": buckets}
    t_all = time.perf_counter()
    log = open(out_dir / "bench_gpu.log", "w")  # noqa: SIM115 - closed at the end of run_all

    def save() -> None:
        r["total_wall_s"] = time.perf_counter() - t_all
        r.save()

    only = set(filter(None, os.environ.get("TC_BENCH_PHASES", "").split(",")))

    def phase(name: str, fn) -> None:
        if only and name not in only:
            return
        if time.perf_counter() - t_all > budget:
            r["skipped"].append(name)
            return
        print(f"== {name} ({time.perf_counter() - t_all:.0f}s)", flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and go on with the next phase
            r[f"{name}-error"] = repr(e)
        save()

    def start(label: str, env: dict, **extra) -> None:
        r[label] = spawn("start", {**a, "label": label, **extra}, env, log)

    def fresh_host() -> None:
        export = work / "tuned.jsonl.gz"
        ex = stores.cli(["--url", url1, "export", export], env=base_env, cwd=work)
        im = stores.cli(["--url", url2, "import", export, "--launch-specs", "--trust-unsigned"], env=base_env, cwd=work)
        r["exchange"] = {
            "export_rc": ex.rc,
            "import_rc": im.rc,
            "out": (ex.stdout + ex.stderr + im.stdout + im.stderr)[-800:],
        }
        if im.rc != 0:  # exchange unavailable: a consistent copy of the file instead
            import sqlite3

            with sqlite3.connect(work / "store1.sqlite3") as src, sqlite3.connect(work / "store2.sqlite3") as dst:
                src.backup(dst)
            r["exchange"]["fallback"] = "sqlite backup copy"
        start("fresh-host", {**base_env, "TRITON_CACHE_DIR": cache2, "TUNECACHE_URL": url2})
        r["fresh-host"]["split_kernels_compiled"] = cubins(cache2)
        r["stock-cold-split_kernels_compiled"] = cubins(cache1)

    def fresh_host_binaries(pause_s: float | None = None) -> None:
        """A fresh host from a signed export with binaries: a new store, an EMPTY Triton cache
        (``pause_s``: another pause before the first launch, in its own store and cache)."""
        plain, signed = work / "results.jsonl.gz", work / "results+binaries.jsonl.gz"
        tag = "" if pause_s is None else f"-{pause_s:g}s"
        url3, cache3 = f"sqlite:///{work / f'store3{tag}.sqlite3'}", str(work / f"triton-cache-3{tag}")
        steps = {}

        def run(name: str, argv: list, env: dict = base_env) -> None:
            p = stores.cli(argv, env=env, cwd=work)  # not from the checkout (its source tree lacks migrations)
            steps[name] = {"rc": p.rc, "wall_s": p.wall_s, "out": (p.stdout + p.stderr)[-600:]}

        run("export-plain", ["--url", url1, "export", str(plain)])
        signing = ["--sign", key["TUNECACHE_SIGNING_KEY"]]
        run("export-binaries-signed", ["--url", url1, "export", str(signed), "--binaries", *signing])
        trusted = {**base_env, "TUNECACHE_TRUSTED_KEYS": key["TUNECACHE_TRUSTED_KEYS"]}
        run("import-dry-run (verify)", ["--url", url3, "import", str(signed), "--binaries", "--dry-run"], trusted)
        run("import-binaries", ["--url", url3, "import", str(signed), "--binaries", "--json"], trusted)
        if steps["import-binaries"]["rc"] != 0:  # the start below would tune from scratch: say so, do not time it
            r["binaries-exchange"] = {"steps": steps}
            raise RuntimeError(f"import --binaries failed: {steps['import-binaries']['out'][-300:]}")
        r["binaries-exchange"] = {
            "steps": steps,
            "bytes_plain": plain.stat().st_size if plain.exists() else None,
            "bytes_with_binaries": signed.stat().st_size if signed.exists() else None,
        }
        label = f"fresh-host-binaries{tag}"
        extra = {} if pause_s is None else {"pause_s": pause_s}
        # Every row's signature is checked (a private SQLite file would otherwise be trusted whole).
        env3 = {**base_env, "TRITON_CACHE_DIR": cache3, "TUNECACHE_URL": url3, "TUNECACHE_TRUST_STORE": "no"}
        start(label, {**env3, "TUNECACHE_TRUSTED_KEYS": key["TUNECACHE_TRUSTED_KEYS"]}, **extra)
        r[label]["split_kernels_compiled"] = cubins(cache3)
        if pause_s is None:  # the same store and an empty cache, the tuning key not trusted
            cache4, other_pub = str(work / "triton-cache-4"), other_key["TUNECACHE_TRUSTED_KEYS"]
            untrusted = {**env3, "TRITON_CACHE_DIR": cache4, "TUNECACHE_TRUSTED_KEYS": other_pub}
            start("fresh-host-untrusted", untrusted)
            r["fresh-host-untrusted"]["split_kernels_compiled"] = cubins(cache4)
            r["fresh-host-untrusted-correctness"] = spawn("correctness", a, untrusted, log)

    def fixed() -> None:
        winners = r.get("tunecache-first", {}).get("winners", {})
        common = statistics.mode([json.dumps(w, sort_keys=True) for w in winners.values()]) if winners else None
        r["fixed_config"] = json.loads(common) if common else DEFAULT_FIXED
        start("fixed", {**env1, "TUNECACHE_PRELOAD": "0"}, config=r["fixed_config"])
        first, again = winners, r.get("tunecache-restart", {}).get("winners", {})
        r["distinct_winners"] = len({json.dumps(w, sort_keys=True) for w in first.values()})
        r["winners_differ_first_vs_restart"] = sum(1 for k in first if first[k] != again.get(k))

    def tuned_winners() -> dict:
        """{bucket: config} the tunecache starts picked (the restart's, else the first start's)."""
        return r.get("tunecache-restart", {}).get("winners") or r.get("tunecache-first", {}).get("winners", {})

    def winners_direct() -> None:
        # The restart's own winners launched with config= (no tuner): the same kernels to load, so
        # the difference to the restart is what the tuner itself costs.
        start("winners-direct", env1, per_bucket_config=tuned_winners())

    if cuda or quick:
        phase("stock-cold", lambda: start("stock-cold", {**env1, "TUNECACHE_MODE": "off"}))
    companions = os.environ.get("TC_BENCH_COMPANIONS", "1") == "1"
    phase("tunecache-first", lambda: start("tunecache-first", env1, companions=companions))
    phase("tunecache-restart", lambda: start("tunecache-restart", env1))
    phase("fixed", fixed)
    phase("winners-direct", winners_direct)

    def restart_series() -> None:
        # Single starts differ by tens of ms (Triton hashes its sources and libtriton at the first
        # compile of each process); so: N rounds of interleaved starts, medians and their ratios.
        n = int(os.environ.get("TC_BENCH_ROUNDS", "5"))
        winners = tuned_winners()
        every = {
            "fixed": ({**env1, "TUNECACHE_PRELOAD": "0"}, {"config": r.get("fixed_config") or DEFAULT_FIXED}),
            "tunecache-restart": (env1, {}),
            "winners-direct": (env1, {"per_bucket_config": winners}),
            "tunecache-restart-no-preload": ({**env1, "TUNECACHE_PRELOAD": "0"}, {}),
            "winners-direct-no-preload": ({**env1, "TUNECACHE_PRELOAD": "0"}, {"per_bucket_config": winners}),
            "tunecache-restart-no-prefetch": ({**env1, "TUNECACHE_PREFETCH": "0"}, {}),
        }
        wanted = os.environ.get("TC_BENCH_SERIES", ",".join(every)).split(",")
        kinds = {k: v for k, v in every.items() if k in wanted and (not k.startswith("winners-direct") or winners)}
        series: dict = {k: [] for k in kinds}
        for turn in timing.rounds(list(kinds), n):
            for k in turn:
                env, extra = kinds[k]
                res = spawn("start", {**a, "label": k, **extra}, env, log)
                series[k].append(res.get("seconds_to_ready"))
                early = res.get("preloaded_before_first_launch")
                series.setdefault(f"{k}-preloaded_before_first_launch", []).append(early)
                if k != "fixed" and res.get("stats", {}).get("benchmarks"):
                    series.setdefault("benchmarks_seen", []).append(res["stats"]["benchmarks"])
        med = {k: statistics.median(v) for k, v in series.items() if k in kinds and None not in v}
        r["restart-series"] = {
            "rounds": n,
            "seconds": series,
            "median_s": med,
            **{f"ratio_{k}_vs_fixed": med[k] / med["fixed"] for k in med if k != "fixed" and "fixed" in med},
        }

    phase("restart-series", restart_series)
    phase("restart-profile", lambda: start("restart-profile", env1, profile=True))
    phase("fresh-host", fresh_host)
    phase("fresh-host-binaries", fresh_host_binaries)
    # A server that loads its weights for longer than 1 s: the same two starts after a 5 s pause.
    phase("tunecache-restart-5s", lambda: start("tunecache-restart-5s", env1, pause_s=5.0))
    phase("fresh-host-binaries-5s", lambda: fresh_host_binaries(5.0))
    phase("oor", lambda: r.__setitem__("oor", spawn("oor", {"url": url1}, base_env, log)))
    phase(
        "capture",
        lambda: r.__setitem__(
            "capture", spawn("capture", a, {**env1, "TUNECACHE_URL": f"sqlite:///{work / 'capture.sqlite3'}"}, log)
        ),
    )
    phase(
        "overhead",
        lambda: r.__setitem__(
            "overhead",
            spawn(
                "overhead",
                {"launches": 10000 if cuda else 200, "rounds": 9 if cuda else 2},
                {**env1, "TUNECACHE_URL": f"sqlite:///{work / 'overhead.sqlite3'}"},
                log,
            ),
        ),
    )
    phase("correctness", lambda: r.__setitem__("correctness", spawn("correctness", a, env1, log)))
    phase("bandwidth", lambda: r.__setitem__("bandwidth", spawn("bandwidth", a, env1, log)))
    if cuda or quick:
        phase("stock-restart", lambda: start("stock-restart", {**env1, "TUNECACHE_MODE": "off"}))
    log.close()
    save()
    (out_dir / "bench_gpu.md").write_text(summary(r))
    print(summary(r))
    return r


def summary(r: dict) -> str:
    def t(k):
        v = r.get(k, {})
        return v.get("seconds_to_ready", float("nan")), v.get("stats", {}).get("benchmarks", "-")

    rows = []
    for k in (
        "stock-cold",
        "stock-restart",
        "tunecache-first",
        "tunecache-restart",
        "fixed",
        "winners-direct",
        "restart-profile",
        "fresh-host",
        "fresh-host-binaries",
        "fresh-host-untrusted",
        "tunecache-restart-5s",
        "fresh-host-binaries-5s",
    ):
        if k in r:
            s, n = t(k)
            rows.append([k, "all (stock)" if k.startswith("stock") else n, f"{s:.3f}",
                         f"{r[k].get('process_wall_s', float('nan')):.1f}"])  # fmt: skip
    header = ["start", "configs benchmarked", "time to all buckets ready (s)", "process wall (s)"]
    lines = [f"date {r.get('date')}, device: {r['device']}, triton {r['triton']}, torch {r['torch']}, "
             f"{r['buckets']} buckets", "", *records.table(header, rows)]  # fmt: skip
    f, tr = t("fixed")[0], t("tunecache-restart")[0]
    fh = r.get("fresh-host", {})
    fb = r.get("fresh-host-binaries", {})
    tuned = ("_split_stage", "split_stage")  # the autotuned kernels (Triton, Gluon): target 0 compiles
    rows = []
    for k in (
        "stock-cold",
        "tunecache-first",
        "tunecache-restart",
        "fresh-host",
        "fresh-host-binaries",
        "fresh-host-untrusted",
        "tunecache-restart-5s",
        "fresh-host-binaries-5s",
    ):
        if k in r and "compiles" in r[k]:
            c = r[k]["compiles"]
            split = sum(v for n, v in c.items() if n in tuned)
            rows.append([k, split, json.dumps(c), json.dumps(r[k].get("cache_hits"))])
    header = ["start", "Triton compiles (autotuned split)", "compiles (all, by kernel)", "cache hits"]
    lines += ["", *records.table(header, rows)]
    if fb:
        ratio = fb.get("seconds_to_ready", float("nan")) / tr if tr else float("nan")
        ex = r.get("binaries-exchange", {})
        lines += [
            "",
            f"fresh host with binaries / warm restart: {ratio:.2f} (target <= 1.5); "
            f"export {ex.get('bytes_plain')} bytes plain, {ex.get('bytes_with_binaries')} with binaries (signed); "
            + ", ".join(f"{n} {v['wall_s']:.2f}s rc={v['rc']}" for n, v in ex.get("steps", {}).items()),
        ]
    fb5, tr5 = r.get("fresh-host-binaries-5s", {}), r.get("tunecache-restart-5s", {}).get("seconds_to_ready")
    if fb5 and tr5:
        lines.append(f"after a 5 s pause: fresh host with binaries / warm restart: {fb5['seconds_to_ready'] / tr5:.2f}")
    lines += [
        "",
        f"tunecache restart / fixed config: {tr / f if f else float('nan'):.3f}",
        f"restart series: {json.dumps(r.get('restart-series', {}).get('median_s'))} "
        f"ratios {json.dumps({k: v for k, v in r.get('restart-series', {}).items() if k.startswith('ratio')})}",
        f"winners differing first vs restart: {r.get('winners_differ_first_vs_restart')}",
        f"fresh host compiled split kernels: {fh.get('split_kernels_compiled')} "
        f"(distinct winners {r.get('distinct_winners')}; stock cold compiled "
        f"{r.get('stock-cold-split_kernels_compiled')})",
        f"overhead (us per launch): {json.dumps(r.get('overhead', {}).get('us_per_launch'))}; tunecache/stock "
        f"{r.get('overhead', {}).get('ratio')}; vs plain: {json.dumps(r.get('overhead', {}).get('ratio_vs_plain'))}",
        f"oor: {json.dumps(r.get('oor'))}",
        f"correctness worst rel err: {r.get('correctness', {}).get('worst_rel_err')} "
        f"all_ok={r.get('correctness', {}).get('all_ok')}",
        f"capture: {json.dumps(r.get('capture'))}",
    ]
    bw = r.get("bandwidth", {})
    if "per_bucket" in bw:
        rows = []
        for b, v in sorted(bw["per_bucket"].items(), key=lambda kv: int(kv[0])):
            w = v["winner"]
            winner = f"BLOCK_T={w.get('BLOCK_T')} w{w.get('num_warps')} s{w.get('num_stages')}"
            rows.append([b, f"{v['ms']:.4f}", f"{v['TBps']:.2f}", winner])
        lines += ["", *records.table(["B", "ms", "TB/s (gathered KV)", "winner"], rows)]
        lines.append(
            f"\nreference at B=64: {bw.get('reference_ms_b64')} ms; speedup {bw.get('speedup_vs_reference_b64')}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", type=Path, default=Path("bench-out"))
    a.add_argument("--quick", action="store_true")
    c = sub.add_parser("child")
    c.add_argument("kind", choices=sorted(CHILDREN))
    c.add_argument("args")
    ns = ap.parse_args()
    if ns.cmd == "all":
        run_all(ns.out, ns.quick)
    else:
        print(json.dumps(CHILDREN[ns.kind](json.loads(ns.args)), default=str))


if __name__ == "__main__":
    main()
