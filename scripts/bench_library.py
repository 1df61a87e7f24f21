#!/usr/bin/env python3
"""Issues 14, 27: tunecache with a real library's own autotuners (fla-core, gemlite), and the .pth hook's cost.

    python3 scripts/bench_library.py --out DIR             # on the H200: everything below
    python3 scripts/bench_library.py --out DIR --pth-only  # any machine: the start-up hook's cost only
    python3 scripts/bench_library.py --out DIR --library gemlite --no-pth  # the second library (issue 27)

fla-core (flash-linear-attention, 0.6.0) builds most of its autotuners as its own
``CachedAutotuner(Autotuner)``, constructed directly, never through ``triton.autotune``. Forward
passes of ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule`` and ``chunk_gla`` at
T = 256, 1024, 4096 (B=1, H=16, K=V=128, bf16), fla's own per-host cache off (FLA_CACHE_RESULTS=0),
each start a fresh process, cubins cached (one stock start first fills the Triton cache):

  stock-cold         stock Triton, empty Triton cache (fills it; reported, not a target)
  stock-restart      stock Triton, cubins cached: every autotuner benchmarks again
  tunecache-first    TUNECACHE_INSTALL=1 (the .pth hook; no tunecache in the child's code), empty store
  tunecache-restart  the same, store filled: target 0 configs benchmarked, of ANY autotuner class
  tunecache-restart-no-fill   the same without torch's fill kernel loaded before the first pass
                     (the setup of runs R-W; see BENCH_TORCH_FILL in the child)
  tunecache-restart-floor     the restart with every winner the tunecache-restart child resolved put
                     into its autotuner's in-process cache before the first pass (a measurement,
                     not a tunecache feature): the best first pass any tuning cache could give
  stock-pinned       stock Triton (no tunecache) with the same winners put into its autotuners
                     before the first pass: configs pinned by hand, cubins cached

Every child times its passes twice: the first (the start) and again in the same process with every
winner known ("second call"); target: a tunecache restart's first passes within 1.1x of that second
call. Each child then sleeps the same pause and times the passes a third time ("second call after
the pause"). Benchmarks are counted per autotuner class by wrapping Triton's own ``Autotuner._bench`` at
the class level in the child (``+tunecache`` marks a class tunecache serves), so a benchmark that
tunecache does not see is counted too.

The .pth hook: where tunecache-install.pth is not in the interpreter's site-packages (tunecache on
PYTHONPATH, not pip-installed), each tunecache child processes a copy of it with
``site.addsitedir`` as its first statement: the same line the interpreter runs at start. The JSON
says which ("activation").

Start-up cost: ``python -c pass`` in a bare venv vs one with the hook installed, TUNECACHE_INSTALL
unset and set, interleaved (side by side), medians and ratios to bare; and ``import triton`` unset vs
set (set: tunecache is imported and installed there).

Writes DIR/bench_library.json and DIR/bench_library.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

import library_child
from benchkit import procs, records, stores, timing

ROOT = Path(__file__).resolve().parent.parent
PTH = ROOT / "tunecache-install.pth"
STARTUP = ROOT / "_tunecache_startup.py"
WORKLOADS = library_child.WORKLOADS


def _pth_in_site() -> bool:
    dirs = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    with_user = dirs | {site.getusersitepackages()} if site.ENABLE_USER_SITE else dirs
    return any((Path(d) / PTH.name).exists() for d in with_user)


def _child(env: dict[str, str], timeout: float, library: str = "fla") -> dict:
    """One start (scripts/library_child.py) with ``env`` over this process's; its result and wall time."""
    r = procs.run(
        procs.python("-c", library_child.code(library)),
        env=procs.child_env(**env),
        timeout=timeout,
        cwd=tempfile.gettempdir(),  # not the checkout: python -c puts its cwd first on sys.path
    )
    out = r.result("RESULT ")
    if r.rc != 0 or out is None:
        return {"error": f"exit {r.rc}", "stderr": r.stderr[-4000:], "process_s": r.wall_s}
    warned = [ln for ln in r.stderr.splitlines() if "tunecache" in ln]
    return {**out, "tunecache_log": warned[-20:], "process_s": r.wall_s}


