"""``tunecache demo``: the bundled sparse MLA decode kernel, started twice on one store.

Each start is a fresh child process, like a server restart: the first tunes every batch bucket,
the second resolves every bucket from the store with zero benchmarks and the same winners.
On a CPU it runs under the Triton interpreter with small shapes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from tunecache import extras, settings
from tunecache.problem.target import gpu_visible, interpreting
from tunecache.store.engine import mask_url


def _child(url: str, buckets: list[int] | None) -> dict[str, Any]:
    """One 'server start': warm every bucket, report the time until all are ready."""
    t0 = time.perf_counter()
    import tunecache
    from tunecache.kernels import sparse_decode

    winners = sparse_decode.warmup(buckets)
    ready = time.perf_counter() - t0
    tunecache.flush()
    s = tunecache.stats()
    return {
        "pid": os.getpid(),
        "benchmarks": s["benchmarks"],
        "hits": s["hits"],
        "misses": s["misses"],
        "seconds_to_ready": round(ready, 3),
        "bench_seconds": round(s["bench_seconds"], 3),
        "winners": {str(k): v for k, v in winners.items()},
    }


def gpu_available() -> bool:
    """Whether kernels can run on a GPU here; if not, the demo and ``tunecache warm`` use the
    interpreter. Told without importing torch (:func:`tunecache.problem.target.gpu_visible`): a missing numpy
    is then one line of ours, before torch warns that it cannot initialise it."""
    return gpu_visible()


def run_demo(url: str | None = None, buckets: list[int] | None = None, as_json: bool = False) -> dict[str, Any]:
    """Two starts on ``url``; without one, on a SQLite file in a temporary directory removed afterwards."""
    if url is not None:
        return _run_demo(url, buckets, as_json, temporary=False)
    tmp = tempfile.mkdtemp(prefix="tunecache-demo-")
    try:
        return _run_demo(f"sqlite:///{Path(tmp) / 'demo.sqlite3'}", buckets, as_json, temporary=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_demo(url: str, buckets: list[int] | None, as_json: bool, temporary: bool) -> dict[str, Any]:
    env = dict(os.environ)
    settings.put("TUNECACHE_URL", url, env)
    gpu = gpu_available()
    if not gpu:
        env["TRITON_INTERPRET"] = "1"
    if not gpu or interpreting():
        extras.require("numpy")  # the interpreter's: one line here, not a traceback from each start
    runs = []
    for i in (1, 2):
        if not as_json:
            click.echo(f"start {i}: {'tuning' if i == 1 else 'restarting'} in a fresh process...", err=True)
        cmd = [sys.executable, "-m", "tunecache.cli.demo", json.dumps({"url": url, "buckets": buckets})]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"demo start {i} failed:\n{r.stderr[-4000:]}")
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    a, b = runs
    differ = sorted(k for k in a["winners"] if a["winners"][k] != b["winners"].get(k))
    out = {
        "store": mask_url(url),
        "store_removed": temporary,
        "device": "gpu" if gpu else "cpu (TRITON_INTERPRET=1)",
        "buckets": len(a["winners"]),
        "runs": runs,
        "winners_differ": len(differ),
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return out
    store = f"{out['store']} (temporary, removed)" if temporary else out["store"]
    click.echo(f"\nstore: {store}   device: {out['device']}   buckets: {out['buckets']}\n")
    click.echo(f"{'process':<22}{'configs benchmarked':>20}{'hits':>7}{'ready after (s)':>17}")
    for i, r in enumerate(runs, 1):
        label = f"start {i} (pid {r['pid']})"
        click.echo(f"{label:<22}{r['benchmarks']:>20}{r['hits']:>7}{r['seconds_to_ready']:>17.2f}")
    click.echo(f"\nwinners that differ between the two starts: {len(differ)}")
    if b["benchmarks"] != 0 or differ:
        raise RuntimeError("the restart benchmarked or picked different winners: the store did not serve it")
    return out


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(_child(args["url"], args["buckets"])))
