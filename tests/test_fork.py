"""Forked workers (how servers really start): locks, background state and deferred writes.

A server defines its kernels (which starts tunecache's background prefetch), then forks workers.
Each scenario runs in a fresh process (tests/forkprog.py) that forks at a chosen moment; a child
that hangs is killed after a deadline and reported as "hung", so these tests fail instead of hanging.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from processes import run_json

ROOT = Path(__file__).resolve().parents[1]


def fork_scenario(scenario: str, url: str) -> dict:
    return run_json(["forkprog.py", scenario, url], {"TUNECACHE_CONNECT_TIMEOUT": "2"}, timeout=240)


@pytest.mark.parametrize("moment", ["before", "connecting", "migrating", "after"])
def test_child_forked_at_any_moment_of_the_prefetch_launches(sqlite_url, moment):
    # "connecting": the prefetch waits on a server that accepts and never answers, holding the
    # store registry's lock; "migrating": it holds that lock and the migration lock. A child that
    # inherited them taken waited forever at its first launch.
    got = fork_scenario(moment, sqlite_url)
    assert got["rc"] == 0, got
    assert got["report"]["launched"] is True
    assert got["report"]["seconds"] < 20  # no lock waited out: at most the 2 s connect timeout
    if moment != "connecting":  # the child opened the store itself and wrote its result
        assert got["stored_problems"] == 1


def test_no_lock_held_by_another_thread_at_fork_blocks_the_child(sqlite_url):
    got = fork_scenario("locks", sqlite_url)
    assert got["rc"] == 0, got
    assert got["report"]["stuck"] == []
    assert got["report"]["launched"] is True


@pytest.mark.parametrize("exit_how", ["os_exit", "sys_exit"])
def test_child_writes_its_own_deferred_hits_and_results_exactly_once(sqlite_url, exit_how):
    # The parent has one hit queued when it forks; the child makes one of its own and defers a
    # result. os_exit: only the child's own timer can write them (the inherited timer has no
    # thread). sys_exit: the child's atexit flush must not write the parent's queued hit too.
    got = fork_scenario(f"hits:{exit_how}", sqlite_url)
    assert got["rc"] == 0, got
    assert got["hit_count"] == 2  # the parent's and the child's, each once
    assert got["child_result_stored"] is True


# ---- the one fork registry (tunecache.process.forks, issue 26) ---------------------------------------------

#: Every module that keeps per-process state a forked child must reset.
RESETTING_MODULES = {
    "tunecache.process.counters",
    "tunecache.process.processend",
    "tunecache.store.forkgate",
    "tunecache.store.migrate",
    "tunecache.store.opening",
    "tunecache.store.store",
    "tunecache.tuner.background",
    "tunecache.tuner.companions",
    "tunecache.process.writeback",
    "tunecache.metrics.families",
    "tunecache.metrics.exporter",
    "tunecache.metrics.mirror",
}

FORK_PROGRAM = """
import json, os
import tunecache.tuner.decorator, tunecache.tuner.companions  # everything that registers a reset
import tunecache.metrics.exporter, tunecache.metrics.mirror  # (imported at a process's first store open)
from tunecache.process import forks

hooks = forks.registered()
names = list(hooks["after_in_child"])
r, w = os.pipe()
ran = []
def spy(name, fn):
    def hook():
        ran.append(name)
        fn()
    return hook
for name in names:
    forks.register(name, spy(name, hooks["after_in_child"][name]),
                   before=hooks["before"].get(name), after_in_parent=hooks["after_in_parent"].get(name))
twice = []
forks.register("test.twice", lambda: twice.append(1))
forks.register("test.twice", lambda: twice.append(2))
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps({"ran": ran, "twice": twice}).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 20))
registered = {k: list(v) for k, v in forks.registered().items()}
print(json.dumps({"registered": registered, "names": names, "child": child, "status": status}))
"""


def test_a_forked_child_runs_every_registered_reset_once():
    got = run_json(["-c", FORK_PROGRAM])
    assert got["status"] == 0
    assert set(got["names"]) >= RESETTING_MODULES, got["names"]
    # every reset ran in the child, in registration order, each once
    assert got["child"]["ran"] == got["names"], got
    # registering a name twice keeps one entry (the last hooks), which runs once
    assert got["registered"]["after_in_child"].count("test.twice") == 1
    assert got["child"]["twice"] == [2]
    # the gate's before/after-in-parent hooks are in the registry too
    assert "tunecache.store.forkgate" in got["registered"]["before"]
    assert "tunecache.store.forkgate" in got["registered"]["after_in_parent"]


def fork_registrations(root: Path) -> list[str]:
    """Every call of ``os.register_at_fork`` (however spelled) in the package but tunecache/process/forks.py."""
    out = []
    for path in sorted([*(root / "tunecache").rglob("*.py"), *(root / "kernels").rglob("*.py")]):
        if path == root / "tunecache" / "process" / "forks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = node.func if isinstance(node, ast.Call) else None
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name == "register_at_fork":
                out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_only_forks_registers_at_fork():
    found = fork_registrations(ROOT)
    assert not found, "register resets with tunecache.process.forks.register, not os.register_at_fork:\n" + "\n".join(
        found
    )


def test_the_fork_check_sees_a_direct_registration(tmp_path):
    (tmp_path / "tunecache" / "store").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "tunecache" / "process").mkdir()
    (tmp_path / "tunecache" / "process" / "forks.py").write_text(
        "import os\nos.register_at_fork(after_in_child=print)\n"
    )
    (tmp_path / "tunecache" / "store" / "x.py").write_text(
        "import os\nfrom os import register_at_fork\n"
        "os.register_at_fork(after_in_child=print)\nregister_at_fork(before=print)\n"
    )
    assert fork_registrations(tmp_path) == ["tunecache/store/x.py:3", "tunecache/store/x.py:4"]
