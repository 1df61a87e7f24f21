#!/usr/bin/env python3
"""Export size with and without binaries, and the time to sign and verify, for the bundled kernel, on
any machine (issue 15; docs/benchmarks/binaries.md).

The bundled kernel's Hopper split stage is compiled for sm90 offline with Triton's own compiler (as
tests/sm90_build.py does) in its two H200 winner configs (docs/gpu-runs/2026-12-01o: BLOCK_T=64
ROWS=8 STAGES=2 w4, and BLOCK_T=128 ROWS=8 STAGES=1 w8); a store gets the 36 SGLang buckets with the
13 config rows each, the two winners' launch specs and their binaries (read from Triton's cache by
tunecache.binaries.binaries.collect). Then: export plain and with ``--binaries --sign``, their sizes; the time
of one signature and one verification; an import's validation (``--dry-run``) with and without them.

    python scripts/bench_binaries.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import records, stores, timing  # noqa: E402

WINNERS = [(64, 4, 2, 8), (128, 8, 1, 8)]  # BLOCK_T, num_warps, STAGES (= num_stages), ROWS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tc-bench-binaries-"))
    os.environ["TRITON_CACHE_DIR"] = str(work / "triton-cache")
    os.environ["TUNECACHE_PREFETCH"] = "0"

    import sm90_build
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from tunecache.kernels import sparse_decode_sm90 as sm90

    from tunecache.binaries import binaries, preload
    from tunecache.buckets import SGLANG_CAPTURE_SIZES
    from tunecache.exchange import export, import_
    from tunecache.problem.configidentity import config_hash_of
    from tunecache.problem.identity import canonical_key, problem_digest
    from tunecache.problem.model import ConfigResult, Problem
    from tunecache.problem.target import Target
    from tunecache.store.opening import open_store
    from tunecache.trust import signing

    t0 = time.perf_counter()
    kernels = [sm90_build.compile_stage(bt, w, st, rows, gluon=True) for bt, w, st, rows in WINNERS]
    compile_s = time.perf_counter() - t0
    jf = sm90.split_stage
    target = GPUTarget("cuda", 90, 32)
    jf.device_caches[0] = ({f"bench-{i}": k for i, k in enumerate(kernels)}, {}, target, make_backend(target), None)

    h200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.6")
    source = sm90.split_kernel.identity.source_hash
    name = sm90.split_kernel.kernel_name
    url = f"sqlite:///{work / 'store.sqlite3'}"
    store = open_store(url)

    def cfg_dict(c: triton.Config) -> dict:
        return {
            "kwargs": dict(c.kwargs),
            "num_warps": c.num_warps,
            "num_stages": c.num_stages,
            "num_ctas": 1,
            "maxnreg": None,
            "pre_hook": None,
        }

    configs = [cfg_dict(c) for c in sm90.CONFIGS]
    win_cfgs = [
        triton.Config({"BLOCK_T": bt, "ROWS": rows, "STAGES": st}, num_warps=w, num_stages=st)
        for bt, w, st, rows in WINNERS
    ]
    win_hashes = [config_hash_of(cfg_dict(c)) for c in win_cfgs]
    for i, b in enumerate(SGLANG_CAPTURE_SIZES):
        key = canonical_key(["B", "TOPK", "H"], [b, 2048, 16])
        p = Problem(problem_digest(source, h200, key), name, source, h200, key, batch_bucket=b, tuning_seconds=3.5)
        win = win_hashes[i % 2]
        rows = {
            config_hash_of(c): ConfigResult(config_hash_of(c), c, "ok", 0.02 + j / 1000, 0.019, 0.021, 25)
            for j, c in enumerate(configs)
        }
        rows[win] = ConfigResult(win, cfg_dict(win_cfgs[i % 2]), "ok", 0.01, 0.009, 0.011, 25)
        store.put(p, list(rows.values()))
    n_bins = 0
    for c, h in zip(win_cfgs, win_hashes):
        specs = preload.capture(jf, c, h)
        store.put_specs(name, source, h200.digest, specs)
        bins = binaries.collect(jf, {s.kernel_hash for s in specs})
        n_bins += store.put_binaries(name, source, bins)
    sizes = sorted(b.size for b in store.get_binaries([str(k.hash) for k in kernels]))
    keys = stores.key_env(work / "key")
    signer = signing.Signer(keys["TUNECACHE_SIGNING_KEY"])
    out: dict = {"compile_s": round(compile_s, 1), "binaries": n_bins, "binary_bytes": sizes, "files": {}}
    for suffix in (".jsonl", ".jsonl.gz"):
        plain = export(store, work / f"plain{suffix}")
        signed = export(store, work / f"binaries{suffix}", with_binaries=True, signer=signer)
        out["files"][suffix] = {
            "plain_bytes": plain["bytes"],
            "with_binaries_signed_bytes": signed["bytes"],
            "ratio": round(signed["bytes"] / plain["bytes"], 2),
        }
    header = (work / "binaries.jsonl").read_bytes().split(b"\n", 1)[0] + b"\n"
    sig = signer.sign(header)
    out["sign_us"] = round(timing.median_us(lambda: signer.sign(header), 2000), 1)
    out["verify_us"] = round(timing.median_us(lambda: signing.verify(sig, header), 2000), 1)
    os.environ["TUNECACHE_TRUSTED_KEYS"] = keys["TUNECACHE_TRUSTED_KEYS"]
    dst = open_store(f"sqlite:///{work / 'dst.sqlite3'}")
    for suffix in (".jsonl", ".jsonl.gz"):
        # The plain export is unsigned: with TUNECACHE_TRUSTED_KEYS set, trusted as one's own file.
        plain_s = [import_(dst, work / f"plain{suffix}", dry_run=True, trust_unsigned=True).seconds for _ in range(5)]
        bin_s = [import_(dst, work / f"binaries{suffix}", dry_run=True, with_binaries=True).seconds for _ in range(5)]
        out["files"][suffix]["validate_plain_ms"] = round(statistics.median(plain_s) * 1000, 1)
        out["files"][suffix]["validate_binaries_signed_ms"] = round(statistics.median(bin_s) * 1000, 1)
    out["machine"] = f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, Triton {triton.__version__}"
    print(json.dumps(out, indent=2))
    if ns.out:
        records.write(ns.out, out)


if __name__ == "__main__":
    main()
