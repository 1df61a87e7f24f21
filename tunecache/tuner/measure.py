"""Measuring configs: a benchmark round as a value, the CPU timer, how a failure is classified, and
whether a benchmark may run now (not during a CUDA graph capture).

A :class:`Round` is created per benchmark of one tuning key. Triton calls the autotuner's
``_bench`` once per config from inside ``bench_fn``, and the benchmarker from inside ``_bench``:
the round in progress is what those hooks fill, and what the autotuner gets back once ``bench_fn``
returns.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunecache import settings
from tunecache.problem.model import ConfigResult


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (a miss then cannot benchmark)."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a broken CUDA context is not a capture
        return False


@dataclass
class Round:
    """One benchmark round of one tuning key.

    ``known``: rows not to measure again (stored for this target, or decided by the driver-change
    policy); ``pruned``: those of them made up now, stored with the results. ``failure`` and
    ``samples`` describe the config being measured; ``results`` holds every config measured.
    """

    known: Mapping[str, ConfigResult] = field(default_factory=dict)
    pruned: Mapping[str, ConfigResult] = field(default_factory=dict)
    results: dict[str, ConfigResult] = field(default_factory=dict)
    seconds: float = 0.0
    failure: tuple[str, dict[str, Any]] | None = None
    samples: int = 0

    def start_config(self) -> None:
        """A new config is measured: forget the previous one's failure and samples."""
        self.failure = None
        self.samples = 0

    def measured(
        self, config_hash: str, config: dict[str, Any], timings: Sequence[float], exc: BaseException | None = None
    ) -> list[float]:
        """Record the config just measured (``exc``: what ``_bench`` raised) as a result; returns
        Triton's [median, p20, p80] (inf when it failed)."""
        if exc is not None:
            self.failure = self.failure or classify(exc)
            timings = [float("inf")] * 3
        if not isinstance(timings, (list, tuple)):
            timings = [float(timings)] * 3
        timings = [float(t) for t in timings] + [float(timings[0])] * (3 - len(timings))
        if self.failure is not None or timings[0] == float("inf"):
            status, failure = self.failure or ("compile_error", {"error": "unknown", "message": "timing inf"})
            result = ConfigResult(config_hash, config, status=status, failure=failure, samples=self.samples)
        else:
            result = ConfigResult(
                config_hash,
                config,
                median_ms=timings[0],
                p20_ms=timings[1],
                p80_ms=timings[2],
                samples=self.samples,
            )
        self.results[config_hash] = result
        return timings[:3]

    def rows(self) -> list[ConfigResult]:
        """What the round stores: every config measured, and the rows the driver-change policy made."""
        new = dict(self.results)
        for h, r in self.pruned.items():
            new.setdefault(h, r)
        return list(new.values())


def cpu_do_bench(kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5, 0.2, 0.8)) -> list[float]:
    """Wall-clock timer for the interpreter, where Triton's CUDA-event benchmarker cannot run."""
    kernel_call()  # warm-up (the interpreter rewrites the function on first use)
    reps = settings.get("TUNECACHE_CPU_BENCH_REPS")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kernel_call()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return [_quantile(times, q) for q in quantiles]


def _quantile(xs: list[float], q: float) -> float:
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


def classify(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """Map an exception from compiling or launching a config to (status, failure detail)."""
    name = type(exc).__name__
    if name == "OutOfResources":
        return "out_of_resources", {
            "error": name,
            "resource": getattr(exc, "name", None),
            "required": getattr(exc, "required", None),
            "limit": getattr(exc, "limit", None),
            "message": str(exc)[:500],
        }
    if name in ("CompilationError", "CompileTimeAssertionFailure", "PTXASError", "UnsupportedLanguageConstruct"):
        return "compile_error", {"error": name, "message": str(exc)[:2000]}
    return "runtime_error", {"error": name, "message": str(exc)[:2000]}
