"""tunecache's counters on Prometheus' /metrics (issue 47): the exposition after real tuning runs,
parsed with prometheus_client's own parser; a zero-code process's /metrics against `tunecache
stats`; the multiprocess mode summing worker processes; a real Prometheus scraping them; and the
docs, dashboard and alert rules naming exactly what is exported."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import tinykernels
import warmpool
from debianpkg import free_port
from processes import run
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheusserver import Prometheus, promtool

import tunecache
from tunecache.inductor.entries import InductorStore
from tunecache.metrics import exporter, families
from tunecache.problem.model import InductorEntry, LaunchSpec
from tunecache.process import counters
from tunecache.store import breaker
from tunecache.store.opening import open_store, shared_store
from tunecache.trust import signing, trust
from tunecache.tuner import singleflight

HERE = Path(__file__).parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "docs" / "metrics" / "grafana-dashboard.json"
ALERTS = ROOT / "docs" / "metrics" / "alerts.yml"


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by (sample name, sorted labels), read by prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exposition() -> tuple[str, list]:
    """This process's metrics as a registry of their own exposes them, and the parsed families."""
    reg = CollectorRegistry()
    reg.register(exporter.Collector())
    text = generate_latest(reg).decode()
    return text, list(text_string_to_metric_families(text))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


# ---- the exposition of a real tuning run ---------------------------------------------------------


def test_the_exposition_after_a_tuning_run_parses_and_agrees_with_the_counters(sqlite_url, monkeypatch):
    configs = tinykernels.CONFIGS[:2]
    first = tinykernels.make_add(configs=configs, store=sqlite_url)
    for n in (16, 40):
        tinykernels.launch(first, n)  # two misses, two configs benchmarked each
    restart = tinykernels.make_add(configs=configs, store=sqlite_url)
    for n in (16, 40):
        tinykernels.launch(restart, n)  # two hits
    monkeypatch.setenv("TUNECACHE_MODE", "offline")
    tinykernels.launch(restart, 72)  # a miss that falls back without benchmarking
    stats = tunecache.stats()
    text, fams = exposition()
    got = parse(text)

    assert stats["benchmarks"] == 4 and stats["hits"] == 2 and stats["offline_fallbacks"] == 1
    assert got[("tunecache_hits_total", ())] == stats["hits"]
    assert got[("tunecache_misses_total", ())] == stats["misses"]
    assert got[("tunecache_benchmarks_total", ())] == stats["benchmarks"]
    assert got[("tunecache_benchmark_seconds_total", ())] == pytest.approx(stats["bench_seconds"])
    assert got[("tunecache_saved_seconds_total", ())] == pytest.approx(stats["saved_seconds"])
    assert got[("tunecache_fallbacks_total", (("reason", "offline"),))] == 1
    assert got[("tunecache_fallbacks_total", (("reason", "capture"),))] == 0
    assert got[("tunecache_lease_waits_total", (("work", "benchmark"),))] == stats["waits"] == 0
    assert got[("tunecache_kernels_seen", ())] == stats["kernels_seen"] == 1
    assert got[("tunecache_store_breaker_open", ())] == 0
    # Prometheus' conventions: the prefix, counters' _total, no sample but the documented ones
    for fam in fams:
        assert fam.name.startswith("tunecache_"), fam.name
        for s in fam.samples:
            assert s.name == (f"{fam.name}_total" if fam.type == "counter" else fam.name), s
            assert set(s.labels) == set(families.BY_NAME[s.name].labels), s


def test_the_collector_reads_nothing_until_scraped_and_shows_what_is_counted_meanwhile():
    reg = CollectorRegistry()
    reg.register(exporter.Collector())  # describe() only: no value read at registration
    counters.count(None, None, store_errors=2, breaker_opened=1)
    counters.preload_skipped("options", 3)
    got = parse(generate_latest(reg).decode())
    assert got[("tunecache_store_errors_total", ())] == 2
    assert got[("tunecache_store_breaker_opened_total", ())] == 1
    assert got[("tunecache_preload_skips_total", (("reason", "options"),))] == 3


