"""A child process whose wall clock runs off by a given number of seconds, for the lease tests.

Only ``time.time`` (and ``time_ns``) is skewed, through a ``sitecustomize`` on the child's path:
its monotonic clock and its sleeps stay true, as on a host whose NTP is off by minutes.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

ROOT = Path(__file__).parent.parent

SITECUSTOMIZE = """
    import os, time
    _real_time, _real_ns = time.time, time.time_ns
    _skew = float(os.environ["TC_TEST_CLOCK_SKEW"])
    time.time = lambda: _real_time() + _skew
    time.time_ns = lambda: _real_ns() + int(_skew * 1e9)
"""


def skewed_env(tmp_path: Path, skew: float, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) for a process whose ``time.time()`` runs ``skew`` seconds
    off; the tests' root stays on its path."""
    d = tmp_path / "skewed-clock"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(d), str(ROOT), env.get("PYTHONPATH", "")])
    env["TC_TEST_CLOCK_SKEW"] = str(skew)
    return env
