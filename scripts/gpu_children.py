"""The child processes of scripts/bench_gpu.py: each one server start, or one check, in a fresh process.

``python scripts/bench_gpu.py child KIND ARGS_JSON`` runs :data:`CHILDREN`[KIND] with the decoded
arguments and prints its result as one JSON line (the driver reads it back: benchkit.procs). The
children share the bundled sparse MLA decode kernel's inputs (:func:`inputs`, on the device) and
shape (:func:`shape`: the H200's, or a small one under the interpreter on a CPU).
"""

from __future__ import annotations

import os
import statistics
import time

from benchkit import compiles, tracing

# The fixed config when no tuned winners are known: the most common winner on the H200 (32 of 36
# buckets in the 2026-12-01 runs).
DEFAULT_FIXED = {"BLOCK_T": 64, "num_warps": 4, "num_stages": 1}


def inputs(buckets, heads, topk, kv_dtype, device, seed=0):
    """The KV cache and, per bucket, the queries and indices (distinct random slots per query, as
    SGLang's), with the key and softmax scales."""
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


def shape(args):
    """What a child runs: the H200's heads, topk and fp8 cache (topk 64 on a CPU), buckets largest first."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": "cuda" if cuda else "cpu",
        "heads": 16,
        "topk": 2048 if cuda else 64,
        "kv_dtype": "fp8",
        "buckets": sorted(args["buckets"], reverse=True),
    }


_T_PROCESS = time.perf_counter()  # the child's own start, for the trace's timestamps


def _trace() -> list | None:
    """With TC_BENCH_TRACE=1: tunecache's debug log of this child, each line with its time since the
    child started and its thread (where the background prefetch and preload spend their time)."""
    return tracing.keep_log(_T_PROCESS) if os.environ.get("TC_BENCH_TRACE") == "1" else None


def child_start(args: dict) -> dict:
    """One server start: launch every bucket once, largest first; time until all are ready."""
    trace = _trace()
    compiled = compiles.listen()  # before any kernel is defined
    import torch
    from tunecache.kernels import sparse_decode as sd

    import tunecache

    s = shape(args)
    if trace is not None:
        trace.append(f"{time.perf_counter() - _T_PROCESS:8.3f} kernels defined")
    kv, data, k_scale, sm_scale = inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], s["device"])
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
        extra["profile_top_cumulative"] = [
            {"fn": fn, "calls": calls, "cum_s": round(cum, 4), "own_s": round(own, 4)}
            for fn, calls, cum, own in tracing.top(pstats.Stats(prof).stats, 40)
        ]
    if args.get("companions") and cfg is None and not per_bucket:
        # Keep the merge stage's binaries with the split stage's (a user's choice: see docs/binaries.md).
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

    s = shape(args)
    res = {}
    worst = 0.0
    for kv_dtype in ("fp8", "bf16"):
        bks = s["buckets"] if kv_dtype == "fp8" else sorted({s["buckets"][0], s["buckets"][-1]})
        kv, data, k_scale, sm_scale = inputs(bks, s["heads"], s["topk"], kv_dtype, s["device"], seed=1)
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

    s = shape(args)
    if s["device"] != "cuda":
        return {"skipped": "needs CUDA"}
    kv, data, k_scale, sm_scale = inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], "cuda", seed=2)
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

    s = shape(args)
    if s["device"] != "cuda":
        return {"skipped": "needs CUDA"}
    kv, data, k_scale, sm_scale = inputs(s["buckets"], s["heads"], s["topk"], s["kv_dtype"], "cuda", seed=3)
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
