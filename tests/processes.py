"""Fresh Python processes for the tests: a "restart" that reports one JSON object, and N copies of
the tests/procs.py worker started at once. Both start from the warm pool (tests/warmpool.py): a
process with no tunecache state, forked from one that already imported torch."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import warmpool

HERE = Path(__file__).parent


def run_json(argv: list[str], env: dict | None = None, timeout: float = 300) -> dict:
    """Run ``python ARGV`` in a fresh process (a "restart"), from tests/; it must exit 0 and print
    one JSON object as its last line, which is returned."""
    return run_json_stderr(argv, env, timeout)[0]


def run_json_stderr(argv: list[str], env: dict | None = None, timeout: float = 300) -> tuple[dict, str]:
    """:func:`run_json`, and what the process wrote on stderr."""
    r = run(argv, env, timeout, cwd=str(HERE))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def run(
    argv: list[str], env: dict | None = None, timeout: float = 300, inherit: bool = True, **kw
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *ARGV], capture_output=True, text=True, ...)`` for a restart, from the
    warm pool (a fresh interpreter where :func:`warmpool.warm_enough` says so): for a child that prints
    no JSON object, or whose failure is the check. ``env`` adds to this process's environment, or with
    ``inherit=False`` is the whole of the child's."""
    full = {**os.environ, **(env or {})} if inherit else dict(env or {})
    p = warmpool.popen(argv, full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def run_procs(cmd: str, nprocs: int, env: dict | None = None, timeout: float = 300, **args) -> list[dict]:
    """Start nprocs copies of ``tests/procs.py CMD`` at once; return each one's RESULT (asserting exit 0)."""
    args.setdefault("start_at", time.time() + 3.0)
    full_env = {**os.environ, **(env or {})}
    procs = [
        warmpool.popen(
            [str(HERE / "procs.py"), cmd, json.dumps(args)],
            full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(nprocs)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{err[-3000:]}"
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, f"worker printed no result:\n{out[-2000:]}\n{err[-2000:]}"
        results.append({**json.loads(line[-1][7:]), "stderr": err})
    return results
