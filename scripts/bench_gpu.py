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
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The fixed config when no tuned winners are known: the most common winner on the H200 (32 of 36
# buckets in the 2026-12-01 runs).
DEFAULT_FIXED = {"BLOCK_T": 64, "num_warps": 4, "num_stages": 1}
ROOT = HERE.parent


def _inputs(buckets, heads, topk, kv_dtype, device, seed=0):
    import torch
    from tunecache.kernels import sparse_decode as sd

    # Generated on the device: a CPU randn of the 1M x 576 cache took seconds per child process.
    gen = torch.Generator(device=device).manual_seed(seed)
    region = 2 * topk
    slots = max(buckets) * region
    kv = (torch.randn(slots, sd.D_QK, generator=gen, device=device) * 0.5).to(sd._KV_DTYPES[kv_dtype])
    out = {}
    for b in buckets:
        q = torch.randn(b, heads, sd.D_QK, generator=gen, device=device).to(torch.bfloat16)
        pick = torch.rand(b, region, generator=gen, device=device).argsort(dim=1)[:, :topk]
        idx = (pick + (torch.arange(b, device=device) * region)[:, None]).to(torch.int32)
        out[b] = (q, idx)
    k_scale = 1.0 / 16 if kv_dtype == "fp8" else 1.0
    return kv, out, k_scale, 1.0 / (sd.D_QK**0.5)


def _shape(args):
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": "cuda" if cuda else "cpu",
        "heads": 16,
        "topk": 2048 if cuda else 64,
        "kv_dtype": "fp8",
        "buckets": sorted(args["buckets"], reverse=True),
    }


def _count_compiles() -> dict:
    """Count Triton's compiles in this process, per kernel name: {"compiles": {...}, "cache_hits": {...}}.
    Through Triton's own compilation listener (3.4-3.9), installed before any kernel is defined."""
    from triton import knobs

    seen: dict = {"compiles": {}, "cache_hits": {}}

    def listener(src, metadata, metadata_group, times, cache_hit) -> None:
        d = seen["cache_hits" if cache_hit else "compiles"]
        name = str(getattr(src, "name", "?"))
        d[name] = d.get(name, 0) + 1

    knobs.compilation.listener = listener
    return seen


_T_PROCESS = time.perf_counter()  # the child's own start, for the trace's timestamps


def _trace() -> list | None:
    """With TC_BENCH_TRACE=1: tunecache's debug log of this child, each line with its time since the
    child started and its thread (where the background prefetch and preload spend their time)."""
    if os.environ.get("TC_BENCH_TRACE") != "1":
        return None
    import logging

    lines: list = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{time.perf_counter() - _T_PROCESS:8.3f} {record.threadName}: {record.getMessage()}")

    lg = logging.getLogger("tunecache")
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)
    return lines


