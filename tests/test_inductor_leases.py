"""Leases on torch.compile's entries (issue 28): one host computes what several would compute at once.

Two hosts are simulated in one process: the second host's ``lease_host`` (what a lease row names
as its holder's host) is another string, its sleep is the test's clock. The store is the real
SQLite file and the real PostgreSQL (``store_url``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import warmpool
from skewclock import skewed_env

pytest.importorskip("torch._inductor.remote_cache")

from tunecache.inductor import entries as inductor_entries  # noqa: E402
from tunecache.inductor import leases  # noqa: E402
from tunecache.inductor.entries import InductorStore  # noqa: E402
from tunecache.process import counters  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent
GRAPH = b'{"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    for var in ("TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY", "TUNECACHE_MODE", "TUNECACHE_WAIT_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    inductor_entries.inductor_target.cache_clear()
    yield
    inductor_entries.inductor_target.cache_clear()


@pytest.fixture
def store(store_url: str):
    with contextlib.closing(open_store(store_url)) as s:
        yield s
        leases.release_all()  # the leases this process took on it (its heartbeat ends with them)


_real_sleep = time.sleep


def waiter_sleep(monkeypatch, sleep) -> None:
    """The lease waits of this (the main) thread call ``sleep``. ``leases.time`` is the ``time`` module:
    every other thread (tunecache's writeback) keeps sleeping for real."""
    main = threading.main_thread()

    def patched(s: float) -> None:
        return sleep(s) if threading.current_thread() is main else _real_sleep(s)

    monkeypatch.setattr(leases.time, "sleep", patched)


def on_another_host(monkeypatch, sleep) -> None:
    """From now on this process is a process of another host, whose waits call ``sleep``."""
    monkeypatch.setattr(leases, "lease_host", lambda: "another-host#pidns=1.2")
    waiter_sleep(monkeypatch, sleep)


def waits() -> int:
    return int(counters.stats()["inductor_lease_waits"])


def test_a_host_that_misses_what_another_computes_waits_and_is_served_its_put(store, monkeypatch):
    first, held = InductorStore(store), leases.held()
    assert first.get("fx_graph", "graph-1") is None  # a miss: this host takes the lease and compiles
    assert leases.held() == held + 1
    slept: list[float] = []

    def sleep(s: float) -> None:  # the first host's compile ends while the second waits
        slept.append(s)
        if len(slept) == 3:
            first.put("fx_graph", "graph-1", GRAPH)

    on_another_host(monkeypatch, sleep)
    before = waits()
    assert InductorStore(store).get("fx_graph", "graph-1") == GRAPH  # served, not compiled
    assert waits() == before + 1 and len(slept) == 3
    assert counters.stats()["inductor_waits_in_vain"] == 0  # the wait served it
    assert leases.held() == held  # the put released the lease
    assert store.lease_of(leases.lease_digest("fx_graph", "graph-1", _digest())) is None


def test_a_lease_released_without_a_put_or_lapsed_ends_the_wait_and_the_waiter_computes(store, monkeypatch):
    # Lapsed: its holder, a process of another host, renews it no more (killed).
    monkeypatch.setenv("TUNECACHE_LEASE_SECONDS", "1")
    digest = leases.lease_digest("autotune", "kernel-1", _digest())
    assert store.try_lease(digest, "inductor:killed", 1)
    on_another_host(monkeypatch, time.sleep)  # real waits, of a 1-second lease
    t = time.monotonic()
    assert InductorStore(store).get("autotune", "kernel-1") is None  # the holder never put: lapsed
    assert 0.5 < time.monotonic() - t < 3
    row = store.lease_of(digest)
    assert row is not None and row["holder"] != "inductor:killed"  # the waiter holds it now
    assert counters.stats()["inductor_waits_in_vain"] == 1  # waited, and computes it all the same

    # Released without a put (Inductor decided not to cache it): the waiter stops at the next look.
    other = leases.lease_digest("autotune", "kernel-2", _digest())
    store.try_lease(other, "inductor:elsewhere", 300)
    looks: list[float] = []

    def sleep(s: float) -> None:
        looks.append(s)
        store.release_lease(other, "inductor:elsewhere")

    waiter_sleep(monkeypatch, sleep)
    assert InductorStore(store).get("autotune", "kernel-2") is None
    assert len(looks) == 1 and counters.stats()["inductor_waits_in_vain"] == 2


def test_processes_of_one_host_never_wait_on_each_other(store, monkeypatch):
    """Inductor may get an entry in a compile worker and put it from the main process: a host that
    waited on its own lease would wait on itself."""
    digest = leases.lease_digest("fx_graph", "graph-2", _digest())
    assert store.try_lease(digest, "inductor:a-compile-worker", 300)  # this host, another process
    waiter_sleep(monkeypatch, lambda s: pytest.fail("waited on its own host"))
    before = waits()
    assert InductorStore(store).get("fx_graph", "graph-2") is None
    assert waits() == before


def test_no_lease_for_triton_kernels_in_readonly_mode_or_with_no_wait(store, monkeypatch):
    entries, held = InductorStore(store), leases.held()
    assert entries.get("triton_kernel", "ab" * 32) is None  # a compile of seconds: no lease
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    assert entries.get("fx_graph", "graph-3") is None
    monkeypatch.setenv("TUNECACHE_MODE", "readwrite")
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "0")
    assert entries.get("fx_graph", "graph-4") is None
    assert leases.held() == held


