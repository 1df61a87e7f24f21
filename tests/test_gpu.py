"""GPU checks of the autotuner on real hardware (marked ``gpu``: not in CI, run on the H200 machine).

    TUNECACHE_TEST_GPU=1 python -m pytest -m gpu tests/test_gpu.py

Small kernels, so the module runs in about a minute; the bundled kernel's figures come from
scripts/bench_sparse_decode.py.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest
from processes import run_json

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("TUNECACHE_TEST_GPU") != "1" or not torch.cuda.is_available(),
        reason="needs a CUDA GPU and TUNECACHE_TEST_GPU=1 (conftest otherwise forces the interpreter)",
    ),
]

KERNELS = """
import torch, triton, triton.language as tl
import tunecache

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256, 512) for w in (2, 4)]

@tunecache.autotune(configs=CONFIGS, key=["N"])
@triton.jit
def add(x, y, out, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

def run_add(n):
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.full((n,), 2.0, device="cuda")
    out = torch.empty(n, device="cuda")
    add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)
    return add.best_config.kwargs["BLOCK"], add.best_config.num_warps

@triton.jit
def scale(out, N, BLOCK: tl.constexpr):  # a plain kernel launched after the tuned one
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(out + offs, mask=offs < N) * 2, mask=offs < N)

def run_add_then_scale(n):
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    out = torch.empty(n, device="cuda")
    add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, x, out, n)
    scale[(triton.cdiv(n, 1024),)](out, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, 4 * x)
"""


def child(code: str, env: dict, tmp_path) -> dict:
    """Run ``code`` in a fresh process with the kernels imported from a module of their own, as a
    server imports its kernels: tunecache hashes a kernel in the background (and so preloads it) only
    once its module has finished importing, which a script run as ``__main__`` never has."""
    (tmp_path / "gpu_kernels.py").write_text(KERNELS)  # @triton.jit needs its source in a file
    script = tmp_path / f"child_{len(list(tmp_path.glob('child_*.py')))}.py"
    script.write_text("from gpu_kernels import *  # noqa: F403\n" + textwrap.dedent(code))
    return run_json([str(script)], env)


RESTART = """
import json
winners = [run_add(n) for n in (1000, 100000, 1000000)]
print(json.dumps({"stats": tunecache.stats(), "winners": winners}))
"""


def test_restart_on_gpu_does_no_benchmarks_and_keeps_the_winners(sqlite_url, tmp_path):
    a = child(RESTART, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    b = child(RESTART, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert a["stats"]["benchmarks"] == 3 * 6 and a["stats"]["hits"] == 0
    assert b["stats"]["benchmarks"] == 0 and b["stats"]["hits"] == 3
    assert b["winners"] == a["winners"]


PRELOAD = """
import json, sys
import triton
from tunecache.binaries import preload
from tunecache.tuner import autotuner, background
torch.zeros(1, device="cuda")  # CUDA comes up, as when a server loads its weights: the preload starts
background.submit(lambda: None).result(timeout=120)  # queued behind it
cache = preload.jit_function(add).device_caches[torch.cuda.current_device()][0]
before = len(cache)
launch_modules = all(n in sys.modules for n in preload.LAUNCH_IMPORTS)  # before the first launch
compiled = []
triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["repr"])
winners = [run_add(n) for n in (1000, 100000, 1000000)]
print(json.dumps({"stats": tunecache.stats(), "winners": winners, "cached_before": before, "compiled": compiled,
                  "launch_modules": launch_modules}))
