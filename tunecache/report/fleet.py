"""Fleet: find a host that measures slower than its peers, from the fleet's own timings.

Pure analysis, no I/O: :mod:`tunecache.report.report` reads the ``measurements`` rows (every host's own
timings of identical problems: same kernel source, same target, same tuning key) and hands them
here one key at a time. Identical problems on identical GPUs and drivers should time the same; a
host that is consistently slower has a degraded GPU (thermal or power throttling, a bad PCIe or
NVLink link, ECC retirement, a noisy neighbour), which no cache of compiled kernels would notice.

A host's time on a key is compared with the **median of its peers** (the other hosts that timed the
same config of the same key), not with the median of all hosts: with two hosts, the all-host median
is their midpoint, and a host 20% slower than the other would show as only 9% above it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A host whose median time relative to its peers exceeds ``1 + DEFAULT_THRESHOLD`` ...
DEFAULT_THRESHOLD = 0.10
#: ... over at least this many keys is an outlier: fewer keys are not evidence.
DEFAULT_MIN_KEYS = 10
#: Evidence kept per host: its worst keys.
EVIDENCE_KEYS = 5


@dataclass
class KeyComparison:
    """One key (problem digest) timed by several hosts: each host's ratio to its peers' median."""

    digest: str
    kernel: str
    key_json: str
    target: str
    ratios: dict[str, float]  # host -> median over shared configs of (host time / peers' median)
    times: dict[str, float]  # host -> its median time (ms) over the shared configs


@dataclass
class HostSummary:
    """How one host compares with its peers over every key it shares with them."""

    host: str
    keys: int
    median_ratio: float
    slower_share: float  # fraction of its keys where it is slower than its peers by more than the threshold
    outlier: bool
    worst: list[KeyComparison] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "keys": self.keys,
            "median_ratio": round(self.median_ratio, 4),
            "slower_share": round(self.slower_share, 4),
            "outlier": self.outlier,
            "worst": [
                {
                    "digest": k.digest,
                    "kernel": k.kernel,
                    "key": k.key_json,
                    "target": k.target,
                    "ratio": round(k.ratios[self.host], 4),
                    "host_ms": k.times[self.host],
                    "peers_ms": statistics.median(t for h, t in k.times.items() if h != self.host),
                }
                for k in self.worst
            ],
        }


@dataclass
class FleetAnalysis:
    """The outcome: per-host summaries, outliers first, and what the analysis looked at."""

    hosts: list[HostSummary]
    keys_compared: int
    threshold: float
    min_keys: int
    ratios: dict[str, list[float]]  # host -> its ratio on each key (for the plot)

    @property
    def outliers(self) -> list[HostSummary]:
        return [h for h in self.hosts if h.outlier]

    def as_dict(self) -> dict[str, Any]:
        return {
            "keys_compared": self.keys_compared,
            "threshold": self.threshold,
            "min_keys": self.min_keys,
            "outliers": [h.host for h in self.outliers],
            "hosts": [h.as_dict() for h in self.hosts],
        }


def compare_key(timings: Iterable[tuple[str, str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each host's ratio to its peers on one key, from ``(host, config_hash, median_ms)`` rows.

    Per config timed by two hosts or more: the host's time over the median of the others; per
    host, the median of those over the configs. A config only one host timed says nothing about
    hosts. Returns (ratios, times), both by host, empty when no config was timed twice.
    """
    by_config: dict[str, dict[str, float]] = {}
    for host, config_hash, ms in timings:
        if ms is not None and ms > 0:
            by_config.setdefault(config_hash, {})[host] = ms
    per_host: dict[str, list[float]] = {}
    per_host_ms: dict[str, list[float]] = {}
    for hosts in by_config.values():
        if len(hosts) < 2:
            continue
        for host, ms in hosts.items():
            peers = statistics.median(t for h, t in hosts.items() if h != host)
            per_host.setdefault(host, []).append(ms / peers)
            per_host_ms.setdefault(host, []).append(ms)
    ratios = {h: statistics.median(r) for h, r in per_host.items()}
    times = {h: statistics.median(t) for h, t in per_host_ms.items()}
    return ratios, times


def analyse(
    keys: Iterable[KeyComparison], threshold: float = DEFAULT_THRESHOLD, min_keys: int = DEFAULT_MIN_KEYS
) -> FleetAnalysis:
    """Summarise each host; an outlier is slower than its peers' median by more than ``threshold``
    (a fraction) on its median key, over at least ``min_keys`` keys."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    per_host: dict[str, list[KeyComparison]] = {}
    n = 0
    for k in keys:
        if len(k.ratios) < 2:
            continue
        n += 1
        for host in k.ratios:
            per_host.setdefault(host, []).append(k)
    summaries = []
    for host, ks in per_host.items():
        ratios = [k.ratios[host] for k in ks]
        med = statistics.median(ratios)
        slower = sum(r > 1.0 + threshold for r in ratios) / len(ratios)
        worst = sorted(ks, key=lambda k: -k.ratios[host])[:EVIDENCE_KEYS]
        outlier = len(ks) >= min_keys and med > 1.0 + threshold
        summaries.append(HostSummary(host, len(ks), med, slower, outlier, worst))
    summaries.sort(key=lambda h: (not h.outlier, -h.median_ratio, h.host))
    ratios_by_host = {h.host: [k.ratios[h.host] for k in per_host[h.host]] for h in summaries}
    return FleetAnalysis(summaries, n, threshold, min_keys, ratios_by_host)


def explain(a: FleetAnalysis) -> list[str]:
    """The analysis as lines of text (``tunecache hosts``)."""
    if not a.hosts:
        return ["no key was timed by more than one host: nothing to compare (see `tunecache report`)"]
    out = [
        f"{a.keys_compared} keys timed by more than one host; outlier: median time > "
        f"{1 + a.threshold:.2f}x its peers' over >= {a.min_keys} keys"
    ]
    out.append(f"{'HOST':<32} {'KEYS':>6} {'VS PEERS':>9} {'SLOWER':>7}  VERDICT")
    for h in a.hosts:
        verdict = "OUTLIER" if h.outlier else ("ok" if h.keys >= a.min_keys else "too few keys")
        out.append(f"{h.host:<32} {h.keys:>6} {h.median_ratio:>8.3f}x {h.slower_share:>6.0%}  {verdict}")
    for h in a.outliers:
        out.append(f"{h.host}: slower than its peers on {h.slower_share:.0%} of {h.keys} keys; worst:")
        for row in h.as_dict()["worst"]:
            out.append(
                f"  {row['kernel']} {row['key']} [{row['target']}]: {row['host_ms']:.4g} ms vs peers "
                f"{row['peers_ms']:.4g} ms ({row['ratio']:.2f}x)"
            )
    return out


def key_from_rows(meta: Mapping[str, Any], rows: Iterable[tuple[str, str, float]]) -> KeyComparison:
    """A :class:`KeyComparison` from one problem's descriptive fields and its measurement rows."""
    ratios, times = compare_key(rows)
    return KeyComparison(meta["digest"], meta["kernel"], meta["key_json"], meta["target"], ratios, times)
