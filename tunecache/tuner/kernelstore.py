"""One kernel's view of its store: the connection, and the kernel's stored problems in memory.

Every stored problem of a kernel (all targets) is fetched in one query, in the background when the
kernel is defined, so that a launch resolves from memory. A store that fails to open is tried again
30 s later; results tuned meanwhile are kept and queued for it once it opens. Failures are counted
and warned about once per store: the autotuner then tunes in its own process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tunecache import settings
from tunecache.binaries import binaries, preload
from tunecache.errors import StoreError, StoreReadOnlyError
from tunecache.problem.model import ConfigResult, LaunchSpec, Problem, pick_winner
from tunecache.problem.target import Target
from tunecache.process import counters, writeback
from tunecache.store.opening import shared_store
from tunecache.store.store import Store
from tunecache.trust import trust
from tunecache.tuner import background, companions, missspool

RETRY_OPEN_S = 30.0
log = logging.getLogger("tunecache")


class KernelStore:
    """The store of one kernel (``kernel``: its name), opened lazily from ``arg`` (a URL, a
    :class:`Store`, or None for the environment's), and what this process holds of it."""

    def __init__(self, kernel: str, arg: str | Store | None) -> None:
        self.kernel = kernel
        self.arg = arg
        self.store: Store | None = None  # once opened
        self.retry_at = 0.0  # no new attempt to open before (monotonic)
        self.unsaved: list[tuple[Problem, list[ConfigResult], bool]] = []  # tuned while it was down
        self.mem: dict[str, Problem] = {}  # by digest: this source's problems, every target
        self.prefetched = False  # the kernel's problems (every target) were fetched
        self.pending: list[Problem] | None = None  # fetched by name, not yet filtered by source hash
        self.specs: dict[str, list[LaunchSpec]] | None = None  # fetched, by target digest
        self.opening: tuple[int, Future] | None = None  # (pid, the background prefetch)

    def reset(self, arg: str | Store | None) -> None:
        """Forget what is in memory and bind to ``arg`` anew (results not yet saved stay queued)."""
        self.mem.clear()
        self.prefetched = False
        self.pending = None
        self.specs = None
        self.arg = arg
        self.store = None
        self.opening = None
        self.retry_at = 0.0

    def after_fork_in_child(self) -> None:
        """The parent's pending prefetch is not the child's to wait for, its unsaved results are the
        parent's to write, and its store is the parent's connections: the child opens it again (a
        Store the user passed gets an empty pool in store.py's own fork handler)."""
        self.opening = None
        self.unsaved = []
        self.retry_at = 0.0
        if not isinstance(self.arg, Store):
            self.store = None

    def open_early(self, source_hash: Callable[[], str | None]) -> None:
        """Background: open the store and prefetch every problem of this kernel (all targets: the
        target needs CUDA, which must not be touched before a server forks), and its launch specs
        if ``source_hash()`` (which hashes the source only where that is safe now) gives the hash."""
        t0 = time.perf_counter()
        _export_metrics()
        with contextlib.suppress(Exception):
            store = self.arg if isinstance(self.arg, Store) else shared_store(self.arg)
            if self.kernel[:255] not in store.kernel_names():
                self.pending, self.prefetched = [], True  # nothing stored: no query, no source hash
                return
            if not store.readonly:
                writeback.start()  # a stored hit queues a count: no thread start at the first launch
            h = source_hash()
            self.fetch(store, h)
            if h is not None:
                self.read_specs(store, h)
        log.debug(
            "tunecache: %s: prefetched (hashed: %s) in %.3f s",
            self.kernel,
            self.specs is not None,
            time.perf_counter() - t0,
        )

    def read_specs(self, store: Store, source_hash: str) -> None:
        """Read this kernel's launch specs that this process trusts (:mod:`tunecache.trust.trust`) and place
        their trusted binaries into Triton's cache, before any compile: Triton then finds them."""
        policy = trust.policy(store)
        self.specs = policy.stored_specs(store, source_hash)
        binaries.place_for(store, self.specs, policy)

    def place_before_launch(self, source_hash: str) -> None:
        """A stored winner's first launch here: the kernel's stored binaries placed first, where no
        prefetch or preload has placed them yet (once per kernel, a resolution, never the launch path).
        Otherwise Triton compiles what the background preload places a moment later (GPU, 2026-12-06:
        a rolling upgrade's fresh hosts compiled the binary the store held, their module not yet
        hashable when the prefetch ran)."""
        if self.specs is not None:
            return
        store = self.open_store()
        if store is None:
            return
        try:
            self.read_specs(store, source_hash)
        except StoreError as e:
            self.trouble("read", e)

    def holds_nothing(self) -> bool:
        """The prefetch ran and the store holds no row of this kernel (of any version): nothing to
        preload, so no source hash and no query for it (a library defines hundreds of kernels)."""
        return self.prefetched and not self.pending and not self.mem

    def wait_for_prefetch(self, timeout: float = 60.0) -> None:
        opening = self.opening
        if opening is not None and opening[0] == os.getpid():
            opening[1].result(timeout=timeout)

    def fetch(self, store: Store, source_hash: str | None) -> None:
        """Every problem of this kernel (all targets) into memory, in one query, once. Raises
        StoreError. Before the source is hashed (``source_hash`` None): every version of the kernel,
        by name, kept aside until :meth:`absorb` keeps those of this source."""
        if self.prefetched:
            return
        if source_hash is None:
            self.pending = store.get_kernel_problems(self.kernel)
        else:
            self.pending = store.get_many(source_hash)
        self.prefetched = True
        if source_hash is not None:
            self.absorb(source_hash)

    def absorb(self, source_hash: str) -> None:
        """Move the prefetched rows of this source into memory. Rows this process already holds
        are kept: they are at least as fresh."""
        rows = self.pending
        if rows is None:
            return
        for q in rows:
            if q.source_hash == source_hash:
                self.mem.setdefault(q.digest, q)
        self.pending = None

    def open_store(self) -> Store | None:
        """The store, opened (after the background prefetch, if one runs); None while it cannot be
        opened. Once it opens, the results tuned meanwhile are queued for it."""
        if self.store is not None:
            return self.store
        if self.opening is not None:
            pid, fut = self.opening
            self.opening = None
            if pid == os.getpid():  # after a fork the parent's thread is gone: open here instead
                with contextlib.suppress(Exception):
                    fut.result(timeout=60)
        if time.monotonic() < self.retry_at:
            return None
        _export_metrics()  # where the prefetch did not run (TUNECACHE_PREFETCH=0, a forked child)
        try:
            self.store = self.arg if isinstance(self.arg, Store) else shared_store(self.arg)
        except StoreError as e:
            self.trouble("open", e)
            self.retry_at = time.monotonic() + RETRY_OPEN_S
            return None
        if not self.store.readonly:
            for item in self.unsaved:  # tuned while the store was down
                writeback.defer_put(self.store, *item)
        self.unsaved.clear()
        return self.store

    def trouble(self, what: str, e: Exception) -> None:
        """Count a failed ``what`` (open, read, lease, write) and warn about the store once."""
        counters.count(None, None, store_errors=1)
        # One warning per store and process: an outage fails reads, leases and writes alike, and
        # every kernel on that store falls back the same way (each failure is counted in stats()).
        arg = self.arg
        where = arg.masked_url if isinstance(arg, Store) else str(arg or settings.raw("TUNECACHE_URL") or "")
        counters.warn_once(
            "",
            f"store-unavailable:{where}",
            "tunecache: %s: store unavailable (%s); tuning in this process instead",
            self.kernel,
            e,
        )

    def lookup(self, digest: str, source_hash: str) -> Problem | None:
        """In memory first (prefetched in one query per kernel); else one query for this digest."""
        store = self.open_store()  # joins the background prefetch
        self.absorb(source_hash)
        p = self.mem.get(digest)
        if p is not None or store is None:
            return p
        try:
            if not self.prefetched:
                self.fetch(store, source_hash)
                self.absorb(source_hash)
                p = self.mem.get(digest)
            else:
                p = store.get(digest)  # tuned by another process since the prefetch?
        except StoreError as e:
            self.trouble("read", e)
            return None
        if p is not None:
            self.mem[p.digest] = p
        return p

    def held(self, digest: str) -> Problem | None:
        """The problem this process holds in memory for ``digest`` (no query)."""
        return self.mem.get(digest)

    def remember(self, problem: Problem) -> None:
        """Hold ``problem`` (another process's result, read from the store) in memory."""
        self.mem[problem.digest] = problem

    def fetch_problem(self, store: Store, digest: str) -> Problem | None:
        """The stored problem of ``digest``, read now (another process may have stored it since the
        prefetch); not held in memory until it is used (:meth:`remember`). Raises StoreError."""
        return store.get(digest)

    def save(self, store: Store, problem: Problem, results: list[ConfigResult], replace: bool) -> Problem | None:
        """Write a result tuned under the lease and hold what the store returns in memory. A failed
        write is counted, warned about, and queued to be written in the background (None)."""
        try:
            stored = store.put(problem, results, replace=replace)
        except StoreError as e:
            self.trouble("write", e)
            writeback.defer_put(store, problem, results, replace)
            return None
        self.mem[stored.digest] = stored
        return stored

    def problems(self) -> list[Problem]:
        """This kernel's problems in memory (a copy: another thread may add to it)."""
        return list(self.mem.values())

    def preload_winners(
        self, fn: Any, known_hash: str | None, source_hash: Callable[[], str], target_digest: str, device: int
    ) -> tuple[int, int]:
        """Load the binaries of this kernel's stored winners on ``target_digest`` onto ``device`` into
        Triton's kernel cache; returns (loaded, skipped). ``known_hash``: the source hash if computed
        already (else the kernel's rows are fetched by name); ``source_hash()`` computes it. Raises."""
        t0 = time.perf_counter()
        if self.specs is None:  # the prefetch was off, failed, or ran before the hash
            store = self.open_store()
            if store is None:
                return 0, 0
            self.fetch(store, known_hash)
            self.read_specs(store, source_hash())
            log.debug("tunecache: %s: specs read, binaries placed (%.3f s)", self.kernel, time.perf_counter() - t0)
        self.absorb(source_hash())
        mine = self.specs.get(target_digest, [])
        if not mine:
            return 0, 0
        winners = {p.winner_config_hash for p in self.problems() if p.target.digest == target_digest}
        loaded, skipped = preload.load(fn, [s for s in mine if s.config_hash in winners], device)
        if settings.get("TUNECACHE_COMPANIONS"):  # the plain kernels filed with it (tunecache.tuner.companions)
            more, less = companions.load(mine, device)
            loaded, skipped = loaded + more, skipped + less
        return loaded, skipped

    def specs_on(self, source_hash: str, target_digest: str) -> list[LaunchSpec]:
        """This kernel's recorded launch specs on ``target_digest``: the prefetched ones, else read now
        (for a failed launch, never a launch path); none while the store cannot answer."""
        specs = self.specs
        if specs is None:
            store = self.open_store()
            if store is None:
                return []
            try:
                specs = store.get_specs(source_hash)
            except StoreError as e:
                self.trouble("read", e)
                return []
        return list(specs.get(target_digest, []))

    def mark_failed(self, digest: str, config_hash: str, status: str, failure: dict[str, Any]) -> None:
        """A stored config failed on this target: mark it ``status`` in memory (the problem's winner
        picked again among the rest) and in the store, so that no process launches it again."""
        p = self.mem.pop(digest, None)
        if p is not None:
            r = p.config_map().get(config_hash)
            if r is not None:
                r.status, r.failure, r.median_ms = status, failure, None
                best = pick_winner(p.configs)
                p.winner_config_hash = best.config_hash if best else None
                self.mem[digest] = p
        store = self.open_store()
        if store is not None and not store.readonly:
            try:
                store.mark_config(digest, config_hash, status, failure)
            except StoreError as e:
                self.trouble("write", e)

    def record_miss(self, problem: Problem, reason: str) -> str:
        """Record ``problem`` as a miss with ``reason`` (``tunecache misses``): in the store if it takes
        writes, else, a read-only store, in the local spool (:mod:`tunecache.tuner.missspool`). Returns where:
        "store", "spool", "unrecorded" (read-only store, spool not writable) or "failed" (the store
        is down or refused the write: warned about by :meth:`trouble`)."""
        store = self.open_store()
        if store is None:
            return "failed"
        if not store.readonly:
            try:
                store.record_miss(problem, reason)
                return "store"
            except StoreReadOnlyError:
                pass  # read-only after all (a file or login that cannot write): the spool, as below
            except StoreError as e:
                self.trouble("write", e)
                return "failed"
        return "spool" if missspool.append(problem, reason, store.masked_url) else "unrecorded"

    def unwritable_miss(self, problem: Problem, mode: str) -> None:
        """A miss benchmarked in this process whose result the read-only store cannot keep: spooled
        (reason "readonly", which ``tunecache misses`` lists), and, outside ``TUNECACHE_MODE=readonly``
        (where that is the intent), said once per process and store with what to do: such a worker
        otherwise re-tunes every miss at every start, silently (issue 38)."""
        store = self.store
        if store is None:
            return
        where = self.record_miss(problem, "readonly")
        if mode == "readonly" or not counters.first_time("readonly store", store.masked_url):
            return
        kept = (
            "`tunecache misses` lists them"
            if where == "spool"
            else f"not listed: {missspool.path()} is not writable (TUNECACHE_MISS_SPOOL)"
        )
        # One line a worker prints at every start: short (docs/images.md says the rest).
        log.warning(
            "tunecache: read-only store %s (%s): misses are benchmarked at every start and not kept (%s); "
            "tune them with `tunecache warm`, or set TUNECACHE_MODE=offline (no benchmarks) or readonly (quiet)",
            store.masked_url,
            read_only_cause(store),
            kept,
        )

    def record_miss_later(self, problem: Problem, reason: str) -> None:
        """:meth:`record_miss` in the background (a report, never a delay)."""
        background.submit(functools.partial(self.record_miss, problem, reason))

    def save_later(self, problem: Problem, rows: list[ConfigResult], replace: bool) -> None:
        """A result tuned without the lease: written in the background, or once the store opens."""
        item = (problem, rows, replace)
        if self.store is not None:
            writeback.defer_put(self.store, *item)
        else:
            self.unsaved.append(item)

    def record_specs(
        self,
        store: Store,
        fn: Any,
        source_hash: str,
        target_digest: str,
        specs: list[LaunchSpec],
    ) -> None:
        """Store what Triton compiled a winner with, and its binaries, for later preloads."""
        try:
            store.put_specs(self.kernel, source_hash, target_digest, specs)
            binaries.upload(store, fn, self.kernel, source_hash, specs, target_digest)
        except StoreError as e:
            self.trouble("write", e)

    def same_key(self, source_hash: str, key_json: str, target: Target) -> list[Problem] | None:
        """Every stored problem of this source and key on ``target``'s GPU model, any driver (None:
        the store is not open or cannot answer)."""
        if self.store is None:
            return None
        try:
            return self.store.find_problems(
                with_configs=True,
                source_hash=source_hash,
                key_json=key_json,
                arch=target.arch,
                device=target.device_name,
            )
        except StoreError as e:
            self.trouble("read", e)
            return None


def _export_metrics() -> None:
    """The server's /metrics shows tunecache's counters from the first store open on (imported
    here, not with this module: ``tunecache.metrics`` and prometheus_client cost nothing until then)."""
    from tunecache.metrics import exporter

    exporter.start()


def read_only_cause(store: Store) -> str:
    """Why ``store`` takes no writes from this process, in a user's words."""
    if store.dialect == "postgresql":
        return "a reader login"
    if store.dialect == "sqlite":
        return "file or directory not writable"
    return "opened read-only"