def child_start(args: dict) -> dict:
    """One server start: launch every bucket once, largest first; time until all are ready."""
    trace = _trace()
    compiled = _count_compiles()
    import torch
    from tunecache.kernels import sparse_decode as sd

    import tunecache

    s = _shape(args)
    if trace is not None:
        trace.append(f"{time.perf_counter() - _T_PROCESS:8.3f} kernels defined")
    kv, data, k_scale, sm_scale = _inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], s["device"])
    cfg = args.get("config")
    if s["device"] == "cuda":
        torch.cuda.synchronize()
    if trace is not None:
        trace.append(f"{time.perf_counter() - _T_PROCESS:8.3f} inputs on the device; pause")
    # A server loads its weights between importing its kernels and their first launch (seconds to
    # minutes); tunecache's background prefetch runs in that window. The same pause for every start.
    time.sleep(float(args.get("pause_s", os.environ.get("TC_BENCH_PAUSE_S", "1.0"))))
    per_bucket = args.get("per_bucket_config")  # {bucket: config}: the winners, launched without the tuner
    prof = None
    if args.get("profile"):
        import cProfile

        prof = cProfile.Profile()
    winners = {}
    preloaded_before = tunecache.stats()["preloaded"]  # binaries loaded before the clock starts
    t0 = time.perf_counter()
    if trace is not None:
        trace.append(f"{t0 - _T_PROCESS:8.3f} first launch")
    if prof is not None:
        prof.enable()
    for b in s["buckets"]:
        q, idx = data[b]
        c = per_bucket[str(b)] if per_bucket else cfg
        sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, config=c, validate=False)
        if c is None:
            best = sd.split_kernel(kv).best_config
            winners[b] = sd._config_dict(best)
    if s["device"] == "cuda":
        torch.cuda.synchronize()
    ready = time.perf_counter() - t0
    extra = {}
    if trace is not None:
        trace.append(f"{time.perf_counter() - _T_PROCESS:8.3f} all buckets ready")
        extra["trace"] = trace
    if prof is not None:
        import pstats

        prof.disable()
        st = pstats.Stats(prof)
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][3])[:40]
        extra["profile_top_cumulative"] = [
            {
                "fn": f"{k[0].rsplit('/', 2)[-1]}:{k[1]}:{k[2]}",
                "calls": v[1],
                "cum_s": round(v[3], 4),
                "own_s": round(v[2], 4),
            }
            for k, v in rows
        ]
    if args.get("companions") and cfg is None and not per_bucket:
        # Keep the merge stage's binaries with the split stage's (a user's choice: see README).
        from tunecache.binaries import binaries

        extra["companion_binaries"] = binaries.record_companions(sd.split_kernel(kv), sd._merge_stage)
    tunecache.flush()
    st = tunecache.stats()
    return {
        "seconds_to_ready": ready,
        "compiles": compiled["compiles"],
        "cache_hits": compiled["cache_hits"],
        "stats": st,
        "preloaded_before_first_launch": preloaded_before,
        "winners": {str(k): v for k, v in winners.items()},
        **extra,
    }


def child_overhead(args: dict) -> dict:
    """Per-launch cost of a resolved key (issue 37), side by side in interleaved rounds: a plain @jit
    launch (the winner's constexprs only, as code writes it; and with the winner's whole
    ``all_kwargs()``, exactly what the autotuners pass to JITFunction.run), a stock triton.autotune
    hit, a tunecache hit (its hit path), and a tunecache hit through Triton's run
    (TUNECACHE_FAST_LAUNCH=0). Every variant launches the same kernel with the same config. To
    attribute costs on a GPU: a check for a capture in progress alone, as torch's public function
    (``capture-check-only``) and as the C function it wraps (``capture-check-c``; the hit path asks
    neither since 2026-12-06, see tunecache/tuner/fastpath.py); and the tunecache kernel's own
    ``@jit`` launched as ``plain-all-kwargs`` is (``tunecache-jit-all-kwargs``: anything
    per-JITFunction shows there)."""
    import torch
    import triton
    import triton.language as tl

    import tunecache

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    configs = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4)]

    def body():
        @triton.jit
        def tiny(x, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)

        return tiny

    from tunecache.tuner.measure import cpu_do_bench

    bench = None if dev == "cuda" else cpu_do_bench  # stock Triton's default needs a GPU (a --quick run on a CPU)
    plain = body()
    stock = triton.autotune(configs=configs, key=["N"], do_bench=bench)(body())
    ours = tunecache.autotune(configs=configs, key=["N"], do_bench=bench)(body())
    slow = tunecache.autotune(configs=configs, key=["N"], do_bench=bench)(body())
    x = torch.zeros(1024, device=dev)
    n = args.get("launches", 10000)
    grid = (4,)
    for k in (stock, ours, slow):
        if k is slow:
            os.environ["TUNECACHE_FAST_LAUNCH"] = "0"  # read at the kernel's first launch
        for _ in range(3):
            k[grid](x, 1024)  # resolve (tune or hit), then hits
        os.environ.pop("TUNECACHE_FAST_LAUNCH", None)
    winner = ours.best_config
    constexprs, full = dict(winner.kwargs), winner.all_kwargs()
    launch = {
        "plain": lambda: plain[grid](x, 1024, **constexprs),
        "plain-all-kwargs": lambda: plain[grid](x, 1024, **full),
        "stock": lambda: stock[grid](x, 1024),
        "tunecache": lambda: ours[grid](x, 1024),
        "tunecache-triton-run": lambda: slow[grid](x, 1024),
        "tunecache-jit-all-kwargs": lambda: ours.fn[grid](x, 1024, **full),  # its own @jit, as plain-all-kwargs
    }
    if dev == "cuda":  # what a check for a capture in progress would cost per launch (the hit path has none)
        launch["capture-check-only"] = torch.cuda.is_current_stream_capturing
        launch["capture-check-c"] = torch._C._cuda_isCurrentStreamCapturing
    for f in launch.values():
        f()
    if dev == "cuda":
        torch.cuda.synchronize()
    rounds: dict = {k: [] for k in launch}
    for _ in range(args.get("rounds", 9)):
        for name, f in launch.items():
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            if dev == "cuda":
                torch.cuda.synchronize()
            rounds[name].append((time.perf_counter() - t0) / n * 1e6)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {
        "us_per_launch": med,
        "ratio": med["tunecache"] / med["stock"],
        "ratio_vs_plain": {k: med[k] / med["plain"] for k in med if k != "plain" and not k.startswith("capture-check")},
        "ratio_vs_plain_all_kwargs": {
            k: med[k] / med["plain-all-kwargs"]
            for k in (
                "stock",
                "tunecache",
                "tunecache-triton-run",
                "tunecache-jit-all-kwargs",
            )
        },
        "fast_path": bool(ours._tc_plan),
        "winner": full,
        "launches": n,
        "rounds": rounds,
    }