def gpu_phases(out_dir: Path, timeout: float, only: set[str], profile: bool, repeat: int, library: str = "fla") -> dict:
    url = stores.sqlite_url(out_dir / "store.sqlite3", fresh=True)
    triton_cache = out_dir / "triton-cache"
    shutil.rmtree(triton_cache, ignore_errors=True)
    base = {
        "FLA_CACHE_RESULTS": "0",
        "TRITON_CACHE_DIR": str(triton_cache),
        "TUNECACHE_URL": url,
        # The checkout last: where tunecache is installed (the GPU host's --target dir) that copy is
        # used, with its tunecache.migrations and tunecache.kernels packages.
        "PYTHONPATH": procs.child_env(after=[ROOT])["PYTHONPATH"],
        "TUNECACHE_INSTALL": "",
    }
    tc = {**base, "TUNECACHE_INSTALL": "1"}
    if _pth_in_site():
        activation = "tunecache-install.pth in site-packages"
    else:
        hook_dir = out_dir / "pth-site"
        hook_dir.mkdir(exist_ok=True)
        shutil.copy(PTH, hook_dir / PTH.name)
        tc["BENCH_ADDSITEDIR"] = str(hook_dir)
        activation = "tunecache-install.pth through site.addsitedir (tunecache not pip-installed here)"
    winners = out_dir / "winners.pickle"  # written by tunecache-restart, read by tunecache-restart-floor
    winners.unlink(missing_ok=True)
    tc_restart = {**tc, "BENCH_RECORD_WINNERS": str(winners)}
    phases = {}
    starts = [
        ("stock-cold", base),
        ("stock-restart", base),
        ("tunecache-first", tc),
        ("tunecache-restart", tc_restart),
        ("tunecache-restart-no-fill", {**tc, "BENCH_TORCH_FILL": "0"}),
        ("tunecache-restart-floor", {**tc, "BENCH_INJECT_WINNERS": str(winners)}),
        ("stock-pinned", {**base, "BENCH_INJECT_WINNERS": str(winners)}),
    ]
    if profile:  # a diagnosis, after the measured starts: where the restart's first pass goes
        starts.append(("tunecache-restart-profiled", {**tc, "BENCH_PROFILE": "1", "TC_BENCH_TRACE": "1"}))
        floor_env = {**tc, "BENCH_INJECT_WINNERS": str(winners), "BENCH_PROFILE": "1"}
        starts.append(("tunecache-restart-floor-profiled", floor_env))
    if only:
        starts = [(n, e) for n, e in starts if n in only]
        if "stock-cold" not in only:  # tunecache-first fills Triton's cache then: stock-restart has its cubins
            starts.sort(key=lambda x: x[0] != "tunecache-first")
    # The restarts change nothing stored: with --repeat they run again in rounds, side by side, the
    # order reversed every other round.
    again = [(n, e) for n, e in starts if n.startswith(("tunecache-restart", "stock-pinned")) and "profiled" not in n]
    profiled = [(n, e) for n, e in starts if n.endswith("profiled")]
    rounds = timing.rounds(again, repeat - 1, "alternate")  # every other round reversed
    order = [x for x in starts if x not in profiled] + [x for r in rounds for x in r] + profiled
    runs: dict[str, list[dict]] = {}
    for name, env in order:
        run = _child(env, timeout, library)
        runs.setdefault(name, []).append(run)
        keys = ("benchmarks", "benchmarks_by_class", "first_s", "second_s", "second_after_pause_s")
        keys += ("winners_injected", "check_disk_cache_first_pass_s", "preloaded_before_first_pass")
        brief = {k: run.get(k) for k in keys}
        print(f"{name}: {json.dumps(brief)}", flush=True)
    for name, rs in runs.items():
        ok = [x for x in rs if "first_s" in x]
        if len(ok) < len(rs) or len(rs) == 1:
            phases[name] = next((x for x in rs if "first_s" not in x), rs[0])
            continue
        # The run with the median first pass stands for the phase; every run's times are kept.
        phases[name] = sorted(ok, key=lambda x: x["first_s"])[len(ok) // 2]
        for k in ("first_s", "second_s", "second_after_pause_s"):
            phases[name][f"{k}_runs"] = [x[k] for x in ok]
        phases[name]["first_over_second_runs"] = [x["first_s"] / x["second_s"] for x in ok]
        phases[name]["benchmarks_runs"] = [x["benchmarks"] for x in ok]

    def ratio(p: dict) -> float:  # each process's own first pass over its own second call; median
        return statistics.median(p.get("first_over_second_runs", [p["first_s"] / p["second_s"]]))

    def first(p: dict) -> float:
        return statistics.median(p.get("first_s_runs", [p["first_s"]]))

    r = phases.get("tunecache-restart", {})
    targets = {}
    if "first_s" in r:
        targets = {
            "restart_benchmarks_any_class": max(r.get("benchmarks_runs", [r["benchmarks"]])),
            "restart_first_over_second_call": ratio(r),
            "zero_benchmarks_met": max(r.get("benchmarks_runs", [r["benchmarks"]])) == 0,
            "within_1_1x_met": ratio(r) <= 1.1,
            "restart_first_over_second_after_pause": r["first_s"] / r["second_after_pause_s"],
            "restart_preloaded": r.get("tunecache_stats", {}).get("preloaded"),
            "restart_preload_skipped": r.get("tunecache_stats", {}).get("preload_skipped"),
            "restart_preload_skip_reasons": r.get("preload_skip_reasons"),
            "restart_tunecache_log_lines": len(r.get("tunecache_log", [])),
        }
    f = phases.get("tunecache-restart-floor", {})
    if "first_s" in r and "first_s" in f:
        targets["floor_first_over_second_call"] = ratio(f)
        targets["restart_first_over_floor_first"] = first(r) / first(f)
        targets["within_1_25x_of_floor_met"] = first(r) / first(f) <= 1.25
    return {"activation": activation, "phases": phases, "targets": targets}


# ---- the start-up hook's cost ----------------------------------------------------------------------


def _venv(where: Path, hooked: bool) -> Path:
    procs.run(procs.python("-m", "venv", "--without-pip", where)).check("python -m venv")
    py = where / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = procs.run([py, "-c", code]).check("the venv's python").stdout.strip()
    # Lends this interpreter's packages (triton, torch, sqlalchemy...) and the checkout's tunecache
    # to both venvs alike; .pth files inside the lent directories are not run.
    # PYTHONPATH's entries too: on the GPU host tunecache's dependencies lie there (a --target dir).
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_dir()]
    lent = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()] + pythonpath + [str(ROOT)]
    Path(purelib, "lend.pth").write_text("".join(f"{p}\n" for p in lent))
    if hooked:
        shutil.copy(PTH, Path(purelib, PTH.name))
        shutil.copy(STARTUP, Path(purelib, STARTUP.name))
    return py


