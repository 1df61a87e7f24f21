"""Starting a bench's child processes: one at a time, timed, or many at once.

A child reports by printing its result as one JSON line, the last of its stdout (after a prefix
such as ``RESULT `` where other output may follow): :meth:`Done.result` reads it back. A child that
exits non-zero or prints no result is a :class:`ChildFailed` where the bench cannot go on without it
(:func:`run_json`); a bench that reports failed children goes on with :meth:`Done.ok` false.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Done:
    """A finished child: its command, exit code, output and wall time (start to exit, seconds)."""

    cmd: list[str]
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def result(self, prefix: str = "") -> Any:
        """The child's result: its last non-empty stdout line that starts with ``prefix``, as JSON
        (``None`` if there is none)."""
        return last_json(self.stdout, prefix)

    def check(self, what: str) -> Done:
        """This, if the child exited 0; else :class:`ChildFailed` naming ``what``."""
        if not self.ok:
            raise ChildFailed(what, self)
        return self


class ChildFailed(RuntimeError):
    """A child the bench needs failed: its exit code and the tail of its stderr, to act on."""

    def __init__(self, what: str, done: Done) -> None:
        why = "timed out" if done.timed_out else f"exit {done.rc}"
        super().__init__(f"{what} failed ({why}):\n{done.stderr[-3000:]}")
        self.done = done


def last_json(text: str, prefix: str = "") -> Any:
    """The last non-empty line of ``text`` that starts with ``prefix``, without it, parsed as JSON."""
    lines = [ln for ln in text.splitlines() if ln.strip() and ln.startswith(prefix)]
    return json.loads(lines[-1][len(prefix) :]) if lines else None


def python(*args: str | Path) -> list[str]:
    """A command line running this interpreter."""
    return [sys.executable, *map(str, args)]


def child_env(
    *,
    drop: Sequence[str] = (),
    before: Iterable[str | Path] = (),
    after: Iterable[str | Path] = (),
    base: Mapping[str, str] | None = None,
    **settings: str,
) -> dict[str, str]:
    """A child's environment: ``base`` (default: this process's) without the variables whose names
    start with one of ``drop``, PYTHONPATH with ``before`` ahead of the inherited entries and
    ``after`` behind them, and ``settings`` on top (a PYTHONPATH there replaces the whole)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not (drop and k.startswith(tuple(drop)))}
    parts = [*map(str, before), env.get("PYTHONPATH", ""), *map(str, after)]
    if any(str(p) for p in [*before, *after]):
        env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    env.update(settings)
    return env


def run(
    cmd: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    cwd: str | Path | None = None,
) -> Done:
    """Run ``cmd`` to its end and time it. Past ``timeout`` the child is killed and
    ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    argv = [str(c) for c in cmd]
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=None if env is None else dict(env), capture_output=True, text=True,
                       timeout=timeout, cwd=cwd)  # fmt: skip
    return Done(argv, p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)


def run_json(cmd: Sequence[str | Path], what: str, *, prefix: str = "", **kwargs: Any) -> Any:
    """Run ``cmd`` (:func:`run`'s arguments) and return its result; :class:`ChildFailed` if it
    failed or printed none."""
    done = run(cmd, **kwargs).check(what)
    out = done.result(prefix)
    if out is None:
        raise ChildFailed(f"{what} (no result line)", done)
    return out


def run_together(
    cmds: Sequence[Sequence[str | Path]], *, envs: Sequence[Mapping[str, str] | None] | None = None, timeout: float
) -> list[Done]:
    """Start every command at once, then wait for each in turn; a child still running ``timeout``
    seconds into its wait is killed (``timed_out``). Their results, in order."""
    t0 = time.perf_counter()
    started = []
    for i, cmd in enumerate(cmds):
        env = envs[i] if envs else None
        argv = [str(c) for c in cmd]
        p = subprocess.Popen(argv, env=None if env is None else dict(env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
        started.append((argv, p))
    out = []
    for argv, p in started:
        timed_out = False
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            timed_out = True
        out.append(Done(argv, p.returncode, so, se, time.perf_counter() - t0, timed_out))
    return out


def at_once(starts: Sequence[Callable[[], T]], *, stagger_s: float = 0.0) -> list[T | BaseException]:
    """Call each of ``starts`` in a thread of its own, all together (or ``stagger_s`` seconds
    apart), each typically running a child to its end; their returns, or what each raised, in order."""
    results: list[Any] = [None] * len(starts)

    def one(i: int, start: Callable[[], T]) -> None:
        time.sleep(i * stagger_s)
        try:
            results[i] = start()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller, who reports it
            results[i] = e

    threads = [threading.Thread(target=one, args=(i, s)) for i, s in enumerate(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