"""


def test_restart_preloads_the_winners_binaries_before_the_first_launch(sqlite_url, tmp_path):
    a = child(RESTART, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    b = child(PRELOAD, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    # Three keys; N=1000 is not a multiple of 16, so its winner is a specialisation of its own.
    assert b["stats"]["benchmarks"] == 0 and b["winners"] == a["winners"]
    assert b["stats"]["preloaded"] >= 2 and b["stats"]["preload_skipped"] == 0
    assert b["cached_before"] == b["stats"]["preloaded"]
    assert b["compiled"] == []  # every launch found its binary loaded
    assert b["launch_modules"]  # and what Triton's first launch imports, imported
    off = child(PRELOAD, {"TUNECACHE_URL": sqlite_url, "TUNECACHE_PRELOAD": "0"}, tmp_path)
    assert off["stats"]["preloaded"] == 0 and off["cached_before"] == 0 and len(off["compiled"]) >= 2
    assert not off["launch_modules"]


COMPANION = """
import json
import triton
from tunecache.binaries import preload
from tunecache.tuner import background
torch.zeros(1, device="cuda")  # CUDA comes up: the preload starts
background.submit(lambda: None).result(timeout=120)
cache = preload.jit_function(scale).device_caches[torch.cuda.current_device()][0]
before = len(cache)
compiled = []
hook = triton.knobs.runtime.jit_post_compile_hook  # tunecache's: it chains to the one set before it
triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["repr"]) or (hook and hook(**kw))
for n in (1000, 100000):
    run_add_then_scale(n)
background.submit(lambda: None).result(timeout=120)  # the companions filed, in the background
print(json.dumps({"stats": tunecache.stats(), "scale_cached_before": before, "compiled": compiled}))
"""


def test_a_plain_kernel_launched_with_a_tuned_one_is_preloaded_at_the_restart(sqlite_url, tmp_path):
    """No code names ``scale``: the first process files what Triton compiled of it with ``add`` (the
    kernel it resolved last), and a restart loads it before its first launch."""
    a = child(COMPANION, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert a["stats"]["benchmarks"] == 2 * 6 and a["scale_cached_before"] == 0
    assert any(c.startswith("scale[") for c in a["compiled"])
    b = child(COMPANION, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert b["stats"]["benchmarks"] == 0 and b["scale_cached_before"] == 2  # N=1000 is not aligned
    assert b["compiled"] == [], b["compiled"]  # neither add nor scale loaded anything at its launch
    off = child(COMPANION, {"TUNECACHE_URL": sqlite_url, "TUNECACHE_COMPANIONS": "0"}, tmp_path)
    assert off["scale_cached_before"] == 0 and any(c.startswith("scale[") for c in off["compiled"])


OOR = """
import json
from tunecache.store.opening import open_store

# BLOCK_K=256 x 4 stages of two 128x256 fp16 tiles: 4 * 2 * 64 KiB = 512 KiB of shared memory.
@tunecache.autotune(
    configs=[triton.Config({"BLOCK_K": 32}, num_stages=2), triton.Config({"BLOCK_K": 256}, num_stages=4)],
    key=["K"],
)
@triton.jit
def mm(a, b, c, K, BLOCK_K: tl.constexpr):
    rm = tl.arange(0, 128)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([128, 128], tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * 128 + rm[None, :])
        acc = tl.dot(x, y, acc)
    tl.store(c + rm[:, None] * 128 + rm[None, :], acc)

K = 1024
a = torch.randn(128, K, device="cuda", dtype=torch.float16)
b = torch.randn(K, 128, device="cuda", dtype=torch.float16)
c = torch.empty(128, 128, device="cuda")
mm[(1,)](a, b, c, K)
torch.cuda.synchronize()
ok = torch.allclose(c, a.float() @ b.float(), rtol=1e-2, atol=1e-1)
rows = [r for p in open_store().find_problems(with_configs=True) for r in p.configs if r.status == "out_of_resources"]
print(json.dumps({"ok": ok, "winner": mm.best_config.kwargs, "failures": [r.failure for r in rows]}))
"""


def test_out_of_resources_is_recorded_with_bytes_and_limit_and_never_compiled_again(sqlite_url, tmp_path):
    got = child(OOR, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert got["ok"] and got["winner"] == {"BLOCK_K": 32}
    [failure] = got["failures"]
    assert failure["resource"] == "shared memory"
    assert failure["required"] > failure["limit"] > 0
    again = child(OOR + "\nassert tunecache.stats()['benchmarks'] == 0\n", {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert again["failures"] == got["failures"]


CAPTURE = """
import json
n = 4096
x = torch.arange(n, dtype=torch.float32, device="cuda")
y = torch.full((n,), 2.0, device="cuda")
out = torch.zeros(n, device="cuda")
import os
if os.environ.get("PRECOMPILE") == "1":  # a server's warm-up: every config's binary loaded, not tuned
    for c in CONFIGS:
        add.fn[(triton.cdiv(n, c.kwargs["BLOCK"]),)](x, y, out, n, num_warps=c.num_warps, **c.kwargs)
    torch.cuda.synchronize()
