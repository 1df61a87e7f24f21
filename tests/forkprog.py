"""Fork scenarios for tests/test_fork.py: ``python forkprog.py SCENARIO URL``.

The parent defines a kernel (which starts the background prefetch), forks at a chosen moment, and
waits for the child with a deadline: a child that hangs is killed (by its own alarm, or by the
parent) and reported as "hung" instead of hanging the test. The child reports what it did through a
pipe; the parent prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

from dataclasses import replace  # noqa: E402

import tinykernels  # noqa: E402

import tunecache  # noqa: E402
from tunecache.metrics import exporter, families, mirror  # noqa: E402
from tunecache.process import counters, writeback  # noqa: E402
from tunecache.store import breaker, migrate, opening  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.tuner import background, companions  # noqa: E402

CHILD_LIMIT_S = 60


def blackhole() -> tuple[int, threading.Event]:
    """A database address that accepts connections and never answers (a hung server, a firewall)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    accepted = threading.Event()
    conns = []

    def serve() -> None:
        while True:
            c, _ = srv.accept()
            conns.append(c)
            accepted.set()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], accepted


def fork(child: object) -> tuple[int, int]:
    """Fork; the child runs ``child()`` (which returns a JSON-able report) and exits by os._exit."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(CHILD_LIMIT_S)  # a hang ends the child (SIGALRM), not the test
        try:
            report = child()
            os.write(w, json.dumps(report).encode())
            code = 0
        except BaseException:  # noqa: BLE001 - report anything, never unwind into the parent's code
            traceback.print_exc()
            code = 3
        os.close(w)
        os._exit(code)
    os.close(w)
    return pid, r


def wait(pid: int, r: int, limit: float = CHILD_LIMIT_S + 10) -> dict:
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = -9
            break
        time.sleep(0.05)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    return {"rc": "hung" if rc in (-signal.SIGALRM, -9) else rc, "report": json.loads(data) if data else None}


def launch_child(kernel: object) -> object:
    def child() -> dict:
        t0 = time.monotonic()
        cfg = tinykernels.launch(kernel, 64)  # asserts the result is right
        tunecache.flush()
        return {"launched": cfg is not None, "seconds": round(time.monotonic() - t0, 2)}

    return child


def moment(name: str, url: str) -> dict:
    """Fork at one moment of the background prefetch; the child's first launch must complete."""
    if name == "before":  # the prefetch is queued, not started
        gate = threading.Event()
        background.submit(gate.wait)
        k = tinykernels.make_add(store=url)
        pid, r = fork(launch_child(k))
        gate.set()
    elif name == "connecting":  # the prefetch waits for a server that never answers
        port, accepted = blackhole()
        url = f"postgresql+psycopg://tc@127.0.0.1:{port}/tc"
        k = tinykernels.make_add(store=url)
        assert accepted.wait(30), "the prefetch never connected"
        time.sleep(0.2)
        pid, r = fork(launch_child(k))
    elif name == "migrating":  # the prefetch holds the store and migration locks, and SQLite's write lock
        import alembic.command

        inside = threading.Event()
        real = alembic.command.upgrade

        def slow_upgrade(*a: object, **kw: object) -> object:
            inside.set()
            time.sleep(1.0)  # the fork comes now
            return real(*a, **kw)

        alembic.command.upgrade = slow_upgrade
        k = tinykernels.make_add(store=url)
        assert inside.wait(60), "the prefetch never migrated"
        pid, r = fork(launch_child(k))
    elif name == "after":  # the prefetch finished: its store and pooled connections exist
        k = tinykernels.make_add(store=url)
        k.wait_for_prefetch()
        pid, r = fork(launch_child(k))
    else:
        raise SystemExit(f"unknown moment {name}")
    out = wait(pid, r)
    if url.startswith("sqlite"):
        tunecache.flush()
        out["stored_problems"] = len(open_store(url).find_problems())
    return out


