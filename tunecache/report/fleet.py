"""Fleet: find a host that measures slower than its peers, from the fleet's own timings.

Pure analysis, no I/O: :mod:`tunecache.report.report` reads the ``measurements`` rows (every host's own
timings of identical problems: same kernel source, same target, same tuning key) and hands them
here one key at a time. Identical problems on identical GPUs and drivers should time the same; a
host that is consistently slower has a degraded GPU (thermal or power throttling, a bad PCIe or
NVLink link, ECC retirement, a noisy neighbour), which no cache of compiled kernels would notice.

One ratio definition, used by the page and by ``tunecache hosts`` alike:

- **a key's ratio** for a host: its median time over the configs it shares with peers, over the
  peers' median time on those same configs (``host ms / peers ms``, both shown). Peers are the
  *other* hosts that timed the config, not all hosts: with two hosts, the all-host median is their
  midpoint, and a host 20% slower than the other would show as only 9% above it.
- **a host's ratio**: the median of its per-key ratios, shown with the median of its per-key times
  and the median of its peers' (so "1.50x: host 93.9 ms vs peers 62.6 ms").

One verdict rule (:func:`verdict`), overall and per kernel: ``outlier`` when the ratio is above
``1 + threshold`` over at least ``min_keys`` keys, ``too few keys`` when fewer keys were shared
(whatever the ratio: the count and the minimum are said), else ``ok``. A host slow on one kernel
only is flagged for that kernel.

A slow host is some healthy hosts' peer, and drags their ratios below 1. :func:`flagged` names the
hosts flagged in a first analysis; analysing again with ``exclude=`` leaves them out of the other
hosts' baselines (where another peer timed the same config), so healthy hosts read about 1.0x.
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
import statistics
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A host whose median per-key ratio exceeds ``1 + DEFAULT_THRESHOLD`` ...
DEFAULT_THRESHOLD = 0.10
#: ... over at least this many keys is an outlier: fewer keys are not evidence.
DEFAULT_MIN_KEYS = 10
#: Evidence kept per host (and per host and kernel): its worst keys where it was slower.
EVIDENCE_KEYS = 5

OUTLIER, OK, TOO_FEW = "outlier", "ok", "too few keys"

#: host -> the kernels it was flagged for (None: flagged overall, so for every kernel)
Flagged = Mapping[str, frozenset[str] | None]

Timing = tuple[str, str, float] | tuple[str, str, float, dt.datetime | None]


@dataclass(frozen=True)
class Verdict:
    """The one verdict of a host (or of a host on one kernel), with what it rests on."""

    status: str  # OUTLIER, OK or TOO_FEW
    keys: int
    min_keys: int
    ratio: float  # median of the per-key ratios
    host_ms: float  # median of the host's per-key times
    peers_ms: float  # median of its peers' per-key times
    threshold: float

    def ratio_text(self) -> str:
        return ratio_text(self.ratio, self.host_ms, self.peers_ms)

    def text(self) -> str:
        """``OUTLIER``, ``ok`` or ``too few keys (6 of 10 needed)``: the word the page and the CLI use."""
        if self.status == TOO_FEW:
            return f"too few keys ({self.keys} of {self.min_keys} needed)"
        return "OUTLIER" if self.status == OUTLIER else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.status,
            "keys": self.keys,
            "min_keys": self.min_keys,
            "ratio": round(self.ratio, 4),
            "host_ms": self.host_ms,
            "peers_ms": self.peers_ms,
        }


def ratio_text(ratio: float, host_ms: float, peers_ms: float) -> str:
    """The one way a host's ratio is written, page and CLI."""
    return f"median of per-key ratios {ratio:.2f}x: host {host_ms:.4g} ms vs peers {peers_ms:.4g} ms"


