"""Benches run on the CPU at their smallest settings, as a user runs them: each finishes and writes
its table. Real processes (each bench starts its own children)."""

from __future__ import annotations

import json
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


@pytest.mark.slow
def test_binaries_bench_validates_the_plain_export_and_the_signed_one(tmp_path: Path) -> None:
    """With TUNECACHE_TRUSTED_KEYS set every import needs a signed file (the trust layer): the
    bench's dry run of its plain (unsigned) export raised UntrustedFileError and wrote nothing."""
    out = tmp_path / "binaries.json"
    r = run_bench("bench_binaries.py", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    for suffix in (".jsonl", ".jsonl.gz"):
        f = got["files"][suffix]
        assert f["validate_plain_ms"] > 0 and f["validate_binaries_signed_ms"] > 0, f
        assert f["with_binaries_signed_bytes"] > f["plain_bytes"], f
