#!/usr/bin/env python3
"""A fleet's rollout, end to end (issue 36): N simulated hosts started together against one store.

    python scripts/bench_rollout.py DIR [--hosts 4] [--workloads sparse,inductor,fla]
        [--scenarios cold,warm,upgrade,trust,trouble] [--modes default,max-autotune-no-cudagraphs]
        [--url postgresql://...] [--pgbouncer] [--stagger 0] [--no-stock] [--cpu] [--check]

Each host is a real process with its own ``TUNECACHE_HOST_ID``, Triton cache, Inductor cache, lock
directory and miss spool, all sharing one store (a SQLite file in DIR, the PostgreSQL of ``--url``,
or with ``--pgbouncer`` that PostgreSQL through a private PgBouncer in transaction mode), with no
code change: ``TUNECACHE_INSTALL=1`` reaches it through a ``sitecustomize`` (scripts/bench_inductor.py's
hook: a PYTHONPATH site dir processes no .pth file). Workloads:

- ``sparse``: the bundled sparse MLA decode kernel over its batch buckets (36 on a GPU; under the
  Triton interpreter on a CPU, ``--buckets``, small shapes); each host runs scripts/rollout_host.py;
- ``fla``: fla-core's autotuned forward ops (scripts/bench_library.py's child; GPU only, skipped
  with a message when fla is not importable);
- ``inductor``: torch.compile of scripts/bench_inductor.py's transformer block (its child and its
  counting hooks), per ``--modes``.

Scenarios (each on a store of its own, except that warm and trust follow cold on cold's store):

- ``cold``: empty store, N hosts at once; target: one benchmark (or computed entry) per key fleet-wide;
- ``warm``: the store warm, N fresh hosts (empty local caches); target: 0 benchmarks, nothing computed;
- ``upgrade`` (sparse): a warm fleet rolls out an edited kernel, host by host (a restart: same host id and
  local caches), first a comment edit, then a real code change; then a fresh host of each version:
  target: no fresh host benchmarks, and each edit is benchmarked at most once fleet-wide;
- ``trust``: a warm, signed store; N fresh hosts, one of them misconfigured (``--bad-host no-keys``:
  no trusted key and no signing key; ``other``: another key pair), then one more fresh host; target:
  the signed rows and entries are intact, the others (and the host after) are served;
- ``trouble`` (needs a private PostgreSQL cluster, tests/faults/pgcluster.py): a cold fleet while the
  database restarts, then N hosts of a new kernel version while it is unreachable; target: every host
  produces its output, no row lost.

Per host: time to first output, time to ready (sparse: every bucket warmed), process time, keys led
(benchmarked here for the fleet), benchmarks, compiles, waits (count, seconds, and waits on an entry
that never landed), entries and binaries served (Triton cache hits in an empty local cache), the
``TUNECACHE_SUMMARY`` line. Per fleet: benchmarks per key, keys led per host and the most benchmarks
in progress at once (1: the fleet tuned one key at a time), the slowest host, the last one ready, rows
lost. Stock starts (no tunecache: one cold, then one warm on its caches) run in the same invocation
for the ratios (``--no-stock`` skips them). Writes DIR/bench_rollout.json and DIR/bench_rollout.md
(the figures, targets and table: scripts/rollout_figures.py); ``--check`` exits 1 when a target on
counts is missed (times are reported, never checked).

On the H200: the commands of the README, "Rolling out" (one per mode, each inside 10 minutes).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_inductor  # noqa: E402 - the block, its child and the compile-counting hook
import rollout_host  # noqa: E402 - the sparse workload's host (its child process)
from rollout_figures import checks, fleet_figures, markdown, per_key, slowest_s, time_targets  # noqa: E402

WORKLOADS = ("sparse", "inductor", "fla")
SCENARIOS = ("cold", "warm", "upgrade", "trust", "trouble")
EDITS = ("comment", "code")


# ---- hosts ----------------------------------------------------------------------------------------


def compile_events(log: Path, since: int = 0) -> list[list[str]]:
    """The compile listener's lines (``pid compile|hit name``) written after byte ``since`` of
    ``log``: one start's, since a host restarted on its own caches appends to its log."""
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(since)
        return [ln.split() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]