def locks(url: str) -> dict:
    """Fork while another thread holds every lock tunecache's background work may hold."""
    k = tinykernels.make_add(store=url)
    k.wait_for_prefetch()
    s = opening.shared_store(url)
    named = {
        "opening._stores_lock": lambda: opening._stores_lock,
        "migrate._alembic_lock": lambda: migrate._alembic_lock,
        "Store._lock": lambda: s._lock,
        "background.pool_lock": lambda: background.fork_locks()["background.pool_lock"],
        "counters.lock": lambda: counters.fork_locks()["counters.lock"],
        "counters.warned_lock": lambda: counters.fork_locks()["counters.warned_lock"],
        "writeback.lock": lambda: writeback.fork_locks()["writeback.lock"],
        "writeback.flush_lock": lambda: writeback.fork_locks()["writeback.flush_lock"],
        "companions.lock": lambda: companions.fork_locks()["companions.lock"],
        "breaker.lock": lambda: breaker.fork_locks()["breaker.lock"],
        "metrics.start_lock": lambda: exporter.fork_locks()["metrics.start_lock"],
        "metrics.since_lock": lambda: families.fork_locks()["metrics.since_lock"],
        "metrics.sync_lock": lambda: mirror.fork_locks()["metrics.sync_lock"],  # the fork waits 2 s for it
        "tuner.identity_lock": lambda: k.fork_locks()["tuner.identity_lock"],
        "tuner.lock": lambda: k.fork_locks()["tuner.lock"],
    }
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        got = [get() for get in named.values()]
        for lock in got:
            lock.acquire()
        held.set()
        release.wait()
        for lock in reversed(got):
            lock.release()

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(30)

    def child() -> dict:
        stuck = []
        for name, get in named.items():
            lock = get()
            if lock.acquire(timeout=1.0):
                lock.release()
            else:
                stuck.append(name)
        return {"stuck": stuck, **launch_child(k)()}

    pid, r = fork(child)
    release.set()
    return wait(pid, r)


def hits(url: str, exit_how: str) -> dict:
    """Deferred writes across a fork: the parent has a pending hit; the child makes its own hit and a
    deferred result, then exits by ``exit_how``. Every hit must be written exactly once.

    The parent's timer waits an hour (its hit stays queued across the fork however long a starved
    step takes; the parent flushes it itself at the end); the child's waits 1 s."""
    writeback.FLUSH_DELAY_S = 3600.0
    k = tinykernels.make_add(store=url)
    tinykernels.launch(k, 64)  # tunes and stores
    tunecache.flush()
    k2 = tinykernels.make_add(store=url)
    tinykernels.launch(k2, 64)  # a hit: queued in the parent, not written yet
    s = open_store(url)
    p = s.find_problems(with_configs=True)[0]
    assert s.get(p.digest).hit_count == 0 and writeback.pending_hits() == 1
    extra = replace(p, digest="f" * 64, key_json='[["N", 12345]]')

    def child() -> dict:
        writeback.FLUSH_DELAY_S = 1.0
        k3 = tinykernels.make_add(store=url)
        tinykernels.launch(k3, 64)  # the child's own hit
        writeback.defer_put(opening.shared_store(url), extra, p.configs, False)  # a result the store could not take
        if exit_how == "sys_exit":
            sys.exit(0)  # atexit flushes
        time.sleep(writeback.FLUSH_DELAY_S + 2.0)  # the child's own timer flushes
        return {}

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(CHILD_LIMIT_S)
        try:
            child()
        except SystemExit:
            os.close(w)
            raise  # unwinds to the top: the interpreter exits and runs atexit
        os.close(w)
        os._exit(0)
    os.close(w)
    out = wait(pid, r)
    tunecache.flush()  # the parent's own pending hit
    s = open_store(url)
    out["hit_count"] = s.get(p.digest).hit_count
    out["child_result_stored"] = s.get("f" * 64) is not None
    return out


if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    if scenario == "locks":
        result = locks(url)
    elif scenario.startswith("hits:"):
        result = hits(url, scenario.split(":", 1)[1])
    else:
        result = moment(scenario, url)
    print(json.dumps(result), flush=True)
    os._exit(0)  # leave the background threads (a hung connection) behind
