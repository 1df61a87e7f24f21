"""Where a test run's time goes, per test: a pytest plugin and its summary (docs/testing.md).

With ``TUNECACHE_TEST_PROFILE=FILE`` set, conftest loads this plugin, and each test appends one JSON
line to FILE: its wall seconds (setup + call + teardown), the CPU seconds of the pytest process and
of the child processes it waited for, the CPU of the children it started from the warm pool (their
server is not its child: ``TUNECACHE_TEST_POOL_CPU`` names a file where the pool writes each one's),
and how many Python processes it started. The wall time that no CPU of ours accounts for is waiting:
sleeps, leases, timeouts, servers, or a busy machine.

``python tests/profiling.py FILE...`` prints the totals by file and the slowest tests;
``python tests/profiling.py --durations FILE...`` rewrites tests/durations.json, the weights that
tests/scheduling.py orders and selects the quick tier by.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

_started = threading.local()
_count = {"python": 0, "other": 0}


def _counting_init(real):
    def init(self, args, *a, **kw):  # noqa: ANN001
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        first = os.path.basename(str(argv[0])) if argv else ""
        _count["python" if first.startswith("python") or str(argv[0]) == sys.executable else "other"] += 1
        return real(self, args, *a, **kw)

    return init


class Profiler:
    def __init__(self, path: str) -> None:
        self.path = path
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        subprocess.Popen.__init__ = _counting_init(subprocess.Popen.__init__)
        self.outcome: dict[str, str] = {}
        self.pool_cpu = f"{path}.pool-{self.worker}-{os.getpid()}"
        os.environ["TUNECACHE_TEST_POOL_CPU"] = self.pool_cpu

    def _pool_cpu(self) -> float:
        try:
            return sum(float(x) for x in Path(self.pool_cpu).read_text().split())
        except OSError:
            return 0.0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.outcome[report.nodeid] = "failed" if report.when == "call" else "error"
        elif report.skipped:
            self.outcome.setdefault(report.nodeid, "skipped")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        before = dict(_count)
        pool = self._pool_cpu()
        t0 = time.monotonic()
        yield
        wall = time.monotonic() - t0
        me2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        row = {
            "test": item.nodeid,
            "outcome": self.outcome.pop(item.nodeid, "passed"),
            "venv": os.path.basename(sys.prefix),
            "worker": self.worker,
            "wall": round(wall, 3),
            "cpu": round(me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime, 3),
            "child_cpu": round(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime, 3),
            "pool_cpu": round(self._pool_cpu() - pool, 3),
            "python_procs": _count["python"] - before["python"],
            "other_procs": _count["other"] - before["other"],
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def summarize(paths: list[str], top: int = 40) -> None:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    by_file: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_file[r["test"].split("::")[0]].append(r)

    def tot(rs: list[dict], k: str) -> float:
        return sum(r.get(k, 0.0) for r in rs)

    print(
        f"{len(rows)} tests, {tot(rows, 'wall'):.0f} s wall, {tot(rows, 'cpu'):.0f} s CPU here, "
        f"{tot(rows, 'child_cpu'):.0f} s CPU in children, {tot(rows, 'pool_cpu'):.0f} s in warm-pool children, "
        f"{tot(rows, 'python_procs'):.0f} Python processes"
    )
    print(f"{'file':45} {'tests':>5} {'wall':>7} {'cpu':>7} {'kidcpu':>7} {'poolcpu':>7} {'pyprocs':>7}")
    for f, rs in sorted(by_file.items(), key=lambda kv: -tot(kv[1], "wall")):
        print(
            f"{f:45} {len(rs):5} {tot(rs, 'wall'):7.0f} {tot(rs, 'cpu'):7.0f} {tot(rs, 'child_cpu'):7.0f} "
            f"{tot(rs, 'pool_cpu'):7.0f} {tot(rs, 'python_procs'):7.0f}"
        )
    print(f"\nslowest {top}:")
    for r in sorted(rows, key=lambda r: -r["wall"])[:top]:
        print(
            f"{r['wall']:7.1f} {r['cpu']:6.1f} {r['child_cpu']:7.1f} {r.get('pool_cpu', 0):7.1f} "
            f"{r['python_procs']:4} {r['test']}"
        )


def write_durations(paths: list[str]) -> None:
    """tests/durations.json from these profiles: each test's wall seconds (the latest profile wins)."""
    out: dict[str, float] = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["test"]] = round(r["wall"], 1)
    target = Path(__file__).with_name("durations.json")
    target.write_text(json.dumps(dict(sorted(out.items())), indent=0) + "\n")
    print(f"{len(out)} tests written to {target}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--durations"]:
        write_durations(sys.argv[2:])
    else:
        summarize(sys.argv[1:])
