#!/usr/bin/env python3
"""Every config of both split stages of the bundled sparse decode kernel, side by side on one GPU:
each result checked against the fp32 reference first, then timed (split + merge, CUDA graph).

    python scripts/bench_split_stages.py --batches 64:4,256:1 --out split-stages.json

The sweeps behind the Hopper kernel's config list (docs/benchmarks/sparse-kernel.md, sweeps H-J) were made with an
earlier form of this script. ``B:S`` pairs fix the batch and the split count (S=0: the heuristic).
The Triton stage runs its configs that fit; on an sm90 GPU the Hopper (Gluon) stage runs its own.
fp8 KV, H=16, topk=2048, each query gathering its own region of distinct slots.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from benchkit import gates, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64:4,256:1", help="comma-separated B:S pairs (S=0: heuristic)")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--stages", default="triton,hopper", help="which split stages: triton, hopper or both")
    ap.add_argument("--first", type=int, default=0, help="only the first N configs of each stage (0: all)")
    ap.add_argument("--out", type=Path, default=Path("split-stages.json"))
    ns = ap.parse_args()

    import torch
    import triton
    from tunecache.kernels import sparse_decode as sd
    from tunecache.kernels import sparse_decode_sm90 as sm90

    if not torch.cuda.is_available():
        sys.exit("bench_split_stages.py needs a CUDA GPU")
    pairs = [tuple(int(x) for x in p.split(":")) for p in ns.batches.split(",")]
    dev, topk, heads = "cuda", ns.topk, 16
    gen = torch.Generator(device=dev).manual_seed(0)
    region = 2 * topk
    kv = (torch.randn(max(b for b, _ in pairs) * region, sd.D_QK, generator=gen, device=dev) * 0.5).to(
        torch.float8_e4m3fn
    )
    k_scale, sm_scale = 1.0 / 16, 1.0 / math.sqrt(sd.D_QK)

    stages = {"triton": [c for c in sd.CONFIGS if sd.estimate_shared_memory(c.kwargs["BLOCK_T"]) <= sd.SM90_MAX_SHARED]}
    hopper = sm90.AVAILABLE and torch.cuda.get_device_capability()[0] == 9
    if hopper:
        stages["hopper"] = [c for c in sm90.CONFIGS if sm90.SHARED_BYTES[c.kwargs["BLOCK_T"]] <= sd.SM90_MAX_SHARED]
    stages = {k: v[: ns.first or None] for k, v in stages.items() if k in ns.stages.split(",")}
    rows = []
    for b, s in pairs:
        q = torch.randn(b, heads, sd.D_QK, generator=gen, device=dev).to(torch.bfloat16)
        pick = torch.rand(b, region, generator=gen, device=dev).argsort(dim=1)[:, :topk]
        idx = (pick + (torch.arange(b, device=dev) * region)[:, None]).to(torch.int32)
        idx[0, topk // 2 + 7 :] = -1  # a ragged tail: the masks are exercised too
        splits = s or sd.choose_num_splits(b, heads, topk, torch.cuda.get_device_properties(0).multi_processor_count)
        ref, _ = sd.reference(q, kv, idx, sm_scale, k_scale=k_scale)
        for stage, configs in stages.items():
            # The dispatch reads this module flag at every call; the Triton stage is forced by clearing it.
            sd._GLUON_ENABLED = stage == "hopper"
            for c in configs:
                cfg = sd._config_dict(c)

                def run(cfg=cfg, q=q, idx=idx, splits=splits):
                    return sd.sparse_mla_decode(
                        q, kv, idx, sm_scale, k_scale=k_scale, num_splits=splits, config=cfg, validate=False
                    )

                out, _ = run()
                err = ((out.float() - ref).abs().amax() / ref.abs().amax()).item()
                ms = triton.testing.do_bench_cudagraph(run, rep=100)
                row = {"stage": stage, "B": b, "S": splits, "config": cfg, "rel_err": err, "us": ms * 1e3}
                row["TBps"] = b * topk * sd.D_QK / (ms * 1e-3) / 1e12
                rows.append(row)
                print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name()
    records.write(ns.out, {"device": device, "triton": triton.__version__, "rows": rows}, indent=None)
    for b, _ in pairs:
        best = sorted((r for r in rows if r["B"] == b), key=lambda r: r["us"])[:3]
        print(f"B={b}: " + "; ".join(f"{r['stage']} {r['config']} {r['us']:.1f} us" for r in best))
    gate = gates.Gate("bench_split_stages")
    gate.expect(all(r["rel_err"] <= 1e-2 for r in rows), "some config does not match the reference (rel_err > 1e-2)")
    gate.enforce()


if __name__ == "__main__":
    main()
