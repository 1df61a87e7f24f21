"""Resolving a tuning key on a miss: the stored winner, a fallback, or a benchmark round.

:class:`Resolution` is a mixin of :class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, whose
state it uses through ``self``; ``check_disk_cache`` (Triton's hook, called by ``run`` on every miss)
hands it the miss. Here the problem is looked up (prefetched in one query per kernel), a CUDA graph
capture or offline mode falls back to the nearest stored bucket's winner, one process per problem
benchmarks under the lease (:mod:`tunecache.tuner.singleflight`), the winner is chosen
(:mod:`tunecache.tuner.winner`) and written back, and the key given its config (``_settle``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from triton.runtime.autotuner import Autotuner

from tunecache import settings
from tunecache.binaries import preload
from tunecache.errors import CaptureMissError, StoreError
from tunecache.problem.configidentity import search_space_hash
from tunecache.problem.identity import canonical_key, problem_digest
from tunecache.problem.model import Problem
from tunecache.problem.target import detect_target, hostname
from tunecache.process import counters, writeback
from tunecache.store.store import Store
from tunecache.trust import sharing
from tunecache.tuner import companions, deferral, measure, missspool, singleflight, winner
from tunecache.tuner.measure import Round
from tunecache.tuner.singleflight import Lease

log = logging.getLogger("tunecache")


class _StoredTimings:
    """Triton's ``configs_timings`` after a stored hit, built at its first read: a restart's first
    launch of each key then hashes no Config (Triton hashes one by building its kwargs). A value
    assigned on the instance (Triton's ``benchmark()`` does) is found first: a non-data descriptor."""

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


class Resolution(Autotuner):
    """A miss's context, its resolution to a config, and the one place a key is given one
    (``_settle``). A subclass of Triton's Autotuner, as :class:`~tunecache.tuner.recovery.WinnerRecovery`
    is (see there)."""

    configs_timings = _StoredTimings()  # Triton's attribute; a stored hit's is built when read

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

    def _settle(
        self,
        key: Any,
        config: Any,
        timings: tuple[Mapping[str, Any], dict[str, Any]] | None = None,
        stored: tuple[str, str] | None = None,
    ) -> None:
        """The one place tunecache gives a tuning key its config (Triton's own ``bench_fn`` first
        sets the fastest, which this then overrides). ``stored``: (digest, config hash) of the
        stored winner launched, blamed if that launch fails (see :mod:`tunecache.tuner.recovery`)."""
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

    def _record_specs(self, ctx: _Ctx, store: Store, best: str | None) -> None:
        """After a benchmark: store what Triton compiled the winner with, for later preloads
        (an idempotent write: specs other keys recorded already are kept)."""
        config = dict(zip(ctx.hashes, ctx.configs)).get(best) if best else None
        if config is None or store.readonly:
            return
        specs = preload.capture(self.fn, config, best)
        self._tc_ks.record_specs(store, self.fn, self.identity.source_hash, ctx.target.digest, specs)


__all__ = ["Resolution"]
