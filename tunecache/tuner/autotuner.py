"""Autotuner: a drop-in ``triton.autotune`` that reads the store before benchmarking.

``TunecacheAutotuner`` subclasses Triton's ``Autotuner``. After a key is resolved, a launch takes
the hit path of :mod:`tunecache.tuner.fastpath` (a mixin: the key from the arguments, one lookup,
the winner's keywords bound once) and anything unusual Triton's own ``run``. Everything tunecache
does happens on a miss, through the hooks that are stable from Triton 3.4 to 3.9. This module is
the conductor: a tuner's state (``_tc_attach``), its identity, and the hooks' entry; what they do
lives in the mixins it is made of:

* ``check_disk_cache(key, configs, bench_fn)``: called by ``run`` on every miss once
  ``cache_results`` is on (we force it on, also under the interpreter). The miss is resolved by
  :mod:`tunecache.tuner.resolution`: the stored winner, a fallback during a CUDA graph capture or
  offline, or a benchmark under the lease, written back.
* ``_bench(config=...)`` and ``do_bench``: stored timings instead of measuring again, and the
  failure Triton swallows (:mod:`tunecache.tuner.benchhooks`).
* ``prune_configs(kwargs)``: only remembers ``kwargs`` to name the tuning-key values.

``run`` is wrapped, not copied, to recover from a stored winner that no longer compiles: blamed only
when its failure reproduces under the stored key's arguments (:mod:`tunecache.tuner.recovery`, a
mixin of ``TunecacheAutotuner``; the rule is in :mod:`tunecache.tuner.blame`). Preloading the
winners' binaries is :mod:`tunecache.tuner.preloading`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache import settings
from tunecache.errors import Busy, ConfigurationError
from tunecache.problem.configidentity import ConfigIds
from tunecache.problem.identity import KernelIdentity, kernel_identity, kernel_name, module_imported
from tunecache.problem.target import interpreting
from tunecache.settings import current_mode
from tunecache.store.store import Store
from tunecache.tuner import background, basepatch, companions
from tunecache.tuner.benchhooks import BenchHooks
from tunecache.tuner.fastpath import FastLaunch
from tunecache.tuner.firstcall import FirstCall
from tunecache.tuner.kernelstore import KernelStore
from tunecache.tuner.measure import Round
from tunecache.tuner.preloading import WinnerPreload
from tunecache.tuner.recovery import WinnerRecovery
from tunecache.tuner.resolution import Resolution

log = logging.getLogger("tunecache")


#: Triton's own ``Autotuner.__init__`` and ``run``: ``install()`` patches the base class's (see
#: :func:`tunecache.tuner.adoption.covering_init`), possibly before this module finished importing (the
#: start-up hook), and tunecache's own calls go to these, never through the patch.
BASE_INIT = basepatch.original("__init__")
BASE_RUN = basepatch.original("run")


class TunecacheAutotuner(FastLaunch, WinnerPreload, WinnerRecovery, Resolution, BenchHooks, Autotuner):
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

    # ---- companions, reset (preloading the winners: tunecache.tuner.preloading) --------------------

    def companion_store(self) -> Store | None:
        """The store this kernel's companions are filed in (None: not open, or unreachable)."""
        return self._tc_ks.open_store()

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

    # ---- the hooks ------------------------------------------------------------------------------

    def prune_configs(self, kwargs: dict) -> list:
        self._tc_kwargs = kwargs
        return super().prune_configs(kwargs)

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
