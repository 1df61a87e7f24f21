"""The kernel module tests/heal_roundtrip.py tunes and restarts (healkernel.py: a tuned kernel and,
launched after it with ``TC_COMPANION=1``, a plain one), and one phase of it
as a fresh process: shared by the binary tests (tests/test_binaries.py) and the shared-build tests
(tests/test_shared_builds.py). ``COMMENT`` in the source is what a comment edit changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processes import run_json

SOURCE = """
import triton
import triton.language as tl

CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK": 128}, num_warps=2, num_stages=1),
]


@triton.jit
def add_two(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N  # COMMENT
    tl.store(Y + i, tl.load(X + i, mask=m) + 2, mask=m)


@triton.jit
def plus_one(X, N, BLOCK: tl.constexpr):  # a plain kernel launched beside add_two: a companion
    i = tl.arange(0, BLOCK)
    m = i < N  # COMMENT
    tl.store(X + i, tl.load(X + i, mask=m) + 1, mask=m)
"""


def kernel_module(where: Path, comment: str) -> Path:
    """A directory holding healkernel.py with ``comment`` in its one comment."""
    where.mkdir(exist_ok=True)
    (where / "healkernel.py").write_text(SOURCE.replace("COMMENT", comment))
    return where


def run_phase(phase: str, kernel_dir: Path, cache: Path, url: str, **env: str) -> dict[str, Any]:
    """One phase of tests/heal_roundtrip.py (``tune`` or ``restart``) in a fresh process."""
    env = {"KERNEL_DIR": str(kernel_dir), "TRITON_CACHE_DIR": str(cache), "TUNECACHE_URL": url, **env}
    return run_json(["heal_roundtrip.py", phase], env=env)
