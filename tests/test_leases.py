"""Benchmark leases across PID namespaces, and a holder that loses its lease mid-benchmark.

Containers with host networking share the hostname, not the PID space: "same host, pid gone" must
not take over a lease whose holder is alive in another namespace (two benchmarks on one GPU).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
import tinykernels

import tunecache
from tunecache.problem.configidentity import config_identity
from tunecache.problem.model import ConfigResult
from tunecache.problem.target import hostname
from tunecache.store import leases as leaseholder
from tunecache.store.opening import open_store
from tunecache.store.schema import leases
from tunecache.tuner import benchhooks

HERE = Path(__file__).parent


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    assert not leaseholder.pid_alive(p.pid)
    return p.pid


def put_lease(s, digest: str, host: str, pid: int, expires_in: float = 60.0) -> None:
    """A lease row as another process wrote it."""
    with s.engine.connect() as c:
        c.execute(
            sa.insert(leases).values(
                digest=digest, holder=f"other:{pid}:x", host=host, pid=pid, expires_at=time.time() + expires_in
            )
        )
        c.commit()


def test_lease_host_names_the_pid_namespace():
    ino = os.stat("/proc/self/ns/pid").st_ino
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip().replace("-", "")[:16]
    assert leaseholder.lease_host() == f"{hostname()}#pidns={ino}.{boot}"


def test_dead_pid_is_judged_only_in_our_own_namespace(store_url):
    s = open_store(store_url)
    pid = dead_pid()
    other_ns = f"{hostname()}#pidns=4026599999.{'0' * 16}"
    put_lease(s, "a" * 64, other_ns, pid)  # a live holder in a container next door, as far as we know
    put_lease(s, "b" * 64, leaseholder.lease_host(), pid)  # our namespace: the holder is really gone
    put_lease(s, "c" * 64, hostname(), pid)  # an older tunecache's row: namespace unknown
    put_lease(s, "d" * 64, other_ns, pid, expires_in=-1)  # expired: taken over wherever its holder is
    tunecache.reset_stats()
    assert s.try_lease("a" * 64, "me:1:x", 30) is False
    assert s.try_lease("b" * 64, "me:1:x", 30) is True
    assert s.try_lease("c" * 64, "me:1:x", 30) is False
    assert s.try_lease("d" * 64, "me:1:x", 30) is True
    assert tunecache.stats()["lease_takeovers"] == 2
    s.close()


def test_a_takeover_names_the_holders_death_before_its_expiry(store_url, caplog):
    """A holder of this namespace that is gone is reported as gone even once its lease expired too
    (a waiter starved of CPU may come late): the log says why the benchmark was orphaned."""
    s = open_store(store_url)
    pid = dead_pid()
    other_ns = f"{hostname()}#pidns=4026599999.{'0' * 16}"
    put_lease(s, "f" * 64, leaseholder.lease_host(), pid, expires_in=-1)  # gone, and expired since
    put_lease(s, "9" * 64, other_ns, pid, expires_in=-1)  # its pid means nothing here: expired only
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert s.try_lease("f" * 64, "me:1:x", 30) is True
        assert s.try_lease("9" * 64, "me:1:x", 30) is True
    took = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(took) == 2
    assert f"other:{pid}:x (its process is gone)" in took[0]
    assert took[1].endswith("(expired)")
    s.close()


HOLDER = """
    import sys, time
    from tunecache.store.opening import open_store
    s = open_store(sys.argv[1])
    assert s.try_lease("e" * 64, "holder", 120)
    print("HELD", flush=True)
    time.sleep(120)  # benchmarking
