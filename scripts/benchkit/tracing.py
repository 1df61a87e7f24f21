"""Where a bench's child spends its time: tunecache's debug log kept with each line's time since the
child started and its thread, and cProfile's top rows."""

from __future__ import annotations

import logging
import time
from typing import Any


def keep_log(t0: float) -> list[str]:
    """tunecache's debug log of this process from now on, each line stamped with its time since
    ``t0`` (``time.perf_counter()`` at the child's start) and its thread: where the background
    prefetch and preload spend their time. The list fills as lines come."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{time.perf_counter() - t0:8.3f} {record.threadName}: {record.getMessage()}")

    lg = logging.getLogger("tunecache")
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)
    return lines


def where(key: tuple[str, int, str]) -> str:
    """A cProfile function key as ``file.py:line:name`` (the file's last two path parts)."""
    return f"{key[0].rsplit('/', 2)[-1]}:{key[1]}:{key[2]}"


def top(stats: dict[Any, Any], n: int) -> list[tuple[str, int, float, float]]:
    """The ``n`` functions of ``pstats.Stats(...).stats`` with the most cumulative time: (where,
    calls, cumulative s, own s)."""
    rows = sorted(stats.items(), key=lambda kv: -kv[1][3])[:n]
    return [(where(k), v[1], v[3], v[2]) for k, v in rows]
