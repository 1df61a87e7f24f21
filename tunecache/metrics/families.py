"""The metrics tunecache exports: one table of names, types, labels and meanings, and this process's
values of them, read from what is counted already (:mod:`tunecache.process.counters`, the store breakers).

Nothing is counted here, and nothing here runs on the launch path: the values are read when
Prometheus scrapes (or, in prometheus_client's multiprocess mode, when :mod:`tunecache.metrics.mirror`
syncs them). Names follow Prometheus' conventions: a ``tunecache_`` prefix, counters end in
``_total``, durations are in ``_seconds``. Every label has a bounded set of values (no key, shape,
URL or kernel name is a label: ``tunecache stats`` and ``misses`` name those), so a fleet's series
stay few. docs/metrics.md lists each metric; tests/test_metrics.py checks it lists exactly these.

A forked child reports what it did since the fork, not its parent's counts again (a server that
tunes and then forks eight workers would otherwise count its parent's benchmarks nine times in a
fleet's sum): counters are taken relative to the fork, as the summary line does. Gauges are what
the process holds now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tunecache.process import counters, forks
from tunecache.store import breaker

COUNTER = "counter"
GAUGE = "gauge"

#: The lease a wait was for: a benchmark (the tuner's) or a torch.compile entry.
WORK = {
    "benchmark": ("waits", "wait_seconds", "waits_in_vain"),
    "torch_compile": ("inductor_lease_waits", "inductor_wait_seconds", "inductor_waits_in_vain"),
}
#: The rows refused as untrusted, from the ``what`` of :func:`tunecache.trust.trust.refused` (its prefix).
ROWS = (("torch.compile", "torch_compile"), ("launch spec", "launch_spec"), ("binary", "binary"))
#: Why a row was refused, from :func:`tunecache.trust.signing.verify_row`'s and :class:`tunecache.trust.trust.Policy`'s
#: words (a text in the reason, first match); "other" for none of these.
REFUSALS = (
    ("unsigned", "is unsigned"),
    ("malformed_signature", "signature is malformed"),
    ("unknown_key", "not in TUNECACHE_TRUSTED_KEYS"),
    ("bad_signature", "does not verify"),
    ("content_mismatch", "do not match its sha256"),  # a torch.compile entry's bytes
    ("content_mismatch", "spec hash is not that of its text"),  # a launch spec's text
    ("wrong_slot", "not in its signer's slot"),
)

Labels = tuple[str, ...]
Key = tuple[str, Labels]  # (exposed name, label values)


class Reading(NamedTuple):
    """What the metrics are read from, at one moment."""

    stats: Mapping[str, float]  # counters.stats()
    skips: Mapping[str, int]  # counters.preload_skips()
    refusals: Mapping[tuple[str, str], int]  # counters.refusals(), by (row, reason)
    breakers_open: int


@dataclass(frozen=True)
class Family:
    """One metric: ``name`` as exposed, its type, help text and label names, and its values in a
    :class:`Reading` (by label values; a labelled family may have none yet)."""

    name: str
    kind: str
    help: str
    values: Callable[[Reading], Mapping[Labels, float]]
    labels: Labels = ()
    #: prometheus_client's multiprocess mode of a gauge: how the processes' values combine.
    multiprocess_mode: str = ""
    #: A gauge of what the process holds now: 0 once it ends (multiprocess mode keeps the last value).
    ends_at_zero: bool = False


def _stat(key: str) -> Callable[[Reading], Mapping[Labels, float]]:
    return lambda r: {(): r.stats.get(key, 0)}


def _work(i: int) -> Callable[[Reading], Mapping[Labels, float]]:
    return lambda r: {(work,): r.stats.get(keys[i], 0) for work, keys in WORK.items()}


def row_of(what: str) -> str:
    """The ``row`` label of a refusal of ``what`` (:func:`tunecache.trust.trust.refused`'s words).

    >>> row_of("torch.compile fx_graph entry"), row_of("launch spec"), row_of("binary"), row_of("x")
    ('torch_compile', 'launch_spec', 'binary', 'other')
    """
    return next((row for prefix, row in ROWS if what.startswith(prefix)), "other")


def reason_of(why: str) -> str:
    """The ``reason`` label of a refusal that says ``why``.

    >>> reason_of("it is signed by key 1a2b3c4d, which is not in TUNECACHE_TRUSTED_KEYS")
    'unknown_key'
    """
    return next((reason for reason, text in REFUSALS if text in why), "other")


FAMILIES: tuple[Family, ...] = (
    Family(
        "tunecache_hits_total", COUNTER, "Tuning keys resolved from a stored winner, not benchmarked.", _stat("hits")
    ),
    Family(
        "tunecache_misses_total",
        COUNTER,
        "Tuning keys the store held no winner for (benchmarked here, by another process, or fallen back).",
        _stat("misses"),
    ),
    Family("tunecache_benchmarks_total", COUNTER, "Configs benchmarked in this process.", _stat("benchmarks")),
    Family("tunecache_benchmark_seconds_total", COUNTER, "Seconds spent benchmarking configs.", _stat("bench_seconds")),
    Family(
        "tunecache_saved_seconds_total",
        COUNTER,
        "Seconds of tuning the hits did not spend (each hit's stored tuning time).",
        _stat("saved_seconds"),
    ),
    Family(
        "tunecache_fallbacks_total",
        COUNTER,
        "Misses launched without benchmarking (nearest stored bucket, else the first config): in a CUDA graph "
        "capture, or in offline mode.",
        lambda r: {(why,): r.stats.get(f"{why}_fallbacks", 0) for why in ("capture", "offline")},
        ("reason",),
    ),
    Family(
        "tunecache_spooled_misses_total",
        COUNTER,
        "Misses a read-only store could not record, written to this host's miss spool.",
        _stat("spooled_misses"),
    ),
    Family(
        "tunecache_preloaded_total",
        COUNTER,
        "Stored winners' compiled kernels (and their companions) loaded before their first launch.",
        _stat("preloaded"),
    ),
    Family(
        "tunecache_preload_skips_total",
        COUNTER,
        "Stored launch specs not preloaded, by reason (they compile or load at their first launch).",
        lambda r: {(reason,): n for reason, n in r.skips.items()},
        ("reason",),
    ),
    Family(
        "tunecache_lease_waits_total",
        COUNTER,
        "Waits for another process's benchmark or torch.compile entry (one per key waited for).",
        _work(0),
        ("work",),
    ),
    Family(
        "tunecache_lease_wait_seconds_total",
        COUNTER,
        "Seconds spent waiting for another process's benchmark or torch.compile entry.",
        _work(1),
        ("work",),
    ),
    Family(
        "tunecache_lease_waits_in_vain_total",
        COUNTER,
        "Waits that ended without the other's result (its holder died or gave up, the wait timed out, or the "
        "store failed): this process computed it after all.",
        _work(2),
        ("work",),
    ),
    Family(
        "tunecache_lease_takeovers_total",
        COUNTER,
        "Benchmark leases taken over from a dead or expired holder.",
        _stat("lease_takeovers"),
    ),
    Family(
        "tunecache_leases_lost_total",
        COUNTER,
        "Benchmark leases another process took while this one was benchmarking (renewals late).",
        _stat("leases_lost"),
    ),
    Family(
        "tunecache_failed_winners_total",
        COUNTER,
        "Stored winners that failed to launch on this target: marked failed, the key resolved again.",
        _stat("poisoned"),
    ),
    Family(
        "tunecache_torch_compile_served_total",
        COUNTER,
        "torch.compile cache entries served from the store.",
        _stat("inductor_hits"),
    ),
    Family(
        "tunecache_torch_compile_computed_total",
        COUNTER,
        "torch.compile cache lookups the store did not serve (missing, or refused as untrusted): Inductor "
        "computed them.",
        _stat("inductor_misses"),
    ),
    Family(
        "tunecache_torch_compile_puts_total", COUNTER, "torch.compile cache entries stored.", _stat("inductor_puts")
    ),
    Family(
        "tunecache_torch_compile_untrusted_total",
        COUNTER,
        "torch.compile cache entries refused as untrusted (also in tunecache_refused_untrusted_total).",
        _stat("inductor_untrusted"),
    ),
    Family(
        "tunecache_refused_untrusted_total",
        COUNTER,
        "Stored rows of code (binaries, launch specs, torch.compile entries) not used because no trusted key "
        "vouches for them, by row and reason.",
        lambda r: dict(r.refusals),
        ("row", "reason"),
    ),
    Family(
        "tunecache_store_errors_total",
        COUNTER,
        "Store operations that failed (open, read, lease, write): the process tuned or compiled without it.",
        _stat("store_errors"),
    ),
    Family(
        "tunecache_store_breaker_opened_total",
        COUNTER,
        "Times a database server's breaker opened: a connection got no answer, the server is left alone 30 s.",
        _stat("breaker_opened"),
    ),
    Family(
        "tunecache_store_breaker_open",
        GAUGE,
        "Database servers whose breaker is open in this process now (1: its store is unreachable).",
        lambda r: {(): r.breakers_open},
        multiprocess_mode="livemax",
        ends_at_zero=True,
    ),
    Family(
        "tunecache_kernels_seen",
        GAUGE,
        "Autotuned kernels this process launched.",
        _stat("kernels_seen"),
        multiprocess_mode="livemax",
    ),
    Family(
        "tunecache_kernels_covered",
        GAUGE,
        "Autotuned kernels this process launched that reached tunecache's hooks (seen - covered: not served).",
        _stat("kernels_covered"),
        multiprocess_mode="livemax",
    ),
)
BY_NAME = {f.name: f for f in FAMILIES}

_since: dict[Key, float] = {}  # the counters at the fork (a forked child reports its own)
_since_lock = threading.Lock()


def read() -> Reading:
    """The counters and breakers of this process now."""
    refusals: dict[tuple[str, str], int] = {}
    for (what, why), n in counters.refusals().items():
        k = (row_of(what), reason_of(why))
        refusals[k] = refusals.get(k, 0) + n
    return Reading(counters.stats(), counters.preload_skips(), refusals, breaker.open_now())


def _samples(reading: Reading) -> dict[Key, float]:
    return {(f.name, labels): float(v) for f in FAMILIES for labels, v in f.values(reading).items()}


def values(reading: Reading) -> dict[Key, float]:
    """Every sample of :data:`FAMILIES` in ``reading``, by (name, label values), as counted since
    this process began (counters since the fork in a forked child)."""
    with _since_lock:
        since = dict(_since)
    return {
        k: max(0.0, v - since.get(k, 0.0)) if BY_NAME[k[0]].kind == COUNTER else v for k, v in _samples(reading).items()
    }


def now() -> dict[Key, float]:
    """:func:`values` of this process now."""
    return values(read())


def fork_locks() -> dict[str, Any]:
    """This module's lock, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"metrics.since_lock": _since_lock}


def _after_fork_in_child() -> None:
    """A forked child's counters start from what its parent had counted (``counters`` reset its
    locks first: it registered first, being imported by this module)."""
    global _since_lock
    _since_lock = threading.Lock()
    base = _samples(read())
    _since.clear()
    _since.update({k: v for k, v in base.items() if BY_NAME[k[0]].kind == COUNTER})


forks.register(__name__, _after_fork_in_child)