before = tunecache.stats()["benchmarks"]
g = torch.cuda.CUDAGraph()
err = None
try:
    with torch.cuda.graph(g):
        add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
except tunecache.CaptureMissError as e:
    err = str(e)
if err is None:
    g.replay()
    torch.cuda.synchronize()
st = tunecache.stats()
print(json.dumps({"benchmarks": st["benchmarks"] - before, "fallbacks": st["capture_fallbacks"],
                  "correct": err is None and bool(torch.equal(out, x + y)), "error": err}))
"""


@pytest.mark.parametrize("precompiled", [True, False], ids=["warm-binaries", "cold-process"])
def test_miss_inside_cuda_graph_capture_falls_back_and_replays(sqlite_url, precompiled, tmp_path):
    env = {"TUNECACHE_URL": sqlite_url, "PRECOMPILE": "1" if precompiled else "0"}
    got = child(CAPTURE, env, tmp_path)
    assert got == {"benchmarks": 0, "fallbacks": 1, "correct": True, "error": None}
    strict = child(CAPTURE, {**env, "TUNECACHE_MODE": "strict"}, tmp_path)
    assert strict["benchmarks"] == 0 and strict["error"] and "add" in strict["error"]
    # Tuned first by another process (an image build, a warm-up), the key is a store hit inside
    # the capture of a new process and launches normally.
    child("run_add(4096)\nprint('{}')", {"TUNECACHE_URL": sqlite_url}, tmp_path)
    hit = child(CAPTURE, {**env, "TUNECACHE_MODE": "strict"}, tmp_path)
    assert hit == {"benchmarks": 0, "fallbacks": 0, "correct": True, "error": None}


HIT_PATH_CAPTURE = """
import json
n = 4096
x = torch.arange(n, dtype=torch.float32, device="cuda")
y = torch.full((n,), 2.0, device="cuda")
out = torch.zeros(n, device="cuda")
grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
paths, real = [], add.fn.run
def spy(*a, **k):  # which path launched: Triton's run sets nargs to the call's dict first
    paths.append("triton" if isinstance(add.nargs, dict) else "fast")
    return real(*a, **k)
for _ in range(3):  # resolve (tune), then hits
    add[grid](x, y, out, n)
torch.cuda.synchronize()
add.fn.run = spy
add[grid](x, y, out, n)
outside = paths[-1]
best = add.best_config
graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    out.zero_()
    with torch.cuda.graph(graph, stream=stream):
        add[grid](x, y, out, n)  # a hit inside the capture
        add.run(x, y, out, n, grid=grid, warmup=False)  # and through run, as a library's super().run
torch.cuda.current_stream().wait_stream(stream)
inside = paths[-2:]
out.zero_()
x.add_(1.0)  # replayed with new values in the captured buffers
graph.replay()
torch.cuda.synchronize()
correct = bool(torch.equal(out, x + y))
add[grid](x, y, out, n)
after = paths[-1]
print(json.dumps({"outside": outside, "inside": inside, "after": after, "correct": correct,
                  "same_config": add.best_config is best, "nargs": add.nargs,
                  "benchmarks": tunecache.stats()["benchmarks"]}))
