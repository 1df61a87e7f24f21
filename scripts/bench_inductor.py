"""torch.compile's fresh-host start with tunecache as Inductor's remote cache backend (issue 28).

    PYTHONPATH=/tmp/site python scripts/bench_inductor.py DIR [--modes default,max-autotune-no-cudagraphs]
        [--seq 512,1024,2048] [--url postgresql://...] [--smoke]

``torch.compile`` of a small transformer block (RMSNorm, SDPA attention, GELU MLP; d=1024, bf16)
over the sequence lengths, ``dynamic=False`` (one graph per length), one fresh process per start:

- ``stock_cold``: empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (a fresh host, no tunecache);
- ``stock_warm``: the same directories again (the same host restarted);
- ``tc_first``: tunecache (TUNECACHE_INSTALL=1, TUNECACHE_INDUCTOR=1), empty local caches, empty
  store: it compiles, autotunes and fills the store, signing what it stores;
- ``tc_fresh``: new empty local caches, the store warm (a fresh host of the fleet; the shared
  PostgreSQL of ``--url``, else a SQLite file);
- ``tc_import``: new empty local caches, a new SQLite store filled by ``tunecache export --inductor``
  of the first store and ``tunecache import --inductor`` (an image built with the entries).

Per start: time from the first call to all outputs (``first_output_s``), the process's wall time,
autotune benchmarks run (Inductor's CachingAutotuner.benchmark_all_configs calls, plus max-autotune's
select_algorithm autotunes, counted where they run: an FX graph cache hit replays the compile's
counters into Inductor's ``counters`` without running them), max-autotune's coordinate-descent
tunings at launch (and of which kernels), Triton compiles and Triton cache hits (Triton's compilation listener,
in every process of the start: Inductor's compile workers too), FX graph cache hits and misses,
the store entries served (hits the store recorded, all processes), and whether the outputs equal
stock's (cold, else warm). Writes DIR/bench_inductor.json and DIR/bench_inductor.md.

The child is scripts/inductor_child.py, run as ``bench_inductor.py --child SPEC_JSON``. Every child
gets a ``sitecustomize.py`` (DIR/hook, scripts/benchkit/compiles.py) on its PYTHONPATH: it installs the compile
listener and, where TUNECACHE_INSTALL is set, imports tunecache's start-up hook, as the .pth of a
``pip install tunecache`` would (``PYTHONPATH=/tmp/site`` processes no .pth file). It shadows a
distribution's own sitecustomize, in stock and tunecache starts alike.

The whole GPU run (both modes, 3 lengths): about 8-9 minutes, two thirds of it the two cold
max-autotune starts (209 s each on the H200); ``--modes`` runs one mode per command and
``--no-stock-cold`` leaves out stock's cold start (tc_first is cold too: stock_warm then restarts on
the local caches tc_first left, which Inductor fills as it would without tunecache).
``--smoke``: CPU, tiny shapes, default mode, float32 (checks the script, in about a minute).

A fleet (N hosts with distinct host ids started together, then N fresh hosts on the warm store,
against stock cold and warm starts of the same invocation) is scripts/bench_rollout.py's
``--workloads inductor``, which runs this script's child and hook.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import compiles, procs, records, stores
from inductor_child import DEFAULT_SEQ, MODES, child, child_spec

# ---- the driver -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.args = out, args
        self.hook = compiles.write_hook(out / "hook")  # the compile listener in every process of a start
        self.runs: list[dict[str, Any]] = []
        self.exchanges: dict[str, dict[str, Any]] = {}  # per mode: the export/import of the entries
        self.n = 0

    def fresh_dirs(self, tag: str) -> dict[str, str]:
        self.n += 1
        d = self.out / "caches" / f"{self.n:02d}-{tag}"
        shutil.rmtree(d, ignore_errors=True)
        (d / "inductor").mkdir(parents=True)
        (d / "triton").mkdir()
        return {"TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"), "TRITON_CACHE_DIR": str(d / "triton")}

    def start(self, name: str, mode: str, dirs: dict[str, str], tunecache_env: dict[str, str] | None) -> dict[str, Any]:
        a = self.args
        log = self.out / "logs" / f"{mode}-{name}.compiles"
        log.parent.mkdir(exist_ok=True)
        log.unlink(missing_ok=True)
        outputs = self.out / "logs" / f"{mode}-{name}.pt"
        spec = child_spec(cpu=a.smoke, d=a.d, heads=a.heads, seq=a.seq, mode=mode, outputs=outputs)
        env = procs.child_env(drop=("TUNECACHE_", "TORCHINDUCTOR_"), before=[self.hook], BENCH_COMPILE_LOG=str(log))
        env.update(dirs)
        env.update(tunecache_env or {})
        store_hits = self.store_hits(tunecache_env)
        r = procs.run(procs.python(__file__, "--child", json.dumps(spec)), env=env)
        (self.out / "logs" / f"{mode}-{name}.stderr").write_text(r.stderr)
        if r.rc != 0:
            raise SystemExit(f"{mode} {name} failed:\n{r.stderr[-4000:]}")
        res = r.result()
        events = compiles.tally(compiles.events(log))
        res.update(
            start=name,
            mode=mode,
            wall_s=round(r.wall_s, 3),
            triton_compiles=events["compiles"],
            triton_cache_hits=events["hits"],
            compiling_processes=events["compiling_processes"],
            entries_served=None if tunecache_env is None else self.store_hits(tunecache_env) - store_hits,
            outputs=str(outputs),
        )
        self.runs.append(res)
        print(
            f"{mode:>28} {name:<10} first output {res['first_output_s']:7.2f}s"
            f"  benchmarks {res['autotune_benchmarks']:4d}  coordesc {res['coordesc_tunings']:3d}"
            f"  compiles {res['triton_compiles']:4d}  fx hits {res['fxgraph_cache_hit']}"
            f"  served {res['entries_served'] if res['entries_served'] is not None else '-'}",
            flush=True,
        )
        return res

    def store_hits(self, tunecache_env: dict[str, str] | None) -> int:
        """Hits the store recorded for its torch.compile entries (every process of the start)."""
        if tunecache_env is None:
            return 0
        from tunecache.store.opening import open_store

        s = open_store(tunecache_env["TUNECACHE_URL"])
        try:
            return sum(v["hits"] for v in s.inductor_counts().values())
        finally:
            s.close()

    def cli(self, *args: str, env: dict[str, str]) -> dict[str, Any]:
        """``tunecache ARGS --json``; its JSON summary."""
        r = stores.cli([*args, "--json"], env=procs.child_env(**env))
        if r.rc != 0:
            raise SystemExit(f"tunecache {' '.join(args)} failed:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout)

    def mode(self, mode: str, keys: dict[str, str]) -> None:
        base = self.out / "stores"
        base.mkdir(exist_ok=True)
        first_url = self.args.url or f"sqlite:///{base / f'{mode}.sqlite3'}"
        if self.args.url is None:
            (base / f"{mode}.sqlite3").unlink(missing_ok=True)
        else:
            self.clear_store(first_url)
        tc = {"TUNECACHE_INSTALL": "1", "TUNECACHE_INDUCTOR": "1", **keys}

        if self.args.no_stock_cold:  # tc_first is the cold start; stock restarts on the caches it left
            first_dirs = self.fresh_dirs("tc-first")
            self.start("tc_first", mode, first_dirs, {**tc, "TUNECACHE_URL": first_url})
            self.start("stock_warm", mode, first_dirs, None)
        else:
            stock_dirs = self.fresh_dirs("stock")
            self.start("stock_cold", mode, stock_dirs, None)
            self.start("stock_warm", mode, stock_dirs, None)
            self.start("tc_first", mode, self.fresh_dirs("tc-first"), {**tc, "TUNECACHE_URL": first_url})
        self.start("tc_fresh", mode, self.fresh_dirs("tc-fresh"), {**tc, "TUNECACHE_URL": first_url})

        exported = base / f"{mode}.jsonl.gz"
        imported = base / f"{mode}-imported.sqlite3"
        imported.unlink(missing_ok=True)
        signing = ["--sign", keys["TUNECACHE_SIGNING_KEY"]] if "TUNECACHE_SIGNING_KEY" in keys else []
        out = self.cli("--url", first_url, "export", str(exported), "--inductor", "--force", *signing, env=keys)
        trust = [] if signing else ["--trust-unsigned"]
        into = self.cli("--url", f"sqlite:///{imported}", "import", str(exported), "--inductor", *trust, env=keys)
        self.exchanges[mode] = {
            "exported": out.get("inductor_entries"),
            "too_large": out.get("inductor_too_large"),
            "untrusted": out.get("untrusted"),
            "bytes": out.get("bytes"),
            "imported": into.get("inductor_new"),
        }
        self.start("tc_import", mode, self.fresh_dirs("tc-import"), {**tc, "TUNECACHE_URL": f"sqlite:///{imported}"})

    def clear_store(self, url: str) -> None:
        """A shared store starts without torch.compile entries (the first start fills it)."""
        from tunecache.problem.model import INDUCTOR_KINDS
        from tunecache.store.opening import open_store

        s = open_store(url)
        try:
            s.delete_inductor(kinds=list(INDUCTOR_KINDS))
        finally:
            s.close()

    def signing_keys(self) -> dict[str, str]:
        """A fresh key pair: the first start signs, the others trust it (the fleet's setting). Without
        the cryptography package: TUNECACHE_TRUST_STORE=yes (the bench's own store)."""
        try:
            return stores.key_env(self.out / "bench-key")
        except Exception as e:  # noqa: BLE001
            print(f"no signing ({e}); the stores are trusted as a whole", flush=True)
            return {"TUNECACHE_TRUST_STORE": "yes"}

    def compare_outputs(self) -> None:
        import torch

        refs: dict[str, Any] = {}  # per mode: stock's outputs (cold, else warm)
        for start in ("stock_warm", "stock_cold"):
            for r in self.runs:
                if r["start"] == start:
                    refs[r["mode"]] = torch.load(r["outputs"])
        for r in self.runs:
            outs, ref = torch.load(r["outputs"]), refs.get(r["mode"])
            if ref is None:
                continue
            r["max_abs_diff_vs_stock"] = max(float((a - b).abs().max()) for a, b in zip(ref, outs))
            r["same_outputs"] = all(torch.equal(a, b) for a, b in zip(ref, outs))

    def write(self) -> None:
        meta: dict[str, Any] = {**records.meta(cpu=self.args.smoke), "seq": self.args.seq, "d": self.args.d}
        records.write(self.out / "bench_inductor.json", {"meta": meta, "runs": self.runs, "exchange": self.exchanges})
        cols = (
            "mode",
            "start",
            "first_output_s",
            "wall_s",
            "autotune_benchmarks",
            "coordesc_tunings",
            "triton_compiles",
            "triton_cache_hits",
            "fxgraph_cache_hit",
            "entries_served",
            "same_outputs",
        )
        md = [f"# bench_inductor ({', '.join(f'{k} {v}' for k, v in meta.items())})", ""]
        md += records.table(cols, [[r.get(c) for c in cols] for r in self.runs])
        md += ["", "Fresh host vs stock warm (first output):", ""]
        for mode in {r["mode"] for r in self.runs}:
            by = {r["start"]: r for r in self.runs if r["mode"] == mode}
            if "stock_warm" in by:
                warm = max(by["stock_warm"]["first_output_s"], 1e-9)
                for s in ("tc_fresh", "tc_import"):
                    if s in by:
                        md.append(f"- {mode} {s}: {by[s]['first_output_s'] / warm:.2f}x of stock warm")
        for mode, x in self.exchanges.items():
            md.append(f"- {mode} export/import of the entries: {x}")
        (self.out / "bench_inductor.md").write_text("\n".join(md) + "\n")
        print((self.out / "bench_inductor.md").read_text())


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", help="where results, caches and stores go (default: a new temporary directory)")
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated: default, max-autotune-no-cudagraphs (default: both; smoke: default)",
    )
    p.add_argument("--seq", default=None, help="comma-separated sequence lengths (default 512,1024,2048)")
    p.add_argument("--url", default=None, help="a shared store for tc_first/tc_fresh (default: a SQLite file in DIR)")
    p.add_argument("--d", type=int, default=None, help="model width (default 1024; smoke 64)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default 8; smoke 4)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, float32 (default mode unless --modes)")
    p.add_argument(
        "--no-stock-cold",
        action="store_true",
        help="skip the stock cold start: tc_first is the cold start and stock_warm restarts on its local "
        "caches (saves one cold max-autotune start, ~209 s on the H200)",
    )
    a = p.parse_args()
    a.seq = [int(s) for s in a.seq.split(",")] if a.seq else ([16, 32] if a.smoke else list(DEFAULT_SEQ))
    a.d = a.d or (64 if a.smoke else 1024)
    a.heads = a.heads or (4 if a.smoke else 8)
    modes = [m.strip() for m in (a.modes or ("default" if a.smoke else ",".join(MODES))).split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}: one of {', '.join(MODES)}")
    out = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="bench-inductor-"))
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out.resolve(), a)
    keys = bench.signing_keys()
    t = time.perf_counter()
    for m in modes:
        bench.mode(m, keys)
    bench.compare_outputs()
    bench.write()
    print(f"{len(bench.runs)} starts in {time.perf_counter() - t:.0f}s; results in {out}/bench_inductor.json")


if __name__ == "__main__":
    main()
