"""Benches run on the CPU at their smallest settings, as a user runs them: each finishes and writes
its table. Real processes (each bench starts its own children)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    cmd = [sys.executable, str(ROOT / "scripts" / script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_import_memory_bench_measures_every_import_of_the_hostile_file() -> None:
    """Launch specs from an unsigned file are refused without --trust-unsigned (the trust layer), so
    the bench's `import --launch-specs` of its own hostile file failed and ended the run with no table."""
    r = run_bench("bench_import_memory.py", "--problems", "20", "--specs", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and ln.endswith(" s) |")]
    assert [ln.split(" | ")[2] for ln in rows] == [
        "import --dry-run",
        "import",
        "import --launch-specs --trust-unsigned",
        "import --dry-run",
        "import",
    ], r.stdout