def child_correctness(args: dict) -> dict:
    """Every bucket against the fp32 reference (tuned kernel); bf16 KV at a few sizes too."""
    import torch
    from tunecache.kernels import sparse_decode as sd

    s = _shape(args)
    res = {}
    worst = 0.0
    for kv_dtype in ("fp8", "bf16"):
        bks = s["buckets"] if kv_dtype == "fp8" else sorted({s["buckets"][0], s["buckets"][-1]})
        kv, data, k_scale, sm_scale = _inputs(bks, s["heads"], s["topk"], kv_dtype, s["device"], seed=1)
        for b in bks:
            q, idx = data[b]
            idx = idx.clone()
            idx[0, s["topk"] // 2 :] = -1  # a ragged tail
            if b > 1:
                idx[1, :] = -1  # a fully invalid row
            out, lse = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale)
            ref_o, ref_l = sd.reference(q, kv, idx, sm_scale, k_scale=k_scale)
            valid = torch.isfinite(ref_l)
            err = ((out.float() - ref_o).abs().amax() / ref_o.abs().amax().clamp(min=1e-6)).item()
            lse_err = (lse[valid] - ref_l[valid]).abs().max().item() if valid.any() else 0.0
            empty_ok = bool((out[~valid] == 0).all()) and bool(torch.isneginf(lse[~valid]).all())
            res[f"{kv_dtype}:{b}"] = {"rel_err": err, "lse_abs_err": lse_err, "empty_rows_ok": empty_ok}
            worst = max(worst, err)
    return {
        "cases": res,
        "worst_rel_err": worst,
        "all_ok": worst <= 1e-2 and all(v["empty_rows_ok"] for v in res.values()),
    }


def child_capture(args: dict) -> dict:
    """A miss inside torch.cuda.graph falls back (no benchmark) and replays correctly; a hit is
    captured normally; every bucket captured after warm-up replays correctly."""
    import torch
    from tunecache.kernels import sparse_decode as sd

    import tunecache

    s = _shape(args)
    if s["device"] != "cuda":
        return {"skipped": "needs CUDA"}
    kv, data, k_scale, sm_scale = _inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], "cuda", seed=2)
    out = {}
    # 1. A miss during capture (this store has never seen the bucket).
    b_miss = s["buckets"][-1]
    q, idx = data[b_miss]
    before = tunecache.stats()["benchmarks"]
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sd.sparse_mla_decode(
            q,
            kv,
            idx,
            sm_scale,
            k_scale=k_scale,
            config=DEFAULT_FIXED,  # a config both split stages accept (Triton and the Hopper kernel)
        )  # warm the merge kernel's compile only
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(g):
        o_g, l_g = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, validate=False)
    g.replay()
    torch.cuda.synchronize()
    ref_o, _ = sd.reference(q, kv, idx, sm_scale, k_scale=k_scale)
    st = tunecache.stats()
    out["miss_in_capture"] = {
        "benchmarks_during_capture": st["benchmarks"] - before,
        "capture_fallbacks": st["capture_fallbacks"],
        "replay_rel_err": ((o_g.float() - ref_o).abs().amax() / ref_o.abs().amax()).item(),
    }
    # 2. Warm every bucket eagerly (as a server does), then capture each and replay.
    errs = {}
    for b in s["buckets"]:
        q, idx = data[b]
        sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale)
    torch.cuda.synchronize()
    before = tunecache.stats()["benchmarks"]
    for b in s["buckets"]:
        q, idx = data[b]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o_g, l_g = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, validate=False)
        g.replay()
        torch.cuda.synchronize()
        ref_o, _ = sd.reference(q, kv, idx, sm_scale, k_scale=k_scale)
        errs[b] = ((o_g.float() - ref_o).abs().amax() / ref_o.abs().amax()).item()
    out["captured_buckets"] = {
        "count": len(errs),
        "worst_rel_err": max(errs.values()),
        "benchmarks_during_capture": tunecache.stats()["benchmarks"] - before,
    }
    return out


