#!/usr/bin/env python3
"""A fleet's rollout, end to end (issue 36): N simulated hosts started together against one store.

    python scripts/bench_rollout.py DIR [--hosts 4] [--workloads sparse,inductor,fla]
        [--scenarios cold,warm,upgrade,trust,trouble] [--modes default,max-autotune-no-cudagraphs]
        [--url postgresql://...] [--pgbouncer] [--stagger 0] [--no-stock] [--cpu] [--check]

Each host is a real process with its own ``TUNECACHE_HOST_ID``, Triton cache, Inductor cache, lock
directory and miss spool, all sharing one store (a SQLite file in DIR, the PostgreSQL of ``--url``,
or with ``--pgbouncer`` that PostgreSQL through a private PgBouncer in transaction mode), with no
code change: ``TUNECACHE_INSTALL=1`` reaches it through a ``sitecustomize`` (scripts/benchkit/compiles.py's
hook: a PYTHONPATH site dir processes no .pth file). Workloads:

- ``sparse``: the bundled sparse MLA decode kernel over its batch buckets (36 on a GPU; under the
  Triton interpreter on a CPU, ``--buckets``, small shapes); each host runs scripts/rollout_host.py;
- ``fla``: fla-core's autotuned forward ops (bench_library's child, scripts/library_child.py; GPU
  only, skipped with a message when fla is not importable);
- ``inductor``: torch.compile of bench_inductor's transformer block (its child,
  scripts/inductor_child.py, and its counting hooks), per ``--modes``.

Scenarios (each on a store of its own, except that warm and trust follow cold on cold's store):

- ``cold``: empty store, N hosts at once; target: one benchmark (or computed entry) per key fleet-wide;
- ``warm``: the store warm, N fresh hosts (empty local caches); target: 0 benchmarks, nothing computed;
- ``upgrade`` (sparse): a warm fleet rolls out an edited kernel, host by host (a restart: same host id and
  local caches), first a comment edit, then a real code change; then a fresh host of each version:
  target: no fresh host benchmarks, and each edit is benchmarked at most once fleet-wide;
- ``trust``: a warm, signed store; N fresh hosts, one of them misconfigured (``--bad-host no-keys``:
  no trusted key and no signing key; ``other``: another key pair), then one more fresh host; target:
  the signed rows and entries are intact, the others (and the host after) are served;
- ``trouble`` (needs a private PostgreSQL cluster, tests/faults/pgcluster.py): a cold fleet while the
  database restarts, then N hosts of a new kernel version while it is unreachable; target: every host
  produces its output, no row lost.

Per host: time to first output, time to ready (sparse: every bucket warmed), process time, keys led
(benchmarked here for the fleet), benchmarks, compiles, waits (count, seconds, and waits on an entry
that never landed), entries and binaries served (Triton cache hits in an empty local cache), the
``TUNECACHE_SUMMARY`` line. Per fleet: benchmarks per key, keys led per host and the most benchmarks
in progress at once (1: the fleet tuned one key at a time), the slowest host, the last one ready, rows
lost. Stock starts (no tunecache: one cold, then one warm on its caches) run in the same invocation
for the ratios (``--no-stock`` skips them). Writes DIR/bench_rollout.json and DIR/bench_rollout.md
(the figures, targets and table: scripts/rollout_figures.py; the hosts: scripts/rollout_fleet.py; the
scenarios: scripts/rollout_scenarios.py); ``--check`` exits 1 when a target on
counts is missed (times are reported, never checked).

On the H200: the commands of docs/rolling-out.md (one per mode, each inside 10 minutes).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from benchkit import ROOT, gates, records
from inductor_child import DEFAULT_SEQ, MODES
from rollout_figures import checks, markdown, time_targets
from rollout_fleet import Fleet
from rollout_scenarios import run_scenarios, stock

WORKLOADS = ("sparse", "inductor", "fla")
SCENARIOS = ("cold", "warm", "upgrade", "trust", "trouble")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", help="results, caches and stores (default: a new temporary directory)")
    p.add_argument("--hosts", type=int, default=4, help="hosts per fleet (default 4)")
    p.add_argument("--workloads", default=None, help=f"comma-separated: {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS[:4]), help=f"comma-separated: {', '.join(SCENARIOS)}")
    p.add_argument("--modes", default=None, help="torch.compile modes (default: default; GPU: both)")
    p.add_argument(
        "--url", default=None, help="the bench's own PostgreSQL database, emptied per scenario (default: SQLite files)"
    )
    p.add_argument(
        "--pgbouncer", action="store_true", help="reach --url through a private PgBouncer (transaction mode)"
    )
    p.add_argument("--stagger", type=float, default=0.0, help="seconds between two hosts' starts (default 0: together)")
    p.add_argument("--bad-host", choices=("no-keys", "other"), default="no-keys", help="the trust scenario's host")
    p.add_argument("--no-stock", action="store_true", help="no stock starts (no ratios)")
    p.add_argument(
        "--stock-fleet",
        action="store_true",
        help="also --hosts stock hosts started together, cold then warm: the baseline with the same contention",
    )
    p.add_argument("--cpu", action="store_true", help="the Triton interpreter, small shapes, torch.compile on the CPU")
    p.add_argument("--buckets", default=None, help="sparse: batch buckets (default: the 36 on a GPU; CPU: 2)")
    p.add_argument("--seq", default=None, help="inductor: sequence lengths (default 512,1024,2048; CPU 16)")
    p.add_argument("--wait-seconds", type=float, default=300, help="TUNECACHE_WAIT_SECONDS of every host")
    p.add_argument(
        "--trouble-after",
        type=float,
        default=120.0,
        help="trouble: the database goes once the fleet stored its first key, or after this many seconds",
    )
    p.add_argument("--gpus", type=int, default=None, help="GPUs to spread hosts over (default: all visible)")
    p.add_argument("--timeout", type=float, default=580.0, help="seconds per host")
    p.add_argument(
        "--warm-rounds",
        type=int,
        default=1,
        help="warm scenario: this many fleets of fresh hosts, each after a stock warm restart; times judged on medians",
    )
    p.add_argument(
        "--debug-log",
        action="store_true",
        help="tunecache's debug lines of every process of a host (compile workers too) in DIR/hosts/*/tunecache.log",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="run each host (not fla's) under cProfile: DIR/hosts/*/profile.prof and its top functions in profile.txt",
    )
    gates.add_check_flag(p, "a target on counts")
    p.add_argument("--check-times", action="store_true", help="with --check: the targets on times too (GPU)")
    a = p.parse_args()
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}: one of {', '.join(SCENARIOS)}")
    workloads = [w for w in (a.workloads or ",".join(WORKLOADS)).split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}: one of {', '.join(WORKLOADS)}")
    from tunecache.buckets import SGLANG_CAPTURE_SIZES

    a.buckets = (
        [int(b) for b in a.buckets.split(",")] if a.buckets else ([2, 1] if a.cpu else list(SGLANG_CAPTURE_SIZES))
    )
    a.heads, a.topk = (16, 32) if a.cpu else (16, 2048)
    a.seq = [int(s) for s in a.seq.split(",")] if a.seq else ([16] if a.cpu else list(DEFAULT_SEQ))
    a.d, a.model_heads = (32, 2) if a.cpu else (1024, 8)
    modes = (a.modes or ("default" if a.cpu else ",".join(MODES))).split(",")
    if a.gpus is None and not a.cpu:
        import torch

        a.gpus = torch.cuda.device_count()
    out = Path(a.dir or tempfile.mkdtemp(prefix="bench-rollout-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    fl = Fleet(out, a)
    bouncer = None
    if a.pgbouncer:
        if not a.url:
            p.error("--pgbouncer needs --url")
        sys.path.insert(0, str(ROOT / "tests"))
        from pgbouncer import PgBouncer

        from tunecache.store.engine import resolve_url

        u = resolve_url(a.url)
        bouncer = PgBouncer(u.host or "127.0.0.1", u.port or 5432).start()
        fl.bouncer_url = bouncer.through(a.url)
    t0 = time.perf_counter()
    try:
        for w in workloads:
            if w == "fla" and (a.cpu or importlib.util.find_spec("fla") is None):
                why = "needs a GPU" if a.cpu else "fla is not importable: pip install fla-core==0.6.0 einops"
                fl.results["skipped"][w] = why
                print(f"[fla] skipped: {why}", file=sys.stderr)
                continue
            for name in [f"inductor:{m}" for m in modes] if w == "inductor" else [w]:
                if a.cpu and name == "sparse":  # stock Triton's benchmarker needs a GPU driver
                    fl.results["skipped"]["sparse stock"] = "stock Triton cannot benchmark under the interpreter"
                elif not a.no_stock:
                    print(f"[{name}] stock cold, then stock warm", file=sys.stderr, flush=True)
                    fl.results["stock"][name] = stock(fl, name)
                fl.results["scenarios"][name] = run_scenarios(fl, name)
    finally:
        if bouncer is not None:
            bouncer.stop()
    meta = {"hosts": a.hosts, **records.meta(cpu=a.cpu)}
    if meta["device"] == "cpu":
        meta["device"] = "cpu (interpreter)"
    meta["seconds"] = round(time.perf_counter() - t0)
    fl.results["meta"] = meta
    fl.results["time_targets"] = time_targets(fl.results)
    gate = gates.Gate("bench_rollout")
    gate.add(checks(fl.results, a.check_times))
    fl.results["checks"] = gate.misses
    records.write(out / "bench_rollout.json", fl.results)
    (out / "bench_rollout.md").write_text(markdown(fl.results))
    print(markdown(fl.results))
    print(f"results in {out}/bench_rollout.json", file=sys.stderr)
    gate.enforce(a.check)


if __name__ == "__main__":
    main()
