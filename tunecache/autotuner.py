"""Autotuner: a drop-in ``triton.autotune`` that reads the store before benchmarking.

``TunecacheAutotuner`` subclasses Triton's ``Autotuner`` and changes nothing on the launch path:
after a key is resolved, Triton's own ``run`` finds it in ``self.cache`` (a dict lookup) and
launches. Everything tunecache does happens on a miss, through the hooks that are stable from
Triton 3.4 to 3.9:

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

``run`` is wrapped, not copied, to recover from a stored winner that no longer compiles.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import statistics
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from triton.runtime.autotuner import Autotuner

from tunecache import binaries as _binaries
from tunecache import metrics as _stats
from tunecache import preload as _preload
from tunecache import settings, tritoncompat
from tunecache.errors import CaptureMissError, StoreError
from tunecache.identity import (
    CONFIG_FIELDS,
    KernelIdentity,
    Target,
    canonical_key,
    config_identity,
    detect_target,
    hostname,
    interpreting,
    kernel_identity,
    kernel_name,
    module_imported,
    problem_digest,
    search_space_hash,
)
from tunecache.model import ConfigResult, LaunchSpec, Problem, pick_winner
from tunecache.settings import current_mode
from tunecache.store import Store, shared_store

log = logging.getLogger("tunecache")


def lease_seconds() -> float:
    """How long a benchmark lease lives without renewal: a killed holder blocks others this long."""
    return settings.get("TUNECACHE_LEASE_SECONDS")


def wait_seconds() -> float:
    """How long a process waits for another's benchmark before benchmarking itself."""
    return settings.get("TUNECACHE_WAIT_SECONDS")


def winner_tolerance() -> float:
    """``TUNECACHE_WINNER_TOLERANCE`` (default 0.02): a config within this fraction of the fastest
    that already wins another key of the same kernel and target is chosen instead (0 disables).

    Why: configs that close are within benchmark noise; reusing a winner means fewer distinct
    kernels to compile on a fresh host and to load at a restart, and fewer winners that flip
    between two tuning runs of one GPU.
    """
    return settings.get("TUNECACHE_WINNER_TOLERANCE")


def preload_enabled() -> bool:
    """``TUNECACHE_PRELOAD`` (default on): load stored winners' binaries once CUDA is up."""
    return settings.get("TUNECACHE_PRELOAD")


def driver_change_policy() -> int | None:
    """``TUNECACHE_ON_DRIVER_CHANGE``: ``retune`` (None) or ``topk:N`` (N)."""
    return settings.get("TUNECACHE_ON_DRIVER_CHANGE")


def cpu_do_bench(kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5, 0.2, 0.8)) -> list[float]:
    """Wall-clock timer for the interpreter, where Triton's CUDA-event benchmarker cannot run."""
    kernel_call()  # warm-up (the interpreter rewrites the function on first use)
    reps = settings.get("TUNECACHE_CPU_BENCH_REPS")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kernel_call()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return [_quantile(times, q) for q in quantiles]


def _quantile(xs: list[float], q: float) -> float:
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


def _capturing() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a broken CUDA context is not a capture
        return False


