"""The benchmarking hooks: Triton's ``_bench`` and ``do_bench``, seen through a benchmark round.

:class:`BenchHooks` is a mixin of :class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, whose state
it uses through ``self``. Triton calls these while it benchmarks a miss (``bench_fn``, run by
:mod:`tunecache.tuner.resolution` with the round in progress set):

* ``_bench(config=...)``: returns stored timings for configs already measured (or failed) on
  this target, so a grown search space benchmarks only new configs and a failed config is never
  compiled again; records the status and failure reason of the rest.
* ``do_bench``: wraps the benchmarker to see the exception Triton swallows (OutOfResources with
  the bytes needed and the limit), and uses a CPU timer under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import orjson
from triton.runtime.autotuner import Autotuner

from tunecache.problem.target import interpreting
from tunecache.process import counters
from tunecache.trust import sharing
from tunecache.tuner.measure import Round, classify, cpu_do_bench


class _computed:
    """A read-only attribute computed at each access that an instance may still assign, as it may
    Triton's ``cached_property`` (a ``property`` would make a library's ``self.do_bench = ...`` raise)."""

    def __init__(self, f: Callable[[Any], Any]) -> None:
        self.f = f
        self.__doc__ = f.__doc__

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        return self if obj is None else self.f(obj)


class BenchHooks(Autotuner):
    """``do_bench`` and ``_bench`` of a tuner, and the round they fill. A subclass of Triton's
    Autotuner, as :class:`~tunecache.tuner.recovery.WinnerRecovery` is (see there)."""

    @_computed
    def do_bench(self) -> Callable[..., Any]:  # shadows Autotuner.do_bench (a cached_property)
        base = self._do_bench
        if base is None:
            if interpreting():
                base = cpu_do_bench
            else:
                from triton.runtime.driver import driver

                base = driver.active.get_benchmarker()
        return functools.partial(self._recording_bench, base)

    def _recording_bench(
        self, base: Callable[..., Any], kernel_call: Callable[[], Any], *args: Any, **kwargs: Any
    ) -> Any:
        """See the exception Triton's ``_bench`` swallows, and count samples."""
        rnd = self._round()

        def counted() -> Any:
            rnd.samples += 1
            return kernel_call()

        try:
            return base(counted, *args, **kwargs)
        except Exception as e:
            rnd.failure = classify(e)
            raise

    def _round(self) -> Round:
        """The round in progress; a throwaway one where Triton benchmarks outside ours (mode "off")."""
        rnd = self._tc_round
        if rnd is None:
            rnd = self._tc_round = Round()
        return rnd

    def _bench(self, *args: Any, config: Any, **meta: Any) -> list[float]:
        config_json, h = self.config_ids(config)
        rnd = self._round()
        known = rnd.known.get(h)
        if known is not None:
            return known.timings()
        rnd.start_config()
        t0 = time.perf_counter()
        exc: Exception | None = None
        timings: Any = None
        try:
            with sharing.not_built_here("a tunecache benchmark"):  # its winner's binary is uploaded as such
                timings = super()._bench(*args, config=config, **meta)
        except Exception as e:  # noqa: BLE001 - a config that fails is a result, not a crash
            exc = e
        elapsed = time.perf_counter() - t0
        timings = rnd.measured(h, orjson.loads(config_json), timings, exc)
        counters.count(self._tc_name, self._tc_ks.store, benchmarks=1, bench_seconds=elapsed)
        return timings


__all__ = ["BenchHooks"]
