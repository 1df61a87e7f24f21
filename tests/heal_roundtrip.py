"""A comment edit and the binaries (issue 25, item 5): real sm90 compiles on a machine without a GPU
(ptxas ships with Triton), through the autotuner's own launch path. Each phase is a fresh process
(the tests run under the interpreter, where nothing is compiled) printing one JSON line for
tests/test_binaries.py:

    tune      launch the tunecache kernel of healkernel.py in KERNEL_DIR once: a miss, a benchmark of
              both configs, the winner's launch spec and binary stored (TUNECACHE_URL, TRITON_CACHE_DIR)
    restart   preload the stored winners (what runs once CUDA is up) and launch the same key again;
              report the benchmarks, the preload, every compile Triton made, and what the store holds
              after the background work
    launch    the same without the preload: the first launch comes before any background work

With ``TC_COMPANION=1`` it launches healkernel.py's plain kernel after the tuned one (a companion,
:mod:`tunecache.tuner.companions`). With ``TC_TRITONCACHE=1`` the process also has torch.compile's
Triton cache seam installed (:mod:`tunecache.inductor.tritoncache`, what ``TUNECACHE_INDUCTOR``
installs), and reports the ``triton_kernel`` entries the store holds.

Only the CUDA driver is answered here: the device, its stream and its target; a compiled kernel's
launch does nothing (there is no GPU to run it on).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.compiler.compiler as compiler_module  # noqa: E402
import triton.runtime.jit as jit_module  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import CompiledKernel  # noqa: E402

import tunecache  # noqa: E402
from tunecache.process import writeback  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.tuner import background  # noqa: E402
from tunecache.tuner.measure import cpu_do_bench  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


class _Device:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return TARGET


class _Driver:
    active = _Device()


def _no_gpu() -> list[str]:
    """Answer Triton's driver queries; a launch runs nothing. Returns the list of kernels whose
    handles were set up (a launch's, or a preload's)."""
    jit_module.driver = _Driver()
    compiler_module.driver = _Driver()  # Triton 3.4: compile(src, target=None) asks the driver
    inits: list[str] = []

    def init_handles(self: CompiledKernel) -> None:
        if self.module is not None:
            return
        inits.append(str(self.hash))
        self.module, self.function = "no module", 0
        if isinstance(vars(CompiledKernel).get("run"), property):  # Triton 3.5+
            self._run = lambda *args, **kwargs: None
        else:  # Triton 3.4: an attribute set here
            self.run = lambda *args, **kwargs: None

    CompiledKernel._init_handles = init_handles
    return inits


def _stored(source_hash: str) -> dict:
    store = open_store()
    try:
        specs = [s for v in store.get_specs(source_hash).values() for s in v]
        keys = sorted({s.kernel_hash for s in specs})
        kernels = sorted(r["key"] for r in store.list_inductor() if r["kind"] == "triton_kernel")
        return {"spec_kernel_hashes": keys, "binaries": sorted(store.binary_heads(keys)), "triton_kernels": kernels}
    finally:
        store.close()


def main(phase: str) -> dict:
    compiles: list[dict] = []
    knobs.compilation.listener = lambda src, metadata, metadata_group, times, cache_hit: compiles.append(
        {"hash": metadata["hash"], "cache_hit": cache_hit}
    )
    inits = _no_gpu()
    if os.environ.get("TC_TRITONCACHE") == "1":
        from tunecache.inductor import tritoncache

        assert tritoncache.install()
    sys.path.insert(0, os.environ["KERNEL_DIR"])
    import healkernel as hk

    tuned = tunecache.autotune(configs=hk.CONFIGS, key=["N"], do_bench=cpu_do_bench)(hk.add_two)
    tuned.wait_for_prefetch()
    tunecache.reset_stats()
    loaded = tuned.load_winners(0) if phase == "restart" else 0
    at_preload = len(compiles)
    x, y = torch.zeros(256), torch.zeros(256)
    tuned[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
    if os.environ.get("TC_COMPANION") == "1":
        hk.plus_one[(1,)](y, 100, BLOCK=128)
    background.submit(lambda: None).result(timeout=120)  # what the launch queued in the background
    writeback.flush()
    jf = hk.add_two
    launched = sorted(str(k.hash) for k in jf.device_caches[0][0].values())
    companion = sorted(str(k.hash) for k in hk.plus_one.device_caches[0][0].values())
    return {
        "source_hash": tuned.identity.source_hash,
        "cache_key": jf.cache_key,
        "loaded": loaded,
        "stats": tunecache.stats(),
        "compiles_at_preload": compiles[:at_preload],
        "compiles_at_launch": compiles[at_preload:],
        "launched": launched,
        "companion_launched": companion,
        "inits": inits,
        **_stored(tuned.identity.source_hash),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
