"""Shared helpers of the fault suite: start worker processes, read their results, record figures.

Figures: every test fills the ``fault_report`` fixture (a dict). At the end of the test it is
printed (visible with ``pytest -s``) and, if ``TUNECACHE_FAULTS_REPORT`` names a file, merged into
that JSON file under the test's name, with the test's outcome and wall time. docs/reliability.md
is filled from that file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

HERE = Path(__file__).parent
WORKER = HERE / "worker.py"


def spawn(
    cmd: str,
    args: dict,
    env: dict | None = None,
    prefix: Sequence[str] = (),
    cwd: str | None = None,
) -> subprocess.Popen:
    """Start ``worker.py CMD args`` (optionally behind a ``prefix`` such as ``ip netns exec NS``)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(
        [*prefix, sys.executable, str(WORKER), cmd, json.dumps(args)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def collect(p: subprocess.Popen, timeout: float) -> dict:
    """Wait (bounded) for a worker; return its RESULT plus rc and stderr. Kills it on timeout."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGUSR1)  # worker.py's faulthandler: every thread's stack to stderr
        time.sleep(2)
        p.kill()
        out, err = p.communicate(timeout=30)
        return {"rc": "timeout", "stderr": err, "stdout": out, "pid": p.pid}
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    res = json.loads(lines[-1][7:]) if lines else {}
    return {**res, "rc": p.returncode, "stderr": err, "stdout": out, "pid": p.pid}


def reap(procs) -> None:
    """Kill and wait for the workers still running (a test's ``finally``: none may outlive it)."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def check_ok(r: dict) -> None:
    """A worker that must have exited cleanly: rc 0, a RESULT, no traceback, no caught exception."""
    assert r["rc"] == 0, f"worker {r['pid']} exited {r['rc']}:\n{r['stderr'][-3000:]}"
    assert "stats" in r, f"worker {r['pid']} printed no result:\n{r['stdout'][-1000:]}\n{r['stderr'][-2000:]}"
    assert "Traceback" not in r["stderr"], r["stderr"][-3000:]
    assert not r.get("errors"), r["errors"][0]


def log_lines(r: dict, level: str = "WARNING", logger: str = "tunecache") -> list[str]:
    prefix = f"LOG {level} {logger}: "
    return [ln[len(prefix) :] for ln in r["stderr"].splitlines() if ln.startswith(prefix)]


def wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``pred`` until it returns a truthy value; fail after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _merge_report(path: Path, name: str, entry: dict) -> None:
    from filelock import FileLock

    with FileLock(str(path) + ".lock", timeout=30):
        data = json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}
        data[name] = entry
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


@pytest.fixture(name="fault_report")
def fault_report_fixture(request: pytest.FixtureRequest) -> Iterator[dict]:
    """A dict of figures for this test; printed and written to ``$TUNECACHE_FAULTS_REPORT``."""
    figures: dict = {}
    t0 = time.monotonic()
    failed_before = request.session.testsfailed
    yield figures
    # The call phase is reported (and counted) before fixtures are torn down.
    entry = {
        "outcome": "failed" if request.session.testsfailed > failed_before else "passed",
        "seconds": round(time.monotonic() - t0, 1),
        **figures,
    }
    print(f"\nFIGURES {request.node.name}: {json.dumps(entry, sort_keys=True, default=str)}")
    path = os.environ.get("TUNECACHE_FAULTS_REPORT")
    if path:
        _merge_report(Path(path), request.node.name, entry)