def _timed(py: Path, code: str, env: dict[str, str]) -> float:
    return procs.run([py, "-c", code], env=env).check(f"{py} -c {code!r}").wall_s


def pth_cost(reps: int, triton_reps: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="tc-pth-"))
    try:
        bare, hooked = _venv(tmp / "bare", False), _venv(tmp / "hooked", True)
        env = {k: v for k, v in procs.child_env().items() if k not in ("PYTHONPATH", "TUNECACHE_INSTALL")}
        env.setdefault("TRITON_INTERPRET", "1")  # import triton needs no GPU either way
        on = {**env, "TUNECACHE_INSTALL": "1"}
        check = "import sys, triton.runtime.autotuner as a; assert hasattr(a.Autotuner.__init__, '__wrapped__')"
        procs.run([hooked, "-c", check], env=on).check("the hooked venv's install check")  # the hook installs
        variants = {
            "bare: python -c pass": (bare, "pass", env),
            "hook, TUNECACHE_INSTALL unset": (hooked, "pass", env),
            "hook, TUNECACHE_INSTALL=1": (hooked, "pass", on),
        }
        triton_variants = {
            "bare: import triton": (bare, "import triton", env),
            "hook, unset: import triton": (hooked, "import triton", env),
            "hook, TUNECACHE_INSTALL=1: import triton (installs)": (hooked, "import triton", on),
        }
        out = {}
        for group, n in ((variants, reps), (triton_variants, triton_reps)):
            times: dict[str, list[float]] = {k: [] for k in group}
            for py, code, e in group.values():  # warm the page cache
                _timed(py, code, e)
            for names in timing.rounds(list(group), n, "rotate"):  # side by side
                for name in names:
                    py, code, e = group[name]
                    times[name].append(_timed(py, code, e))
            first = statistics.median(times[next(iter(group))])
            for name, ts in times.items():
                out[name] = {**timing.spread_ms(ts), "ratio_to_bare": round(statistics.median(ts) / first, 3)}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TIMES = ("first_s", "second_s", "second_after_pause_s")