# ---- what was not counted before (issue 47) ------------------------------------------------------


def _hold_lease(url: str, digest: str) -> None:
    """Another holder's live lease on ``digest`` (this pid: alive, so it is not taken over)."""
    s = open_store(url)
    assert s.try_lease(digest, "other:1:x", 60)
    s.close()


@pytest.mark.parametrize("served", [True, False], ids=["served", "in-vain"])
def test_a_wait_for_another_processs_benchmark_counts_its_seconds_and_whether_it_was_in_vain(sqlite_url, served):
    digest = "d" * 64
    _hold_lease(sqlite_url, digest)
    store = shared_store(sqlite_url)
    looks = []

    def settled() -> str | None:
        looks.append(time.monotonic())
        return "theirs" if served and len(looks) >= 3 else None

    if not served:  # the holder goes without storing a result: the waiter leads after all

        def release() -> None:
            time.sleep(0.4)
            open_store(sqlite_url).release_lease(digest, None)

        threading.Thread(target=release, daemon=True).start()
    t0 = time.monotonic()
    got = singleflight.run(
        store,
        digest,
        kernel="k",
        what="[]",
        lead=lambda lease: "mine",
        settled=settled,
        trouble=lambda what, e: pytest.fail(f"{what}: {e}"),
    )
    took = time.monotonic() - t0
    s = tunecache.stats()
    assert got == ("theirs" if served else "mine")
    assert s["waits"] == 1
    assert s["waits_in_vain"] == (0 if served else 1)
    assert 0.05 < s["wait_seconds"] <= took
    got = parse(exposition()[0])
    assert got[("tunecache_lease_wait_seconds_total", (("work", "benchmark"),))] == pytest.approx(s["wait_seconds"])
    assert got[("tunecache_lease_waits_in_vain_total", (("work", "benchmark"),))] == s["waits_in_vain"]


