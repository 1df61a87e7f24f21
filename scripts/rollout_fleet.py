"""The hosts and stores of scripts/bench_rollout.py: :class:`Fleet` starts one simulated host of a
workload (a real process with its own ``TUNECACHE_HOST_ID``, Triton and Inductor caches, lock
directory and miss spool, tunecache through the start-up hook), many together on one store, and
reads what each host did into one result shape across the workloads (:meth:`Fleet.normalise`).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import pstats
import shutil
import tempfile
from pathlib import Path
from typing import Any

import library_child
import rollout_host
from benchkit import ROOT, SCRIPTS, compiles, procs, stores
from inductor_child import child_spec


class Fleet:
    """Hosts, stores and results of one invocation."""

    def __init__(self, out: Path, a: argparse.Namespace) -> None:
        self.out, self.a = out, a
        self.hook = compiles.write_hook(out / "hook")  # the start-up hook and the compile listener
        self.n = 0
        self.keys = self.signing_keys()
        self.results: dict[str, Any] = {"scenarios": {}, "stock": {}, "skipped": {}}
        self.stock_dirs: dict[str, dict[str, str]] = {}  # workload -> the lone stock host's caches
        self.stock_fleet: dict[str, list[dict[str, Any]]] = {}  # workload -> the stock fleet's hosts

    def signing_keys(self) -> dict[str, dict[str, str]]:
        """The fleet's key pair (its hosts sign and trust it) and another one (a misconfigured host)."""
        return {who: stores.key_env(self.out / f"{who}-key") for who in ("fleet", "other")} | {"no-keys": {}}

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
        env = procs.child_env(drop=("TUNECACHE_", "TORCHINDUCTOR_", "TRITON_"), before=[self.hook, ROOT], **dirs)
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

    def command(self, workload: str, tag: str, version: str | None) -> tuple[list[str], str]:
        """The command of one host of ``workload``, and the prefix of its result line."""
        a = self.a
        if workload == "sparse":
            spec = {"buckets": a.buckets, "heads": a.heads, "topk": a.topk}
            if version and version != "v1":
                spec["sources"] = rollout_host.edited_source(self.out, version)
            return procs.python(rollout_host.__file__, "--child-sparse", json.dumps(spec)), ""
        if workload.startswith("inductor:"):
            outputs = self.out / "outputs" / f"{tag}.pt"
            outputs.parent.mkdir(exist_ok=True)
            mode = workload.split(":", 1)[1]
            spec = child_spec(cpu=a.cpu, d=a.d, heads=a.model_heads, seq=a.seq, mode=mode, outputs=outputs)
            return procs.python(SCRIPTS / "bench_inductor.py", "--child", json.dumps(spec)), ""
        if workload == "fla":
            return procs.python("-c", library_child.code("fla")), "RESULT "
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
        cmd, prefix = self.command(workload, tag, version)
        prof = Path(dirs["TRITON_CACHE_DIR"]).parent / "profile.prof"
        if self.a.profile and cmd[1] != "-c":  # where a fresh host's time goes (issue 35)
            cmd = [cmd[0], "-m", "cProfile", "-o", str(prof), *cmd[1:]]
        r = procs.run(cmd, env=env, timeout=self.a.timeout, cwd=tempfile.gettempdir())
        Path(dirs["TRITON_CACHE_DIR"]).parent.joinpath("stderr").write_text(r.stderr)
        if prof.exists():
            top = io.StringIO()
            pstats.Stats(str(prof), stream=top).sort_stats("cumulative").print_stats(80)
            prof.with_suffix(".txt").write_text(top.getvalue())
        res: dict[str, Any] = {"host": host, "trust": trust, "version": version, "wall_s": round(r.wall_s, 3)}
        raw = r.result(prefix)
        if r.rc != 0 or raw is None:
            res["error"] = f"exit {r.rc}: {r.stderr[-1500:]}"
            return res
        res.update(self.normalise(workload, raw))
        seen = compiles.tally(compiles.events(log, since))
        # fla's child counts its first pass's loads itself (its own listener replaces the hook's there)
        res["compiles"] = seen["compiles"] + res.pop("first_pass_compiles", 0)
        res["binaries_served"] = seen["hits"] + res.pop("first_pass_hits", 0)  # from the store
        res["compiled"] = seen["compiled"]
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
        starts = [
            functools.partial(
                self.host,
                workload,
                h["host"],
                h["dirs"],
                url,
                trust=h.get("trust", "fleet"),
                version=h.get("version", "v1"),
            )  # fmt: skip
            for h in hosts
        ]
        done = procs.at_once(starts, stagger_s=self.a.stagger)
        failed = lambda h, e: {"host": h["host"], "error": repr(e)}  # reported, not fatal to the others  # noqa: E731
        return [failed(h, r) if isinstance(r, BaseException) else r for h, r in zip(hosts, done)]

    def fresh(self, n: int, scenario: str, **extra: Any) -> list[dict[str, Any]]:
        return [{"host": f"{scenario}-{i}", "dirs": self.dirs(f"{scenario}-{i}"), **extra} for i in range(n)]

    # ---- stores -----------------------------------------------------------------------------------

    def store(self, name: str) -> str:
        """An empty store of its own per scenario: a SQLite file, or the --url database emptied."""
        if self.a.url is None:
            return stores.sqlite_url(self.out / "stores" / f"{name}.sqlite3", fresh=True)
        import datetime as dt

        from tunecache.problem.model import INDUCTOR_KINDS
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
