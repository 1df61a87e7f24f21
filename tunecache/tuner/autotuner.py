"""Autotuner: a drop-in ``triton.autotune`` that reads the store before benchmarking.

``TunecacheAutotuner`` subclasses Triton's ``Autotuner``. After a key is resolved, a launch takes
the hit path of :mod:`tunecache.tuner.fastpath` (a mixin: the key from the arguments, one lookup,
the winner's keywords bound once) and anything unusual Triton's own ``run``. Everything tunecache
does happens on a miss, through the hooks that are stable from Triton 3.4 to 3.9:

* ``check_disk_cache(key, configs, bench_fn)``: called by ``run`` on every miss once
  ``cache_results`` is on (we force it on, also under the interpreter). Here we look the problem
  up (prefetched in one query per kernel), fall back during a CUDA graph capture, take the
  benchmark lease, and write results back.
* ``_bench(config=...)``: returns stored timings for configs already measured (or failed) on
  this target, so a grown search space benchmarks only new configs and a failed config is never
  compiled again; records the status and failure reason of the rest.
* ``do_bench``: wraps the benchmarker to see the exception Triton swallows (OutOfResources with
  the bytes needed and the limit), and uses a CPU timer under ``TRITON_INTERPRET=1``.
* ``prune_configs(kwargs)``: only remembers ``kwargs`` to name the tuning-key values.

``run`` is wrapped, not copied, to recover from a stored winner that no longer compiles: blamed only
when its failure reproduces under the stored key's arguments (:mod:`tunecache.tuner.recovery`, a
mixin of ``TunecacheAutotuner``; the rule is in :mod:`tunecache.tuner.blame`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from triton.runtime.autotuner import Autotuner

from tunecache import counters, settings, sharing, writeback
from tunecache.binaries import preload
from tunecache.configidentity import ConfigIds, search_space_hash
from tunecache.errors import Busy, CaptureMissError, ConfigurationError, StoreError
from tunecache.identity import (
    KernelIdentity,
    canonical_key,
    kernel_identity,
    kernel_name,
    module_imported,
    problem_digest,
)
from tunecache.model import Problem
from tunecache.settings import current_mode
from tunecache.store.store import Store
from tunecache.target import detect_target, hostname, interpreting
from tunecache.tuner import (
    background,
    basepatch,
    companions,
    deferral,
    measure,
    missspool,
    singleflight,
    winner,
)
from tunecache.tuner.fastpath import FastLaunch
from tunecache.tuner.firstcall import FirstCall
from tunecache.tuner.kernelstore import KernelStore
from tunecache.tuner.measure import Round, classify, cpu_do_bench
from tunecache.tuner.preloading import WinnerPreload
from tunecache.tuner.recovery import WinnerRecovery
from tunecache.tuner.singleflight import Lease

log = logging.getLogger("tunecache")


#: Triton's own ``Autotuner.__init__`` and ``run``: ``install()`` patches the base class's (see
#: :func:`tunecache.tuner.adoption.covering_init`), possibly before this module finished importing (the
#: start-up hook), and tunecache's own calls go to these, never through the patch.
BASE_INIT = basepatch.original("__init__")
BASE_RUN = basepatch.original("run")


class _computed:
    """A read-only attribute computed at each access that an instance may still assign, as it may
    Triton's ``cached_property`` (a ``property`` would make a library's ``self.do_bench = ...`` raise)."""

    def __init__(self, f: Callable[[Any], Any]) -> None:
        self.f = f
        self.__doc__ = f.__doc__

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        return self if obj is None else self.f(obj)


class _StoredTimings:
    """Triton's ``configs_timings`` after a stored hit, built at its first read: a restart's first
    launch of each key then hashes no Config (Triton hashes one by building its kwargs). A value
    assigned on the instance (Triton's ``benchmark()`` does) is found first, as with ``_computed``."""

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return self
        pending = obj.__dict__.get("_tc_timings")
        if pending is None:
            raise AttributeError(f"{type(obj).__name__!r} object has no attribute 'configs_timings'")
        rows, by_hash = pending
        timings = {c: rows[h].timings() for h, c in by_hash.items() if h in rows}
        obj.__dict__["configs_timings"] = timings  # found first from now on
        return timings


class _Ctx:
    """Everything about one miss: computed once per new tuning key, never on the launch path."""

    __slots__ = ("key", "names", "values", "key_json", "digest", "bucket", "target", "hashes", "configs")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class TunecacheAutotuner(FastLaunch, WinnerPreload, WinnerRecovery, Autotuner):
    """Triton's Autotuner, backed by a shared store of results."""

    # The instance attributes ``_tc_attach`` sets, declared: a library's class must not define them
    # (tunecache.tuner.adoption derives the names it refuses from this class).
    _tc_user_cache_results: bool
    _tc_bucket: dict[str, Callable[[int], int]]
    _tc_name: str
    _tc_set_name: bool
    _tc_ks: KernelStore
    _tc_identity: KernelIdentity | None
    _tc_identity_lock: threading.Lock
    _tc_kwargs: dict[str, Any]
    _tc_round: Round | None
    config_ids: ConfigIds
    _tc_from_store: dict[Any, tuple[str, str]]
    _tc_resolved_by: dict[Any, Any]
    _tc_lock: threading.RLock
    _tc_timings: Any

    def __init__(
        self,
        fn: Any,
        arg_names: Sequence[str],
        configs: Any,
        key: Sequence[str],
        reset_to_zero: Any,
        restore_value: Any,
        pre_hook: Any = None,
        post_hook: Any = None,
        prune_configs_by: Any = None,
        warmup: Any = None,
        rep: Any = None,
        use_cuda_graph: bool = False,
        do_bench: Any = None,
        cache_results: bool = False,
        *,
        store: str | Store | None = None,
        bucket: Mapping[str, Callable[[int], int]] | None = None,
    ) -> None:
        # Forward by keyword: the positional order differs between Triton versions.
        super().__init__(
            fn,
            arg_names,
            configs,
            key,
            reset_to_zero,
            restore_value,
            pre_hook=pre_hook,
            post_hook=post_hook,
            prune_configs_by=prune_configs_by,
            warmup=warmup,
            rep=rep,
            use_cuda_graph=use_cuda_graph,
            do_bench=do_bench,
            cache_results=cache_results,
        )
        self._tc_attach(cache_results, store, bucket)

    def _tc_attach(
        self,
        cache_results: bool,
        store: str | Store | None,
        bucket: Mapping[str, Callable[[int], int]] | None,
    ) -> None:
        """Give an initialised Autotuner tunecache's state: from ``__init__``, or when ``install()``
        adopts an Autotuner that a library built (its class then has TunecacheAutotuner under it)."""
        # Route every miss through check_disk_cache (3.6+ turns it off under the interpreter); the
        # user's own choice still applies in mode "off".
        self._tc_user_cache_results = cache_results
        self.cache_results = True
        bucket = dict(bucket or {})
        unknown = [n for n in bucket if n not in self.keys]
        if unknown:
            raise ValueError(f"bucket names {unknown} must also be in key={list(self.keys)}")
        for n, f in bucket.items():
            if not callable(f):
                raise TypeError(f"bucket[{n!r}] must be a function of the batch size, got {type(f).__name__}")
        self._tc_bucket = bucket
        fn = self.fn
        self._tc_name = kernel_name(fn)  # no parsing: the source is hashed later (see identity)
        self._tc_set_name = "kernel_name" not in vars(self)
        if self._tc_set_name:  # a library's subclass may set its own after this (fla does): kept
            self.kernel_name = self._tc_name
        self._tc_ks = KernelStore(self._tc_name, store)  # the store, and this kernel's problems in memory
        self._tc_identity: KernelIdentity | None = None
        self._tc_identity_lock = threading.Lock()
        self._tc_kwargs: dict[str, Any] = {}
        self._tc_round: Round | None = None  # the benchmark round in progress (see _run_bench)
        self.config_ids = ConfigIds()  # config identities, memoised by value
        self._tc_from_store: dict[Any, tuple[str, str]] = {}  # tuning key -> (digest, config hash)
        self._tc_resolved_by: dict[Any, Any] = {}  # tuning key -> a mark of the call that resolved it (see _blame)
        self._tc_lock = threading.RLock()
        background.register(self)
        companions.register_tuned(fn)  # its compiles are benchmarks and winners, not companions
        if current_mode() != "off":
            companions.watch()  # the plain kernels launched next to it (see tunecache.tuner.companions)
        self.__dict__["run"] = FirstCall(self, self._tc_name, self._tc_record_uncovered)  # does it reach Autotuner.run?
        if current_mode() != "off" and settings.get("TUNECACHE_PREFETCH"):
            # Open the store and fetch this kernel's problems while the server loads its weights,
            # so the first launch pays no query, imports or connection set-up. No CUDA calls here:
            # a server may still fork. The source is hashed no earlier than the first launch unless
            # its module finished importing (a @jit helper below the kernel does not exist yet).
            if background.AST_NOT_THREAD_SAFE and module_imported(fn):
                self.identity  # noqa: B018 - hashed here, so that no other thread parses source
            early = functools.partial(self._tc_ks.open_early, self._early_hash)
            self._tc_ks.opening = (os.getpid(), background.submit(early))
            background.warm_triton_key()
            if settings.get("TUNECACHE_PRELOAD") and not interpreting() and not background.AST_NOT_THREAD_SAFE:
                # (On 3.11 a background preload could parse source, racing the launching thread.)
                background.preload_when_cuda_is_up(self)

    def _early_hash(self) -> str | None:
        """The source hash for the background prefetch: hashed there only if its module finished
        importing, and never on 3.11 (see ``background.AST_NOT_THREAD_SAFE``)."""
        if self._tc_identity is None and not background.AST_NOT_THREAD_SAFE and module_imported(self.fn):
            self.identity  # noqa: B018
        return self._known_hash()

    def _known_hash(self) -> str | None:
        """The source hash if it was computed already (None: not yet; nothing is parsed here)."""
        ident = self._tc_identity
        return ident.source_hash if ident is not None else None

    def wait_for_prefetch(self, timeout: float = 60.0) -> None:
        """Wait until the background prefetch this kernel's definition started (if any, in this
        process) has run: for tests, and for a server that wants its stores open before it serves."""
        self._tc_ks.wait_for_prefetch(timeout)

    def after_fork_in_child(self) -> None:
        """Called by :mod:`tunecache.tuner.background` in a forked child: fresh locks, no parent's work.

        A lock a parent's thread held at the fork (the prefetch hashing a kernel, a launch resolving
        a key) would stay taken forever; see also ``KernelStore.after_fork_in_child``. What the
        parent resolved before the fork stays: a child that launches a warmed key does no I/O.
        """
        self._tc_identity_lock = threading.Lock()
        self._tc_lock = threading.RLock()
        self._tc_ks.after_fork_in_child()

    def fork_locks(self) -> dict[str, Any]:
        """This tuner's locks, which a forked child gets fresh (for tests/test_fork.py)."""
        return {"tuner.identity_lock": self._tc_identity_lock, "tuner.lock": self._tc_lock}

    # ---- companions, launch specs, reset (preloading the winners: tunecache.tuner.preloading) ------

    def companion_store(self) -> Store | None:
        """The store this kernel's companions are filed in (None: not open, or unreachable)."""
        return self._tc_ks.open_store()

    def _record_specs(self, ctx: _Ctx, store: Store, best: str | None) -> None:
        """After a benchmark: store what Triton compiled the winner with, for later preloads
        (an idempotent write: specs other keys recorded already are kept)."""
        config = dict(zip(ctx.hashes, ctx.configs)).get(best) if best else None
        if config is None or store.readonly:
            return
        specs = preload.capture(self.fn, config, best)
        self._tc_ks.record_specs(store, self.fn, self.identity.source_hash, ctx.target.digest, specs)

    def reset(self, store: str | Store | None = None) -> None:
        """Forget every in-memory resolution and bind to ``store`` (default: the environment's) anew.

        For tests and for a process that changes ``TUNECACHE_URL`` after its kernels were defined.
        """
        self.cache.clear()
        self.__dict__.pop("_tc_plan", None)  # the hit path is planned again at the next launch
        self._tc_from_store.clear()
        self._tc_resolved_by.clear()
        self._tc_ks.reset(store)

    # ---- identity ---------------------------------------------------------------------------

    def _may_hash_here(self) -> bool:
        """Whether this thread may hash the source now, before the first launch: only once the
        module finished importing, and on 3.11 only on the main thread (see ``background.AST_NOT_THREAD_SAFE``)."""
        if background.AST_NOT_THREAD_SAFE and threading.current_thread() is not threading.main_thread():
            return False
        return module_imported(self.fn)

    @property
    def identity(self) -> KernelIdentity:
        """Computed once, no earlier than the first launch unless the module provably finished
        importing. A first launch that races the background prefetch waits for its hash instead of
        parsing the same source again in a second thread."""
        ident = self._tc_identity
        if ident is None:
            with self._tc_identity_lock:
                if self._tc_identity is None:
                    self._tc_identity = kernel_identity(self.fn)
                ident = self._tc_identity
        return ident

    def _key_names(self, n: int) -> list[str]:
        """Names of Triton's tuning-key values, built exactly as ``Autotuner.run`` builds them."""
        all_args = {**(self.nargs or {}), **self._tc_kwargs}
        _args = {k: v for k, v in all_args.items() if k in self.arg_names}
        names = [k for k in self.keys if k in _args]
        names += [f"{k}.dtype" for k, v in _args.items() if hasattr(v, "dtype")]
        return names if len(names) == n else [f"key[{i}]" for i in range(n)]

    def _context(self, tuning_key: tuple, configs: Sequence[Any]) -> _Ctx:
        names = self._key_names(len(tuning_key))
        values = list(tuning_key)
        bucket = None
        for i, name in enumerate(names):
            f = self._tc_bucket.get(name)
            if f is not None:
                values[i] = int(f(values[i]))
                bucket = values[i] if bucket is None else bucket
        key_json = canonical_key(names, values)  # TypeError names a bad argument, before any benchmark
        target = detect_target()
        return _Ctx(
            key=tuning_key,
            names=names,
            values=values,
            key_json=key_json,
            bucket=bucket,
            target=target,
            digest=problem_digest(self.identity.source_hash, target, key_json),
            hashes=[self.config_ids(c)[1] for c in configs],
            configs=list(configs),
        )

    # ---- the hooks ------------------------------------------------------------------------------

    def prune_configs(self, kwargs: dict) -> list:
        self._tc_kwargs = kwargs
        return super().prune_configs(kwargs)

    configs_timings = _StoredTimings()  # Triton's attribute; a stored hit's is built when read

    @_computed
    def do_bench(self) -> Callable[..., Any]:  # shadows Autotuner.do_bench (a cached_property)
        base = self._do_bench
        if base is None:
            if interpreting():
                base = cpu_do_bench
            else:
                from triton.runtime.driver import driver

                base = driver.active.get_benchmarker()
        return functools.partial(self._recording_bench, base)

    def _recording_bench(
        self, base: Callable[..., Any], kernel_call: Callable[[], Any], *args: Any, **kwargs: Any
    ) -> Any:
        """See the exception Triton's ``_bench`` swallows, and count samples."""
        rnd = self._round()

        def counted() -> Any:
            rnd.samples += 1
            return kernel_call()

        try:
            return base(counted, *args, **kwargs)
        except Exception as e:
            rnd.failure = classify(e)
            raise

    def _round(self) -> Round:
        """The round in progress; a throwaway one where Triton benchmarks outside ours (mode "off")."""
        rnd = self._tc_round
        if rnd is None:
            rnd = self._tc_round = Round()
        return rnd

    def _bench(self, *args: Any, config: Any, **meta: Any) -> list[float]:
        config_json, h = self.config_ids(config)
        rnd = self._round()
        known = rnd.known.get(h)
        if known is not None:
            return known.timings()
        rnd.start_config()
        t0 = time.perf_counter()
        exc: Exception | None = None
        timings: Any = None
        try:
            with sharing.not_built_here("a tunecache benchmark"):  # its winner's binary is uploaded as such
                timings = super()._bench(*args, config=config, **meta)
        except Exception as e:  # noqa: BLE001 - a config that fails is a result, not a crash
            exc = e
        elapsed = time.perf_counter() - t0
        timings = rnd.measured(h, orjson.loads(config_json), timings, exc)
        counters.count(self._tc_name, self._tc_ks.store, benchmarks=1, bench_seconds=elapsed)
        return timings

    def check_disk_cache(self, tuning_key: Any, configs: list, bench_fn: Callable[[], None]) -> bool:
        try:
            mode = current_mode()
        except ConfigurationError:  # set bad after this kernel was defined: Triton's own, warned once
            settings.usable()
            mode = "off"
        if mode == "off":
            if self._tc_user_cache_results:
                return super().check_disk_cache(tuning_key, configs, bench_fn)
            bench_fn()
            return False
        if len(configs) == 1:
            # Nothing to choose (Triton 3.8+ does the same before calling us): never benchmark.
            self._settle(tuning_key, configs[0])
            return True
        ctx = self._context(tuning_key, configs)
        try:
            with self._tc_lock:
                return self._resolve(ctx, mode, bench_fn)
        except Busy:  # deferred (tunecache.defer_busy()): nothing launched, as Triton leaves a launch
            self.nargs = None
            raise

    # ---- resolution -------------------------------------------------------------------------------

    def _settle(
        self,
        key: Any,
        config: Any,
        timings: tuple[Mapping[str, Any], dict[str, Any]] | None = None,
        stored: tuple[str, str] | None = None,
    ) -> None:
        """The one place tunecache gives a tuning key its config (Triton's own ``bench_fn`` first
        sets the fastest, which this then overrides). ``stored``: (digest, config hash) of the
        stored winner launched, blamed if that launch fails (see :meth:`run`)."""
        self.cache[key] = config
        companions.resolved(self)
        if timings is not None:  # (stored rows, config by hash): see _StoredTimings
            self.__dict__.pop("configs_timings", None)
            self.__dict__["_tc_timings"] = timings
        if stored is not None:
            self._tc_from_store[key] = stored
            self._tc_mark_resolved(key)

    def _covers(self, p: Problem | None, ctx: _Ctx) -> bool:
        if p is None:
            return False
        stored = p.config_map()
        return all(h in stored for h in ctx.hashes)

    def _use(self, ctx: _Ctx, p: Problem, *, hit: bool) -> None:
        """Launch the stored winner: the same config on every worker of the fleet."""
        by_hash = dict(zip(ctx.hashes, ctx.configs))
        win = winner.stored_choice(p, ctx.hashes)
        self._tc_ks.place_before_launch(p.source_hash)
        self._settle(ctx.key, by_hash[win], (p.config_map(), by_hash), stored=(p.digest, win))
        if hit:
            counters.count(self._tc_name, self._tc_ks.store, hits=1, saved_seconds=p.tuning_seconds or 0.0)
            writeback.hit(self._tc_ks.store, p.digest)

    def _problem(self, ctx: _Ctx, seconds: float = 0.0, best: str | None = None) -> Problem:
        ident = self.identity
        return Problem(
            digest=ctx.digest,
            kernel=ident.name,
            source_hash=ident.source_hash,
            target=ctx.target,
            key_json=ctx.key_json,
            batch_bucket=ctx.bucket,
            tuning_seconds=seconds,
            host=hostname(),
            search_space_hash=search_space_hash(ctx.hashes),
            winner_config_hash=best,
        )

    def _resolve(self, ctx: _Ctx, mode: str, bench_fn: Callable[[], None]) -> bool:
        p = self._tc_ks.lookup(ctx.digest, self.identity.source_hash)
        if self._covers(p, ctx):
            self._use(ctx, p, hit=True)
            return True
        capture = measure.capturing()
        if capture or mode == "offline":
            return self._fallback(ctx, "capture" if capture else "offline", mode)
        if not sharing.builds_shareable():  # timings of builds Triton's key does not tell apart: kept here
            self._missed()
            return self._bench_unstored(ctx, p, bench_fn, keep=False)
        store = self._tc_ks.open_store()
        if mode == "readonly" or store is None or store.readonly:
            self._missed()
            if store is not None and store.readonly:
                self._tc_ks.unwritable_miss(self._problem(ctx), mode)
            return self._bench_unstored(ctx, p, bench_fn, keep=mode != "readonly" and store is None)
        return self._single_flight(ctx, p, store, bench_fn)

    def _missed(self) -> None:
        counters.count(self._tc_name, self._tc_ks.store, misses=1)

    def _fallback(self, ctx: _Ctx, reason: str, mode: str) -> bool:
        """No benchmark now: nearest stored bucket's winner, else the first config. Deterministic."""
        if reason == "capture" and mode == "strict":
            raise CaptureMissError(self._tc_name, dict(zip(ctx.names, ctx.values)))
        near = winner.nearest(
            self._tc_ks.problems(),
            ctx.hashes,
            ctx.values,
            target_digest=ctx.target.digest,
            bucket_index=next((i for i, n in enumerate(ctx.names) if n in self._tc_bucket), None),
        )
        cfg = dict(zip(ctx.hashes, ctx.configs))[near] if near is not None else ctx.configs[0]
        self._settle(ctx.key, cfg)
        counters.count(self._tc_name, None, **{f"{reason}_fallbacks": 1})
        where = self._tc_ks.record_miss(self._problem(ctx), reason)
        what = (self._tc_name, ctx.key_json, "CUDA graph capture" if reason == "capture" else "offline mode", cfg)
        missed = "tunecache: %s: no stored config for %s during %s; using %s without benchmarking. "
        if where == "unrecorded":  # nothing keeps this key but the log: one line per key
            counters.warn_once(
                self._tc_name,
                f"{reason}:{ctx.digest}",
                missed + "The store is read-only and the miss spool %s is not writable (set TUNECACHE_MISS_SPOOL): "
                "this miss is not recorded; tune this key before the next start.",
                *what,
                missspool.path(),
            )
        elif where == "spool":
            counters.warn_once(
                self._tc_name,
                reason,
                missed + "The store is read-only: misses are recorded in %s, which `tunecache misses` lists; "
                "tune these keys before the next start.",
                *what,
                missspool.path(),
            )
        else:
            counters.warn_once(
                self._tc_name,
                reason,
                missed + "Run `tunecache misses` and tune these keys before the next start.",
                *what,
            )
        return True

    def _new_round(self, ctx: _Ctx, p: Problem | None) -> Round:
        """What this key's round need not measure: rows stored for this target, or, for a key new
        here, what the driver-change policy decides."""
        known = {h: r for h, r in (p.config_map().items() if p else ()) if h in ctx.hashes}
        if p is not None:
            return Round(known=known)
        pruning = self._driver_change_prune(ctx)
        if pruning is None:
            return Round(known=known)
        return Round(known={**known, **pruning.skip}, pruned=pruning.pruned)

    def _driver_change_prune(self, ctx: _Ctx) -> winner.Pruning | None:
        """``topk:N``: after a driver change, benchmark only the N best configs of the old driver."""
        n = settings.get("TUNECACHE_ON_DRIVER_CHANGE")
        if n is None:
            return None
        same_key = self._tc_ks.same_key(self.identity.source_hash, ctx.key_json, ctx.target)
        old = winner.previous_driver(same_key, ctx.target) if same_key is not None else None
        if old is None:
            return None
        configs = {h: orjson.loads(self.config_ids(c)[0]) for c, h in zip(ctx.configs, ctx.hashes)}
        pruning = winner.driver_change_prune(old, configs, n)
        if pruning is not None:
            log.info(
                "tunecache: %s: driver changed; re-checking %d of %d configs",
                self._tc_name,
                len(pruning.keep),
                len(ctx.hashes),
            )
        return pruning

    def _run_bench(self, rnd: Round, bench_fn: Callable[[], None]) -> Round:
        """Run Triton's ``bench_fn`` with ``rnd`` as the round in progress; returns it, filled."""
        self._tc_round = rnd
        t0 = time.perf_counter()
        try:
            bench_fn()
        finally:
            self._tc_round = None
        rnd.seconds = time.perf_counter() - t0
        return rnd

    def _single_flight(self, ctx: _Ctx, p: Problem | None, store: Store, bench_fn: Callable[[], None]) -> bool:
        """Exactly one process per digest benchmarks (see :mod:`tunecache.tuner.singleflight`).

        Inside ``tunecache.defer_busy()`` a key another process holds raises ``Busy`` instead of
        waiting (:mod:`tunecache.tuner.deferral`): counted as nothing, not even a miss, since the
        walk launches it again later; the miss is counted once this launch leads or tunes here."""
        defer = deferral.deferring()
        if not defer:
            self._missed()

        def lead(lease: Lease) -> bool:
            if defer:
                self._missed()
            return self._bench_and_store(ctx, store, bench_fn, lease)

        def settled() -> bool | None:  # another process's result, once it covers this key
            return self._take_stored(ctx, self._tc_ks.fetch_problem(store, ctx.digest)) or None

        def trouble(what: str, e: StoreError) -> bool:
            if defer:
                self._missed()
            self._tc_ks.trouble(what, e)
            return self._bench_unstored(ctx, p, bench_fn)

        return singleflight.run(
            store,
            ctx.digest,
            kernel=self._tc_name,
            what=ctx.key_json,
            lead=lead,
            settled=settled,
            trouble=trouble,
            busy=(lambda: deferral.busy(self._tc_name, ctx.key_json)) if defer else None,
        )

    def _choose(self, ctx: _Ctx, rnd: Round) -> str | None:
        """The winner of a round (see :func:`tunecache.tuner.winner.choose`), launched from now on."""
        rows = {**rnd.known, **rnd.results}
        best = winner.choose(
            rows,
            ctx.hashes,
            self._tc_ks.problems(),
            digest=ctx.digest,
            target_digest=ctx.target.digest,
            tolerance=settings.get("TUNECACHE_WINNER_TOLERANCE"),
        )
        if best is not None:
            self._settle(ctx.key, dict(zip(ctx.hashes, ctx.configs))[best])
        return best

    def _bench_unstored(self, ctx: _Ctx, p: Problem | None, bench_fn: Callable[[], None], keep: bool = True) -> bool:
        """Tune in this process; with ``keep``, write the result once the store is back."""
        rnd = self._run_bench(self._new_round(ctx, p), bench_fn)
        best = self._choose(ctx, rnd)
        if keep:
            self._tc_ks.save_later(self._problem(ctx, rnd.seconds, best), rnd.rows(), p is not None)
        return False

    def _bench_and_store(self, ctx: _Ctx, store: Store, bench_fn: Callable[[], None], lease: Lease) -> bool:
        try:
            p = self._tc_ks.fetch_problem(store, ctx.digest)  # someone may have finished while we took the lease
        except StoreError as e:
            self._tc_ks.trouble("read", e)
            p = self._tc_ks.held(ctx.digest)
        if self._take_stored(ctx, p):
            return True
        rnd = self._new_round(ctx, p)
        with lease.kept():
            self._run_bench(rnd, bench_fn)
        if lease.lost.is_set() and self._use_theirs(ctx, store):
            return False
        best = self._choose(ctx, rnd)  # launched even if the store cannot take it
        problem = self._problem(ctx, rnd.seconds + (p.tuning_seconds if p else 0.0), best)
        results = rnd.rows()
        stored = self._tc_ks.save(store, problem, results, replace=p is not None)
        if stored is None:  # counted, warned about, written in the background
            return False
        self._use(ctx, stored, hit=False)
        self._record_specs(ctx, store, stored.winner_config_hash)
        return False

    def _use_theirs(self, ctx: _Ctx, store: Store) -> bool:
        """After losing the lease mid-benchmark: launch the result the new holder stored, if it
        covers this key, rather than overwrite the fleet's winner with ours."""
        try:
            q = self._tc_ks.fetch_problem(store, ctx.digest)
        except StoreError as e:
            self._tc_ks.trouble("read", e)
            return False
        return self._take_stored(ctx, q)

    def _take_stored(self, ctx: _Ctx, q: Problem | None) -> bool:
        """Launch ``q``, another process's result read from the store, if it covers this key."""
        if not self._covers(q, ctx):
            return False
        self._tc_ks.remember(q)
        self._use(ctx, q, hit=False)
        return True

    def _tc_record_uncovered(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Record the first key of a kernel tunecache could not serve as a miss with reason
        ``uncovered`` (``tunecache misses``, ``tunecache stats``), written in the background. Never raises."""
        try:
            mode = current_mode()
            if mode in ("off", "readonly") or len(self.configs) < 2:
                return
            self.nargs, self._tc_kwargs = dict(zip(self.arg_names, args)), dict(kwargs)
            try:
                ctx = self._context(self._tuning_key(args, kwargs), self.configs)
            finally:
                self.nargs = None
            problem = self._problem(ctx)
        except Exception as e:  # noqa: BLE001 - a report, never a failed launch
            log.debug("tunecache: %s: cannot record the uncovered key: %r", self._tc_name, e)
            return
        self._tc_ks.record_miss_later(problem, "uncovered")


def attach(tuner: Any) -> None:
    """Give an Autotuner that other code built tunecache's state, with ``cache_results`` as Triton set
    it for them (``install()`` adopting it: see :mod:`tunecache.tuner.adoption`)."""
    tuner._tc_attach(tuner.cache_results, None, None)


def detach(tuner: Any) -> None:
    """Undo what :func:`attach` set on the instance: its first-call ``run``, the ``kernel_name``
    tunecache gave it, and the user's ``cache_results``; a stored hit's ``configs_timings`` is
    built, so that it stays readable under Triton's class."""
    tuner.__dict__.pop("run", None)
    if "_tc_timings" in tuner.__dict__:  # Triton's class reads configs_timings from the instance only
        getattr(tuner, "configs_timings", None)
    if tuner.__dict__.get("kernel_name") == tuner._tc_name and tuner._tc_set_name:
        del tuner.__dict__["kernel_name"]
    tuner.cache_results = tuner._tc_user_cache_results


__all__ = [
    "BASE_INIT",
    "BASE_RUN",
    "TunecacheAutotuner",
    "attach",
    "detach",
]