def _hung_server() -> socket.socket:
    """A database address that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []
    threading.Thread(target=lambda: held.extend(iter(lambda: srv.accept()[0], None)), daemon=True).start()
    return srv


def test_an_open_breaker_shows_in_its_gauge_and_counter(monkeypatch):
    monkeypatch.setenv("TUNECACHE_CONNECT_TIMEOUT", "1")
    srv = _hung_server()
    url = f"postgresql+psycopg://u@127.0.0.1:{srv.getsockname()[1]}/db"
    try:
        with pytest.raises(tunecache.StoreError):
            shared_store(url)
        got = parse(exposition()[0])
        assert got[("tunecache_store_breaker_open", ())] == 1 == breaker.open_now()
        assert got[("tunecache_store_breaker_opened_total", ())] == 1 == tunecache.stats()["breaker_opened"]
    finally:
        srv.close()
    breaker.reset()
    assert parse(exposition()[0])[("tunecache_store_breaker_open", ())] == 0


@pytest.fixture
def keys(tmp_path):
    return {k: signing.keygen(tmp_path / k) for k in ("fleet", "stranger")}


def test_every_refusal_of_the_trust_layer_is_counted_by_row_and_a_reason_of_its_own(tmp_path, keys, monkeypatch):
    fleet = signing.Signer(keys["fleet"]["private_key"])
    stranger = signing.Signer(keys["stranger"]["private_key"])
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["fleet"]["public_key"])
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    store = open_store(url)
    target = "t" * 64

    def entry(key: str, value: bytes, signer: signing.Signer | None = None, **kw) -> InductorEntry:
        e = InductorEntry("fx_graph", key, target, value, {}, **kw)
        if signer is None:
            return e
        return replace(e, signature=signer.sign_row(trust.inductor_message(e)))

    entries = {
        "unsigned": entry("k-unsigned", b"a"),
        "malformed_signature": entry("k-malformed", b"b", signature="ed25519:x:y"),
        "unknown_key": entry("k-unknown", b"c", stranger),  # signed by a key this host does not trust
        "bad_signature": replace(entry("k-bad", b"d", fleet), value=b"D", sha256=""),  # the fleet's key, other bytes
        "content_mismatch": entry("k-bytes", b"e", fleet, sha256="0" * 64),  # the fleet's, bytes not its sha256
    }
    for e in entries.values():
        store.put_inductor(e)
    inductor = InductorStore(store)
    for e in entries.values():
        assert inductor.lookup("fx_graph", e.key, target) == (None, True)  # refused: Inductor computes it
    text = '{"key": "k"}'
    spec = LaunchSpec(hashlib.sha256(text.encode()).hexdigest(), "c" * 64, "h" * 64, text, "3.9.0")
    moved = replace(spec, spec_hash="s" * 64)  # filed under another text's hash
    trust.policy(store).specs("src", {target: [spec, moved]})  # refused: unsigned, and not its hash
    store.close()

    got = parse(exposition()[0])
    for reason in entries:
        assert got[("tunecache_refused_untrusted_total", (("reason", reason), ("row", "torch_compile")))] == 1, reason
    for reason in ("unsigned", "content_mismatch"):
        assert got[("tunecache_refused_untrusted_total", (("reason", reason), ("row", "launch_spec")))] == 1, reason
    assert not [k for k in got if k[0] == "tunecache_refused_untrusted_total" and ("reason", "other") in k[1]]
    assert got[("tunecache_torch_compile_untrusted_total", ())] == len(entries)
    assert got[("tunecache_torch_compile_computed_total", ())] == len(entries)
    assert sum(counters.refusals().values()) == tunecache.stats()["untrusted"] == len(entries) + 2


def test_a_spooled_miss_is_counted(tmp_path, make_readonly, monkeypatch):
    open_store(f"sqlite:///{tmp_path / 's.sqlite3'}").close()  # created, its log folded into the file
    image = make_readonly([tmp_path / "s.sqlite3"])
    monkeypatch.setenv("TUNECACHE_MODE", "offline")
    tinykernels.launch(tinykernels.make_add(configs=tinykernels.CONFIGS[:2], store=f"sqlite:///{image}/s.sqlite3"), 40)
    assert tunecache.stats()["spooled_misses"] == 1  # the image cannot record the miss: this host's spool does
    assert parse(exposition()[0])[("tunecache_spooled_misses_total", ())] == 1


NEVER_FIRST = """
import sys, tunecache, tinykernels
assert "prometheus_client" not in sys.modules, "import tunecache imported it"
tinykernels.launch(tinykernels.make_add(configs=tinykernels.CONFIGS[:2], store=sys.argv[1]), 16)
first = "prometheus_client" in sys.modules
import prometheus_client
names = {m.name for m in prometheus_client.REGISTRY.collect()}
print(first, "tunecache_hits" in names)
"""


@pytest.mark.parametrize("metrics", ["1", "0"])
def test_tunecache_never_imports_prometheus_client_first_and_registers_once_the_program_does(sqlite_url, metrics):
    # A restart, from the warm pool: its server imports neither prometheus_client nor tunecache.
    r = run(["-c", NEVER_FIRST, sqlite_url], {"TUNECACHE_METRICS": metrics}, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", str(metrics == "1")]


# ---- a zero-code process, the multiprocess mode, a real Prometheus ---------------------------------


class Prog:
    """A tests/metricsprog.py process: its RESULT, and the line on stdin that ends it. From the warm
    pool; a zero-code one (``TUNECACHE_INSTALL=1``: the start-up hook) starts fresh."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = warmpool.popen(
            [str(HERE / "metricsprog.py"), *args],
            {**os.environ, **env},
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("RESULT "):
                return json.loads(line[7:])
            if not line and self.proc.poll() is not None:
                break
        self.proc.kill()
        pytest.fail(f"metricsprog printed no result: {self.proc.stderr.read()[-3000:]}")

    def end(self, timeout: float = 120) -> str:
        """Let it end; its stderr (it must exit 0)."""
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        _, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-3000:]
        return err