"""


def test_hit_path_outside_and_inside_a_capture_and_the_graph_replays(sqlite_url, tmp_path):
    """Issue 37: a resolved key launches through tunecache's hit path, inside a CUDA graph capture too
    (a hit is one launch of the winner there, as through Triton's run; no benchmark can happen on a
    hit); the captured launches replay correctly, and after the capture the same config is launched.
    A miss inside a capture (tunecache's run, which never benchmarks there): bench_gpu.py's capture."""
    got = child(HIT_PATH_CAPTURE, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert got["outside"] == "fast" and got["inside"] == ["fast", "fast"] and got["after"] == "fast"
    assert got["correct"] and got["same_config"] and got["nargs"] is None
    assert got["benchmarks"] == 6  # the first launch only


HOPPER = """
import json, math
from tunecache.kernels import sparse_decode as sd, sparse_decode_sm90 as sm90
from tunecache.store.opening import open_store
import os

gen = torch.Generator(device="cuda").manual_seed(5)
topk, slots = 1024, 1 << 16
kv = (torch.randn(slots, sd.D_QK, generator=gen, device="cuda") * 0.5).to(torch.float8_e4m3fn)
k_scale, sm_scale = 1.0 / 16, 1.0 / math.sqrt(sd.D_QK)
cases = {}
for b in (1, 3, 64):
    q = torch.randn(b, 16, sd.D_QK, generator=gen, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, slots, (b, topk), generator=gen, device="cuda", dtype=torch.int32)
    idx[0, topk // 2 + 5:] = -1                   # a ragged tail
    if b > 1:
        idx[1, :] = -1                            # a fully invalid row
        idx[2 % b, ::7] = -1                      # scattered holes
    cases[b] = (q, idx, *sd.reference(q, kv, idx, sm_scale, k_scale=k_scale))

def check(out, lse, ref, ref_lse):
    valid = torch.isfinite(ref_lse)
    err = ((out.float() - ref)[valid].abs().max() / ref[valid].abs().max()).item()
    lse_err = (lse[valid] - ref_lse[valid]).abs().max().item()
    empty = bool((out[~valid] == 0).all()) and bool(torch.isneginf(lse[~valid]).all())
    return err, lse_err, empty

worst, worst_lse, empty_ok = 0.0, 0.0, True
for c in sm90.CONFIGS:
    if sm90.SHARED_BYTES[c.kwargs["BLOCK_T"]] > sd.SM90_MAX_SHARED:
        continue
    for b, (q, idx, ref, ref_lse) in cases.items():
        for s in {1, 4, sd.choose_num_splits(b, 16, topk)}:
            out, lse = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, num_splits=s,
                                            config=sd._config_dict(c))
            e, l, ok = check(out, lse, ref, ref_lse)
            worst, worst_lse, empty_ok = max(worst, e), max(worst_lse, l), empty_ok and ok
# Head counts that are not one block of 16 (a padded block; several blocks), with the first config.
for h in (8, 20, 128):
    q = torch.randn(3, h, sd.D_QK, generator=gen, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, slots, (3, topk), generator=gen, device="cuda", dtype=torch.int32)
    idx[0, 100:] = -1
    idx[1, :] = -1
    out, lse = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, config=sd._config_dict(sm90.CONFIGS[0]))
    e, l, ok = check(out, lse, *sd.reference(q, kv, idx, sm_scale, k_scale=k_scale))
    worst, worst_lse, empty_ok = max(worst, e), max(worst_lse, l), empty_ok and ok
# The autotuned path: the Hopper kernel serves fp8 here, and its deliberate config fails for lack
# of shared memory, recorded with the bytes it needs.
q, idx, ref, ref_lse = cases[64]
out, lse = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale)
tuned = check(out, lse, ref, ref_lse)
(p,) = open_store(os.environ["TUNECACHE_URL"]).find_problems(with_configs=True)
oor = [r.failure for r in p.configs if r.status == "out_of_resources"]
print(json.dumps({"worst": worst, "worst_lse": worst_lse, "empty_ok": empty_ok, "tuned": tuned,
                  "hopper": sd.split_kernel(kv) is sm90.split_kernel, "kernel": p.kernel,
                  "configs": len(p.configs), "n_configs": len(sm90.CONFIGS), "oor": oor}))
