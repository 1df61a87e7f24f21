#!/usr/bin/env python3
"""Issue 37: the autotuner's own cost per launch of a resolved key, tunecache against stock Triton.

    python3 scripts/bench_dispatch.py                     # 100k calls per variant, 5 interleaved rounds
    python3 scripts/bench_dispatch.py --calls 20000 --rounds 3 --out DIR   # quicker; JSON + markdown in DIR
    python3 scripts/bench_dispatch.py --instructions [--calls 2000] [--out DIR] # instructions per call

Runs on a CPU, without the interpreter: ``JITFunction.run`` is replaced by a no-op taking Triton's
keyword-only ``grid`` and ``warmup``, so nothing compiles or launches and what is measured is only
the Python between ``kernel[grid](...)`` and ``JITFunction.run``. Every variant wraps the same
``@triton.jit`` function with the same configs and key, resolved once before timing (stock Triton
benchmarks the no-op with a CPU timer; tunecache benchmarks it too, into a throwaway SQLite store):

  stock            ``triton.autotune``: Triton's ``Autotuner.run`` for every launch
  tunecache        ``tunecache.autotune``: the hit path (``tunecache/tuner/fastpath.py``)
  tunecache-triton ``tunecache.autotune`` with ``TUNECACHE_FAST_LAUNCH=0``: Triton's run under tunecache
  plain            the bare ``@triton.jit`` launched with the winner's ``Config.all_kwargs()``: the floor
  key              no launch: Triton's key of the call, built by the statements tunecache's launchers
                   use, looked up in the kernel's cache. What any hit path must do on top of a launch,
                   so ``plain + key`` is about the least a hit can cost (``floor`` in the table)

Cases (the call, then what a launch of it passes):

  tiny       ``tiny[grid](x, 1024)``: scripts/bench_gpu.py's overhead kernel, key ``N``
  five       ``five[grid](x, y, out, 1024, 64)``: fp32 and fp16 tensors, key ``N, M``
  keywords   ``five[grid](x=x, y=y, out=out, N=1024, M=64)``: every argument by keyword, as fla launches
  run        ``five.run(x, y, out, 1024, 64, grid=grid, warmup=False)``: what a library's own ``run``
             reaches through ``super().run``
  later      ``tiny[grid](x, 1024)`` on kernels first launched as ``tiny[grid](x, N=1024)`` (a warm-up
             with another call shape): tunecache's ``kernel[grid]`` follows the shape it keeps seeing
  two        ``tiny[grid](x, 1024)`` and ``tiny[grid](x, N=1024)`` in turn, per pair: one of the two
             shapes is always handed on

Each round times ``--calls`` calls of every variant of a case, interleaved in blocks of ``--block``
calls (every variant meets the same phases of a noisy machine); per variant the median over rounds of
the thread's CPU time per call (wall time too); the ratio ``tunecache / stock`` (target <= 1/3), the
floor ``(plain + key) / stock``, and each one's overhead above ``plain``.

``--instructions`` counts instead of timing, for a machine too noisy for times: the same variants,
each ``--calls`` calls (default 2000) between client requests to callgrind (valgrind's, on this
process's main thread; the garbage collector off, hashing seeded, address randomisation off), so the
count per call repeats to about 0.2% from run to run, whatever else the machine does. Instructions are
not time (a cache miss costs more than an add), so this complements the timed table; it needs
valgrind, its ``callgrind.h`` and a C compiler (the requests are a dozen lines of C built here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the real JITFunction, its run replaced below
os.environ.setdefault("TUNECACHE_URL", f"sqlite:///{tempfile.mkdtemp(prefix='tc-dispatch-')}/store.sqlite3")
os.environ.setdefault("TUNECACHE_PREFETCH", "0")  # nothing in the background while timing
os.environ.setdefault("TUNECACHE_COMPANIONS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from benchkit import procs, records  # noqa: E402
from benchkit.timing import per_call as timed  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import tunecache  # noqa: E402
from tunecache.tuner import fastpath  # noqa: E402

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256) for w in (4, 8)]


@triton.jit
def tiny(x, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < N) + 1, mask=offs < N)


@triton.jit
def five(x, y, out, N, M, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < N) + tl.load(y + offs, mask=offs < N) * M, mask=offs < N)


def noop_run(self, *args, grid, warmup, **kwargs):  # JITFunction.run's signature; launches nothing
    return None


def cpu_bench(kernel_call, quantiles):
    kernel_call()
    return [1.0, 1.0, 1.0]


def variants(fn, key: list[str], call, plain, passed: tuple[tuple, dict], first=None) -> dict:
    """A case's variants, each resolved (benchmarked by stock Triton and by the first tunecache kernel,
    a store hit for the second) and launched a few times, as a call of no arguments. ``passed``: the
    arguments the call passes to the kernel (for ``key``)."""
    kernels = {
        "stock": triton.autotune(configs=CONFIGS, key=key, do_bench=cpu_bench)(fn),
        "tunecache": tunecache.autotune(configs=CONFIGS, key=key, do_bench=cpu_bench)(fn),
        "tunecache-triton": tunecache.autotune(configs=CONFIGS, key=key, do_bench=cpu_bench)(fn),
    }
    for name, k in kernels.items():
        if name == "tunecache-triton":  # read at the kernel's first launch
            os.environ["TUNECACHE_FAST_LAUNCH"] = "0"
        for launch in (first, call) if first else (call,):  # another call shape first
            for _ in range(3):
                launch(k)
        os.environ.pop("TUNECACHE_FAST_LAUNCH", None)
    assert kernels["tunecache"]._tc_plan, "the hit path is not planned"
    assert kernels["tunecache-triton"]._tc_plan is False
    assert kernels["tunecache"].best_config is kernels["tunecache-triton"].best_config  # the stored winner
    winner = kernels["tunecache"].best_config.all_kwargs()
    out = {name: (lambda k=k: call(k)) for name, k in kernels.items()}
    out["plain"] = lambda: plain(winner)
    k, (args, kwargs) = kernels["tunecache"], passed
    value_types = [type(v) for v in (*args, *kwargs.values())]
    key = fastpath.key_function(k.arg_names, k.keys, len(args), list(kwargs), value_types, "bench")
    cache = k.cache
    assert cache.get(key(args, kwargs)) is k.best_config
    out["key"] = lambda: cache.get(key(args, kwargs))
    return out


def cases() -> dict:
    x, y, out = torch.zeros(1024), torch.zeros(1024, dtype=torch.float16), torch.zeros(1024)
    grid = (8,)
    return {
        "tiny": variants(tiny, ["N"], lambda k: k[grid](x, 1024), lambda w: tiny[grid](x, 1024, **w), ((x, 1024), {})),
        "five": variants(
            five,
            ["N", "M"],
            lambda k: k[grid](x, y, out, 1024, 64),
            lambda w: five[grid](x, y, out, 1024, 64, **w),
            ((x, y, out, 1024, 64), {}),
        ),
        "keywords": variants(
            five,
            ["N", "M"],
            lambda k: k[grid](x=x, y=y, out=out, N=1024, M=64),
            lambda w: five[grid](x=x, y=y, out=out, N=1024, M=64, **w),
            ((), {"x": x, "y": y, "out": out, "N": 1024, "M": 64}),
        ),
        "run": variants(
            five,
            ["N", "M"],
            lambda k: k.run(x, y, out, 1024, 64, grid=grid, warmup=False),
            lambda w: five.run(x, y, out, 1024, 64, grid=grid, warmup=False, **w),
            ((x, y, out, 1024, 64), {}),
        ),
        "later": variants(
            tiny,
            ["N"],
            lambda k: k[grid](x, 1024),
            lambda w: tiny[grid](x, 1024, **w),
            ((x, 1024), {}),
            first=lambda k: k[grid](x, N=1024),
        ),
        "two": variants(
            tiny,
            ["N"],
            lambda k: (k[grid](x, 1024), k[grid](x, N=1024)),
            lambda w: (tiny[grid](x, 1024, **w), tiny[grid](x, N=1024, **w)),
            ((x, 1024), {}),
        ),
    }


#: Callgrind's client requests, as a library ctypes calls around each variant's calls.
REQUESTS_C = """#include <valgrind/callgrind.h>
void tc_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void tc_stop(const char *name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""


def count_child(lib: str, calls: int) -> None:
    """Under callgrind: each variant's ``calls`` calls between a start and a named dump."""
    import ctypes
    import gc

    requests = ctypes.CDLL(lib)
    for case, variants in cases().items():
        for v, f in variants.items():
            timed(f, 200)
            gc.collect()
            gc.disable()
            requests.tc_start()
            for _ in range(calls):
                f()
            requests.tc_stop(f"{case}:{v}".encode())
            gc.enable()


def count_instructions(calls: int, out: Path | None) -> None:
    """Run this script under callgrind (see the module's docstring); a table of instructions per call."""
    missing = [t for t in ("valgrind", "gcc", "setarch") if shutil.which(t) is None]
    if missing:
        sys.exit(f"--instructions needs {', '.join(missing)} (Debian: valgrind, gcc, util-linux)")
    with tempfile.TemporaryDirectory(prefix="tc-dispatch-cg-") as tmp:
        d = Path(tmp)
        (d / "requests.c").write_text(REQUESTS_C)
        built = procs.run(["gcc", "-O2", "-shared", "-fPIC", "-o", d / "requests.so", d / "requests.c"])
        if built.rc:
            sys.exit("--instructions: building callgrind's client requests failed (is valgrind/callgrind.h there?)")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        cmd = ["setarch", os.uname().machine, "-R", "valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += ["--separate-threads=yes", f"--callgrind-out-file={d}/cg.%p", *procs.python(__file__)]
        cmd += ["--count-child", str(d / "requests.so"), "--calls", str(calls)]
        r = procs.run(cmd, env=env)
        if r.rc:
            sys.exit(f"callgrind run failed:\n{r.stderr[-3000:]}")
        per_call: dict = {}
        dumps = d.glob("cg.*.*-01")  # the main thread's dump of each variant: cg.PID.PART-01, PART in run order
        for f in sorted(dumps, key=lambda f: int(f.name.split(".")[2].split("-")[0])):
            text = f.read_text()
            name = text.split("Client Request: ", 1)[1].split("\n", 1)[0]
            total = int(text.rsplit("totals: ", 1)[1].split()[0])
            case, variant = name.split(":")
            per_call.setdefault(case, {})[variant] = total / calls
    result = {**records.meta(cpu=True), "calls": calls, "cases": {}}
    rows = []
    for case, m in per_call.items():  # in the order cases() made them
        ratio = m["tunecache"] / m["stock"]
        result["cases"][case] = {"instructions_per_call": m, "ratio_tunecache_vs_stock": ratio}
        rows.append([*cells(case, m), f"**{ratio:.3f}**"])
    title = f"Triton {result['triton']}, Python {result['python']}; instructions per call (callgrind, {calls} calls)"
    save(out, "bench_dispatch_instructions", result, [title, "", *records.table(COLUMNS, rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=None, help="calls per variant (default 100000; 2000 counted)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=1000, help="calls per variant between switches (default 1000)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind, not time")
    ap.add_argument("--count-child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    JITFunction.run = noop_run
    if ns.count_child:
        return count_child(ns.count_child, ns.calls)
    if ns.instructions:
        return count_instructions(ns.calls or 2000, ns.out)
    ns.calls = ns.calls or 100_000
    result: dict = {
        **records.meta(cpu=True),
        "calls": ns.calls,
        "rounds": ns.rounds,
        "block": ns.block,
        "cases": {},
    }
    for case, variants in cases().items():
        for f in variants.values():  # warm up
            timed(f, 1000)
        cpu: dict = {v: [] for v in variants}
        wall: dict = {v: [] for v in variants}
        blocks = [min(ns.block, ns.calls - i) for i in range(0, ns.calls, ns.block)]
        for _ in range(ns.rounds):
            spent = {v: [0.0, 0.0] for v in variants}
            for b in blocks:
                for v, f in variants.items():
                    c, w = timed(f, b)
                    spent[v][0] += c * b
                    spent[v][1] += w * b
            for v, (c, w) in spent.items():
                cpu[v].append(c / ns.calls)
                wall[v].append(w / ns.calls)
        med = {v: statistics.median(xs) for v, xs in cpu.items()}
        result["cases"][case] = {
            "ns_per_call_cpu": med,
            "ns_per_call_wall": {v: statistics.median(xs) for v, xs in wall.items()},
            "ratio_tunecache_vs_stock": med["tunecache"] / med["stock"],
            "ratio_tunecache_triton_vs_stock": med["tunecache-triton"] / med["stock"],
            "ratio_floor_vs_stock": (med["plain"] + med["key"]) / med["stock"],
            "overhead_above_plain_ns": {v: med[v] - med["plain"] for v in med if v not in ("plain", "key")},
            "rounds_cpu": cpu,
        }
    save(ns.out, "bench_dispatch", result, summary(result))


#: The tables' columns: the case, each variant per call, tunecache over stock.
COLUMNS = ["case", "stock", "tunecache", "tunecache, Triton's run", "plain @jit", "key alone", "**tunecache / stock**"]


def cells(case: str, per_call: dict) -> list[str]:
    return [case, *(f"{per_call[v]:.0f}" for v in ("stock", "tunecache", "tunecache-triton", "plain", "key"))]


def save(out: Path | None, name: str, result: dict, lines: list[str]) -> None:
    """Print the summary; with ``--out``, the record and the summary into OUT/NAME.json and .md."""
    md = "\n".join(lines) + "\n"
    print(md)
    if out:
        records.write(out / f"{name}.json", result, indent=1)
        (out / f"{name}.md").write_text(md)


def summary(r: dict) -> list[str]:
    title = (
        f"Triton {r['triton']}, torch {r['torch']}, Python {r['python']}; {r['calls']} calls x {r['rounds']} "
        f"rounds, interleaved in blocks of {r['block']}, median thread CPU ns per call"
    )
    rows = []
    for case, c in r["cases"].items():
        m, o = c["ns_per_call_cpu"], c["overhead_above_plain_ns"]
        rows.append([*cells(case, m), f"**{c['ratio_tunecache_vs_stock']:.2f}**", f"{c['ratio_floor_vs_stock']:.2f}",
                     f"{o['stock']:.0f} / {o['tunecache']:.0f}"])  # fmt: skip
    header = [*COLUMNS, "floor: (plain + key) / stock", "overhead above plain: stock / tunecache"]
    return [title, "", *records.table(header, rows)]


if __name__ == "__main__":
    main()
