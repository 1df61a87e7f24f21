"""A fresh process that torch.compiles a tiny function on the CPU and prints, as one JSON line, its
outputs and what Inductor's caches did (tests/test_inductor.py runs it twice or more on one store).

``--enable`` calls tunecache.inductor.enable.enable() in code; without it the start-up hook
(TUNECACHE_INSTALL=1, TUNECACHE_INDUCTOR=1) is what makes tunecache the backend."""

from __future__ import annotations

import json
import sys

import cppbuilds
import torch


def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).sum(dim=-1) + x.sin().mean()


def main() -> None:
    cppbuilds.share()  # the suite's C++ builds (tests/cppbuilds.py): no test here is about gcc
    if "--enable" in sys.argv:
        from tunecache.inductor import enable

        enable.enable()
    g = torch.manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g)
    out = torch.compile(f)(x, w)
    from torch._dynamo.utils import counters
    from torch._inductor.remote_cache import RemoteFxGraphCache

    from tunecache.process import counters as tc_counters

    backend = getattr(RemoteFxGraphCache.backend_override_cls, "__name__", None)
    print(
        json.dumps(
            {
                "out": out.tolist(),
                "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
                "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
                "tunecache": {k: v for k, v in tc_counters.stats().items() if v},
                "fx_backend": backend,
            }
        )
    )


if __name__ == "__main__":
    main()
