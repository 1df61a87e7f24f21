"""scripts/bench_rollout.py as the rollout tests drive it (tests/test_rollout*.py): one invocation on
the CPU, without stock starts, and the check that every host of a scenario produced its output.

The tests run 3 hosts per fleet (the bench's default is 4): several processes with distinct
``TUNECACHE_HOST_ID``, started together on one store, which is what every fleet assertion needs; a
fourth host adds a fresh ``python`` importing torch (and, for torch.compile, building Inductor's C++)
to every fleet of a scenario, and no behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROLLOUT = ROOT / "scripts" / "bench_rollout.py"
HOSTS = 3


def bench(out: Path, *args: str, timeout: float = 900) -> dict[str, Any]:
    """One invocation of the harness on the CPU, without stock starts, ``HOSTS`` hosts (unless ``args``
    say otherwise: the last ``--hosts`` wins); its JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TRITON_", "TORCHINDUCTOR_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(ROLLOUT), str(out), "--cpu", "--no-stock", "--hosts", str(HOSTS), *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((out / "bench_rollout.json").read_text())


def hosts_ok(rec: dict[str, Any]) -> None:
    """Every host of a scenario produced its output (a failed host's error, else nothing)."""
    errors = {h["host"]: h["error"][-800:] for h in rec["hosts"] if "error" in h}
    assert not errors, errors