def verdict(
    ratios: list[float], host_ms: list[float], peers_ms: list[float], threshold: float, min_keys: int
) -> Verdict:
    """The verdict on per-key ``ratios`` (with the per-key times they came from)."""
    med = statistics.median(ratios)
    status = TOO_FEW if len(ratios) < min_keys else (OUTLIER if med > 1.0 + threshold else OK)
    return Verdict(
        status, len(ratios), min_keys, med, statistics.median(host_ms), statistics.median(peers_ms), threshold
    )


@dataclass
class KeyComparison:
    """One key (problem digest) timed by several hosts: each host's time, its peers', and the ratio."""

    digest: str
    kernel: str
    key_json: str
    target: str
    ratios: dict[str, float]  # host -> times[host] / peers[host]
    times: dict[str, float]  # host -> its median time (ms) over the configs it shares with peers
    peers: dict[str, float] = field(default_factory=dict)  # host -> the peers' median time on those configs
    device: str = ""  # the GPU (device name)
    measured: dict[str, tuple[dt.datetime, dt.datetime]] = field(default_factory=dict)  # host -> first, last


@dataclass
class Evidence:
    """A key where the host was slower than its peers."""

    digest: str
    kernel: str
    key_json: str
    target: str
    ratio: float
    host_ms: float
    peers_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "kernel": self.kernel,
            "key": self.key_json,
            "target": self.target,
            "ratio": round(self.ratio, 4),
            "host_ms": self.host_ms,
            "peers_ms": self.peers_ms,
        }