"""


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="the Hopper (sm90) kernel"
)
def test_hopper_fp8_kernel_matches_the_reference_for_every_config_and_records_its_oor(sqlite_url, tmp_path):
    got = child(HOPPER, {"TUNECACHE_URL": sqlite_url}, tmp_path)
    assert got["hopper"] and "sm90" in got["kernel"]
    assert got["worst"] <= 1e-2 and got["worst_lse"] <= 1e-3 and got["empty_ok"], got
    err, lse_err, empty_ok = got["tuned"]
    assert err <= 1e-2 and lse_err <= 1e-3 and empty_ok
    assert got["configs"] == got["n_configs"] >= 13
    [failure] = got["oor"]
    assert failure["required"] == 322560 and failure["limit"] == 232448, failure


def _bench_inductor_hook(tmp_path: Path) -> Path:
    """A folder with the benches' sitecustomize.py (scripts/benchkit/compiles.py): tunecache's start-up
    hook and its compile counter in a child, as the .pth of an install would run it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from benchkit import compiles

    return compiles.write_hook(tmp_path / "hook")


def test_torch_compile_on_a_fresh_host_with_the_store_warm_runs_no_autotune_benchmarks(tmp_path):
    """Issue 28: max-autotune torch.compile of the bench's transformer block. A tunecache start with
    empty local caches and an empty store autotunes and fills the store; a fresh host (new empty
    Inductor and Triton caches, the store warm) runs 0 autotune benchmarks (counted where they run,
    not from Inductor's counters, which a cache hit replays) and no more coordinate-descent tunings than
    stock restarting on its own warm caches (torch 2.11 re-runs those at every warm start), no more
    Triton compiles than that warm start (the search's variants are Triton cache hits in stock's warm
    cache, and come from the store's Triton kernels on a fresh host: docs/benchmarks/torch-compile.md), serves
    entries from the store, and computes what the filling start did (bit for bit: the same kernels
    and configs) and what stock torch.compile does (to bf16 tolerance: stock's own autotuning may pick other GEMMs)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    root = Path(__file__).resolve().parent.parent
    hook = _bench_inductor_hook(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"

    def start(name: str, caches: str, with_tunecache: bool) -> tuple[dict, list]:
        d, log = tmp_path / caches, tmp_path / f"{name}.compiles"
        spec = {"device": "cuda", "dtype": "bfloat16", "d": 256, "heads": 4, "seq": [128]}
        spec |= {"mode": "max-autotune-no-cudagraphs", "outputs": str(tmp_path / f"{name}.pt")}
        env = {
            "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
            "TRITON_CACHE_DIR": str(d / "triton"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p),
            "BENCH_COMPILE_LOG": str(log),
        }
        if with_tunecache:
            env |= {"TUNECACHE_INSTALL": "1", "TUNECACHE_INDUCTOR": "1", "TUNECACHE_URL": url}
        r = run_json([str(root / "scripts" / "bench_inductor.py"), "--child", json.dumps(spec)], env=env, timeout=900)
        r["triton_compiles"] = (
            sum(ln.split()[1] == "compile" for ln in log.read_text().splitlines()) if log.exists() else 0
        )
        return r, torch.load(spec["outputs"])

    with ThreadPoolExecutor(2) as pool:  # starts side by side: the two cold ones take minutes each
        stock_run, first_run = pool.submit(start, "stock", "stock", False), pool.submit(start, "first", "first", True)
        (stock, stock_out), (first, first_out) = stock_run.result(), first_run.result()
        warm_run, fresh_run = pool.submit(start, "warm", "stock", False), pool.submit(start, "fresh", "fresh", True)
        (warm, _), (fresh, fresh_out) = warm_run.result(), fresh_run.result()
    assert stock["fx_backend"] is None and stock["autotune_benchmarks"] > 0, stock
    assert first["fx_backend"] == "TunecacheFxGraphBackend" and first["autotune_benchmarks"] > 0, first
    assert fresh["autotune_benchmarks"] == 0, fresh
    assert fresh["coordesc_tunings"] <= warm["coordesc_tunings"], (fresh, warm)
    # The search's variants come from the store's Triton kernels (tunecache/inductor/tritoncache.py).
    assert fresh["triton_compiles"] <= warm["triton_compiles"], (fresh, warm)
    assert fresh["fxgraph_cache_hit"] == len(first_out) and fresh["tunecache"]["inductor_hits"] >= len(first_out)
    assert all(torch.equal(a, b) for a, b in zip(first_out, fresh_out))
    assert all(torch.allclose(a, b, rtol=2e-2, atol=2e-2) for a, b in zip(stock_out, fresh_out))


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_hosts_started_together_leave_no_lease_and_wait_no_longer_than_the_first_computes(tmp_path, mode):
    """Issue 35, item 1, on the GPU (compile workers look autotune entries up, the main process puts
    them): 4 hosts with distinct host ids start torch.compile together on one empty store. No host
    waits longer than the first host's whole run plus two lease periods (it waited 287 s on leases
    nobody put: TUNECACHE_WAIT_SECONDS), and no lease is left in the store once they have ended."""
    import json
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    root = Path(__file__).resolve().parent.parent
    hook = _bench_inductor_hook(tmp_path)
    store = tmp_path / "store.sqlite3"
    lease_s = 10

    def start(name: str) -> dict:
        d = tmp_path / name
        spec = {"device": "cuda", "dtype": "bfloat16", "d": 256, "heads": 4, "seq": [128, 256]}
        spec |= {"mode": mode, "outputs": str(tmp_path / f"{name}.pt")}
        env = {
            "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
            "TRITON_CACHE_DIR": str(d / "triton"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p),
            "TUNECACHE_INSTALL": "1",
            "TUNECACHE_INDUCTOR": "1",
            "TUNECACHE_URL": f"sqlite:///{store}",
            "TUNECACHE_HOST_ID": name,
            "TUNECACHE_LEASE_SECONDS": str(lease_s),
        }
        t = time.monotonic()
        r = run_json([str(root / "scripts" / "bench_inductor.py"), "--child", json.dumps(spec)], env=env, timeout=900)
        return {**r, "wall": time.monotonic() - t}

    from tunecache.store.opening import open_store

    open_store(f"sqlite:///{store}").close()  # the schema, before they start
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(start, [f"host-{i}" for i in range(4)]))
    computed_most = max(runs, key=lambda r: r["tunecache"].get("inductor_misses", 0))  # the one others waited on
    for r in runs:
        assert r["tunecache"].get("inductor_wait_seconds", 0) < computed_most["wall"] + 2 * lease_s, runs
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT count(*) FROM leases").fetchone()[0] == 0, runs


def test_the_target_info_reads_without_torch_is_the_one_a_tuning_process_detects():
    """``tunecache info`` reads the GPU from libcuda (tunecache.problem.target.machine_target); a process that
    tunes asks torch and Triton: the same fields, digest and all, and torch never imported for it."""
    import json
    import subprocess
    import sys

    prog = (
        "import json, sys\n"
        "from tunecache.problem import target\n"
        "cheap = target.machine_target().as_dict()\n"
        "clean = 'torch' not in sys.modules and 'triton' not in sys.modules\n"
        "print(json.dumps([cheap, target.detect_target().as_dict(), clean]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cheap, tuner, clean = json.loads(r.stdout.strip().splitlines()[-1])
    assert tuner["backend"] == "cuda" and cheap == tuner and clean, (cheap, tuner, clean)