def _digest() -> str:
    return inductor_entries.inductor_target()[0]


# ---- a fleet: real processes with distinct host ids, on Inductor's own cache classes (issue 35) ----

LEASE_S = 1.0  # TUNECACHE_LEASE_SECONDS of these processes
WAIT_S = 20.0  # TUNECACHE_WAIT_SECONDS: a waiter held by a lease nobody renews or releases waits this


def host(store_url: str, host_id: str, *argv: str, base: dict[str, str] | None = None, **more: str) -> subprocess.Popen:
    """``tests/inductor_lease_prog.py ARGV`` as a process of host ``host_id`` (``more``: its env, on
    ``base``, by default this process's). Forked from the warm pool's Inductor server (it imports
    torch._dynamo and Inductor's remote caches first thing): it never compiles, so its local Inductor
    cache directory is the pool's, where it writes nothing; a skewed clock (``base``) starts fresh."""
    base = dict(os.environ if base is None else base)
    env = {
        **base,
        "TUNECACHE_URL": store_url,
        "TUNECACHE_HOST_ID": host_id,
        "TUNECACHE_TRUST_STORE": "yes",
        "TUNECACHE_LEASE_SECONDS": str(LEASE_S),
        "TUNECACHE_WAIT_SECONDS": str(WAIT_S),
        "PYTHONPATH": os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]),
        **more,
    }
    return warmpool.popen(
        [str(HERE / "inductor_lease_prog.py"), *argv],
        env,
        inductor=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def held(p: subprocess.Popen, what: str = "HELD") -> int:
    """Wait until ``p`` printed HELD (its get is done, the lease taken), or ``what``; the pid it
    printed there (``p.pid`` is a warm child's launcher)."""
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.split()[:1] == [what], (line, p.stderr.read() if p.poll() is not None else "")
    return int(line.split()[1])


def go(p: subprocess.Popen) -> None:
    """Let ``p`` (``compute-put``) compute, from now."""
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


def result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def waiter(store_url: str, cache: str, key: str) -> dict:
    """A process of host B that misses ``key`` now: what it got and how long its get took."""
    return result(host(store_url, "host-b", "wait", cache, key))


def lease_row(store, kind: str, key: str) -> dict | None:
    """The lease of ``key`` as the program's cache (``RedisRemoteCache("tc-lease-test")``) files it."""
    return store.lease_of(leases.lease_digest(kind, f"pt2:tc-lease-test::{key}:c1", _digest()))


def test_a_get_that_no_put_follows_does_not_hold_another_host_after_its_process_ends(store, store_url):
    """The issue's repro: host A gets an autotune entry and exits without a put; host B's get must
    not wait for the lease to lapse (it waited TUNECACHE_WAIT_SECONDS)."""
    a = result(host(store_url, "host-a", "get", "RemoteAutotuneCache", "k-exit"))
    assert a["got"] is None
    assert lease_row(store, "autotune", "k-exit") is None  # released as A ended
    b = waiter(store_url, "RemoteAutotuneCache", "k-exit")
    assert b["got"] is None and b["seconds"] < LEASE_S, b
    assert "inductor_lease_waits" not in b["stats"], b


@pytest.mark.parametrize(
    ("store_url", "skew"),
    [("sqlite", 120.0), ("postgresql", -120.0)],
    ids=["sqlite-holder-fast", "pg-holder-slow"],
    indirect=["store_url"],
)
def test_a_killed_holder_holds_the_waiter_no_longer_than_the_lease_seconds(store, store_url, tmp_path, skew):
    """Host A is compiling (its lease renewed) when it is killed: B, waiting on it, stops waiting
    within the lease seconds of the kill, not TUNECACHE_WAIT_SECONDS after A took the lease. Whatever
    A's clock (issue 43, item 4: minutes fast, B waited TUNECACHE_WAIT_SECONDS; minutes slow, B took
    A's live lease over at once): a lease's time is the database's. (Each skew on one database: both
    skews on all three are tests/test_lease_clock.py's, through the same store calls.)"""
    base = skewed_env(tmp_path, skew)
    a = host(store_url, "host-a", "compiling-hold", "RemoteFxGraphCache", "g-killed", base=base)
    try:
        held(a)
        b = host(store_url, "host-b", "wait", "RemoteFxGraphCache", "g-killed")
        held(b, "LOOKING")
        time.sleep(2 * LEASE_S)  # B waits past a lease period: A's heartbeat keeps its lease meanwhile
        a.send_signal(signal.SIGKILL)
        killed_at = time.time()
        got = result(b)
    finally:
        a.kill()
        a.communicate()
    assert got["got"] is None and got["stats"]["inductor_lease_waits"] == 1, got
    assert 0 < got["end"] - killed_at < LEASE_S + 2, got  # waited while A lived, then the lease at most
    assert got["stats"]["lease_takeovers"] == 1, got  # B took A's lease over (and released it as it ended)
    assert lease_row(store, "fx_graph", "g-killed") is None


def test_a_holder_whose_compile_ended_without_a_put_does_not_hold_the_waiter(store, store_url):
    a = host(store_url, "host-a", "compile-end", "RemoteFxGraphCache", "g-ended")
    try:
        held(a)
        b = waiter(store_url, "RemoteFxGraphCache", "g-ended")
        assert a.poll() is None  # A still lives
    finally:
        a.kill()
        a.communicate()
    assert b["got"] is None and b["seconds"] < LEASE_S, b


def test_an_idle_holder_of_an_autotune_lease_stops_holding_it_within_two_lease_periods(store, store_url):
    """A kernel whose autotune entry was looked up but which is never launched (so never put): the
    holder lives on, idle; its lease goes within twice the lease seconds, not the wait seconds."""
    a = host(store_url, "host-a", "hold", "RemoteAutotuneCache", "k-idle")
    try:
        held(a)
        b = waiter(store_url, "RemoteAutotuneCache", "k-idle")
        assert a.poll() is None
    finally:
        a.kill()
        a.communicate()
    assert b["got"] is None and b["seconds"] < 2 * LEASE_S + 3, b


def test_a_holder_computing_longer_than_the_lease_keeps_it_and_the_waiter_is_served_its_put(store, store_url):
    a = host(store_url, "host-a", "compute-put", "RemoteFxGraphCache", "g-slow", str(4 * LEASE_S))
    try:
        held(a)
        b = host(store_url, "host-b", "wait", "RemoteFxGraphCache", "g-slow")
        held(b, "LOOKING")
        go(a)
        assert result(a)["got"] is None
        b = result(b)
    finally:
        a.kill()
        a.communicate()
    assert b["got"] == {"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}, b  # served, not computed
    assert b["stats"]["inductor_lease_waits"] == 1 and b["stats"]["inductor_hits"] == 1, b
    assert lease_row(store, "fx_graph", "g-slow") is None


def test_a_put_from_another_process_of_the_host_releases_the_lease_a_compile_worker_took(store, store_url):
    """Inductor looks an autotune entry up where it loads the kernel (a compile worker) and puts it
    from the process that benchmarks it (the main process)."""
    long = {"TUNECACHE_LEASE_SECONDS": "60"}  # the worker keeps it: only the put ends it here
    worker = host(store_url, "host-a", "hold", "RemoteAutotuneCache", "k-worker", **long)
    try:
        pid = held(worker)
        assert lease_row(store, "autotune", "k-worker")["pid"] == pid
        result(host(store_url, "host-a", "put", "RemoteAutotuneCache", "k-worker", **long))
        assert lease_row(store, "autotune", "k-worker") is None
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.communicate()


# ---- TUNECACHE_SUMMARY for torch.compile (issue 35, item 7) ----------------------------------------

INDUCTOR_SUMMARY = re.compile(
    r"tunecache(?: \(pid (?P<pid>\d+)\))?: torch\.compile: (?P<served>[\d,]+) served, (?P<computed>[\d,]+) computed, "
    r"(?P<put>[\d,]+) put, (?P<waits>[\d,]+) lease waits? \((?P<wait_s>[\d.]+) s\), (?P<untrusted>[\d,]+) untrusted"
)


def inductor_summary(stderr: str) -> dict:
    [line] = [m.groupdict() for ln in stderr.splitlines() if (m := INDUCTOR_SUMMARY.fullmatch(ln))] or [None]
    assert line is not None, stderr[-3000:]
    assert not re.search(r"^tunecache(?: \(pid \d+\))?: \d", stderr, re.M), stderr  # no tuner line: no kernel
    return {k: v if k == "pid" else float(v.replace(",", "")) for k, v in line.items()}


def test_the_summary_line_says_what_torch_compiles_store_did(store_url, monkeypatch):
    """A process that computed and put, one kept waiting then served, one refused an entry it does
    not trust: each says so in its TUNECACHE_SUMMARY line (the tuner's line stays as it was)."""
    monkeypatch.setenv("TUNECACHE_SUMMARY", "1")
    a = host(store_url, "host-a", "compute-put", "RemoteFxGraphCache", "g-said", str(2 * LEASE_S))
    held(a)
    b = host(store_url, "host-b", "wait", "RemoteFxGraphCache", "g-said")
    held(b, "LOOKING")
    go(a)
    _, a_err = a.communicate(timeout=120)
    b_out, b_err = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, a_err + b_err
    said = inductor_summary(a_err)
    assert (said["served"], said["computed"], said["put"], said["waits"]) == (0, 1, 1, 0), said
    said, got = inductor_summary(b_err), json.loads(b_out.strip().splitlines()[-1])
    assert (said["served"], said["computed"], said["put"], said["waits"]) == (1, 0, 0, 1), said
    assert LEASE_S < said["wait_s"] <= got["seconds"] + 0.05, (said, got)  # A computed 2 s: B waited that
    c = host(store_url, "host-c", "wait", "RemoteFxGraphCache", "g-said", TUNECACHE_TRUST_STORE="no")
    _, c_err = c.communicate(timeout=120)
    said = inductor_summary(c_err)
    assert (said["served"], said["computed"], said["untrusted"]) == (0, 1, 1), said


@pytest.mark.slow  # two real torch.compile runs on the CPU: about a minute on a busy 2-core machine
def test_hosts_started_together_one_compiles_the_other_is_served_its_graph_with_a_short_lease(pg_url, tmp_path):
    """The fleet path end to end: a real torch.compile on two hosts started together, with a lease
    much shorter than the compile (the heartbeat keeps it while A compiles): B waits and is served
    A's FX graph (Inductor's own hit counter), and no lease is left once both ended."""
    env = {
        **os.environ,
        "TUNECACHE_URL": pg_url,
        "TUNECACHE_TRUST_STORE": "yes",
        "TUNECACHE_INDUCTOR": "1",
        "TUNECACHE_LEASE_SECONDS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with contextlib.closing(open_store(pg_url)) as s:
        s.revision()  # the schema is there before both start
        procs = []
        for h in ("host-a", "host-b"):
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "inductor_prog.py"), "--enable"],
                    env={**env, "TUNECACHE_HOST_ID": h, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / h)},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            time.sleep(1.0)  # A usually misses first; on a loaded machine B may reach the compile first
        a, b = sorted((result(p) for p in procs), key=lambda r: -r["fxgraph_cache_miss"])  # the one that computed
        assert a["fxgraph_cache_miss"] == 1 and a["tunecache"]["inductor_puts"] >= 1, a
        assert b["fxgraph_cache_hit"] == 1 and b["tunecache"]["inductor_lease_waits"] >= 1, b
        assert b["tunecache"]["inductor_wait_seconds"] > 1 and "inductor_puts" not in b["tunecache"], b
        assert b["out"] == a["out"]
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM leases")).scalar() == 0  # none left behind
    finally:
        engine.dispose()