def _classify(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """Map an exception from compiling or launching a config to (status, failure detail)."""
    name = type(exc).__name__
    if name == "OutOfResources":
        return "out_of_resources", {
            "error": name,
            "resource": getattr(exc, "name", None),
            "required": getattr(exc, "required", None),
            "limit": getattr(exc, "limit", None),
            "message": str(exc)[:500],
        }
    if name in ("CompilationError", "CompileTimeAssertionFailure", "PTXASError", "UnsupportedLanguageConstruct"):
        return "compile_error", {"error": name, "message": str(exc)[:2000]}
    return "runtime_error", {"error": name, "message": str(exc)[:2000]}


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(kernel: str, what: str, msg: str, *args: Any) -> None:
    with _warned_lock:
        if (kernel, what) in _warned:
            return
        _warned.add((kernel, what))
    log.warning(msg, *args)


class _Ctx:
    """Everything about one miss: computed once per new tuning key, never on the launch path."""

    __slots__ = ("key", "names", "values", "key_json", "digest", "bucket", "target", "hashes", "configs")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class TunecacheAutotuner(Autotuner):
    """Triton's Autotuner, backed by a shared store of results."""

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
        self._tc_store_arg = store
        self._tc_store: Store | None = None
        self._tc_store_retry_at = 0.0
        self._tc_unsaved: list[tuple[Problem, list[ConfigResult], bool]] = []
        self._tc_name = kernel_name(fn)  # no parsing: the source is hashed later (see identity)
        self._tc_identity: KernelIdentity | None = None
        self._tc_identity_lock = threading.Lock()
        self._tc_mem: dict[str, Problem] = {}
        self._tc_prefetched = False  # the kernel's problems (every target) were fetched
        self._tc_pending: list[Problem] | None = None  # fetched by name, not yet filtered by source hash
        self._tc_kwargs: dict[str, Any] = {}
        self._tc_known: dict[str, ConfigResult] = {}
        self._tc_results: dict[str, ConfigResult] = {}
        self._tc_failure: tuple[str, dict[str, Any]] | None = None
        self._tc_samples = 0
        self._tc_hash_of: dict[tuple, tuple[Any, tuple[str, str]]] = {}  # config value -> (pre_hook, identity)
        self._tc_from_store: dict[Any, tuple[str, str]] = {}  # tuning key -> (digest, config hash)
        self._tc_lock = threading.RLock()
        self._tc_opening: tuple[int, Future] | None = None
        self._tc_specs: dict[str, list[LaunchSpec]] | None = None  # fetched, by target digest
        self._tc_autoload = False  # load_winners() once CUDA is up (see _preload_when_cuda_is_up)
        _tuners.add(self)
        if current_mode() != "off" and settings.get("TUNECACHE_PREFETCH"):
            # Open the store and fetch this kernel's problems while the server loads its weights,
            # so the first launch pays no query, imports or connection set-up. No CUDA calls here:
            # a server may still fork. The source is hashed no earlier than the first launch unless
            # its module finished importing (a @jit helper below the kernel does not exist yet).
            if _AST_NOT_THREAD_SAFE and module_imported(fn):
                self.identity  # noqa: B018 - hashed here, so that no other thread parses source
            self._tc_opening = (os.getpid(), _background(self._open_early))
            _warm_triton_key()
            if preload_enabled() and not interpreting() and not _AST_NOT_THREAD_SAFE:
                # (On 3.11 a background preload could parse source, racing the launching thread.)
                _preload_when_cuda_is_up(self)

    def _open_early(self) -> None:
        """Background: open the store, prefetch every problem of this kernel (all targets: the
        target needs CUDA, which must not be touched before a server forks); hash the source only
        if its module finished importing, and never on 3.11 (see ``_AST_NOT_THREAD_SAFE``)."""
        with contextlib.suppress(Exception):
            arg = self._tc_store_arg
            store = arg if isinstance(arg, Store) else shared_store(arg)
            if self._tc_identity is None and not _AST_NOT_THREAD_SAFE and module_imported(self.fn):
                self.identity  # noqa: B018
            self._fetch_problems(store)
            if self._tc_identity is not None:
                self._tc_specs = store.get_specs(self._tc_identity.source_hash)
                _binaries.place_for(store, self._tc_specs)  # before any compile: Triton finds them

    def _fetch_problems(self, store: Store) -> None:
        """Every problem of this kernel (all targets) into memory, in one query, once. Raises
        StoreError. Before the source is hashed: every version of the kernel, by name, kept aside
        until :meth:`_absorb` keeps those of this source."""
        if self._tc_prefetched:
            return
        ident = self._tc_identity
        if ident is None:
            self._tc_pending = store.get_kernel_problems(self._tc_name)
        else:
            self._tc_pending = store.get_many(ident.source_hash)
        self._tc_prefetched = True
        if ident is not None:
            self._absorb()

    def _absorb(self) -> None:
        """Move the prefetched rows of this source into memory (computes the source hash). Rows
        this process already holds are kept: they are at least as fresh."""
        rows = self._tc_pending
        if rows is None:
            return
        h = self.identity.source_hash
        for q in rows:
            if q.source_hash == h:
                self._tc_mem.setdefault(q.digest, q)
        self._tc_pending = None

    # ---- preloading the winners' binaries ---------------------------------------------------------

    def load_winners(self, device: int | None = None) -> int:
        """Load this kernel's stored winners for ``device`` (default: the current one) into
        Triton's kernel cache; returns how many binaries were loaded. Never raises."""
        try:
            import torch

            dev = int(device) if device is not None else torch.cuda.current_device() if torch.cuda.is_available() else 0
            if self._tc_identity is None and not self._may_hash_here():
                return 0  # the first launch loads its kernel as before
            target = detect_target(device)  # device None: also warms the launch's own lookup
            if self._tc_specs is None:  # the prefetch was off, failed, or ran before the hash
                store = self._store()
                if store is None:
                    return 0
                self._fetch_problems(store)
                self._tc_specs = store.get_specs(self.identity.source_hash)
                _binaries.place_for(store, self._tc_specs)
            self._absorb()
            mine = self._tc_specs.get(target.digest, [])
            if not mine:
                return 0
            winners = {p.winner_config_hash for p in list(self._tc_mem.values()) if p.target.digest == target.digest}
            loaded, skipped = _preload.load(self.fn, [s for s in mine if s.config_hash in winners], dev)
        except Exception as e:  # noqa: BLE001 - best effort: launches load their kernels as before
            log.debug("tunecache: %s: preload failed: %r", self.kernel_name, e)
            return 0
        _stats.count(None, None, preloaded=loaded, preload_skipped=skipped)
        if loaded or skipped:
            log.debug("tunecache: %s: preloaded %d binaries (%d skipped)", self.kernel_name, loaded, skipped)
        return loaded

    def _record_specs(self, ctx: _Ctx, store: Store, winner: str | None) -> None:
        """After a benchmark: store what Triton compiled the winner with, for later preloads
        (an idempotent write: specs other keys recorded already are kept)."""
        config = dict(zip(ctx.hashes, ctx.configs)).get(winner) if winner else None
        if config is None or store.readonly:
            return
        specs = _preload.capture(self.fn, config, winner)
        try:
            store.put_specs(self.kernel_name, self.identity.source_hash, ctx.target.digest, specs)
            _binaries.upload(store, self.fn, self.kernel_name, self.identity.source_hash, specs)
        except StoreError as e:
            self._store_trouble("write", e)

    def reset(self, store: str | Store | None = None) -> None:
        """Forget every in-memory resolution and bind to ``store`` (default: the environment's) anew.

        For tests and for a process that changes ``TUNECACHE_URL`` after its kernels were defined.
        """
        self.cache.clear()
        self._tc_mem.clear()
        self._tc_prefetched = False
        self._tc_pending = None
        self._tc_specs = None
        self._tc_from_store.clear()
        self._tc_store_arg = store
        self._tc_store = None
        self._tc_opening = None
        self._tc_store_retry_at = 0.0

    # ---- identity ---------------------------------------------------------------------------

    @property
    def kernel_name(self) -> str:
        return self._tc_name

    def _may_hash_here(self) -> bool:
        """Whether this thread may hash the source now, before the first launch: only once the
        module finished importing, and on 3.11 only on the main thread (see _AST_NOT_THREAD_SAFE)."""
        if _AST_NOT_THREAD_SAFE and threading.current_thread() is not threading.main_thread():
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

    def _config_id(self, config: Any) -> tuple[str, str]:
        """(JSON, hash) of a config, memoised by the config's VALUE: ``early_config_prune`` may build
        fresh Config objects at the addresses of freed ones. The pre_hook enters by ``id``; the memo
        holds the hook itself, so that id is not reused while the entry lives. Bounded."""
        hook = getattr(config, "pre_hook", None)
        try:
            vkey = (
                tuple(sorted(config.kwargs.items())),
                tuple(getattr(config, f, None) for f in CONFIG_FIELDS),
                getattr(config, "ir_override", None),
                id(hook) if hook is not None else None,
            )
            memo = self._tc_hash_of.get(vkey)
        except TypeError:  # an unhashable kwarg: config_identity names it
            return config_identity(config)
        if memo is not None:
            return memo[1]
        ident = config_identity(config)
        if len(self._tc_hash_of) >= _CONFIG_MEMO_MAX:
            self._tc_hash_of.clear()
        self._tc_hash_of[vkey] = (hook, ident)
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
            hashes=[self._config_id(c)[1] for c in configs],
            configs=list(configs),
        )

    # ---- store access -------------------------------------------------------------------------

    def _store(self) -> Store | None:
        if self._tc_store is not None:
            return self._tc_store
        if self._tc_opening is not None:
            pid, fut = self._tc_opening
            self._tc_opening = None
            if pid == os.getpid():  # after a fork the parent's thread is gone: open here instead
                with contextlib.suppress(Exception):
                    fut.result(timeout=60)
        if time.monotonic() < self._tc_store_retry_at:
            return None
        try:
            arg = self._tc_store_arg
            self._tc_store = arg if isinstance(arg, Store) else shared_store(arg)
        except StoreError as e:
            self._store_trouble("open", e)
            self._tc_store_retry_at = time.monotonic() + 30.0
            return None
        if not self._tc_store.readonly:
            for item in self._tc_unsaved:  # tuned while the store was down
                _stats.defer_put(self._tc_store, *item)
        self._tc_unsaved.clear()
        return self._tc_store

    def _store_trouble(self, what: str, e: Exception) -> None:
        _stats.count(None, None, store_errors=1)
        # One warning per store and process: an outage fails reads, leases and writes alike, and
        # every kernel on that store falls back the same way (each failure is counted in stats()).
        arg = self._tc_store_arg
        where = arg.masked_url if isinstance(arg, Store) else str(arg or settings.raw("TUNECACHE_URL") or "")
        _warn_once(
            "",
            f"store-unavailable:{where}",
            "tunecache: %s: store unavailable (%s); tuning in this process instead",
            self.kernel_name,
            e,
        )

    def _lookup(self, ctx: _Ctx) -> Problem | None:
        """In memory first (prefetched in one query per kernel); else one query for this digest."""
        store = self._store()  # joins the background prefetch
        self._absorb()
        p = self._tc_mem.get(ctx.digest)
        if p is not None or store is None:
            return p
        try:
            if not self._tc_prefetched:
                self._fetch_problems(store)
                self._absorb()
                p = self._tc_mem.get(ctx.digest)
            else:
                p = store.get(ctx.digest)  # tuned by another process since the prefetch?
        except StoreError as e:
            self._store_trouble("read", e)
            return None
        if p is not None:
            self._tc_mem[p.digest] = p
        return p

    # ---- the hooks ------------------------------------------------------------------------------

    def prune_configs(self, kwargs: dict) -> list:
        self._tc_kwargs = kwargs
        return super().prune_configs(kwargs)

    @property
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

        def counted() -> Any:
            self._tc_samples += 1
            return kernel_call()

        try:
            return base(counted, *args, **kwargs)
        except Exception as e:
            self._tc_failure = _classify(e)
            raise

    def _bench(self, *args: Any, config: Any, **meta: Any) -> list[float]:
        config_json, h = self._config_id(config)
        known = self._tc_known.get(h)
        if known is not None:
            return known.timings()
        self._tc_failure = None
        self._tc_samples = 0
        t0 = time.perf_counter()
        try:
            timings = super()._bench(*args, config=config, **meta)
        except Exception as e:  # noqa: BLE001 - a config that fails is a result, not a crash
            self._tc_failure = self._tc_failure or _classify(e)
            timings = [float("inf")] * 3
        elapsed = time.perf_counter() - t0
        if not isinstance(timings, (list, tuple)):
            timings = [float(timings)] * 3
        timings = [float(t) for t in timings] + [float(timings[0])] * (3 - len(timings))
        cfg = orjson.loads(config_json)
        if self._tc_failure is not None or timings[0] == float("inf"):
            status, failure = self._tc_failure or ("compile_error", {"error": "unknown", "message": "timing inf"})
            result = ConfigResult(h, cfg, status=status, failure=failure, samples=self._tc_samples)
        else:
            result = ConfigResult(
                h, cfg, median_ms=timings[0], p20_ms=timings[1], p80_ms=timings[2], samples=self._tc_samples
            )
        self._tc_results[h] = result
        _stats.count(self.kernel_name, self._tc_store, benchmarks=1, bench_seconds=elapsed)
        return timings[:3]

    def check_disk_cache(self, tuning_key: Any, configs: list, bench_fn: Callable[[], None]) -> bool:
        mode = current_mode()
        if mode == "off":
            if self._tc_user_cache_results:
                return super().check_disk_cache(tuning_key, configs, bench_fn)
            bench_fn()
            return False
        if len(configs) == 1:
            # Nothing to choose (Triton 3.8+ does the same before calling us): never benchmark.
            self.cache[tuning_key] = configs[0]
            return True
        ctx = self._context(tuning_key, configs)
        with self._tc_lock:
            return self._resolve(ctx, mode, bench_fn)

    # ---- resolution -------------------------------------------------------------------------------

    def _covers(self, p: Problem | None, ctx: _Ctx) -> bool:
        if p is None:
            return False
        stored = p.config_map()
        return all(h in stored for h in ctx.hashes)

    def _use(self, ctx: _Ctx, p: Problem, *, hit: bool) -> None:
        """Launch the stored winner: the same config on every worker of the fleet."""
        rows = p.config_map()
        by_hash = dict(zip(ctx.hashes, ctx.configs))
        if p.winner_config_hash in by_hash:
            win = p.winner_config_hash
        else:  # configs were removed since: best stored among the current ones
            best = pick_winner(rows[h] for h in ctx.hashes if h in rows)
            win = best.config_hash if best else ctx.hashes[0]
        self.cache[ctx.key] = by_hash[win]
        self.configs_timings = {c: rows[h].timings() for h, c in by_hash.items() if h in rows}
        self._tc_from_store[ctx.key] = (p.digest, win)
        if hit:
            _stats.count(self.kernel_name, self._tc_store, hits=1, saved_seconds=p.tuning_seconds or 0.0)
            _stats.hit(self._tc_store, p.digest)

    def _problem(self, ctx: _Ctx, seconds: float = 0.0, winner: str | None = None) -> Problem:
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
            winner_config_hash=winner,
        )

    def _resolve(self, ctx: _Ctx, mode: str, bench_fn: Callable[[], None]) -> bool:
        p = self._lookup(ctx)
        if self._covers(p, ctx):
            self._use(ctx, p, hit=True)
            return True
        capturing = _capturing()
        if capturing or mode == "offline":
            return self._fallback(ctx, "capture" if capturing else "offline", mode)
        _stats.count(self.kernel_name, self._tc_store, misses=1)
        store = self._store()
        if mode == "readonly" or store is None or store.readonly:
            return self._bench_unstored(ctx, p, bench_fn, keep=mode != "readonly" and store is None)
        return self._single_flight(ctx, p, store, bench_fn)

    def _fallback(self, ctx: _Ctx, reason: str, mode: str) -> bool:
        """No benchmark now: nearest stored bucket's winner, else the first config. Deterministic."""
        if reason == "capture" and mode == "strict":
            raise CaptureMissError(self.kernel_name, dict(zip(ctx.names, ctx.values)))
        cfg = self._nearest(ctx)
        self.cache[ctx.key] = cfg
        _stats.count(self.kernel_name, None, **{f"{reason}_fallbacks": 1})
        _warn_once(
            self.kernel_name,
            reason,
            "tunecache: %s: no stored config for %s during %s; using %s without benchmarking. "
            "Run `tunecache misses` and tune these keys before the next start.",
            self.kernel_name,
            ctx.key_json,
            "CUDA graph capture" if reason == "capture" else "offline mode",
            cfg,
        )
        store = self._store()
        if store is not None and not store.readonly:
            try:
                store.record_miss(self._problem(ctx), reason)
            except StoreError as e:
                self._store_trouble("write", e)
        return True

    def _nearest(self, ctx: _Ctx) -> Any:
        by_hash = dict(zip(ctx.hashes, ctx.configs))
        bi = next((i for i, n in enumerate(ctx.names) if n in self._tc_bucket), None)
        best: tuple[Any, ...] | None = None
        for p in self._tc_mem.values():
            if p.target.digest != ctx.target.digest or p.winner_config_hash not in by_hash:
                continue
            try:
                other = [v for _, v in orjson.loads(p.key_json)]
            except ValueError:
                continue
            if len(other) != len(ctx.values):
                continue
            same_rest = all(a == b for i, (a, b) in enumerate(zip(other, ctx.values)) if i != bi)
            dist = abs(other[bi] - ctx.values[bi]) if bi is not None and isinstance(other[bi], int) else 0
            rank = (0 if same_rest else 1, dist, other[bi] if bi is not None else 0, p.digest)
            if best is None or rank < best[0]:
                best = (rank, by_hash[p.winner_config_hash])
        return best[1] if best else ctx.configs[0]

    def _prepare_known(self, ctx: _Ctx, p: Problem | None) -> dict[str, ConfigResult]:
        known = {h: r for h, r in (p.config_map().items() if p else ()) if h in ctx.hashes}
        if p is None:
            known.update(self._driver_change_prune(ctx))
        return known

    def _driver_change_prune(self, ctx: _Ctx) -> dict[str, ConfigResult]:
        """``topk:N``: after a driver change, benchmark only the N best configs of the old driver."""
        n = driver_change_policy()
        store = self._tc_store
        if n is None or store is None:
            return {}
        t = ctx.target
        try:
            olds = [
                q
                for q in store.list(
                    with_configs=True,
                    source_hash=self.identity.source_hash,
                    key_json=ctx.key_json,
                    arch=t.arch,
                    device=t.device_name,
                )
                if q.target.driver_version != t.driver_version or q.target.driver_release != t.driver_release
            ]
        except StoreError as e:
            self._store_trouble("read", e)
            return {}
        olds = [
            q
            for q in olds
            if {k: v for k, v in q.target.digest_fields().items() if not k.startswith("driver")}
            == {k: v for k, v in t.digest_fields().items() if not k.startswith("driver")}
        ]
        if not olds:
            return {}
        old = max(olds, key=lambda q: (q.updated_at or 0, q.digest))
        ranked = sorted(
            (r for r in old.configs if r.ok and r.config_hash in ctx.hashes), key=lambda r: (r.median_ms, r.config_hash)
        )
        keep = {r.config_hash for r in ranked[:n]}
        if not keep:
            return {}
        skip = {}
        for h in ctx.hashes:
            if h in keep:
                continue
            prev = old.config_map().get(h)
            if prev is not None and not prev.ok:
                skip[h] = prev  # failed before: stays failed, no compile
            else:
                skip[h] = ConfigResult(
                    h,
                    {},
                    status="pruned",
                    failure={
                        "reason": f"TUNECACHE_ON_DRIVER_CHANGE=topk:{n}: not among the {n} best configs stored for "
                        f"driver {old.target.driver_release or old.target.driver_version}"
                    },
                )
        log.info(
            "tunecache: %s: driver changed; re-checking %d of %d configs", self.kernel_name, len(keep), len(ctx.hashes)
        )
        return skip

    def _run_bench(
        self, ctx: _Ctx, known: dict[str, ConfigResult], bench_fn: Callable[[], None]
    ) -> tuple[list[ConfigResult], float]:
        self._tc_known = known
        self._tc_results = {}
        t0 = time.perf_counter()
        try:
            bench_fn()
        finally:
            self._tc_known = {}
        seconds = time.perf_counter() - t0
        new = dict(self._tc_results)
        for h, r in known.items():  # rows made up by the driver-change policy are stored too
            if h not in new and r.status == "pruned" and not r.config:
                new[h] = ConfigResult(h, _config_json(self, ctx, h), status="pruned", failure=r.failure)
        return list(new.values()), seconds

    def _single_flight(self, ctx: _Ctx, p: Problem | None, store: Store, bench_fn: Callable[[], None]) -> bool:
        """Exactly one process per digest benchmarks, on this host (filelock) and across hosts (lease row)."""
        holder = f"{hostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        ttl = lease_seconds()
        deadline = time.monotonic() + wait_seconds()
        flock = _host_lock(store, ctx.digest)
        waited = False
        poll = 0.05
        while True:
            got_host = flock is None or _try_acquire(flock)
            if got_host:
                try:
                    if store.try_lease(ctx.digest, holder, ttl):
                        try:
                            return self._bench_and_store(ctx, store, bench_fn, holder, ttl)
                        finally:
                            with contextlib.suppress(StoreError):
                                store.release_lease(ctx.digest, holder)
                except StoreError as e:
                    self._store_trouble("lease", e)
                    return self._bench_unstored(ctx, p, bench_fn)
                finally:
                    if flock is not None:
                        flock.release()
            if not waited:
                waited = True
                _stats.count(None, None, waits=1)
                log.info("tunecache: %s: another process is benchmarking %s; waiting", self.kernel_name, ctx.key_json)
            time.sleep(poll)
            poll = min(poll * 1.5, 0.5)
            try:
                q = store.get(ctx.digest)
            except StoreError as e:
                self._store_trouble("read", e)
                return self._bench_unstored(ctx, p, bench_fn)
            if self._covers(q, ctx):
                self._tc_mem[q.digest] = q
                self._use(ctx, q, hit=False)
                return True
            if time.monotonic() > deadline:
                _warn_once(
                    self.kernel_name,
                    "wait-timeout",
                    "tunecache: %s: waited %.0fs for another process's benchmark of %s; benchmarking here",
                    self.kernel_name,
                    wait_seconds(),
                    ctx.key_json,
                )
                return self._bench_and_store(ctx, store, bench_fn, None, ttl)

    def _choose(self, ctx: _Ctx, known: dict[str, ConfigResult], results: list[ConfigResult]) -> str | None:
        """The winner among this key's configs: the fastest, or a config within
        ``winner_tolerance()`` of it that already wins more keys of this kernel on this target."""
        rows = {**known, **{r.config_hash: r for r in results}}
        counts: dict[str, int] = {}
        for q in list(self._tc_mem.values()):
            if q.digest != ctx.digest and q.winner_config_hash and q.target.digest == ctx.target.digest:
                counts[q.winner_config_hash] = counts.get(q.winner_config_hash, 0) + 1
        prefer = sorted(counts, key=lambda h: (-counts[h], h))
        best = pick_winner((rows[h] for h in ctx.hashes if h in rows), prefer, winner_tolerance())
        if best is None:
            return None
        self.cache[ctx.key] = dict(zip(ctx.hashes, ctx.configs))[best.config_hash]
        return best.config_hash

    def _bench_unstored(self, ctx: _Ctx, p: Problem | None, bench_fn: Callable[[], None], keep: bool = True) -> bool:
        """Tune in this process; with ``keep``, write the result once the store is back."""
        known = self._prepare_known(ctx, p)
        results, seconds = self._run_bench(ctx, known, bench_fn)
        winner = self._choose(ctx, known, results)
        if keep:
            item = (self._problem(ctx, seconds, winner), results, p is not None)
            if self._tc_store is not None:
                _stats.defer_put(self._tc_store, *item)
            else:
                self._tc_unsaved.append(item)
        return False

    def _bench_and_store(
        self, ctx: _Ctx, store: Store, bench_fn: Callable[[], None], holder: str | None, ttl: float
    ) -> bool:
        try:
            p = store.get(ctx.digest)  # someone may have finished while we took the lease
        except StoreError as e:
            self._store_trouble("read", e)
            p = self._tc_mem.get(ctx.digest)
        if self._covers(p, ctx):
            self._tc_mem[p.digest] = p
            self._use(ctx, p, hit=False)
            return True
        stop, lost = threading.Event(), threading.Event()
        if holder is not None:
            args = (store, ctx.digest, holder, ttl, stop, lost, self.kernel_name)
            threading.Thread(target=_heartbeat, args=args, daemon=True).start()
        known = self._prepare_known(ctx, p)
        try:
            results, seconds = self._run_bench(ctx, known, bench_fn)
        finally:
            stop.set()
        if holder is not None and not lost.is_set():
            _renew(store, ctx.digest, holder, ttl, lost, self.kernel_name)  # taken since the last beat?
        if lost.is_set() and self._use_theirs(ctx, store):
            return False
        winner = self._choose(ctx, known, results)
        problem = self._problem(ctx, seconds + (p.tuning_seconds if p else 0.0), winner)
        try:
            stored = store.put(problem, results, replace=p is not None)
        except StoreError as e:
            self._store_trouble("write", e)
            _stats.defer_put(store, problem, results, p is not None)
            return False  # _choose already set self.cache[key] to the local winner
        self._tc_mem[stored.digest] = stored
        self._use(ctx, stored, hit=False)
        self._record_specs(ctx, store, stored.winner_config_hash)
        return False

    def _use_theirs(self, ctx: _Ctx, store: Store) -> bool:
        """After losing the lease mid-benchmark: launch the result the new holder stored, if it
        covers this key, rather than overwrite the fleet's winner with ours."""
        try:
            q = store.get(ctx.digest)
        except StoreError as e:
            self._store_trouble("read", e)
            return False
        if not self._covers(q, ctx):
            return False
        self._tc_mem[q.digest] = q
        self._use(ctx, q, hit=False)
        return True

    # ---- a stored winner that no longer works ---------------------------------------------------

    def run(self, *args: Any, **kwargs: Any) -> Any:
        # Triton sets best_config just before it launches: None after a failure means the call
        # failed earlier (pruning, benchmarking, a bad argument), and no stored winner is to blame.
        previous, self.best_config = getattr(self, "best_config", None), None
        try:
            return super().run(*args, **kwargs)
        except Exception as e:
            launched = self.best_config
            if launched is None:
                self.best_config = previous
                raise
            if not self._tc_from_store or not type(e).__module__.startswith("triton"):
                raise
            key = self._tuning_key(args, kwargs)
            if key not in self._tc_from_store or self.cache.get(key) is not launched:
                raise
            self._poisoned([key], e)
        return super().run(*args, **kwargs)

    def _tuning_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
        """The tuning key ``Autotuner.run`` built for this call (the same steps in 3.4-3.9); used
        only after a failed launch, to blame that key's stored winner and no other."""
        all_args = {**dict(zip(self.arg_names, args)), **kwargs}
        _args = {k: v for k, v in all_args.items() if k in self.arg_names}
        key = [_args[k] for k in self.keys if k in _args]
        key += [str(v.dtype) for v in _args.values() if hasattr(v, "dtype")]
        return tuple(key)

    def _poisoned(self, keys: list[Any], exc: Exception) -> None:
        status, failure = _classify(exc)
        for k in keys:
            digest, h = self._tc_from_store.pop(k)
            self.cache.pop(k, None)
            p = self._tc_mem.pop(digest, None)
            if p is not None:
                r = p.config_map().get(h)
                if r is not None:
                    r.status, r.failure, r.median_ms = status, failure, None
                    best = pick_winner(p.configs)
                    p.winner_config_hash = best.config_hash if best else None
                    self._tc_mem[digest] = p
            _stats.count(None, None, poisoned=1)
            log.warning(
                "tunecache: %s: stored winner %s failed on this target (%s: %s); marked %s and re-resolving",
                self.kernel_name,
                h[:12],
                type(exc).__name__,
                str(exc)[:200],
                status,
            )
            store = self._store()
            if store is not None and not store.readonly:
                try:
                    store.mark_config(digest, h, status, failure)
                except StoreError as e:
                    self._store_trouble("write", e)


