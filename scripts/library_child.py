"""The child of scripts/bench_library.py (and of bench_rollout's ``fla`` workload): one start of a
real library's kernels in a fresh process, run as ``python -c`` (:func:`code`) outside the checkout.

The child imports the library (its autotuners are built there), makes its inputs, fills a buffer
and pauses as a server loading its weights would, then times its passes: the first (the start),
the second (every winner known), and the second again after the same pause. It counts benchmarks
per autotuner class (Triton's own ``Autotuner._bench``, wrapped at the class level), what Triton
compiles or loads during the first pass, and prints its result as one ``RESULT`` JSON line.
Environment: BENCH_ADDSITEDIR (process tunecache-install.pth first), BENCH_TORCH_FILL,
BENCH_PAUSE_S, BENCH_PROFILE, BENCH_INJECT_WINNERS / BENCH_RECORD_WINNERS (the floor), TC_BENCH_TRACE.
"""

from __future__ import annotations

import textwrap

from benchkit import SCRIPTS

SEQ_LENS = (256, 1024, 4096)
OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gla")

CHILD = r"""
import json, os, sys, time
T_PROCESS = time.perf_counter()
sys.path.append(SCRIPTS_DIR)  # the harness, after everything else: it shadows nothing
trace = []
if os.environ.get("TC_BENCH_TRACE") == "1":  # tunecache's debug log, timed from the child's start
    from benchkit import tracing

    trace = tracing.keep_log(T_PROCESS)
if os.environ.get("BENCH_ADDSITEDIR"):
    import site
    site.addsitedir(os.environ["BENCH_ADDSITEDIR"])  # runs tunecache-install.pth, as interpreter start does
import torch, triton
import torch.nn.functional as F
from triton.runtime.autotuner import Autotuner
from benchkit import calls, compiles

counts = {}

def class_name(obj):  # an autotuner's class, "+tunecache" where tunecache serves it
    cls = type(obj)
    return cls.__name__ + ("+tunecache" if any(c.__name__ == "TunecacheAutotuner" for c in cls.__mro__) else "")

def counting(self):
    counts[class_name(self)] = counts.get(class_name(self), 0) + 1

calls.count_calls(Autotuner, "_bench", counting)
WORKLOAD
if os.environ.get("BENCH_TORCH_FILL", "1") == "1":
    # A server fills buffers (its KV cache) while it loads: torch's fill kernel is loaded (CUDA lazy
    # loading) before the first pass, as it is there. Without it the first torch.zeros of the first
    # pass loads it: 7.7 ms there and not in the second call (run X's profile; phase
    # tunecache-restart-no-fill keeps the earlier setup, as runs R-W measured).
    torch.zeros(1, device=dev)
torch.cuda.synchronize()
# A server loads its weights between importing its kernels and their first launch; the same pause
# for every start (BENCH_PAUSE_S, as bench_gpu.py's TC_BENCH_PAUSE_S).
time.sleep(float(os.environ.get("BENCH_PAUSE_S", "1.0")))
loads = compiles.listen()


def _autotuners():  # every Autotuner object of the process
    import gc
    return [obj for obj in gc.get_objects() if isinstance(obj, Autotuner)]


def _tuners():  # every autotuner of the process by its kernel's module.qualname (a name two share: left out)
    found = {}
    for obj in _autotuners():
        fn = getattr(obj, "base_fn", None)
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
        found[name] = None if name in found else obj
    return {k: v for k, v in found.items() if v is not None}


injected = None
if os.environ.get("BENCH_INJECT_WINNERS"):
    # The floor (phase tunecache-restart-floor): every winner put into its autotuner's in-process
    # cache before the first pass, as if this process had already resolved every key. No cache can
    # do better; what its first pass still pays over the second call is not tuning.
    import pickle
    with open(os.environ["BENCH_INJECT_WINNERS"], "rb") as f:
        recorded = pickle.load(f)
    injected = 0
    for name, tuner in _tuners().items():
        by_str = {str(c): c for c in tuner.configs}
        for key, cfg in recorded.get(name, []):
            if cfg in by_str:
                tuner.cache[key] = by_str[cfg]
                injected += 1
cdc_times = []  # tunecache's own share of a first pass: each check_disk_cache (a key's first launch)
if "tunecache" in sys.modules:
    from tunecache.tuner.autotuner import TunecacheAutotuner

    _cdc = TunecacheAutotuner.check_disk_cache

    def _timed_cdc(self, *a, **kw):
        t = time.perf_counter()
        try:
            return _cdc(self, *a, **kw)
        finally:
            cdc_times.append(time.perf_counter() - t)

    TunecacheAutotuner.check_disk_cache = _timed_cdc
preloaded_before = None
if "tunecache" in sys.modules:
    preloaded_before = sys.modules["tunecache"].stats()["preloaded"]
prof = None
if os.environ.get("BENCH_PROFILE") == "1":
    import cProfile
    from benchkit import tracing

    prof = cProfile.Profile()
    prof.enable()
trace.append(f"{time.perf_counter() - T_PROCESS:8.3f} first pass")
modules_before = set(sys.modules)
t0 = time.perf_counter()
first = passes()
t_first = time.perf_counter() - t0
trace.append(f"{time.perf_counter() - T_PROCESS:8.3f} first pass done")
if prof is not None:
    import pstats

    prof.disable()
    profile = [f"{cum:8.4f} {n:6d} {fn}" for fn, n, cum, own in tracing.top(pstats.Stats(prof).stats, 45)]
compiles.stop()
imported_in_first_pass = sorted(set(sys.modules) - modules_before)
benched_first = dict(counts)
cdc_first = list(cdc_times)
if prof is not None:  # the second call profiled too: the difference is what only a first pass pays
    prof2 = cProfile.Profile()
    prof2.enable()
    passes()
    prof2.disable()
    s1, s2 = pstats.Stats(prof).stats, pstats.Stats(prof2).stats
    extra = {k: v[2] - s2.get(k, (0, 0, 0.0))[2] for k, v in s1.items()}  # own time, first minus second
    top = sorted(extra.items(), key=lambda kv: -kv[1])[:40]

    def package(k):
        path, name = k[0], k[2]
        for p in ("tunecache", "triton", "torch", "fla"):
            if f"/{p}/" in path or (path == "~" and p in name):
                return p
        return "import" if "importlib" in path else "python/builtins"

    by_package = {}
    for k, d in extra.items():
        by_package[package(k)] = by_package.get(package(k), 0.0) + d
    profile_extra = [f"{d:8.4f} {s1[k][1]:6d} {tracing.where(k)}" for k, d in top]
t0 = time.perf_counter()
second = passes()
t_second = time.perf_counter() - t0
# The second call again after the same pause as the first pass had: an idle GPU and a cold CPU
# cost a first pass something that no cache can take away; this shows how much.
time.sleep(float(os.environ.get("BENCH_PAUSE_S", "1.0")))
t0 = time.perf_counter()
passes()
t_second_paused = time.perf_counter() - t0
if os.environ.get("BENCH_RECORD_WINNERS"):
    import pickle
    with open(os.environ["BENCH_RECORD_WINNERS"], "wb") as f:
        pickle.dump({n: [(k, str(c)) for k, c in t.cache.items()] for n, t in _tuners().items()}, f)
same = all(torch.equal(a, b) for T in first for a, b in zip(first[T], second[T]))
finite = all(bool(torch.isfinite(o.float()).all()) for T in first for o in first[T])
classes = {}
for obj in _autotuners():
    classes[class_name(obj)] = classes.get(class_name(obj), 0) + 1
out = {
    "first_s": t_first,
    "second_s": t_second,
    "second_after_pause_s": t_second_paused,
    "winners_injected": injected,
    "check_disk_cache_first_pass_s": [sum(cdc_first), len(cdc_first)],
    "benchmarks_by_class": benched_first,
    "benchmarks": sum(benched_first.values()),
    "benchmarks_second_call": sum(counts.values()) - sum(benched_first.values()),
    "autotuners_by_class": classes,
    "outputs_finite": finite,
    "second_call_same_outputs": same,
    "tunecache_imported": "tunecache" in sys.modules,
    "first_pass_loads": loads,
    "preloaded_before_first_pass": preloaded_before,
    "imported_in_first_pass": imported_in_first_pass,
}
if trace:
    out["trace"] = trace[-400:]
if prof is not None:
    out["profile_first_pass"] = profile
    out["profile_first_minus_second_own_time"] = profile_extra
    out["profile_first_minus_second_by_package"] = {k: round(v, 5) for k, v in sorted(by_package.items())}
if "tunecache" in sys.modules:
    import tunecache
    from tunecache.tuner import decorator
    tunecache.flush()
    out["tunecache_installed"] = decorator.installed()
    out["tunecache_stats"] = tunecache.stats()
    cov = tunecache.coverage()
    out["kernels_covered"] = sum(c["covered"] for c in cov.values())
    out["kernels_uncovered"] = {k: c["why"] for k, c in cov.items() if not c["covered"]}
    out["preload_skip_reasons"] = tunecache.preload_skips()
print("RESULT " + json.dumps(out))
"""