"""


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare(CLONE_NEWPID) (root on Linux)")
def test_live_holder_in_another_pid_namespace_keeps_its_lease(store_url):
    # A real holder in a new PID namespace (as in a container with host networking), whose pid
    # there is one that does not exist here: it is alive, so its lease must not be taken over.
    pid = next(p for p in (random.randrange(2000, 30000) for _ in range(1000)) if not leaseholder.pid_alive(p))
    script = textwrap.dedent(HOLDER)
    shell = f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "{sys.executable}" -c \'{script}\' "{store_url}"'
    holder = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", shell],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(HERE),
    )
    try:
        assert holder.stdout.readline().strip() == "HELD", holder.stderr.read()
        s = open_store(store_url)
        with s.engine.connect() as c:
            row = c.execute(sa.select(leases)).mappings().one()
        assert row["pid"] == pid and not leaseholder.pid_alive(pid)  # its pid means nothing here
        assert row["host"].startswith(hostname() + "#pidns=") and row["host"] != leaseholder.lease_host()
        assert s.try_lease("e" * 64, "me:1:x", 30) is False
        s.close()
    finally:
        holder.kill()
        holder.wait()


def test_holder_that_loses_its_lease_notices_and_keeps_the_other_holders_result(sqlite_url, monkeypatch, caplog):
    # The heartbeat renews every ttl/3. Mid-benchmark another process takes the lease over (it judged
    # ours expired) and stores a complete result. We must notice, say so once, count it, and launch
    # and keep that result rather than overwrite the fleet's winner with ours.
    monkeypatch.setenv("TUNECACHE_LEASE_SECONDS", "0.3")
    configs = tinykernels.CONFIGS
    ids = [config_identity(c) for c in configs]
    hashes = [h for _, h in ids]
    first = tinykernels.make_add(configs=configs[:3], store=sqlite_url)
    tinykernels.launch(first, 100)
    s = open_store(sqlite_url)
    (p,) = s.find_problems(with_configs=True)
    cfg = {r.config_hash: r.config for r in p.configs}

    def rows(times: dict[int, float]) -> list[ConfigResult]:
        return [
            ConfigResult(hashes[i], cfg.get(hashes[i], {}), median_ms=t, p20_ms=t, p80_ms=t, samples=1)
            for i, t in times.items()
        ]

    # Three of six configs stored, config 0 the fastest: the full kernel benchmarks configs 3-5.
    s.put(replace(p, winner_config_hash=hashes[0]), rows({0: 1.0, 1: 2.0, 2: 3.0}), replace=True)
    theirs = {i: (0.5 if i == 5 else 50.0) for i in range(6)}
    calls = []

    def bench(kernel_call, quantiles=(0.5, 0.2, 0.8)):
        if not calls:  # the other process takes over and stores its complete result, winner config 5
            with s.engine.connect() as c:
                c.execute(
                    sa.update(leases)
                    .where(leases.c.digest == p.digest)
                    .values(holder="other:1:x", expires_at=time.time() + 60)
                )
                c.commit()
            s.put(replace(p, winner_config_hash=hashes[5]), rows(theirs), replace=True)
            time.sleep(0.6)  # two heartbeats
        calls.append(1)
        return [10.0, 10.0, 10.0]

    monkeypatch.setattr(benchhooks, "cpu_do_bench", bench)  # where the _bench hook looks it up
    tunecache.reset_stats()
    k = tinykernels.make_add(configs=configs, store=sqlite_url)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        best = tinykernels.launch(k, 100)
    assert len(calls) == 3  # configs 3-5 were benchmarked here
    assert tunecache.stats()["leases_lost"] == 1
    assert sum("lost the benchmark lease" in r.getMessage() for r in caplog.records) == 1
    stored = s.get(p.digest)
    assert stored.winner_config_hash == hashes[5]  # not overwritten
    assert stored.config_map()[hashes[5]].median_ms == 0.5
    assert config_identity(best)[1] == hashes[5]  # and launched, like the rest of the fleet
    s.close()


def test_a_waiter_polls_quickly_at_first_then_ever_less_often():
    """The storm of a fleet-wide miss is the database's limit (docs/scaling.md): a waiter must not
    read every 0.5 s for the whole benchmark. Simulated: the looks a waiter makes in 60 s."""
    from tunecache.tuner.singleflight import next_poll

    t, poll, looks = 0.0, 0.0, []
    while t < 60.0:
        poll = next_poll(poll, t)
        t += poll
        looks.append(t)
    assert looks[0] <= 0.06 and sum(1 for x in looks if x <= 1.0) >= 5  # a short benchmark is seen at once
    assert max(b - a for a, b in zip(looks, looks[1:])) == pytest.approx(5.0)  # capped
    assert 30 <= len(looks) <= 50  # a fixed 0.5 s poll would look 120 times
    assert all(0.05 <= next_poll(p, w) <= 5.0 for p in (0.0, 0.05, 1.0, 9.0) for w in (0.0, 3.0, 600.0))
