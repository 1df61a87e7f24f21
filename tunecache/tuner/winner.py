"""Winner choice: which config a tuning key launches.

Pure functions of plain data (problems, config hashes, key values): no I/O, no logging, no
autotuner. Each returns a decision (a config hash, or the rows a policy decides without a
benchmark); the autotuner alone acts on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.problem.model import ConfigResult, Problem, pick_winner
from tunecache.problem.target import Target


def choose(
    rows: Mapping[str, ConfigResult],
    hashes: Sequence[str],
    problems: Iterable[Problem],
    *,
    digest: str,
    target_digest: str,
    tolerance: float,
) -> str | None:
    """The winner among ``hashes`` (this key's configs, with their rows in ``rows``): the fastest,
    or a config within ``tolerance`` of it that already wins more of the other keys (``problems``
    other than ``digest``) of this kernel on this target. None: no config ran."""
    counts = Counter(
        q.winner_config_hash
        for q in problems
        if q.digest != digest and q.winner_config_hash and q.target.digest == target_digest
    )
    prefer = sorted(counts, key=lambda h: (-counts[h], h))
    best = pick_winner((rows[h] for h in hashes if h in rows), prefer, tolerance)
    return best.config_hash if best else None


def stored_choice(problem: Problem, hashes: Sequence[str]) -> str:
    """The config a stored problem launches: its winner, the same on every worker of the fleet; if
    that config was removed since, the best stored among the current ones (else the first)."""
    if problem.winner_config_hash in hashes:
        return problem.winner_config_hash
    rows = problem.config_map()
    best = pick_winner(rows[h] for h in hashes if h in rows)
    return best.config_hash if best else hashes[0]


def nearest(
    problems: Iterable[Problem],
    hashes: Sequence[str],
    values: Sequence[Any],
    *,
    target_digest: str,
    bucket_index: int | None,
) -> str | None:
    """For a key with no stored result (a fallback: no benchmark now), the winner of the nearest
    stored key on this target among ``hashes``: the same other key values first, then the closest
    batch bucket (``values[bucket_index]``), then the smaller bucket, then the digest. Deterministic.
    None: no stored key fits."""
    bi = bucket_index
    best: tuple[tuple[Any, ...], str] | None = None
    for p in problems:
        if p.target.digest != target_digest or p.winner_config_hash not in hashes:
            continue
        try:
            other = [v for _, v in orjson.loads(p.key_json)]
        except ValueError:
            continue
        if len(other) != len(values):
            continue
        same_rest = all(a == b for i, (a, b) in enumerate(zip(other, values)) if i != bi)
        dist = abs(other[bi] - values[bi]) if bi is not None and isinstance(other[bi], int) else 0
        rank = (0 if same_rest else 1, dist, other[bi] if bi is not None else 0, p.digest)
        if best is None or rank < best[0]:
            best = (rank, p.winner_config_hash)
    return best[1] if best else None


@dataclass(frozen=True)
class Pruning:
    """What ``TUNECACHE_ON_DRIVER_CHANGE=topk:N`` decides after a driver change: benchmark ``keep``
    only; ``failed`` configs stay failed (no compile); ``pruned`` rows are stored as such."""

    keep: frozenset[str]
    old: Problem
    failed: dict[str, ConfigResult] = field(default_factory=dict)
    pruned: dict[str, ConfigResult] = field(default_factory=dict)

    @property
    def skip(self) -> dict[str, ConfigResult]:
        return {**self.failed, **self.pruned}


def previous_driver(problems: Iterable[Problem], target: Target) -> Problem | None:
    """The latest of ``problems`` (the same source and key) on ``target`` but for its driver."""

    def no_driver(t: Target) -> dict[str, Any]:
        return {k: v for k, v in t.digest_fields().items() if not k.startswith("driver")}

    olds = [
        q
        for q in problems
        if (q.target.driver_version != target.driver_version or q.target.driver_release != target.driver_release)
        and no_driver(q.target) == no_driver(target)
    ]
    return max(olds, key=lambda q: (q.updated_at or 0, q.digest)) if olds else None


def driver_change_prune(old: Problem, configs: Mapping[str, dict[str, Any]], n: int) -> Pruning | None:
    """Keep the ``n`` best of ``configs`` (hash -> config, this key's) that ran ok under the old
    driver (``old``); the rest become rows of their own: failed before (kept as they were) or
    pruned (with their config and why). None: none of them ran ok before (benchmark them all)."""
    ranked = sorted(
        (r for r in old.configs if r.ok and r.config_hash in configs), key=lambda r: (r.median_ms, r.config_hash)
    )
    keep = frozenset(r.config_hash for r in ranked[:n])
    if not keep:
        return None
    before = old.config_map()
    failed: dict[str, ConfigResult] = {}
    pruned: dict[str, ConfigResult] = {}
    driver = old.target.driver_release or old.target.driver_version
    for h, config in configs.items():
        if h in keep:
            continue
        prev = before.get(h)
        if prev is not None and not prev.ok:
            failed[h] = prev
        else:
            reason = f"TUNECACHE_ON_DRIVER_CHANGE=topk:{n}: not among the {n} best configs stored for driver {driver}"
            pruned[h] = ConfigResult(h, dict(config), status="pruned", failure={"reason": reason})
    return Pruning(keep=keep, old=old, failed=failed, pruned=pruned)
