"""Scenario 3: two hosts share one PostgreSQL.

Each "host" is a network namespace joined to the root namespace by a veth pair on a private bridge
(10.231.X.0/24, made here and removed after), and every worker in it runs under ``unshare --uts``
with its own hostname. Each host has its own lock directory, as separate machines would: only the
database lease serialises benchmarks across them. The PostgreSQL is a private cluster listening
on the bridge address. Where namespaces are not allowed, the test says so and falls back to one
network with distinct ``TUNECACHE_HOST_ID`` values.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from faultlib import check_ok, collect, fault_report_fixture, log_lines, reap, spawn, wait_until  # noqa: F401
from pgcluster import pg_cluster_fixture  # noqa: F401

import tunecache
from tunecache.store.opening import open_store
from tunecache.store.schema import configs, leases, problems

HOSTS = ("tc-host-a", "tc-host-b")
N_CONFIGS = 6


@dataclass
class Hosts:
    isolated: bool  # True: namespaces + UTS; False: the fallback (TUNECACHE_HOST_ID)
    server_ip: str
    trust: str
    why: str = ""
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def prefix(self, i: int) -> list[str]:
        if not self.isolated:
            return []
        set_name = 'hostname "$0" && exec "$@"'  # $0 is the host name, "$@" the worker command
        return ["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts", "--", "sh", "-c", set_name, HOSTS[i]]

    def env(self, i: int, tmp: Path) -> dict:
        locks = tmp / f"locks-{HOSTS[i]}"  # separate machines do not share a lock directory
        locks.mkdir(exist_ok=True)
        env = {"TUNECACHE_LOCK_DIR": str(locks)}
        if not self.isolated:
            env["TUNECACHE_HOST_ID"] = HOSTS[i]
        return env


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _setup_hosts() -> Hosts:
    sfx = str(os.getpid() % 100000)
    used = _ip("-4", "addr").stdout
    third = next((x for x in [os.getpid() % 200 + 20, *range(20, 250)] if f"10.231.{x}." not in used), None)
    if third is None:
        return Hosts(False, "127.0.0.1", "127.0.0.1/32", why="no free 10.231.x.0/24 subnet")
    net = f"10.231.{third}"
    h = Hosts(True, f"{net}.1", f"{net}.0/24")
    bridge = f"tcbr{sfx}"
    steps = [("link", "add", bridge, "type", "bridge")]
    h.links.append(bridge)
    steps += [("addr", "add", f"{net}.1/24", "dev", bridge), ("link", "set", bridge, "up")]
    for i in range(2):
        ns, outer, inner = f"tcns{i}{sfx}", f"tcv{i}{sfx}", f"tcp{i}{sfx}"
        h.namespaces.append(ns)
        h.links.append(outer)
        steps += [
            ("netns", "add", ns),
            ("link", "add", outer, "type", "veth", "peer", "name", inner),
            ("link", "set", outer, "master", bridge),
            ("link", "set", outer, "up"),
            ("link", "set", inner, "netns", ns),
            ("-n", ns, "addr", "add", f"{net}.{i + 2}/24", "dev", inner),
            ("-n", ns, "link", "set", inner, "up"),
            ("-n", ns, "link", "set", "lo", "up"),
        ]
    for step in steps:
        r = _ip(*step)
        if r.returncode != 0:
            _teardown(h)
            why = f"`ip {' '.join(step)}` failed: {r.stderr.strip()}"
            return Hosts(False, "127.0.0.1", "127.0.0.1/32", why=why)
    probe = subprocess.run([*h.prefix(0), "hostname"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or probe.stdout.strip() != HOSTS[0]:
        _teardown(h)
        return Hosts(False, "127.0.0.1", "127.0.0.1/32", why=f"unshare --uts failed: {probe.stderr.strip()}")
    return h


def _teardown(h: Hosts) -> None:
    for ns in h.namespaces:
        _ip("netns", "del", ns)
    for link in h.links:
        _ip("link", "del", link)  # deleting one end of a veth removes both


@pytest.fixture
def two_hosts():
    if os.environ.get("TUNECACHE_FAULTS_NO_NETNS"):  # exercise the fallback on a machine that has namespaces
        h = Hosts(False, "127.0.0.1", "127.0.0.1/32", why="TUNECACHE_FAULTS_NO_NETNS is set")
    else:
        h = _setup_hosts() if os.geteuid() == 0 else Hosts(False, "127.0.0.1", "127.0.0.1/32", why="not root")
    if not h.isolated:
        msg = f"network namespaces unavailable ({h.why}): falling back to distinct TUNECACHE_HOST_ID on one network"
        warnings.warn(msg, stacklevel=1)  # shows in pytest's summary, -s or not
    try:
        yield h
    finally:
        _teardown(h)
        leftovers = [ns for ns in h.namespaces if ns in _ip("netns", "list").stdout]
        assert not leftovers, f"namespaces left behind: {leftovers}"


def _server(pg_cluster, hosts: Hosts) -> str:
    cluster = pg_cluster(listen=(hosts.server_ip,), trust=(hosts.trust,))
    return cluster.create_database()


@pytest.mark.slow
def test_two_hosts_benchmark_each_key_once_and_read_each_others_winners(pg_cluster, two_hosts, tmp_path, fault_report):
    url = _server(pg_cluster, two_hosts)
    open_store(url).close()
    sizes = sorted(tunecache.buckets.SGLANG_CAPTURE_SIZES)
    go = tmp_path / "go"
    status = tmp_path / "status"
    status.mkdir()
    env = {
        "TUNECACHE_FAULTS_BENCH_SLEEP": "0.05",
        "TUNECACHE_FAULTS_GO": str(go),
        "TUNECACHE_FAULTS_STATUS_DIR": str(status),
        "TUNECACHE_LEASE_SECONDS": "5",
    }
    # Two workers per host; host A warms small sizes first, host B large first: they meet in the middle.
    plan = [(0, sizes), (0, sizes[::-1][::2] + sizes[::-1][1::2]), (1, sizes[::-1]), (1, sizes[::2] + sizes[1::2])]
    procs = []
    for i, order in plan:
        args = {"url": url, "sizes": order, "start_at": 0, "n_configs": N_CONFIGS}
        procs.append((i, spawn("warm", args, {**env, **two_hosts.env(i, tmp_path)}, prefix=two_hosts.prefix(i))))
    try:
        wait_until(lambda: all((status / str(p.pid)).exists() for _, p in procs), 120, what="workers ready")
        go.touch()
        results = [(i, collect(p, 180)) for i, p in procs]
    finally:
        reap([p for _, p in procs])
    for i, r in results:
        check_ok(r)
        assert r["host"] == HOSTS[i], r["host"]
        assert r["stats"]["store_errors"] == 0
        assert len(r["winners"]) == len(sizes)
    # One benchmark per config per key across both hosts.
    assert sum(r["stats"]["benchmarks"] for _, r in results) == len(sizes) * N_CONFIGS
    e = sa.create_engine(url)
    with e.connect() as c:
        rows = c.execute(sa.select(problems.c.digest, problems.c.host, problems.c.key_json)).all()
        cfg_hosts = c.execute(sa.select(configs.c.digest, configs.c.host)).all()
        left = c.execute(sa.select(sa.func.count()).select_from(leases)).scalar_one()
    e.dispose()
    assert len(rows) == len(sizes) and left == 0
    by_host = {h: sum(1 for r in rows if r.host == h) for h in HOSTS}
    assert set(r.host for r in rows) == set(HOSTS), by_host  # both hosts tuned, each recorded as itself
    row_host = {r.digest: r.host for r in rows}
    assert all(row_host[d] == h for d, h in cfg_hosts)  # config rows name the host that measured them
    # Every worker on either host launches the same winner for every key: the keys the other host
    # tuned were read from the store.
    assert len({tuple(sorted(r["winners"].items())) for _, r in results}) == 1
    benched_by = {h: sum(r["stats"]["benchmarks"] for i, r in results if HOSTS[i] == h) for h in HOSTS}
    for h in HOSTS:
        assert benched_by[h] == by_host[h] * N_CONFIGS
    fault_report.update(
        isolated=two_hosts.isolated,
        fallback_reason=two_hosts.why or None,
        server=two_hosts.server_ip,
        hosts=2,
        workers=len(procs),
        keys=len(sizes),
        keys_tuned_by_host=by_host,
        benchmarks_total=sum(benched_by.values()),
        waits=sum(r["stats"]["waits"] for _, r in results),
        hits=sum(r["stats"]["hits"] for _, r in results),
        rows_checked=len(rows) + len(cfg_hosts),
    )


@pytest.mark.slow
def test_two_hosts_killed_holder_is_taken_over_after_lease_expiry(pg_cluster, two_hosts, tmp_path, fault_report):
    """Host A's holder dies mid-benchmark: host B cannot see A's processes, so it waits for the lease to expire."""
    ttl = 5.0
    url = _server(pg_cluster, two_hosts)
    open_store(url).close()
    status = tmp_path / "status"
    status.mkdir()
    env = {"TUNECACHE_LEASE_SECONDS": str(ttl), "TUNECACHE_FAULTS_STATUS_DIR": str(status)}
    args = {"url": url, "sizes": [128], "start_at": 0, "n_configs": N_CONFIGS}
    env_a = {**env, **two_hosts.env(0, tmp_path), "TUNECACHE_FAULTS_BENCH_SLEEP": "600"}  # hangs in its benchmark
    env_b = {**env, **two_hosts.env(1, tmp_path), "TUNECACHE_FAULTS_BENCH_SLEEP": "0.05"}
    a = spawn("warm", args, env_a, prefix=two_hosts.prefix(0))
    b = None
    try:
        a_status = status / str(a.pid)
        wait_until(lambda: a_status.exists() and a_status.read_text() == "bench", 120, what="host A benchmarking")
        b = spawn("warm", args, env_b, prefix=two_hosts.prefix(1))
        wait_until(lambda: (status / str(b.pid)).exists(), 120, what="host B started")
        time.sleep(1.5)  # B finds A's lease and waits
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        t_kill = time.time()
        r = collect(b, 60)
    finally:
        reap((a, b))
    check_ok(r)
    assert r["host"] == HOSTS[1]
    took = r["finished"] - t_kill
    assert took <= ttl + 10
    assert took >= ttl / 3, f"host B benchmarked {took:.1f}s after the kill: before A's lease could have expired"
    assert r["stats"]["lease_takeovers"] == 1 and r["stats"]["benchmarks"] == N_CONFIGS
    takeover = [m for m in log_lines(r) if "took over" in m]
    assert len(takeover) == 1 and HOSTS[0] in takeover[0] and "expired" in takeover[0], takeover
    p = open_store(url).find_problems(with_configs=True)
    assert len(p) == 1 and p[0].host == HOSTS[1] and len(p[0].configs) == N_CONFIGS
    fault_report.update(
        isolated=two_hosts.isolated,
        hosts=2,
        kills=1,
        lease_seconds=ttl,
        host_b_done_after_kill_s=round(took, 1),
        rows_checked=1 + len(p[0].configs),
    )