class _Worst:
    """The ``EVIDENCE_KEYS`` keys with the largest ratio above 1 (a bounded heap)."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, str, Evidence]] = []

    def wants(self, ratio: float) -> bool:
        """Whether a key of this ratio would be kept (checked before building its evidence)."""
        # a key where the host was as fast or faster is no evidence of slowness
        return ratio > 1.0 and (len(self.heap) < EVIDENCE_KEYS or ratio >= self.heap[0][0])

    def add(self, e: Evidence) -> None:
        if not self.wants(e.ratio):
            return
        item = (e.ratio, e.digest, e)
        if len(self.heap) < EVIDENCE_KEYS:
            heapq.heappush(self.heap, item)
        elif item[:2] > self.heap[0][:2]:
            heapq.heapreplace(self.heap, item)

    def sorted(self) -> list[Evidence]:
        return [e for _, _, e in sorted(self.heap, key=lambda t: (-t[0], t[1]))]


@dataclass
class KernelSummary:
    """A host on one kernel: its own verdict, dates and worst keys."""

    kernel: str
    verdict: Verdict
    first_measured: dt.datetime | None
    last_measured: dt.datetime | None
    worst: list[Evidence] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            **self.verdict.as_dict(),
            "first_measured": self.first_measured,
            "last_measured": self.last_measured,
            "worst": [e.as_dict() for e in self.worst],
        }


@dataclass
class HostSummary:
    """How one host compares with its peers over every key it shares with them, and per kernel."""

    host: str
    verdict: Verdict
    slower_share: float  # fraction of its keys where it is slower than its peers by more than the threshold
    gpus: list[str]
    first_measured: dt.datetime | None
    last_measured: dt.datetime | None
    kernels: list[KernelSummary] = field(default_factory=list)
    worst: list[Evidence] = field(default_factory=list)

    @property
    def keys(self) -> int:
        return self.verdict.keys

    @property
    def median_ratio(self) -> float:
        return self.verdict.ratio

    @property
    def outlier(self) -> bool:
        """Flagged overall."""
        return self.verdict.status == OUTLIER

    @property
    def slow_kernels(self) -> list[KernelSummary]:
        """The kernels this host is an outlier on."""
        return [k for k in self.kernels if k.verdict.status == OUTLIER]

    @property
    def flagged(self) -> bool:
        """An outlier overall or on one kernel at least."""
        return self.outlier or bool(self.slow_kernels)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            **self.verdict.as_dict(),
            "median_ratio": round(self.verdict.ratio, 4),
            "slower_share": round(self.slower_share, 4),
            "outlier": self.outlier,
            "outlier_kernels": [k.kernel for k in self.slow_kernels],
            "gpus": self.gpus,
            "first_measured": self.first_measured,
            "last_measured": self.last_measured,
            "kernels": [k.as_dict() for k in self.kernels],
            "worst": [e.as_dict() for e in self.worst],
        }


@dataclass
class FleetAnalysis:
    """The outcome: per-host summaries, flagged hosts first, and what the analysis looked at."""

    hosts: list[HostSummary]
    keys_compared: int
    threshold: float
    min_keys: int
    ratios: dict[str, list[float]]  # host -> its ratio on each key (for the plot)
    excluded: dict[str, list[str] | None] = field(default_factory=dict)  # left out of peers' baselines

    @property
    def outliers(self) -> list[HostSummary]:
        """Hosts flagged overall or on one kernel."""
        return [h for h in self.hosts if h.flagged]

    @property
    def too_few(self) -> list[HostSummary]:
        return [h for h in self.hosts if h.verdict.status == TOO_FEW]

    def as_dict(self) -> dict[str, Any]:
        return {
            "keys_compared": self.keys_compared,
            "threshold": self.threshold,
            "min_keys": self.min_keys,
            "ratio": "a key's ratio: host's median ms over the configs it shares / peers' median ms on them; "
            "a host's: the median of its per-key ratios",
            "outliers": [h.host for h in self.outliers],
            "too_few_keys": [h.host for h in self.too_few],
            "peers_exclude": self.excluded,
            "hosts": [h.as_dict() for h in self.hosts],
        }


def _median(xs: list[float]) -> float:
    """statistics.median, without its generality (the hot loop of a 100k-key analysis)."""
    n = len(xs)
    if n == 1:
        return xs[0]
    if n == 2:
        return (xs[0] + xs[1]) / 2
    s = sorted(xs)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True, slots=True)
class KeyTimings:
    """One key's timings, compact (a flat array, host names shared): the analysis holds every key
    for its second pass (:func:`judge`) without reading the store twice."""

    digest: str
    kernel: str
    key_json: str
    target: str
    device: str
    hosts: tuple[str, ...]
    values: array  # 'd', config-major: values[c * len(hosts) + i] is host i's time of config c; NaN: not timed


def pack(meta: Mapping[str, Any], rows: Iterable[Timing], shared: dict[Any, Any] | None = None) -> KeyTimings:
    """A :class:`KeyTimings` from one problem's fields and its ``(host, config_hash, median_ms)``
    rows; ``shared`` interns the strings and host tuples that repeat from key to key."""
    shared = {} if shared is None else shared
    by_config: dict[str, dict[str, float]] = {}
    for row in rows:
        ms = row[2]
        if ms is not None and ms > 0:
            by_config.setdefault(row[1], {})[row[0]] = ms
    names = sorted({h for hosts in by_config.values() for h in hosts})
    hosts = shared.setdefault(tuple(names), tuple(names))
    nan = math.nan
    values = array("d", [t.get(h, nan) for t in by_config.values() for h in hosts])

    def one(v: str) -> str:
        return shared.setdefault(v, v)

    return KeyTimings(
        meta["digest"],
        one(meta["kernel"]),
        meta["key_json"],
        one(meta["target"]),
        one(meta.get("device", "")),
        hosts,
        values,
    )


def compare(k: KeyTimings, exclude: Iterable[str] = ()) -> KeyComparison:
    """Each host's time, its peers' and its ratio on one key.

    Per config timed by two hosts or more, a host's peers are the other hosts that timed it, less
    ``exclude`` (hosts already flagged) unless that leaves none. Per host, its median time and its
    peers' median time over those configs; the ratio is one over the other. A config only one host
    timed says nothing about hosts.
    """
    hosts, values, nh = k.hosts, k.values, len(k.hosts)
    if nh == 2:  # the common case, whatever ``exclude`` says: each host is the other's only peer
        return _compare_two(k)
    skip = {i for i, h in enumerate(hosts) if h in exclude} if exclude else set()
    own: list[list[float]] = [[] for _ in hosts]
    base: list[list[float]] = [[] for _ in hosts]
    for c in range(0, len(values), nh):
        row = values[c : c + nh]
        present = [(i, v) for i, v in enumerate(row) if v == v]  # NaN: not timed
        if len(present) < 2:
            continue
        for i, v in present:
            others = [w for j, w in present if j != i and j not in skip] if skip else []
            others = others or [w for j, w in present if j != i]
            own[i].append(v)
            base[i].append(_median(others))
    times = {hosts[i]: _median(t) for i, t in enumerate(own) if t}
    peers = {hosts[i]: _median(t) for i, t in enumerate(base) if t}
    ratios = {h: times[h] / peers[h] for h in times}
    return KeyComparison(k.digest, k.kernel, k.key_json, k.target, ratios, times, peers, k.device)


def _compare_two(k: KeyTimings) -> KeyComparison:
    """:func:`compare` of a key two hosts timed: over the configs both timed, each host's time is
    the other's peers' time (the same medians, the same ratios, no list per config)."""
    a, b = k.hosts
    values = k.values
    mine: list[float] = []
    theirs: list[float] = []
    for c in range(0, len(values), 2):
        x, y = values[c], values[c + 1]
        if x == x and y == y:  # NaN: not timed
            mine.append(x)
            theirs.append(y)
    if not mine:
        return KeyComparison(k.digest, k.kernel, k.key_json, k.target, {}, {}, {}, k.device)
    ta, tb = _median(mine), _median(theirs)
    return KeyComparison(
        k.digest, k.kernel, k.key_json, k.target, {a: ta / tb, b: tb / ta}, {a: ta, b: tb}, {a: tb, b: ta}, k.device
    )


def compare_key(
    timings: Iterable[Timing], exclude: Iterable[str] = ()
) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, tuple[dt.datetime, dt.datetime]]]:
    """:func:`compare` of ``(host, config_hash, median_ms[, measured_at])`` rows: (ratios, times,
    peers, measured: host -> (first, last)), each by host."""
    rows = list(timings)
    measured: dict[str, tuple[dt.datetime, dt.datetime]] = {}
    for row in rows:
        when = row[3] if len(row) > 3 else None
        if when is not None and row[2] is not None and row[2] > 0:
            lo, hi = measured.get(row[0], (when, when))
            measured[row[0]] = (min(lo, when), max(hi, when))
    meta = {"digest": "", "kernel": "", "key_json": "", "target": ""}
    c = compare(pack(meta, rows), set(exclude))
    return c.ratios, c.times, c.peers, {h: measured[h] for h in c.times if h in measured}


@dataclass
class _Acc:
    """One host's (or host and kernel's) per-key figures while keys stream by."""

    ratios: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    peers: list[float] = field(default_factory=list)
    first: dt.datetime | None = None
    last: dt.datetime | None = None
    worst: _Worst = field(default_factory=_Worst)

    def add(self, k: KeyComparison, host: str) -> None:
        ratio = k.ratios[host]
        self.ratios.append(ratio)
        self.times.append(k.times[host])
        self.peers.append(k.peers[host])
        when = k.measured.get(host)
        if when is not None:
            self.first = when[0] if self.first is None or when[0] < self.first else self.first
            self.last = when[1] if self.last is None or when[1] > self.last else self.last
        if self.worst.wants(ratio):
            self.worst.add(Evidence(k.digest, k.kernel, k.key_json, k.target, ratio, k.times[host], k.peers[host]))


def analyse(
    keys: Iterable[KeyComparison],
    threshold: float = DEFAULT_THRESHOLD,
    min_keys: int = DEFAULT_MIN_KEYS,
    excluded: Flagged | None = None,
    dates: Mapping[tuple[str, str], tuple[dt.datetime, dt.datetime]] | None = None,
) -> FleetAnalysis:
    """Summarise each host, overall and per kernel, with :func:`verdict`. ``excluded`` only records
    which hosts the keys' baselines left out (see :func:`flagged`); ``dates``: ``{(host, kernel):
    (first, last measured)}`` from the store, else the keys' own ``measured``."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    per_kernel: dict[str, dict[str, _Acc]] = {}  # host -> kernel -> figures; a host's are their union
    gpus: dict[str, set[str]] = {}
    n = 0
    for k in keys:
        if len(k.ratios) < 2:
            continue
        n += 1
        for host in k.ratios:
            mine = per_kernel.get(host)
            if mine is None:
                mine = per_kernel[host] = {}
                gpus[host] = set()
            acc = mine.get(k.kernel)
            if acc is None:
                acc = mine[k.kernel] = _Acc()
            acc.add(k, host)
            gpus[host].add(k.device)
    for (host, kernel), (lo, hi) in (dates or {}).items():
        acc = per_kernel.get(host, {}).get(kernel)
        if acc is not None:
            acc.first = lo if acc.first is None or lo < acc.first else acc.first
            acc.last = hi if acc.last is None or hi > acc.last else acc.last
    summaries = []
    overall: dict[str, _Acc] = {}
    for host, mine in per_kernel.items():
        acc = overall[host] = _Acc()
        for a in mine.values():
            acc.ratios += a.ratios
            acc.times += a.times
            acc.peers += a.peers
            for _, _, e in a.worst.heap:
                acc.worst.add(e)
            firsts = [d for d in (acc.first, a.first) if d is not None]
            lasts = [d for d in (acc.last, a.last) if d is not None]
            acc.first, acc.last = min(firsts, default=None), max(lasts, default=None)
        kernels = [
            KernelSummary(
                kernel, verdict(a.ratios, a.times, a.peers, threshold, min_keys), a.first, a.last, a.worst.sorted()
            )
            for kernel, a in sorted(mine.items())
        ]
        kernels.sort(key=lambda ks: (ks.verdict.status != OUTLIER, -ks.verdict.ratio, ks.kernel))
        slower = sum(r > 1.0 + threshold for r in acc.ratios) / len(acc.ratios)
        v = verdict(acc.ratios, acc.times, acc.peers, threshold, min_keys)
        devices = sorted(d for d in gpus[host] if d)
        summaries.append(HostSummary(host, v, slower, devices, acc.first, acc.last, kernels, acc.worst.sorted()))
    summaries.sort(key=lambda h: (not h.flagged, -h.median_ratio, h.host))
    ratios_by_host = {h.host: overall[h.host].ratios for h in summaries}
    shown = {h: (sorted(ks) if ks is not None else None) for h, ks in (excluded or {}).items()}
    return FleetAnalysis(summaries, n, threshold, min_keys, ratios_by_host, shown)


