#!/usr/bin/env python3
"""One simulated host of scripts/bench_rollout.py's ``sparse`` workload: the child process it starts.

    python scripts/rollout_host.py --child-sparse SPEC_JSON

Warms the bundled sparse MLA decode kernel over the spec's buckets (an edited copy of its source for
a rolling upgrade: ``edited_source``), counting benchmarks, the keys this host led and its waits on
other hosts' benchmarks, and prints its result as one JSON line. A file of its own so that a host
starts without bench_rollout's driver (rollout_fleet.py builds the command; ``--profile`` runs it under
cProfile); of the harness it uses only ``benchkit.calls``, to count benchmarks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import calls


def sparse_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One host's start of the bundled kernel: every bucket once, as a server warms before capture."""
    t_proc = time.perf_counter()
    import torch
    from triton.runtime.autotuner import Autotuner

    ran = {"benchmarks": 0}
    calls.count_calls(Autotuner, "_bench", lambda self: ran.update(benchmarks=ran["benchmarks"] + 1))  # every class
    if spec.get("sources"):  # an edited kernel (a rolling upgrade): the same module names, another text
        import tunecache.kernels

        for name, path in spec["sources"].items():  # the Hopper kernel's module first: sparse_decode imports it
            found = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module
            found.loader.exec_module(module)
            setattr(tunecache.kernels, name.rsplit(".", 1)[1], module)
    from tunecache.kernels import sparse_decode

    flights: dict[str, Any] = {"benchmarked": [], "leads": [], "wait_s": 0.0, "in_vain": 0}
    tuned = os.environ.get("TUNECACHE_INSTALL") == "1" and os.environ.get("TUNECACHE_MODE") != "off"
    if tuned:
        from tunecache.process import counters
        from tunecache.tuner import singleflight

        singleflight.run = timed_run(singleflight.run, ran, flights, lambda: counters.stats()["waits"])
    firsts: list[float] = []
    t0 = time.perf_counter()
    winners = sparse_decode.warmup(
        spec["buckets"],
        heads=spec["heads"],
        topk=spec["topk"],
        progress=lambda b, s: firsts.append(time.perf_counter()),
    )
    ready = time.perf_counter() - t0
    out: dict[str, Any] = {
        "first_output_s": round((firsts[0] if firsts else time.perf_counter()) - t0, 3),
        "ready_s": round(ready, 3),
        "benchmarks": ran["benchmarks"],
        "winners": {str(k): v for k, v in winners.items()},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if tuned:
        import tunecache

        tunecache.flush()
        s = tunecache.stats()
        out.update(
            benchmarked_keys=flights["benchmarked"],
            led=len(set(flights["benchmarked"])),
            leads=flights["leads"],
            waits=int(s["waits"]),
            wait_s=round(flights["wait_s"], 3),
            waits_in_vain=flights["in_vain"],
            entries_served=int(s["hits"]),
            preloaded=int(s["preloaded"]),
            untrusted=int(s["untrusted"]),
            store_errors=int(s["store_errors"]),
        )
    out["process_s"] = round(time.perf_counter() - t_proc, 3)
    return out


def timed_run(run: Any, ran: dict[str, int], flights: dict[str, Any], waits: Any) -> Any:
    """``singleflight.run`` wrapped to record which keys this host benchmarked, and how long it
    waited on another's benchmark. A wait is in vain only where this host then benchmarked the key
    itself: a waiter that takes the lease just after the holder released it finds the result stored
    and benchmarks nothing (CI of 2026-12-06 counted that as in vain)."""

    def timed(store: Any, digest: str, *, lead: Any, **kwargs: Any) -> Any:
        t, before_waits, led, benched = time.perf_counter(), waits(), [], []

        def leading(lease: Any) -> Any:
            led.append(time.perf_counter())
            start, before = time.time(), ran["benchmarks"]  # the wall clock: leads compared across hosts
            try:
                return lead(lease)
            finally:  # a lead that found the result stored meanwhile benchmarked nothing: not counted
                if ran["benchmarks"] > before:
                    benched.append(digest)
                    flights["benchmarked"].append(digest)
                    flights["leads"].append([round(start, 3), round(time.time(), 3)])

        try:
            return run(store, digest, lead=leading, **kwargs)
        finally:
            if waits() > before_waits:
                flights["wait_s"] += (led[0] if led else time.perf_counter()) - t
                flights["in_vain"] += bool(benched)  # waited, then benchmarked it itself after all

    return timed


#: The modules holding the bundled kernel's split stage, and the split stage's function in each: the
#: Hopper module's runs on an sm90 GPU with an fp8 cache (the GPU bench), the portable one elsewhere.
SPLIT_STAGES = {
    "tunecache.kernels.sparse_decode_sm90": "_split_stage_sm90",
    "tunecache.kernels.sparse_decode": "_split_stage",
}


def edited_source(out: Path, edit: str) -> dict[str, str]:
    """The bundled kernel's modules with one edit inside each split stage's body, whichever of them a
    host runs: a comment, or a real code change (a statement that changes the kernel's text, not its
    results). Returns {module name: path of its edited copy}, the Hopper module first."""
    paths = {}
    for name, fn in SPLIT_STAGES.items():
        text = Path(importlib.util.find_spec(name).origin).read_text()
        at = text.index(f"def {fn}(")
        doc_open = text.index('"""', at)
        doc_end = text.index("\n", text.index('"""', doc_open + 3)) + 1
        indent = " " * (doc_open - text.rindex("\n", 0, doc_open) - 1)
        line = "# rollout: an edited comment\n" if edit == "comment" else "sm_scale = sm_scale * 1.0  # rollout\n"
        path = out / "sources" / edit / f"{name.rsplit('.', 1)[1]}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text[:doc_end] + indent + line + text[doc_end:])
        paths[name] = str(path)
    return paths


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child-sparse":
        print(json.dumps(sparse_child(json.loads(sys.argv[2]))))
        return
    sys.exit(f"usage: {sys.argv[0]} --child-sparse SPEC_JSON (a host of scripts/bench_rollout.py)")


if __name__ == "__main__":
    main()
