"""Timing inside a bench: the time per call of a function, medians and percentiles of runs, and the
order of interleaved rounds (each variant meets the same phases of a noisy machine)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def per_call(f: Callable[[], Any], n: int) -> tuple[float, float]:
    """(thread CPU ns, wall ns) per call of ``f`` over ``n`` calls."""
    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.thread_time_ns() - c0) / n, (time.perf_counter_ns() - w0) / n


def median_us(f: Callable[[], Any], n: int) -> float:
    """The median wall time of one call of ``f`` over ``n`` calls timed one by one, in us."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def pct(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``xs`` by nearest rank (the sorted value at ``int(q * n)``);
    nan for no values."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def quantile(xs: Sequence[float], percent: int) -> float:
    """The ``percent`` percentile of ``xs``, interpolated (``statistics.quantiles``, inclusive)."""
    return statistics.quantiles(xs, n=100, method="inclusive")[percent - 1] if len(xs) > 1 else xs[0]


def spread_ms(seconds: Sequence[float]) -> dict[str, float | int]:
    """Runs of one variant, in seconds: median, p10 and p90 in ms, and how many."""
    s = sorted(seconds)
    return {
        "median_ms": round(statistics.median(s) * 1e3, 2),
        "p10_ms": round(s[len(s) // 10] * 1e3, 2),
        "p90_ms": round(s[(len(s) * 9) // 10] * 1e3, 2),
        "runs": len(s),
    }


def rounds(items: Sequence[T], n: int, order: str = "same") -> list[list[T]]:
    """``n`` rounds of ``items``: each in the same order (``same``), rotated by one more each round
    (``rotate``), or reversed every other round (``alternate``)."""
    if order == "rotate":
        return [list(items[i % len(items) :]) + list(items[: i % len(items)]) for i in range(n)]
    if order == "alternate":
        return [list(items) if i % 2 == 0 else list(items)[::-1] for i in range(n)]
    if order != "same":
        raise ValueError(f"unknown order {order!r}: same, rotate or alternate")
    return [list(items) for _ in range(n)]