def flagged(a: FleetAnalysis) -> dict[str, frozenset[str] | None]:
    """The hosts to leave out of their peers' baselines: None for one flagged overall (every
    kernel), else the kernels it was flagged on."""
    return {h.host: None if h.outlier else frozenset(k.kernel for k in h.slow_kernels) for h in a.outliers}


def excluded_for(flags: Flagged, kernel: str) -> set[str]:
    """The flagged hosts that count as flagged on ``kernel``."""
    return {h for h, ks in flags.items() if ks is None or kernel in ks}


def _date(d: dt.datetime | None) -> str:
    return f"{d:%Y-%m-%d %H:%M}" if d else "?"


def measured_text(first: dt.datetime | None, last: dt.datetime | None) -> str:
    """When a host's timings were taken (UTC)."""
    if first is None:
        return "?"
    return _date(first) if _date(first) == _date(last) else f"{_date(first)} .. {_date(last)}"


def _columns(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows aligned to their longest cell (a 60-character cloud hostname included)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def _evidence_lines(worst: list[Evidence]) -> list[str]:
    return [
        f"  {e.kernel} {e.key_json} [{e.target}]: {e.ratio:.2f}x: host {e.host_ms:.4g} ms vs peers {e.peers_ms:.4g} ms"
        for e in worst
    ]


def explain(a: FleetAnalysis) -> list[str]:
    """The analysis as lines of text (``tunecache hosts``): the same verdicts as the page."""
    if not a.hosts:
        return ["no key was timed by more than one host: nothing to compare (see `tunecache report`)"]
    out = [
        f"{a.keys_compared} keys timed by more than one host. A key's ratio: the host's median ms over the "
        "configs it shares / its peers' median ms on them; a host's: the median of its per-key ratios.",
        f"Outlier: a median ratio > {1 + a.threshold:.2f}x over >= {a.min_keys} keys, overall or on one kernel.",
    ]
    if a.excluded:
        out.append("Peers' baselines leave out the flagged hosts: " + ", ".join(sorted(a.excluded)))
    headers = ["HOST", "GPU", "KEYS", "RATIO", "HOST MS", "PEERS MS", "SLOWER", "MEASURED (UTC)", "VERDICT"]
    rows = []
    for h in a.hosts:
        v = h.verdict
        word = v.text()
        if h.slow_kernels and not h.outlier:
            word = f"{word}; OUTLIER on {len(h.slow_kernels)} kernel{'s' if len(h.slow_kernels) > 1 else ''}"
        rows.append(
            [
                h.host,
                ", ".join(h.gpus) or "?",
                str(v.keys),
                f"{v.ratio:.3f}x",
                f"{v.host_ms:.4g}",
                f"{v.peers_ms:.4g}",
                f"{h.slower_share:.0%}",
                measured_text(h.first_measured, h.last_measured),
                word,
            ]
        )
    out += _columns(headers, rows, {2, 3, 4, 5, 6})
    for h in a.outliers:
        if h.outlier:
            out.append(
                f"{h.host}: OUTLIER: {h.verdict.ratio_text()} over {h.keys} keys; slower by more than "
                f"{a.threshold:.0%} on {h.slower_share:.0%} of them; worst keys where it was slower:"
            )
            out += _evidence_lines(h.worst)
            if len(h.slow_kernels) > 1:
                out.append(f"{h.host}: OUTLIER on kernels: " + ", ".join(k.kernel for k in h.slow_kernels))
            continue
        for k in h.slow_kernels:
            out.append(f"{h.host}: OUTLIER on {k.kernel}: {k.verdict.ratio_text()} over {k.verdict.keys} keys; worst:")
            out += _evidence_lines(k.worst)
    for h in a.too_few:
        out.append(f"{h.host}: too few keys to judge: {h.keys} of the {a.min_keys} needed ({h.verdict.ratio_text()})")
    return out


def key_from_rows(meta: Mapping[str, Any], rows: Iterable[Timing], exclude: Iterable[str] = ()) -> KeyComparison:
    """A :class:`KeyComparison` from one problem's descriptive fields and its measurement rows."""
    ratios, times, peers, measured = compare_key(rows, exclude)
    return KeyComparison(
        meta["digest"],
        meta["kernel"],
        meta["key_json"],
        meta["target"],
        ratios,
        times,
        peers,
        meta.get("device", ""),
        measured,
    )


def judge(
    keys: Iterable[KeyTimings],
    threshold: float = DEFAULT_THRESHOLD,
    min_keys: int = DEFAULT_MIN_KEYS,
    dates: Mapping[tuple[str, str], tuple[dt.datetime, dt.datetime]] | None = None,
) -> FleetAnalysis:
    """The fleet's verdicts: :func:`analyse` the keys; when a host is flagged (overall or on a
    kernel), analyse again with it left out of the other hosts' baselines (a slow peer would make
    healthy hosts look fast, and hide a second slow host), from the keys held in memory."""
    held = list(keys)
    first = analyse((compare(k) for k in held), threshold, min_keys, dates=dates)
    flags = flagged(first)
    # Leaving a flagged host out changes a key only where its host has another peer to compare with.
    if not any(len(k.hosts) > 2 and not flags.keys().isdisjoint(k.hosts) for k in held):
        return first
    again = (compare(k, excluded_for(flags, k.kernel)) for k in held)
    return analyse(again, threshold, min_keys, flags, dates)