def stats_of_store(url: str) -> dict[str, float]:
    """`tunecache stats --json`, summed over the store's kernels."""
    r = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "--url", url, "stats", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    return {k: sum(row[k] for row in rows) for k in ("hits", "misses", "benchmarks", "bench_seconds", "saved_seconds")}


@pytest.mark.parametrize("server", ["TUNECACHE_METRICS_PORT", "the program's own"])
def test_a_zero_code_process_shows_its_counters_on_metrics_matching_tunecache_stats(sqlite_url, server):
    port = free_port()
    env = {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1"}
    if server == "TUNECACHE_METRICS_PORT":
        prog = Prog(["zero"], {**env, "TUNECACHE_METRICS_PORT": f"127.0.0.1:{port}"})
    else:  # prometheus_client's default registry, served by the program as an inference server does
        prog = Prog(["zero", str(port)], env)
    try:
        stats = prog.result()["stats"]
        got = parse(scrape(port))
    finally:
        prog.end()
    assert stats["benchmarks"] == 4 and stats["hits"] == 2 and stats["misses"] == 2  # tuned, then served
    stored = stats_of_store(sqlite_url)  # what the process persisted, as `tunecache stats` shows it
    for name, key in [("hits", "hits"), ("misses", "misses"), ("benchmarks", "benchmarks")]:
        assert got[(f"tunecache_{name}_total", ())] == stats[key] == stored[key], name
    assert got[("tunecache_benchmark_seconds_total", ())] == pytest.approx(stored["bench_seconds"])
    assert got[("tunecache_saved_seconds_total", ())] == pytest.approx(stored["saved_seconds"])
    assert got[("tunecache_kernels_covered", ())] == 1
    if server != "TUNECACHE_METRICS_PORT":
        assert ("process_cpu_seconds_total", ()) in got  # the server's own metrics, beside tunecache's


def test_a_server_that_sets_its_multiprocess_directory_after_defining_kernels_keeps_its_mode(tmp_path, sqlite_url):
    """SGLang's launcher: kernels defined (tunecache starts), then PROMETHEUS_MULTIPROC_DIR set, then
    prometheus_client imported. Had tunecache imported it first, it would run without the directory,
    and the server's own metrics with it."""
    port, directory = free_port(), tmp_path / "prometheus"
    directory.mkdir()
    prog = Prog(["late", str(port), str(directory)], {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1"})
    try:
        got = prog.result()
        scraped = parse(scrape(port))
    finally:
        prog.end()
    assert got["imported"] is False and got["multiprocess"] is True
    assert scraped[("server_requests_total", ())] == 1  # the server's own metric, summed from the directory
    assert scraped[("tunecache_benchmarks_total", ())] == got["stats"]["benchmarks"] == 4
    assert scraped[("tunecache_hits_total", ())] == got["stats"]["hits"] == 2


def test_the_multiprocess_mode_sums_every_worker_a_forked_child_and_a_live_one(tmp_path, sqlite_url):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "TUNECACHE_URL": sqlite_url}
    start_at = str(time.time() + 4.0)
    progs = [Prog(["worker", sqlite_url, start_at, how], env) for how in ("plain", "fork", "live")]
    results = [p.result() for p in progs]
    for p in progs[:2]:
        p.end()
    own = [r["stats"] for r in results] + [results[1]["child"]["stats"]]  # each process's own counts
    assert results[1]["child_status"] == 0
    expect = {k: sum(s[k] for s in own) for k in ("hits", "misses", "benchmarks", "waits", "bench_seconds")}
    assert expect["benchmarks"] >= 4 + 2  # the two keys (once at least), and the child's own key

    def summed() -> dict:
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=str(directory))
        return parse(generate_latest(reg).decode())

    deadline = time.monotonic() + 30
    while True:  # the live worker's counts come by its thread (every 0.2 s), not its end
        got = summed()
        if got.get(("tunecache_hits_total", ())) == expect["hits"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    progs[2].end()
    assert got[("tunecache_hits_total", ())] == expect["hits"]
    assert got[("tunecache_misses_total", ())] == expect["misses"]
    assert got[("tunecache_benchmarks_total", ())] == expect["benchmarks"]
    assert got[("tunecache_lease_waits_total", (("work", "benchmark"),))] == expect["waits"]
    assert got[("tunecache_benchmark_seconds_total", ())] == pytest.approx(expect["bench_seconds"])
    assert got[("tunecache_kernels_seen", ())] == 1  # livemax: the most any process saw
    pids = {r["pid"] for r in results} | {results[1]["child"]["pid"]}
    assert {int(f.stem.split("_")[-1]) for f in directory.glob("counter_*.db")} == pids  # one file each
    assert summed() == got  # the live worker's end changed nothing: its thread had synced it all


def test_a_real_prometheus_scrapes_the_counters_and_answers_a_query(sqlite_url):
    port = free_port()
    prog = Prog(["zero"], {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1", "TUNECACHE_METRICS_PORT": str(port)})
    server = None
    try:
        stats = prog.result()["stats"]
        server = Prometheus([f"127.0.0.1:{port}"], rule_files=[ALERTS]).start()
        deadline = time.monotonic() + 60
        while not (found := server.query("tunecache_benchmarks_total")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert found, "prometheus never scraped tunecache_benchmarks_total"
        [sample] = found
        assert sample["metric"]["job"] == "tunecache" and float(sample["value"][1]) == stats["benchmarks"] == 4
        [hits] = server.query('sum(tunecache_hits_total{job="tunecache"})')
        assert float(hits["value"][1]) == stats["hits"] == 2
        for expr in dashboard_queries():  # each panel's query runs (PromQL that parses and evaluates)
            server.query(expr)
        deadline = time.monotonic() + 30
        while True:  # the docs' alert rules load and evaluate (health "unknown" until their first evaluation)
            rules = [r for g in server.api("rules")["groups"] for r in g["rules"]]
            if all(r["health"] == "ok" for r in rules) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(rules) == 3 and all(r["health"] == "ok" for r in rules), rules
    finally:
        if server is not None:
            server.stop()
        prog.end()


# ---- the docs ------------------------------------------------------------------------------------


def documented() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's table: name -> (type, label names)."""
    out = {}
    for m in re.finditer(r"^\| `(tunecache_\w+)` \| (counter|gauge) \|([^|]*)\|", DOC.read_text(), re.M):
        out[m.group(1)] = (m.group(2), set(re.findall(r"`(\w+)`", m.group(3))))
    return out


def test_the_docs_list_exactly_the_metrics_the_collector_exports():
    _, fams = exposition()
    exported = {}
    for f in fams:
        name = f"{f.name}_total" if f.type == "counter" else f.name
        exported[name] = (f.type, set(families.BY_NAME[name].labels))
    assert documented() == exported


def test_the_docs_name_every_label_value():
    from tunecache.binaries.preload import SKIP_REASONS

    text = DOC.read_text()
    values = [*SKIP_REASONS, *families.WORK, *(r for _, r in families.ROWS), *(r for r, _ in families.REFUSALS)]
    assert [v for v in values if f"`{v}`" not in text] == []


def dashboard_queries() -> list[str]:
    """The dashboard's queries, with its variables as Grafana fills them (every job, a 1 m rate window)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return [e.replace("$job", ".*").replace("$__rate_interval", "1m") for e in exprs]


def test_the_dashboard_and_alert_rules_use_only_exported_metrics_and_the_rules_are_valid():
    exprs = dashboard_queries()
    assert len(exprs) >= 14
    used = set(re.findall(r"\btunecache_\w+", " ".join(exprs) + ALERTS.read_text()))
    assert used and used <= set(documented()), used - set(documented())
    r = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS: 3 rules found" in r.stdout, r.stdout + r.stderr
