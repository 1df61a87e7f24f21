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

Every child gets a ``sitecustomize.py`` (DIR/hook) on its PYTHONPATH: it installs the compile
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
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOOK = r"""
# Written by scripts/bench_inductor.py: counts Triton compiles in every process of a start.
import os, sys

def _listener(*, src=None, metadata=None, metadata_group=None, times=None, cache_hit=False, **_):
    path = os.environ.get("BENCH_COMPILE_LOG")
    if path:
        md = metadata if isinstance(metadata, dict) else {}
        with open(path, "a") as f:  # pid, compile or hit, the kernel's name and its Triton key
            f.write(f"{os.getpid()} {'hit' if cache_hit else 'compile'} {md.get('name', '?')} {md.get('hash', '?')}\n")

class _Loader:
    def __init__(self, loader):
        self._loader = loader
    def create_module(self, spec):
        return self._loader.create_module(spec)
    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            import triton.knobs
            triton.knobs.compilation.listener = _listener
        except Exception as e:
            sys.stderr.write(f"bench hook: no compile listener: {e!r}\n")

class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "triton":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None

if os.environ.get("BENCH_COMPILE_LOG"):
    sys.meta_path.insert(0, _Finder())
if os.environ.get("BENCH_TUNECACHE_LOG"):  # tunecache's debug lines of every process (leases: who waits on what)
    import logging
    _h = logging.FileHandler(os.environ["BENCH_TUNECACHE_LOG"])
    _h.setFormatter(logging.Formatter("%(created).3f %(process)d %(message)s"))
    logging.getLogger("tunecache").addHandler(_h)
    logging.getLogger("tunecache").setLevel(logging.DEBUG)
if os.environ.get("TUNECACHE_INSTALL"):  # what tunecache-install.pth does in site-packages
    try:
        __import__("_tunecache_startup")
    except ImportError as e:
        sys.stderr.write(f"bench hook: tunecache start-up hook not importable: {e!r}\n")
"""

DEFAULT_SEQ = (512, 1024, 2048)
MODES = ("default", "max-autotune-no-cudagraphs")


def counting_put(put: Any, by_kind: dict[str, int], put_keys: list[str]) -> Any:
    """``InductorStore.put`` counted into ``by_kind`` (per kind; Triton's host modules apart: every
    cold host builds them, with no lease) and ``put_keys`` (the entries this process computed), every
    argument passed on (runs BB-BD: a wrapper that dropped a host module's target failed its put)."""
    from tunecache.binaries.hostmodules import NAMES as HOST_MODULES

    def counted_put(self: Any, kind: str, key: str, data: bytes, *args: Any, **kwargs: Any) -> None:
        try:
            module = kind == "triton_kernel" and json.loads(data).get("name") in HOST_MODULES
        except (ValueError, AttributeError):
            module = False
        if not module:
            put_keys.append(f"{kind}:{hashlib.sha256(key.encode()).hexdigest()[:16]}")
        tag = "host_module" if module else kind
        by_kind[f"{tag}_put"] = by_kind.get(f"{tag}_put", 0) + 1
        put(self, kind, key, data, *args, **kwargs)

    return counted_put


# ---- one start (the child process) ---------------------------------------------------------------