class Fleet:
    """Hosts, stores and results of one invocation."""

    def __init__(self, out: Path, a: argparse.Namespace) -> None:
        self.out, self.a = out, a
        self.hook = out / "hook"
        self.hook.mkdir(parents=True, exist_ok=True)
        (self.hook / "sitecustomize.py").write_text(bench_inductor.HOOK)
        self.n = 0
        self.keys = self.signing_keys()
        self.results: dict[str, Any] = {"scenarios": {}, "stock": {}, "skipped": {}}
        self.stock_dirs: dict[str, dict[str, str]] = {}  # workload -> the lone stock host's caches
        self.stock_fleet: dict[str, list[dict[str, Any]]] = {}  # workload -> the stock fleet's hosts

    def signing_keys(self) -> dict[str, dict[str, str]]:
        """The fleet's key pair (its hosts sign and trust it) and another one (a misconfigured host)."""
        from tunecache import signing

        keys = {}
        for who in ("fleet", "other"):
            made = signing.keygen(self.out / f"{who}-key", overwrite=True)
            keys[who] = {"TUNECACHE_SIGNING_KEY": made["private_key"], "TUNECACHE_TRUSTED_KEYS": made["public_key"]}
        keys["no-keys"] = {}
        return keys

    def dirs(self, tag: str) -> dict[str, str]:
        """A host's own local state: Triton and Inductor caches, lock directory, miss spool."""
        self.n += 1
        d = self.out / "hosts" / f"{self.n:03d}-{tag}"
        shutil.rmtree(d, ignore_errors=True)
        for sub in ("triton", "inductor", "locks"):
            (d / sub).mkdir(parents=True)
        gpu = {"CUDA_VISIBLE_DEVICES": str(self.n % self.a.gpus)} if self.a.gpus and not self.a.cpu else {}
        return {
            **gpu,  # the hosts spread over the GPUs: one host per GPU where there are enough
            "TRITON_CACHE_DIR": str(d / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"),
            "TUNECACHE_LOCK_DIR": str(d / "locks"),
            "TUNECACHE_MISS_SPOOL": str(d / "misses.jsonl"),
        }

    def env(self, host: str, dirs: dict[str, str], url: str | None, trust: str = "fleet") -> dict[str, str]:
        """A host's environment: tunecache through the start-up hook where ``url`` is set, else stock."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_", "TRITON_"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.hook), str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env.update(dirs)
        if self.a.cpu:  # the interpreter; Inductor compiles in this process (no worker pool on 2 cores)
            env.update(TRITON_INTERPRET="1", TORCHINDUCTOR_COMPILE_THREADS="1")
        if url is None:
            env["TUNECACHE_MODE"] = "off"  # the bundled kernel is tunecache.autotune: off is plain Triton
            return env
        env.update(
            TUNECACHE_INSTALL="1",
            TUNECACHE_INDUCTOR="1",
            TUNECACHE_SUMMARY="1",
            TUNECACHE_URL=url,
            TUNECACHE_HOST_ID=host,
            TUNECACHE_WAIT_SECONDS=str(self.a.wait_seconds),
            TUNECACHE_TRUST_STORE="no",  # only signatures vouch for code, as on a fleet's shared store
            **self.keys[trust],
        )
        return env

    # One host of a workload: the command and how its result reads.

    def command(self, workload: str, tag: str, version: str | None) -> list[str]:
        a = self.a
        if workload == "sparse":
            spec = {"buckets": a.buckets, "heads": a.heads, "topk": a.topk}
            if version and version != "v1":
                spec["sources"] = rollout_host.edited_source(self.out, version)
            return [sys.executable, rollout_host.__file__, "--child-sparse", json.dumps(spec)]
        if workload.startswith("inductor:"):
            outputs = self.out / "outputs" / f"{tag}.pt"
            outputs.parent.mkdir(exist_ok=True)
            mode = workload.split(":", 1)[1]
            spec = bench_inductor.child_spec(
                cpu=a.cpu, d=a.d, heads=a.model_heads, seq=a.seq, mode=mode, outputs=outputs
            )
            return [sys.executable, bench_inductor.__file__, "--child", json.dumps(spec)]
        if workload == "fla":
            import textwrap

            import bench_library

            code = bench_library.CHILD.replace("WORKLOAD", textwrap.dedent(bench_library.WORKLOADS["fla"]))
            return [sys.executable, "-c", textwrap.dedent(code.replace("SEQ_LENS", repr(bench_library.SEQ_LENS)))]
        raise ValueError(workload)

    def host(
        self,
        workload: str,
        host: str,
        dirs: dict[str, str],
        url: str | None,
        *,
        trust: str = "fleet",
        version: str = "v1",
    ) -> dict[str, Any]:
        """Run one host to its end; its result, normalised across workloads."""
        tag = f"{host}-{self.n}"
        env = self.env(host, dirs, url, trust)
        log = Path(dirs["TRITON_CACHE_DIR"]).parent / "compiles.log"
        env["BENCH_COMPILE_LOG"] = str(log)
        since = log.stat().st_size if log.exists() else 0  # a restarted host appends to its log
        if self.a.debug_log:
            env["BENCH_TUNECACHE_LOG"] = str(log.with_name("tunecache.log"))
        if workload == "fla":
            env.update(FLA_CACHE_RESULTS="0", BENCH_PAUSE_S="0")
        cmd = self.command(workload, tag, version)
        prof = Path(dirs["TRITON_CACHE_DIR"]).parent / "profile.prof"
        if self.a.profile and cmd[1] != "-c":  # where a fresh host's time goes (issue 35)
            cmd = [cmd[0], "-m", "cProfile", "-o", str(prof), *cmd[1:]]
        t = time.perf_counter()
        r = subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=self.a.timeout,
            cwd=tempfile.gettempdir(),
        )
        wall = time.perf_counter() - t
        Path(dirs["TRITON_CACHE_DIR"]).parent.joinpath("stderr").write_text(r.stderr)
        if prof.exists():
            top = io.StringIO()
            pstats.Stats(str(prof), stream=top).sort_stats("cumulative").print_stats(80)
            prof.with_suffix(".txt").write_text(top.getvalue())
        res: dict[str, Any] = {"host": host, "trust": trust, "version": version, "wall_s": round(wall, 3)}
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        if r.returncode != 0 or not lines:
            res["error"] = f"exit {r.returncode}: {r.stderr[-1500:]}"
            return res
        raw = json.loads(lines[-1].removeprefix("RESULT "))
        res.update(self.normalise(workload, raw))
        events = compile_events(log, since)
        # fla's child counts its first pass's loads itself (its own listener replaces the hook's there)
        res["compiles"] = sum(e[1] == "compile" for e in events) + res.pop("first_pass_compiles", 0)
        res["binaries_served"] = sum(e[1] == "hit" for e in events) + res.pop("first_pass_hits", 0)  # from the store
        res["compiled"] = dict(collections.Counter(e[2] for e in events if e[1] == "compile" and len(e) > 2))
        res["summary"] = [  # TUNECACHE_SUMMARY: the tuner's line and torch.compile's
            ln
            for ln in r.stderr.splitlines()
            if ln.startswith("tunecache") and (" covered," in ln or ": torch.compile: " in ln)
        ]
        res["warnings"] = [
            ln for ln in r.stderr.splitlines() if ln.startswith("tunecache:") and ln not in res["summary"]
        ][:5]
        return res

    @staticmethod
    def normalise(workload: str, raw: dict[str, Any]) -> dict[str, Any]:
        if workload == "sparse":
            return raw
        if workload == "fla":
            st = raw.get("tunecache_stats") or {}
            loads = raw.get("first_pass_loads") or {}
            return {
                "first_output_s": round(raw["first_s"], 3),
                "first_pass_compiles": sum((loads.get("compiles") or {}).values()),
                "first_pass_hits": sum((loads.get("cache_hits") or {}).values()),
                "benchmarks": raw["benchmarks"],
                "waits": int(st.get("waits", 0)),
                "entries_served": int(st.get("hits", 0)),
                "preloaded": int(st.get("preloaded", 0)),
                "untrusted": int(st.get("untrusted", 0)),
            }
        tc = raw.get("tunecache") or {}
        return {
            "first_output_s": raw["first_output_s"],
            "process_s": raw["process_s"],
            "benchmarks": raw["autotune_benchmarks"],
            "coordesc_tunings": raw["coordesc_tunings"],
            "fxgraph_cache_hit": raw["fxgraph_cache_hit"],
            "computed_keys": raw.get("put_keys", []),
            "waits": int(tc.get("inductor_lease_waits", 0)),
            "wait_s": raw.get("lease_wait_s", 0.0),
            "waits_in_vain": raw.get("lease_waits_in_vain", 0),
            "entries_served": int(tc.get("inductor_hits", 0)),
            "untrusted": int(tc.get("untrusted", 0)),
            "store_errors": int(tc.get("store_errors", 0)),
            "outputs": raw.get("outputs"),
        }

    def fleet(self, workload: str, url: str, hosts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Start every host of ``hosts`` (host, dirs, trust, version) together, or ``--stagger`` apart."""
        results: list[dict[str, Any] | None] = [None] * len(hosts)

        def one(i: int, h: dict[str, Any]) -> None:
            time.sleep(i * self.a.stagger)
            try:
                results[i] = self.host(workload, h["host"], h["dirs"], url, trust=h.get("trust", "fleet"),
                                       version=h.get("version", "v1"))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a host that failed is reported, not fatal to the others
                results[i] = {"host": h["host"], "error": repr(e)}

        threads = [threading.Thread(target=one, args=(i, h)) for i, h in enumerate(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r for r in results if r is not None]

    def fresh(self, n: int, scenario: str, **extra: Any) -> list[dict[str, Any]]:
        return [{"host": f"{scenario}-{i}", "dirs": self.dirs(f"{scenario}-{i}"), **extra} for i in range(n)]

    # ---- stores -----------------------------------------------------------------------------------

    def store(self, name: str) -> str:
        """An empty store of its own per scenario: a SQLite file, or the --url database emptied."""
        if self.a.url is None:
            path = self.out / "stores" / f"{name}.sqlite3"
            path.parent.mkdir(exist_ok=True)
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
            return f"sqlite:///{path}"
        import datetime as dt

        from tunecache.model import INDUCTOR_KINDS
        from tunecache.store.opening import open_store

        s = open_store(self.a.url)
        try:
            s.delete(since=dt.datetime(1970, 1, 1))  # every problem: --url is the bench's own database
            s.delete_inductor(kinds=list(INDUCTOR_KINDS))
        finally:
            s.close()
        return self.bouncer_url or self.a.url

    bouncer_url: str | None = None

    @staticmethod
    def rows(url: str) -> dict[str, Any]:
        """What the store holds: problem and config rows, and every Inductor entry with its signer."""
        from tunecache.store.opening import open_store

        s = open_store(url)
        try:
            entries = s.list_inductor()
            return {
                **s.counts(),
                "inductor": sorted(
                    f"{e['kind']}:{e['key'][:40]}:{e['host']}:{int(bool(e['signed']))}" for e in entries
                ),
            }
        finally:
            s.close()

    @staticmethod
    def size(url: str) -> dict[str, Any]:
        """The store's size after a cold fleet: torch.compile's entries and bytes by cache, rows by table."""
        from tunecache.store.opening import open_store

        s = open_store(url)
        try:
            inductor = {k: v for k, v in s.inductor_counts().items() if v["entries"]}
            return {"inductor": inductor, "inductor_bytes": sum(v["bytes"] for v in inductor.values()), **s.counts()}
        finally:
            s.close()


# ---- scenarios ------------------------------------------------------------------------------------


def run_scenarios(fl: Fleet, workload: str) -> dict[str, Any]:
    a, n = fl.a, fl.a.hosts
    out: dict[str, Any] = {}
    scen = a.scenarios
    log = lambda s: print(f"[{workload}] {s}", file=sys.stderr, flush=True)  # noqa: E731

    def record(name: str, hosts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        out[name] = {"fleet": fleet_figures(hosts), "hosts": hosts, **extra}
        f = out[name]["fleet"]
        log(f"{name}: {f['benchmarks']} benchmarks, {f['keys']} keys, most per key {f['most_per_key']}, "
            f"keys led {f['keys_led']}, at once {f['most_at_once']}, waits {f['waits']} (in vain "
            f"{f['waits_in_vain']}), slowest {f['slowest_host']}, last ready {f['last_ready']}")  # fmt: skip
        return out[name]

    fleet_url = None
    if "cold" in scen or "warm" in scen:
        url = fleet_url = fl.store(f"{workload}-fleet")
        if "cold" in scen:
            log(f"cold fleet: {n} hosts, empty store")
            record("cold", fl.fleet(workload, url, fl.fresh(n, "cold")))
            out["cold"]["store_size"] = fl.size(url)  # what one model costs the store
        else:
            log("seeding the store: one host")
            fl.fleet(workload, url, fl.fresh(1, "seed"))

        if "warm" in scen:
            log(f"warm fleet: {n} fresh hosts")
            rec = record("warm", fl.fleet(workload, url, fl.fresh(n, "warm")))
            if a.warm_rounds > 1:
                rec["rounds"] = warm_rounds(fl, workload, url, rec["hosts"], log)

    if "upgrade" in scen and workload == "sparse":
        url = fl.store(f"{workload}-upgrade")
        hosts = fl.fresh(n, "up")
        log("upgrade: the fleet on v1")
        fl.fleet(workload, url, hosts)
        steps = []
        for edit in EDITS:
            for h in hosts[: max(1, n // 2)]:  # half the fleet, one restart at a time (same host, same caches)
                log(f"upgrade: {h['host']} restarts on the {edit} edit")
                steps += fl.fleet(workload, url, [{**h, "version": edit}])
        log("upgrade: a fresh host of each version")
        fresh = fl.fleet(workload, url, [{"host": f"fresh-{v}", "dirs": fl.dirs(f"fresh-{v}"), "version": v}
                                         for v in ("v1", *EDITS)])  # fmt: skip
        rec = record("upgrade", steps + fresh)
        rec["fresh_hosts"] = [{"host": h["host"], "benchmarks": h.get("benchmarks"), "compiles": h.get("compiles"),
                               "compiled": h.get("compiled")} for h in fresh]  # fmt: skip
        rec["per_edit_benchmarked_keys"] = {
            e: len({k for h in steps if h["version"] == e for k in h.get("benchmarked_keys", [])}) for e in EDITS
        }

    if "trust" in scen:
        if fleet_url is None:
            fleet_url = fl.store(f"{workload}-trust")
            log("trust: a signed fleet fills the store")
            fl.fleet(workload, fleet_url, fl.fresh(1, "signed"))
        url = fleet_url  # the signed fleet's store
        before = fl.rows(url)
        hosts = fl.fresh(n, "trust")
        hosts[-1]["trust"] = a.bad_host
        log(f"trust: {n} fresh hosts, {hosts[-1]['host']} with {a.bad_host}")
        res = fl.fleet(workload, url, hosts)
        after = fl.rows(url)
        signed_before = {e for e in before["inductor"] if e.endswith(":1")}
        rec = record("trust", res)
        rec["signed_entries_before"] = len(signed_before)
        rec["signed_entries_lost"] = sorted(signed_before - set(after["inductor"]))
        rec["problems_before"], rec["problems_after"] = before["problems"], after["problems"]
        log("trust: the fleet again after the misconfigured host")
        rec["fleet_after"] = fleet_figures(fl.fleet(workload, url, fl.fresh(1, "trust-after")))

    if "trouble" in scen and workload == "sparse":
        out["trouble"] = store_trouble(fl, workload, log)
    for name in ("upgrade", "trouble"):
        if name in scen and workload != "sparse":
            out[name] = {"skipped": "run with the sparse workload only (an edited kernel source; rows to lose)"}
    return out


def warm_rounds(fl: Fleet, workload: str, url: str, first: list[dict[str, Any]], log: Any) -> list[dict[str, Any]]:
    """``--warm-rounds``: the warm fleet again with new fresh hosts, each round after the lone stock
    host restarted once more (and the stock fleet, with ``--stock-fleet``), interleaved so that the
    machine's drift hits both sides; the time targets then judge the medians over rounds."""
    st = fl.results["stock"].get(workload) or {}
    rounds = [
        {
            "stock_warm_s": (st.get("warm") or {}).get("first_output_s"),
            "stock_fleet_warm_s": ((st.get("fleet_warm") or {}).get("fleet") or {})
            .get("slowest_host", {})
            .get("first_output_s"),
            "fleet_warm_s": slowest_s(first),
        }
    ]
    for r in range(1, fl.a.warm_rounds):
        one: dict[str, Any] = {}
        if workload in fl.stock_dirs:
            one["stock_warm_s"] = fl.host(workload, "stock-warm", fl.stock_dirs[workload], None).get("first_output_s")
        if workload in fl.stock_fleet:
            again = [{**h, "host": f"{h['host']}-warm{r}"} for h in fl.stock_fleet[workload]]
            one["stock_fleet_warm_s"] = slowest_s(fl.fleet(workload, None, again))
        one["fleet_warm_s"] = slowest_s(fl.fleet(workload, url, fl.fresh(fl.a.hosts, f"warm{r}")))
        log(f"warm round {r + 1}: {one}")
        rounds.append(one)
    return rounds


def store_trouble(fl: Fleet, workload: str, log: Any) -> dict[str, Any]:
    """A private PostgreSQL restarted during a cold rollout, then down during another."""
    sys.path.insert(0, str(ROOT / "tests" / "faults"))
    from pgcluster import PgCluster, private_cluster_available

    why = private_cluster_available()
    if why:
        return {"skipped": f"no private PostgreSQL cluster: {why}"}
    n = fl.a.hosts
    cluster = PgCluster()
    try:
        cluster.init()
        cluster.start()
        url = cluster.create_database()
        from tunecache.store.opening import open_store

        open_store(url).close()  # the schema, before the fleet
        hosts = fl.fresh(n, "restart")
        log(f"trouble: {n} hosts, the database restarted after {fl.a.trouble_after}s")
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(res=fl.fleet(workload, url, hosts)))
        t.start()
        until_rows(url, 1, fl.a.trouble_after)  # the fleet is writing: the first key landed, others are being tuned
        down = cluster.stop("immediate")
        up = cluster.start()
        t.join()
        restart = box["res"]
        stored = fl.rows(url)
        keys = per_key(restart)
        from tunecache.store.opening import open_store as _open

        s = _open(url)
        try:
            missing = [k for k in keys if s.get(k) is None]
        finally:
            s.close()
        log(f"trouble: the database down while {n} hosts of the code edit start")
        before = fl.rows(url)
        hosts2 = fl.fresh(n, "down", version="code")
        box2: dict[str, Any] = {}
        t2 = threading.Thread(target=lambda: box2.update(res=fl.fleet(workload, url, hosts2)))
        t2.start()
        until_rows(url, before["problems"] + 1, fl.a.trouble_after)  # the new version's first key landed
        cluster.stop("immediate")
        t2.join()
        cluster.start()
        after = fl.rows(url)
        lost = max(0, before["problems"] - after["problems"]) + max(0, before["configs"] - after["configs"])
        rec = {
            "restart": {"fleet": fleet_figures(restart), "hosts": restart, "stop_s": down, "start_s": up},
            "down": {"fleet": fleet_figures(box2["res"]), "hosts": box2["res"]},
            "keys_benchmarked_not_stored": missing,
            # every bucket was tuned by some host, in a single flight or in process while the store was
            # restarting (then written when it was back): each must be stored
            "buckets_not_stored": max(0, len(fl.a.buckets) - stored["problems"]),
            "rows_lost": len(missing) + lost + max(0, len(fl.a.buckets) - stored["problems"]),
            "rows": {
                "after_restart": {k: stored[k] for k in ("problems", "configs")},
                "before_down": {k: before[k] for k in ("problems", "configs")},
                "after_down": {k: after[k] for k in ("problems", "configs")},
            },  # fmt: skip
        }
        log(f"trouble: rows lost {rec['rows_lost']}")
        return rec
    finally:
        cluster.destroy()


def until_rows(url: str, problems: int, at_most: float) -> None:
    """Wait until the store holds ``problems`` problems (or ``at_most`` seconds passed)."""
    from tunecache.store.opening import open_store

    deadline = time.monotonic() + at_most
    while time.monotonic() < deadline:
        s = open_store(url)
        try:
            if s.counts()["problems"] >= problems:
                return
        except Exception:  # noqa: BLE001 - the store may still be starting
            pass
        finally:
            s.close()
        time.sleep(0.1)


def stock(fl: Fleet, workload: str) -> dict[str, Any]:
    """Stock starts in this invocation: a cold host (empty caches), then it restarted (warm); with
    ``--stock-fleet``, also ``--hosts`` stock hosts started together, cold, then restarted together.

    The simulated hosts of a fleet share this machine's CPUs (Inductor's compile workers) and GPU; a
    lone stock start does not. The stock fleet has the same contention: the like-for-like baseline
    (``time_targets`` judges against it where it ran, and reports the lone start's ratio beside it)."""
    dirs = fl.stock_dirs[workload] = fl.dirs("stock")
    cold = fl.host(workload, "stock-cold", dirs, None)
    warm = fl.host(workload, "stock-warm", dirs, None)
    out: dict[str, Any] = {"cold": cold, "warm": warm}
    if fl.a.stock_fleet and fl.a.hosts > 1:
        specs = fl.stock_fleet[workload] = fl.fresh(fl.a.hosts, "stock-fleet")
        for name, hosts in (("fleet_cold", specs), ("fleet_warm", [{**h, "host": f"{h['host']}-warm"} for h in specs])):
            ran = fl.fleet(workload, None, hosts)  # url None: stock hosts
            out[name] = {"hosts": ran, "fleet": fleet_figures(ran)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", help="results, caches and stores (default: a new temporary directory)")
    p.add_argument("--hosts", type=int, default=4, help="hosts per fleet (default 4)")
    p.add_argument("--workloads", default=None, help=f"comma-separated: {', '.join(WORKLOADS)} (default: all)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS[:4]), help=f"comma-separated: {', '.join(SCENARIOS)}")
    p.add_argument("--modes", default=None, help="torch.compile modes (default: default; GPU: both)")
    p.add_argument(
        "--url", default=None, help="the bench's own PostgreSQL database, emptied per scenario (default: SQLite files)"
    )
    p.add_argument(
        "--pgbouncer", action="store_true", help="reach --url through a private PgBouncer (transaction mode)"
    )
    p.add_argument("--stagger", type=float, default=0.0, help="seconds between two hosts' starts (default 0: together)")
    p.add_argument("--bad-host", choices=("no-keys", "other"), default="no-keys", help="the trust scenario's host")
    p.add_argument("--no-stock", action="store_true", help="no stock starts (no ratios)")
    p.add_argument(
        "--stock-fleet",
        action="store_true",
        help="also --hosts stock hosts started together, cold then warm: the baseline with the same contention",
    )
    p.add_argument("--cpu", action="store_true", help="the Triton interpreter, small shapes, torch.compile on the CPU")
    p.add_argument("--buckets", default=None, help="sparse: batch buckets (default: the 36 on a GPU; CPU: 2)")
    p.add_argument("--seq", default=None, help="inductor: sequence lengths (default 512,1024,2048; CPU 16)")
    p.add_argument("--wait-seconds", type=float, default=300, help="TUNECACHE_WAIT_SECONDS of every host")
    p.add_argument(
        "--trouble-after",
        type=float,
        default=120.0,
        help="trouble: the database goes once the fleet stored its first key, or after this many seconds",
    )
    p.add_argument("--gpus", type=int, default=None, help="GPUs to spread hosts over (default: all visible)")
    p.add_argument("--timeout", type=float, default=580.0, help="seconds per host")
    p.add_argument(
        "--warm-rounds",
        type=int,
        default=1,
        help="warm scenario: this many fleets of fresh hosts, each after a stock warm restart; times judged on medians",
    )
    p.add_argument(
        "--debug-log",
        action="store_true",
        help="tunecache's debug lines of every process of a host (compile workers too) in DIR/hosts/*/tunecache.log",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="run each host (not fla's) under cProfile: DIR/hosts/*/profile.prof and its top functions in profile.txt",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target on counts is missed")
    p.add_argument("--check-times", action="store_true", help="with --check: the targets on times too (GPU)")
    a = p.parse_args()
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}: one of {', '.join(SCENARIOS)}")
    workloads = [w for w in (a.workloads or ",".join(WORKLOADS)).split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}: one of {', '.join(WORKLOADS)}")
    from tunecache.buckets import SGLANG_CAPTURE_SIZES

    a.buckets = (
        [int(b) for b in a.buckets.split(",")] if a.buckets else ([2, 1] if a.cpu else list(SGLANG_CAPTURE_SIZES))
    )
    a.heads, a.topk = (16, 32) if a.cpu else (16, 2048)
    a.seq = [int(s) for s in a.seq.split(",")] if a.seq else ([16] if a.cpu else list(bench_inductor.DEFAULT_SEQ))
    a.d, a.model_heads = (32, 2) if a.cpu else (1024, 8)
    modes = (a.modes or ("default" if a.cpu else ",".join(bench_inductor.MODES))).split(",")
    if a.gpus is None and not a.cpu:
        import torch

        a.gpus = torch.cuda.device_count()
    out = Path(a.dir or tempfile.mkdtemp(prefix="bench-rollout-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    fl = Fleet(out, a)
    bouncer = None
    if a.pgbouncer:
        if not a.url:
            p.error("--pgbouncer needs --url")
        sys.path.insert(0, str(ROOT / "tests"))
        from pgbouncer import PgBouncer

        from tunecache.store.engine import resolve_url

        u = resolve_url(a.url)
        bouncer = PgBouncer(u.host or "127.0.0.1", u.port or 5432).start()
        fl.bouncer_url = bouncer.through(a.url)
    t0 = time.perf_counter()
    try:
        for w in workloads:
            if w == "fla" and (a.cpu or importlib.util.find_spec("fla") is None):
                why = "needs a GPU" if a.cpu else "fla is not importable: pip install fla-core==0.6.0 einops"
                fl.results["skipped"][w] = why
                print(f"[fla] skipped: {why}", file=sys.stderr)
                continue
            for name in [f"inductor:{m}" for m in modes] if w == "inductor" else [w]:
                if a.cpu and name == "sparse":  # stock Triton's benchmarker needs a GPU driver
                    fl.results["skipped"]["sparse stock"] = "stock Triton cannot benchmark under the interpreter"
                elif not a.no_stock:
                    print(f"[{name}] stock cold, then stock warm", file=sys.stderr, flush=True)
                    fl.results["stock"][name] = stock(fl, name)
                fl.results["scenarios"][name] = run_scenarios(fl, name)
    finally:
        if bouncer is not None:
            bouncer.stop()
    import platform

    import torch
    import triton

    meta = {
        "hosts": a.hosts,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    meta["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() and not a.cpu else "cpu (interpreter)"
    meta["seconds"] = round(time.perf_counter() - t0)
    fl.results["meta"] = meta
    fl.results["time_targets"] = time_targets(fl.results)
    fl.results["checks"] = checks(fl.results, a.check_times)
    (out / "bench_rollout.json").write_text(json.dumps(fl.results, indent=2, default=str))
    (out / "bench_rollout.md").write_text(markdown(fl.results))
    print(markdown(fl.results))
    print(f"results in {out}/bench_rollout.json", file=sys.stderr)
    if a.check and fl.results["checks"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