def child_bandwidth(args: dict) -> dict:
    """Per-bucket time of the tuned kernel (split + merge), effective TB/s on gathered KV bytes,
    and the torch fp32 reference at B=64."""
    import triton
    from tunecache.kernels import sparse_decode as sd

    s = _shape(args)
    if s["device"] != "cuda":
        return {"skipped": "needs CUDA"}
    kv, data, k_scale, sm_scale = _inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], "cuda", seed=3)
    rows = {}
    for b in s["buckets"]:
        q, idx = data[b]

        def fn(q=q, idx=idx):
            return sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, validate=False)

        fn()
        ms = triton.testing.do_bench_cudagraph(fn, rep=50)
        gathered = b * s["topk"] * sd.D_QK * kv.element_size()
        rows[b] = {
            "ms": ms,
            "TBps": gathered / (ms * 1e-3) / 1e12,
            "winner": sd._config_dict(sd.split_kernel(kv).best_config),
        }
    out = {"per_bucket": rows}
    if 64 in data:
        q, idx = data[64]
        ref_ms = triton.testing.do_bench(lambda: sd.reference(q, kv, idx, sm_scale, k_scale=k_scale), rep=200)
        out["reference_ms_b64"] = ref_ms
        out["speedup_vs_reference_b64"] = ref_ms / rows[64]["ms"]
    return out


def child_oor(args: dict) -> dict:
    from tunecache.store.opening import open_store

    s = open_store(args["url"])
    rows = []
    for p in s.find_problems(with_configs=True):
        rows += [
            dict(bucket=p.batch_bucket, config=r.config, failure=r.failure)
            for r in p.configs
            if r.status == "out_of_resources"
        ]
    return {
        "out_of_resources_rows": len(rows),
        "example": rows[0] if rows else None,
        "problems": s.counts()["problems"],
    }


CHILDREN = {
    "start": child_start,
    "overhead": child_overhead,
    "correctness": child_correctness,
    "capture": child_capture,
    "bandwidth": child_bandwidth,
    "oor": child_oor,
}


