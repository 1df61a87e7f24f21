"""One start of scripts/bench_inductor.py's transformer block (and of bench_rollout's ``inductor``
workload): the child process, ``python scripts/bench_inductor.py --child SPEC_JSON``.

It compiles the block with ``torch.compile`` (``dynamic=False``, one graph per length), runs every
sequence length once, saves the outputs, and prints one JSON line: the time to the first outputs,
the autotuning that really ran (counted where it runs: an FX graph cache hit replays the compile's
counters without running anything), FX graph hits, the store's answers per Inductor cache, the
entries it computed and its lease waits.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import calls

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
    if os.environ.get("TEST_INDUCTOR_CPP_BUILDS"):  # under the test suite only: tests/cppbuilds.py
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import cppbuilds

        cppbuilds.share()
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
        def tally(self: Any) -> None:
            ran[what] += 1
            if what == "coordesc":
                ran["coordesc_kernels"].append(getattr(self, "inductor_meta", {}).get("kernel_name", "?"))
            trace(what)

        calls.count_calls(cls, method, tally)

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

        from tunecache.inductor import leases
        from tunecache.process import counters as tc_counters

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
