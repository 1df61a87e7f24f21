"""The ``tunecache`` command in a real process, for checks about what a user sees on stderr.

click's ``CliRunner`` catches an uncaught exception itself: the output then holds no traceback and
the exit code is 1, so "exit 1 and no Traceback in the output" passes for a command that crashed.
Here the traceback, if any, is on the real stderr. Also: the CLI's leaf commands, for checks that
cover every one of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

HERE = Path(__file__).parent


def cli_process(
    *args: str, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m tunecache.cli ARGS``; stdout and stderr as text."""
    r = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", *args],
        input=input,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return subprocess.CompletedProcess(
        r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    )


def one_line_error(r: subprocess.CompletedProcess, code: int = 1) -> str:
    """Assert the command failed with exit ``code`` and exactly one line on stderr, no traceback;
    return that line. Exit 1 is tunecache's own error line, exit 2 click's usage error."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("tunecache: error: "), r.stderr[-3000:]
        return lines[0]
    assert lines and lines[-1].startswith("Error: "), r.stderr[-3000:]  # click: usage lines, then the error
    return lines[-1]


def tc(
    *args: str, env: dict[str, str | None] | None = None, pool: bool = False, **kw: Any
) -> subprocess.CompletedProcess:
    """``tunecache ARGS`` in a fresh process, tests/ importable; ``env`` values of None remove a variable.

    ``pool``: forked from the warm pool (tests/warmpool.py), for a command that imports torch (``warm``:
    2 s of CPU fresh) in a test about what the command does, not about the process's own start-up.
    Most commands import neither torch nor Triton: a fresh one costs 0.4 s, so they stay fresh."""
    full = {**os.environ}
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), full.get("PYTHONPATH")) if p)
    if not pool:
        return subprocess.run(
            [sys.executable, "-m", "tunecache.cli", *args], env=full, capture_output=True, text=True, timeout=300, **kw
        )
    from processes import run

    return run(["-m", "tunecache.cli", *args], full, inherit=False, **kw)


def leaf_commands(group: click.Group | None = None, prefix: str = "") -> dict[str, click.Command]:
    """Every command of the CLI that is not a group, by its full name (``"db upgrade"``)."""
    if group is None:
        from tunecache.cli import main as group
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out.update(leaf_commands(cmd, f"{prefix}{name} "))
        else:
            out[prefix + name] = cmd
    return out