def spawn(kind: str, args: dict, env: dict, log) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, __file__, "child", kind, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    wall = time.perf_counter() - t0
    log.write(f"--- {kind} {args.get('label', '')} rc={r.returncode} wall={wall:.1f}s\n{r.stderr[-3000:]}\n")
    log.flush()
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        return {"error": r.stderr[-1500:], "process_wall_s": wall}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = wall
    return res


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
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not cuda:
        base_env["TRITON_INTERPRET"] = "1"
    cache1, cache2 = str(work / "triton-cache-1"), str(work / "triton-cache-2")
    url1, url2 = f"sqlite:///{work / 'store1.sqlite3'}", f"sqlite:///{work / 'store2.sqlite3'}"
    # The tuning starts sign what they store, as a fleet's tuning jobs would (README, "Trust model").
    from tunecache import signing

    key, other_key = work / "signing-key", work / "other-key"
    signing.keygen(key)
    signing.keygen(other_key)
    env1 = {**base_env, "TRITON_CACHE_DIR": cache1, "TUNECACHE_URL": url1, "TUNECACHE_SIGNING_KEY": str(key)}
    r: dict = {
        "buckets": len(buckets),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "triton": __import__("triton").__version__,
        "torch": torch.__version__,
        "skipped": [],
    }
    a = {"buckets": buckets}
    t_all = time.perf_counter()
    log = open(out_dir / "bench_gpu.log", "w")  # noqa: SIM115 - closed at the end of run_all

    def save() -> None:
        r["total_wall_s"] = time.perf_counter() - t_all
        (out_dir / "bench_gpu.json").write_text(json.dumps(r, indent=2, default=str))

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
        tc = [sys.executable, "-m", "tunecache.cli"]
        ex = subprocess.run(
            [*tc, "--url", url1, "export", str(export)], env=base_env, capture_output=True, text=True, cwd=work
        )
        im = subprocess.run(
            [*tc, "--url", url2, "import", str(export), "--launch-specs", "--trust-unsigned"],
            env=base_env,
            capture_output=True,
            text=True,
            cwd=work,
        )
        r["exchange"] = {
            "export_rc": ex.returncode,
            "import_rc": im.returncode,
            "out": (ex.stdout + ex.stderr + im.stdout + im.stderr)[-800:],
        }
        if im.returncode != 0:  # exchange unavailable: a consistent copy of the file instead
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
        tc = [sys.executable, "-m", "tunecache.cli"]
        plain, signed = work / "results.jsonl.gz", work / "results+binaries.jsonl.gz"
        tag = "" if pause_s is None else f"-{pause_s:g}s"
        url3, cache3 = f"sqlite:///{work / f'store3{tag}.sqlite3'}", str(work / f"triton-cache-3{tag}")
        steps = {}

        def run(name: str, argv: list, env: dict = base_env) -> None:
            t0 = time.perf_counter()
            # Not from the checkout: `-m tunecache.cli` would import its source tree, not the install.
            p = subprocess.run([*tc, *argv], env=env, capture_output=True, text=True, cwd=work)
            steps[name] = {"rc": p.returncode, "wall_s": time.perf_counter() - t0, "out": (p.stdout + p.stderr)[-600:]}

        run("export-plain", ["--url", url1, "export", str(plain)])
        run("export-binaries-signed", ["--url", url1, "export", str(signed), "--binaries", "--sign", str(key)])
        trusted = {**base_env, "TUNECACHE_TRUSTED_KEYS": f"{key}.pub"}
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
        start(label, {**env3, "TUNECACHE_TRUSTED_KEYS": f"{key}.pub"}, **extra)
        r[label]["split_kernels_compiled"] = cubins(cache3)
        if pause_s is None:  # the same store and an empty cache, the tuning key not trusted
            cache4 = str(work / "triton-cache-4")
            untrusted = {**env3, "TRITON_CACHE_DIR": cache4, "TUNECACHE_TRUSTED_KEYS": f"{other_key}.pub"}
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
        for _ in range(n):
            for k, (env, extra) in kinds.items():
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

    lines = [
        f"device: {r['device']}, triton {r['triton']}, torch {r['torch']}, {r['buckets']} buckets",
        "",
        "| start | configs benchmarked | time to all buckets ready (s) | process wall (s) |",
        "|---|---|---|---|",
    ]
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
            if k.startswith("stock"):
                n = "all (stock)"
            lines.append(f"| {k} | {n} | {s:.3f} | {r[k].get('process_wall_s', float('nan')):.1f} |")
    f, tr = t("fixed")[0], t("tunecache-restart")[0]
    fh = r.get("fresh-host", {})
    fb = r.get("fresh-host-binaries", {})
    tuned = ("_split_stage", "split_stage")  # the autotuned kernels (Triton, Gluon): target 0 compiles
    lines += [
        "",
        "| start | Triton compiles (autotuned split) | compiles (all, by kernel) | cache hits |",
        "|---|---|---|---|",
    ]
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
            lines.append(
                f"| {k} | {sum(v for n, v in c.items() if n in tuned)} | {json.dumps(c)} | "
                f"{json.dumps(r[k].get('cache_hits'))} |"
            )
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
        lines += ["", "| B | ms | TB/s (gathered KV) | winner |", "|---|---|---|---|"]
        for b, v in sorted(bw["per_bucket"].items(), key=lambda kv: int(kv[0])):
            w = v["winner"]
            lines.append(
                f"| {b} | {v['ms']:.4f} | {v['TBps']:.2f} | BLOCK_T={w.get('BLOCK_T')} w{w.get('num_warps')} "
                f"s{w.get('num_stages')} |"
            )
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