def markdown(result: dict) -> str:
    lines = [f"# bench_library ({result.get('date')}, {result.get('device', 'start-up only')})", ""]
    g = result.get("gpu")
    if g:
        rows = []
        for name, p in g["phases"].items():
            if "error" in p:
                rows.append([name, f"error: {p['error']}", "", "", "", ""])
                continue
            by = ", ".join(f"`{k}` {v}" for k, v in sorted(p["benchmarks_by_class"].items())) or "-"
            ms = {k: " / ".join(f"{t * 1e3:.1f}" for t in p.get(f"{k}_runs", [p[k]])) + " ms" for k in TIMES}
            st = p.get("tunecache_stats") or {}
            pre = f"{st.get('preloaded', '-')} / {st.get('preload_skipped', '-')}" if st else "-"
            logged = len(p.get("tunecache_log", [])) if p.get("tunecache_imported") else "-"
            rows.append([name, p["benchmarks"], by, *(ms[k] for k in TIMES), pre, logged])
        header = ["start", "configs benchmarked", "by autotuner class", "passes (first)", "passes (second call)"]
        header += ["second call after the pause", "preloaded / skipped", "tunecache log lines"]
        lines += [f"activation: {g['activation']}", "", *records.table(header, rows)]
        lines += ["", "(each run's figure where a start ran more than once: --repeat)", ""]
        lines += [f"targets: {json.dumps(g['targets'])}", ""]
    rows = [
        [name, f"{s['median_ms']} ms", f"{s['p10_ms']}-{s['p90_ms']} ms", s["ratio_to_bare"]]
        for name, s in result["pth"].items()
    ]
    lines += records.table(["start-up", "median", "p10-p90", "ratio to bare"], rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--pth-only", action="store_true", help="only the start-up hook's cost (any machine)")
    ap.add_argument("--reps", type=int, default=40, help="runs of each `python -c pass` variant")
    ap.add_argument("--triton-reps", type=int, default=8, help="runs of each `import triton` variant")
    ap.add_argument("--timeout", type=float, default=540.0, help="seconds per fla child")
    ap.add_argument("--phases", default="", help="comma-separated starts to run (default: all)")
    ap.add_argument("--profile", action="store_true", help="then a profiled, traced tunecache restart")
    ap.add_argument("--no-pth", action="store_true", help="skip the start-up hook's cost")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the (unprofiled) restarts, side by side")
    ap.add_argument("--library", choices=sorted(WORKLOADS), default="fla", help="the library whose kernels run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result: dict = records.meta(versions=False)
    if not a.pth_only:
        import torch
        import triton

        result.update(triton=triton.__version__, torch=torch.__version__, device=torch.cuda.get_device_name())
        installs = {"fla": ("fla", "fla-core==0.6.0 einops"), "gemlite": ("gemlite", "gemlite==0.6.0.post2")}
        package, install = installs[a.library]
        try:
            mod = __import__(package)
            result["library"] = {"name": a.library, "version": getattr(mod, "__version__", "?")}
        except ImportError as e:
            sys.exit(f"{package} is not importable ({e}): pip install {install}")
        only = set(filter(None, a.phases.split(",")))
        result["gpu"] = gpu_phases(a.out, a.timeout, only, a.profile, a.repeat, a.library)
    result["pth"] = {} if a.no_pth else pth_cost(a.reps, a.triton_reps)
    records.write(a.out / "bench_library.json", result)
    (a.out / "bench_library.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
