"""Recovery from a stored winner that no longer works: Triton's ``run`` wrapped, not copied.

A stored winner that fails at launch is blamed only when the failure reproduces under the stored
key's arguments (the rule is :mod:`tunecache.tuner.blame`'s); then it is marked failed in the store
and the key re-resolved to the next stored config. Otherwise the exception reaches the caller, as
with stock Triton's cached config. :class:`WinnerRecovery` is a mixin of
:class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, whose state it uses through ``self``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache.problem.target import detect_target
from tunecache.process import counters
from tunecache.tuner import basepatch, blame, measure
from tunecache.tuner.measure import Round, classify

log = logging.getLogger("tunecache")

#: Triton's own ``Autotuner.run`` and ``_bench`` (see :mod:`tunecache.tuner.basepatch`).
_BASE_RUN = basepatch.original("run")
_BASE_BENCH = basepatch.original("_bench")

#: Marks in ``_tc_resolved_by`` besides a weak reference to the resolving call's ``nargs``: the stored
#: winner ran for the key here (a reproduction ran it), or a failure of it was not judged (judge the next).
_PROVEN = object()
_UNPROVEN = object()


class _Nargs(dict):
    """Triton's ``nargs`` of the call that resolved a key from the store, same contents: a dict that a
    weak reference can follow. Triton drops it when that call's launch succeeds (``nargs = None``), so
    the reference dies with it and holds none of the call's tensors."""