def child_spec(*, cpu: bool, d: int, heads: int, seq: list[int], mode: str, outputs: Path) -> dict[str, Any]:
    """What one start of the block is told (``--child``): float32 on the CPU, bf16 on the GPU."""
    return {
        "device": "cpu" if cpu else "cuda",
        "dtype": "float32" if cpu else "bfloat16",
        "d": d,
        "heads": heads,
        "seq": seq,
        "mode": mode,
        "outputs": str(outputs),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh start: compile the block, run every length once, report what it took."""
    t_proc = time.perf_counter()
    import torch
    import torch.nn.functional as F
    from torch import nn

    device, dtype = spec["device"], getattr(torch, spec["dtype"])
    d, heads = spec["d"], spec["heads"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))

    # Autotuning that really ran in this process, counted where it runs: Inductor's counters are no
    # measure of it, since an FX graph cache hit replays the compile's counter deltas
    # (select_algorithm_autotune and the rest) into counters["inductor"] without running anything.
    ran: dict[str, Any] = {"benchmark_all_configs": 0, "select_algorithm": 0, "coordesc": 0, "coordesc_kernels": []}
    traced_once: set[str] = set()

    def trace(what: str) -> None:
        """BENCH_TRACE_AUTOTUNE=1: the stack of the first autotune of each kind, on stderr."""
        if os.environ.get("BENCH_TRACE_AUTOTUNE") and what not in traced_once:
            import traceback

            traced_once.add(what)
            sys.stderr.write(f"bench: first {what} from:\n{''.join(traceback.format_stack(limit=60))}\n")

    def counting(cls: Any, method: str, what: str) -> None:
        original = getattr(cls, method)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            ran[what] += 1
            if what == "coordesc":
                ran["coordesc_kernels"].append(getattr(self, "inductor_meta", {}).get("kernel_name", "?"))
            trace(what)
            return original(self, *args, **kwargs)

        setattr(cls, method, counted)

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
        from torch._inductor.select_algorithm import AlgorithmSelectorCache

        counting(CachingAutotuner, "benchmark_all_configs", "benchmark_all_configs")  # a kernel's configs
        # max-autotune's search at a kernel's first launch; the public method also runs (and returns at
        # once) on every launch of a kernel it does not apply to: count the search itself where it is apart.
        has_inner = hasattr(CachingAutotuner, "_coordinate_descent_tuning")
        counting(
            CachingAutotuner, "_coordinate_descent_tuning" if has_inner else "coordinate_descent_tuning", "coordesc"
        )
        counting(AlgorithmSelectorCache, "benchmark", "select_algorithm")  # max-autotune's GEMM choices
    except Exception as e:  # noqa: BLE001 - report without the counts
        ran["error"] = repr(e)

    by_kind: dict[str, int] = {}  # the store's answers per Inductor cache (main process)
    put_keys: list[str] = []  # the entries this process computed and put (kind:key hash)
    waits: dict[str, float] = {"seconds": 0.0, "in_vain": 0}  # lease waits (main process)
    if os.environ.get("TUNECACHE_INSTALL"):
        from tunecache.inductor.entries import InductorStore

        get, put = InductorStore.get, InductorStore.put

        def counted_get(self: Any, kind: str, key: str) -> bytes | None:
            value = get(self, kind, key)
            tag = f"{kind}_{'hit' if value is not None else 'miss'}"
            by_kind[tag] = by_kind.get(tag, 0) + 1
            return value

        counted_put = counting_put(put, by_kind, put_keys)
        InductorStore.get, InductorStore.put = counted_get, counted_put  # type: ignore[method-assign]

        from tunecache import counters as tc_counters
        from tunecache.inductor import leases

        on_miss = leases.on_miss

        def timed_on_miss(*args: Any, **kwargs: Any) -> Any:
            """A lease wait: how long, and whether the entry it waited for landed (a fleet's defect
            when not: the host waited on a holder that never put it)."""
            before, t = tc_counters.stats()["inductor_lease_waits"], time.perf_counter()
            entry = on_miss(*args, **kwargs)
            if tc_counters.stats()["inductor_lease_waits"] > before:
                waits["seconds"] += time.perf_counter() - t
                waits["in_vain"] += entry is None
            return entry

        leases.on_miss = timed_on_miss

    torch.manual_seed(0)
    model = Block().to(device=device, dtype=dtype).eval()
    mode = None if spec["mode"] == "default" else spec["mode"]
    compiled = torch.compile(model, mode=mode, dynamic=False)
    xs = [torch.randn(1, s, d, device=device, dtype=dtype) for s in spec["seq"]]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    per_seq = []
    outs = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for x in xs:
            t = time.perf_counter()
            outs.append(compiled(x))
            sync()
            per_seq.append(round(time.perf_counter() - t, 3))
    first_output = time.perf_counter() - t0
    torch.save([o.float().cpu() for o in outs], spec["outputs"])

    from torch._dynamo.utils import counters

    inductor = dict(counters["inductor"])
    stats: dict[str, Any] = {}
    backend = None
    if "tunecache" in sys.modules:
        from torch._inductor.remote_cache import RemoteFxGraphCache

        from tunecache.inductor import entries

        stats = entries.stats()
        backend = getattr(RemoteFxGraphCache.backend_override_cls, "__name__", None)
    return {
        "first_output_s": round(first_output, 3),
        "per_seq_s": per_seq,
        "process_s": round(time.perf_counter() - t_proc, 3),
        "autotune_benchmarks": ran["benchmark_all_configs"] + ran["select_algorithm"],
        "benchmark_all_configs": ran["benchmark_all_configs"],
        "select_algorithm_autotune": ran["select_algorithm"],
        "coordesc_tunings": ran["coordesc"],
        "coordesc_kernels": sorted(set(ran["coordesc_kernels"])),
        "fxgraph_cache_hit": inductor.get("fxgraph_cache_hit", 0),
        "fxgraph_cache_miss": inductor.get("fxgraph_cache_miss", 0),
        "inductor_counters": {k: v for k, v in sorted(inductor.items()) if v},
        "tunecache": stats,
        "tunecache_by_kind": by_kind,
        "put_keys": put_keys,
        "lease_wait_s": round(waits["seconds"], 3),
        "lease_waits_in_vain": int(waits["in_vain"]),
        "fx_backend": backend,
        **({"benchmark_count_error": ran["error"]} if "error" in ran else {}),
    }


# ---- the driver -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.args = out, args
        self.hook = out / "hook"
        self.hook.mkdir(parents=True, exist_ok=True)
        (self.hook / "sitecustomize.py").write_text(HOOK)
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
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.hook), os.environ.get("PYTHONPATH")) if p)
        env["BENCH_COMPILE_LOG"] = str(log)
        env.update(dirs)
        env.update(tunecache_env or {})
        store_hits = self.store_hits(tunecache_env)
        t = time.perf_counter()
        r = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t
        (self.out / "logs" / f"{mode}-{name}.stderr").write_text(r.stderr)
        if r.returncode != 0:
            raise SystemExit(f"{mode} {name} failed:\n{r.stderr[-4000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        events = [ln.split() for ln in (log.read_text().splitlines() if log.exists() else [])]
        res.update(
            start=name,
            mode=mode,
            wall_s=round(wall, 3),
            triton_compiles=sum(e[1] == "compile" for e in events),
            triton_cache_hits=sum(e[1] == "hit" for e in events),
            compiling_processes=len({e[0] for e in events if e[1] == "compile"}),
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
        full = {**os.environ, **env}
        cmd = [sys.executable, "-m", "tunecache.cli", *args, "--json"]
        r = subprocess.run(cmd, env=full, capture_output=True, text=True)
        if r.returncode != 0:
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
        from tunecache.model import INDUCTOR_KINDS
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
            from tunecache import signing

            made = signing.keygen(self.out / "bench-key", overwrite=True)
        except Exception as e:  # noqa: BLE001
            print(f"no signing ({e}); the stores are trusted as a whole", flush=True)
            return {"TUNECACHE_TRUST_STORE": "yes"}
        return {"TUNECACHE_SIGNING_KEY": made["private_key"], "TUNECACHE_TRUSTED_KEYS": made["public_key"]}

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
        import platform

        meta: dict[str, Any] = {"python": platform.python_version(), "seq": self.args.seq, "d": self.args.d}
        try:
            import torch
            import triton

            meta.update(torch=torch.__version__, triton=triton.__version__)
            if torch.cuda.is_available():
                meta["device"] = torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001
            pass
        (self.out / "bench_inductor.json").write_text(
            json.dumps({"meta": meta, "runs": self.runs, "exchange": self.exchanges}, indent=2)
        )
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
        md += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        md += ["| " + " | ".join(str(r.get(c)) for c in cols) + " |" for r in self.runs]
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