#: Each library's part of the child: import it (its autotuners are built there), make the inputs,
#: and ``passes()``: one pass over its calls, returning {shape: tuple of outputs}.
WORKLOADS = {
    "fla": """import fla.ops as ops  # builds its autotuners (CachedAutotuner, triton.autotune) here

B, H, K, V = 1, 16, 128, 128
dev, dt = "cuda", torch.bfloat16
gen = torch.Generator(device=dev).manual_seed(0)
inputs = {}
for T in SEQ_LENS:
    r = lambda *s: torch.randn(*s, device=dev, generator=gen)
    q = F.normalize(r(B, T, H, K), dim=-1).to(dt)
    k = F.normalize(r(B, T, H, K), dim=-1).to(dt)
    v = r(B, T, H, V).to(dt)
    g = F.logsigmoid(r(B, T, H)).float()
    gk = F.logsigmoid(r(B, T, H, K)).to(dt)
    beta = torch.sigmoid(r(B, T, H)).to(dt)
    inputs[T] = (q, k, v, g, gk, beta)

def passes():
    outs = {}
    with torch.no_grad():
        for T, (q, k, v, g, gk, beta) in inputs.items():
            o1, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta)
            o2, _ = ops.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta)
            o3, _ = ops.chunk_gla(q, k, v, gk)
            outs[T] = (o1, o2, o3)
    torch.cuda.synchronize()
    return outs

""",
    # gemlite 0.6 (mobiusml): int8/fp8 GEMM and GEMV kernels under triton.autotune whose constexpr
    # arguments are Triton dtypes (input_dtype=tl.float16, ...), strings and enum values: the launch
    # keys issue 27 found unparseable. Its per-GPU default configs (configs/*.json) match no H200.
    "gemlite": """
import gemlite
from gemlite.helper import A8W8_int8_dynamic, A8W8_fp8_dynamic, A16W8_INT8

dev, dt = "cuda", torch.float16
torch.manual_seed(0)
layers = []
procs = (A8W8_int8_dynamic, A8W8_fp8_dynamic, A16W8_INT8)
for proc in (P(device=dev, dtype=dt) for P in procs):
    for n in (4096, 11008):
        layers.append(proc.from_linear(torch.nn.Linear(4096, n, bias=False, dtype=dt, device=dev)))
inputs = {M: torch.randn(M, 4096, dtype=dt, device=dev) / 100 for M in (1, 16, 64, 256)}

def passes():
    with torch.no_grad():
        outs = {M: tuple(layer(x) for layer in layers) for M, x in inputs.items()}
    torch.cuda.synchronize()
    return outs
""",
}


def code(library: str) -> str:
    """The child's program for ``library`` (a key of :data:`WORKLOADS`), for ``python -c``."""
    text = CHILD.replace("WORKLOAD", textwrap.dedent(WORKLOADS[library])).replace("SEQ_LENS", repr(SEQ_LENS))
    return textwrap.dedent(text.replace("SCRIPTS_DIR", repr(str(SCRIPTS))))