class WinnerRecovery(Autotuner):
    """``run`` that recovers from a stored winner's own failure, and the blame, reproduction and
    marking behind it; the tuning key of a call.

    A subclass of Triton's Autotuner, not a plain mixin: a plain base class would give
    TunecacheAutotuner another layout base, and adoption's ``__class__`` assignment would fail."""

    def _tc_mark_resolved(self, key: Any) -> None:
        """Mark the call that resolved ``key`` from the store (its ``nargs``), for :meth:`_blame`."""
        if isinstance(self.nargs, dict):  # this call's own (Autotuner.run makes one per call)
            self.nargs = nargs = _Nargs(self.nargs)
            self._tc_resolved_by[key] = weakref.ref(nargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        # Triton sets best_config just before it launches: None after a failure means the call
        # failed earlier (pruning, benchmarking, a bad argument), and no stored winner is to blame.
        previous, self.best_config = getattr(self, "best_config", None), None
        try:
            return _BASE_RUN(self, *args, **kwargs)
        except Exception as e:
            launched = self.best_config
            if launched is None:
                self.best_config = previous
                raise
            if not self._tc_blamed(launched, args, kwargs, e):
                raise  # the call's failure, as stock Triton's cached config would fail it
        return _BASE_RUN(self, *args, **kwargs)

    def _tc_blamed(self, launched: Any, args: Sequence[Any], kwargs: Mapping[str, Any], exc: Exception) -> bool:
        """After the launch of ``launched`` failed with ``exc``: whether the failure is the stored winner's
        own. Then it is marked failed and its key forgotten, and the caller launches the call again
        (Triton's run re-resolves the key); False: the caller re-raises ``exc``. Shared by :meth:`run`
        and the hit path (:mod:`tunecache.tuner.fastpath`)."""
        if not self._tc_from_store:
            return False
        key = self._tuning_key(args, kwargs)
        if key not in self._tc_from_store or self.cache.get(key) is not launched:
            return False
        failure = self._blame(key, launched, args, kwargs, exc)
        if failure is None:
            return False
        self._poisoned([key], exc, failure)
        return True

    def _blame(
        self, key: Any, config: Any, args: Sequence[Any], kwargs: Mapping[str, Any], exc: Exception
    ) -> tuple[str, dict[str, Any]] | None:
        """The stored winner's own failure (status, detail) if the failed launch of ``config`` for
        ``key`` reproduces under the key's arguments; None if it is the call's (:mod:`tunecache.tuner.blame`).

        Whether it already ran for ``key`` here is learnt without work on the launch path: the call
        that resolved ``key`` marked its ``nargs`` (see ``_settle``), which Triton leaves in place only
        when the launch raises. A dead mark: that call's launch succeeded; this call's: this is it.
        """
        mark = self._tc_resolved_by.get(key)
        ran_here = mark is _PROVEN or (isinstance(mark, weakref.ref) and mark() is not self.nargs)
        if not type(exc).__module__.startswith("triton"):  # not Triton's failure (an illegal address...)
            if not ran_here:
                self._tc_resolved_by[key] = _UNPROVEN
            return None
        digest, h = self._tc_from_store[key]
        passed = blame.call_constexprs(blame.constexpr_names(self.fn), self.arg_names, self.keys, config, args, kwargs)
        specs = []
        if not ran_here and passed:
            p = self._tc_ks.held(digest)
            target_digest = p.target.digest if p is not None else detect_target().digest
            specs = self._tc_ks.specs_on(self.identity.source_hash, target_digest)
        v = blame.verdict(ran_here=ran_here, passed=passed, specs=specs, config_hash=h, arg_names=self.arg_names)
        if v == blame.REPRODUCE and measure.capturing():
            v = blame.UNKNOWN  # a benchmark would break the capture: judge the next failure outside it
        if v == blame.UNKNOWN:
            self._tc_resolved_by[key] = _UNPROVEN
            counters.warn_once(
                self._tc_name,
                "unblamed",
                "tunecache: %s: stored winner %s failed for a call passing %s; not marked failed, since the "
                "values it was stored with are unknown here (no launch spec recorded). If it fails for "
                "every call, delete its rows with `tunecache invalidate --kernel %s` and tune again.",
                self._tc_name,
                h[:12],
                sorted(passed),
                self._tc_name,
            )
            return None
        if v == blame.CALL:
            if not ran_here:
                self._tc_resolved_by[key] = _UNPROVEN  # its specs vouch for it, but it has not run here
            log.debug(
                "tunecache: %s: stored winner %s ran or compiled under its key; the call failed it",
                self._tc_name,
                h[:12],
            )
            return None
        failure = self._reproduce(config, args, kwargs)
        if failure is None:
            self._tc_resolved_by[key] = _PROVEN
            log.debug("tunecache: %s: stored winner %s runs when benchmarked alone", self._tc_name, h[:12])
        return failure

    def _reproduce(
        self, config: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]] | None:
        """Benchmark ``config`` alone with the call's arguments (Triton's ``_bench``, with its reset
        and restore hooks): its failure (status, detail), or None if it runs."""
        with self._tc_lock:
            rnd = self._tc_round = Round()
            self.nargs = dict(zip(self.arg_names, args))
            try:
                timings = _BASE_BENCH(self, *args, config=config, **kwargs)
            except Exception as e:  # noqa: BLE001 - the failure reproduced
                return rnd.failure or classify(e)
            finally:
                self._tc_round = None
                self.nargs = None
        if float(timings[0]) == float("inf"):  # Triton's _bench maps compile failures to inf
            return rnd.failure or ("compile_error", {"error": "unknown", "message": "timing inf"})
        return None

    def _tuning_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
        """The tuning key ``Autotuner.run`` built for this call (the same steps in 3.4-3.9); used
        only after a failed launch, to blame that key's stored winner and no other."""
        all_args = {**dict(zip(self.arg_names, args)), **kwargs}
        _args = {k: v for k, v in all_args.items() if k in self.arg_names}
        key = [_args[k] for k in self.keys if k in _args]
        key += [str(v.dtype) for v in _args.values() if hasattr(v, "dtype")]
        return tuple(key)

    def _poisoned(self, keys: list[Any], exc: Exception, reproduced: tuple[str, dict[str, Any]] | None = None) -> None:
        """Mark each key's stored winner failed (``reproduced``: the failure of benchmarking it alone)."""
        status, failure = reproduced or classify(exc)
        for k in keys:
            digest, h = self._tc_from_store.pop(k)
            self._tc_resolved_by.pop(k, None)
            self.cache.pop(k, None)
            counters.count(None, None, poisoned=1)
            log.warning(
                "tunecache: %s: stored winner %s failed on this target (%s: %s); marked %s and re-resolving",
                self._tc_name,
                h[:12],
                type(exc).__name__,
                str(exc)[:200],
                status,
            )
            self._tc_ks.mark_failed(digest, h, status, failure)


__all__ = ["WinnerRecovery"]