def _config_json(tuner: TunecacheAutotuner, ctx: _Ctx, h: str) -> dict[str, Any]:
    for c, ch in zip(ctx.configs, ctx.hashes):
        if ch == h:
            return orjson.loads(tuner._config_id(c)[0])
    return {}


_CONFIG_MEMO_MAX = 4096  # config identities memoised per kernel (a prune may build configs without end)

_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_pool_lock = threading.Lock()
_tuners: weakref.WeakSet[TunecacheAutotuner] = weakref.WeakSet()


def _background(fn: Callable[[], Any]) -> Future:
    """One worker thread per process, jobs in order (a preload runs after its kernel's prefetch).
    A forked child gets its own: the parent's thread does not exist there."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunecache")
            _pool_pid = os.getpid()
        return _pool.submit(fn)


_autoload_pid: int | None = None  # the process whose torch queue holds _load_when_cuda_is_up


def _preload_when_cuda_is_up(tuner: TunecacheAutotuner) -> None:
    """Have ``tuner``'s winners loaded in the background once CUDA is initialised: one callback per
    process on torch's lazy-init queue covers every kernel defined before that; a kernel defined
    after it is queued at once."""
    global _autoload_pid
    tuner._tc_autoload = True
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        with _pool_lock:
            if _autoload_pid == os.getpid():
                return
            _autoload_pid = os.getpid()
    _preload.on_cuda_init(_load_when_cuda_is_up)  # runs it now if CUDA is up already


def _load_when_cuda_is_up() -> None:
    """Queue, behind the prefetches, the preload of every kernel marked for it. Only where the
    device is unambiguous: with several visible GPUs the device a worker will use is not known
    yet, and it calls ``tunecache.load_winners()`` itself."""
    import torch

    if torch.cuda.device_count() != 1:
        return
    todo = [t for t in list(_tuners) if t._tc_autoload]
    for t in todo:
        t._tc_autoload = False  # once: a kernel defined later is queued by itself
    _background(lambda: sum(t.load_winners() for t in todo))  # the worker's current device is that one


def load_winners(device: int | None = None) -> int:
    """Load the stored winners' binaries of every tunecache kernel defined so far onto ``device``
    (default: the current one); returns how many were loaded.

    With one visible GPU this happens by itself in the background once CUDA is initialised. A
    process that sees several GPUs calls it after ``torch.cuda.set_device`` (it may run in a
    thread while weights load). Never raises: whatever is not loaded here loads at its launch.
    """
    return sum(t.load_winners(device) for t in list(_tuners))


# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread:
# ast.parse in two threads at once can raise "SystemError: AST constructor recursion depth mismatch"
# in either of them (reproduced here on 3.11.7, not on 3.10, 3.12 or 3.13; CPython gh-106905).
# There the source is hashed on the thread that defines the kernel (a few ms per kernel at import)
# and the background work is store I/O only, so it never races Triton's own parse of a kernel.
_AST_NOT_THREAD_SAFE = sys.version_info[:2] == (3, 11)

_key_thread: threading.Thread | None = None
_key_pid: int | None = None  # the process that started it: a forked child starts its own


def _warm_triton_key() -> None:
    """Once per process, in a daemon thread: compute Triton's compiler fingerprint (``triton_key``).

    Triton computes it at the first compile of every process, cache hits included, by hashing its
    own sources and libtriton (0.33 s on the H200 test host, most of a warm restart's first launch).
    Done while the server is still loading weights, it is off the first launch. Pure file hashing:
    no CUDA. A fork waits (at most 2 s) for it, so that no import lock is held across the fork.
    """
    global _key_thread, _key_pid
    with _pool_lock:
        if _key_pid == os.getpid():
            return
        triton_key = tritoncompat.triton_key()  # moved in 3.5; tests/test_triton_names.py checks it resolves
        if triton_key is None:
            return

        def work() -> None:
            with contextlib.suppress(Exception):
                triton_key()

        _key_pid = os.getpid()
        _key_thread = threading.Thread(target=work, name="tunecache-triton-key", daemon=True)
        _key_thread.start()


def _join_key_thread_before_fork() -> None:
    t = _key_thread
    if t is not None and t.is_alive():
        t.join(timeout=2.0)


def _after_fork_in_child() -> None:
    """Fresh locks and background state in a forked child (the parent's threads do not exist there).

    A lock a parent's thread held at the fork (the prefetch hashing a kernel, the pool submitting a
    job, a launch resolving a key) would stay taken forever. The parent's pending prefetches are
    not the child's to wait for, and its stores are the parent's connections: each tuner opens its
    store again (a Store the user passed gets an empty pool in store.py's own fork handler). What
    the parent resolved before the fork stays: a child that launches a warmed key does no I/O.
    """
    global _pool, _pool_pid, _pool_lock, _warned_lock
    _pool_lock = threading.Lock()
    _warned_lock = threading.Lock()
    _pool, _pool_pid = None, None
    for t in list(_tuners):
        t._tc_identity_lock = threading.Lock()
        t._tc_lock = threading.RLock()
        t._tc_opening = None
        t._tc_unsaved = []  # the parent's results, for the parent to write
        t._tc_store_retry_at = 0.0
        if not isinstance(t._tc_store_arg, Store):
            t._tc_store = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_join_key_thread_before_fork, after_in_child=_after_fork_in_child)


def _heartbeat(
    store: Store, digest: str, holder: str, ttl: float, stop: threading.Event, lost: threading.Event, kernel: str
) -> None:
    """Renew the benchmark lease every ttl/3 until ``stop``; stop renewing once it is lost."""
    while not stop.wait(max(ttl / 3.0, 0.05)):
        if not _renew(store, digest, holder, ttl, lost, kernel):
            return


def _renew(store: Store, digest: str, holder: str, ttl: float, lost: threading.Event, kernel: str) -> bool:
    """Renew the lease; False once another process holds it (it judged ours expired or its holder
    dead): then ``lost`` is set, counted and warned about once per kernel. A failed renewal (store
    down) is not a loss: the lease may still be ours."""
    try:
        if store.renew_lease(digest, holder, ttl):
            return True
    except StoreError:
        log.debug("tunecache: lease renewal failed", exc_info=True)
        return True
    lost.set()
    _stats.count(None, None, leases_lost=1)
    _warn_once(
        kernel,
        "lease-lost",
        "tunecache: %s: lost the benchmark lease of %s to another process (renewals later than "
        "TUNECACHE_LEASE_SECONDS?); finishing this benchmark, then launching that process's result if it stored one",
        kernel,
        digest[:12],
    )
    return False


def _lock_dir(store: Store) -> Path | None:
    base = settings.get("TUNECACHE_LOCK_DIR")
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("tunecache")
    d = Path(base) / "locks" / hashlib.sha256(str(store.url).encode()).hexdigest()[:16]
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return d if os.access(d, os.W_OK) else None


@functools.lru_cache(maxsize=64)
def _lock_dir_cached(store: Store) -> Path | None:
    return _lock_dir(store)


def _host_lock(store: Store, digest: str) -> Any:
    """A per-digest file lock: the OS drops it when its holder dies, even by kill -9."""
    d = _lock_dir_cached(store)
    if d is None:
        return None
    from filelock import FileLock

    return FileLock(str(d / f"{digest[:32]}.lock"))


def _try_acquire(lock: Any) -> bool:
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
        return True
    except Timeout:
        return False
    except OSError:
        return True  # no usable lock file: the lease row still serialises


def autotune(
    configs: Any,
    key: Sequence[str],
    prune_configs_by: Any = None,
    reset_to_zero: Any = None,
    restore_value: Any = None,
    pre_hook: Any = None,
    post_hook: Any = None,
    warmup: Any = None,
    rep: Any = None,
    use_cuda_graph: bool = False,
    do_bench: Any = None,
    cache_results: bool = False,
    *,
    store: str | Store | None = None,
    bucket: Mapping[str, Callable[[int], int]] | None = None,
) -> Callable[[Any], Any]:
    """``triton.autotune`` with a shared store behind it. Same arguments, plus:

    store: a SQLAlchemy URL or a :class:`Store` (default: ``TUNECACHE_URL`` or the per-user SQLite).
    bucket: ``{"B": tunecache.buckets.sglang}`` puts the batch bucket of argument ``B`` in the tuning
        key while the kernel still receives the real ``B``.
    """

    def decorator(fn: Any) -> Any:
        kw = dict(
            prune_configs_by=prune_configs_by,
            warmup=warmup,
            rep=rep,
            use_cuda_graph=use_cuda_graph,
            do_bench=do_bench,
            cache_results=cache_results,
            pre_hook=pre_hook,
            post_hook=post_hook,
        )
        if current_mode() == "off":
            return Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value, **kw)
        return TunecacheAutotuner(
            fn, fn.arg_names, configs, key, reset_to_zero, restore_value, **kw, store=store, bucket=bucket
        )

    return decorator


_originals: dict[str, Any] = {}


def install() -> None:
    """Make ``triton.autotune`` build tunecache autotuners, so unmodified third-party kernels
    decorated after this call use the store. Idempotent."""
    import triton
    import triton.runtime
    import triton.runtime.autotuner as at

    if _originals:
        return
    _originals.update(triton=triton.autotune, runtime=triton.runtime.autotune, autotuner=at.autotune)
    triton.autotune = autotune
    triton.runtime.autotune = autotune
    at.autotune = autotune


def uninstall() -> None:
    """Undo :func:`install`; kernels decorated meanwhile keep their tunecache autotuner."""
    import triton
    import triton.runtime
    import triton.runtime.autotuner as at

    if not _originals:
        return
    triton.autotune = _originals["triton"]
    triton.runtime.autotune = _originals["runtime"]
    at.autotune = _originals["autotuner"]
    _originals.clear()


def installed() -> bool:
    return bool(_originals)


__all__ = [
    "TunecacheAutotuner",
    "autotune",
    "install",
    "uninstall",
    "installed",
    "current_mode",
    "load_winners",
    "Target",
]
