"""Compare: what changed between two stores (``tunecache report --compare OTHER``).

Before and after a driver or Triton upgrade, a new image, a week of re-tuning: per tuning key,
did the winner change, and how much faster or slower is the winner now (``ratio = now ms / before
ms``, both shown)? Summarised per kernel.

The two sides are matched by **kernel, GPU (device name and arch) and key**, not by problem
digest: the digest covers the kernel's source and the driver and Triton versions, which are
exactly what an upgrade changes. Where one side holds several problems for one such key (two
drivers, two sources), its most recently updated one stands for it. ``OTHER`` is the *before*
side; this store is *now*.

Bounded: the other side's winners are held in memory one small tuple per key (a 100k-problem
store: tens of MB); the page lists the ``MAX_LISTED`` largest changes and says how many it left out.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.store import reports
from tunecache.store.store import Store

#: A key got faster (slower) when its winner's time moved by more than this fraction.
DEFAULT_CHANGE = 0.05
#: Changed keys the page lists (largest change first); the JSON lists up to MAX_JSON_KEYS.
MAX_LISTED = 200
MAX_JSON_KEYS = 10_000
BATCH = 2000

FASTER, SLOWER, SAME, NEW_WINNER, LOST_WINNER = "faster", "slower", "same", "winner found", "no winner now"


@dataclass(frozen=True)
class Side:
    """One side's winner of a key."""

    config_hash: str | None
    config: str  # the winner's config as text ("" without a winner)
    ms: float | None
    driver: str
    triton: str


@dataclass
class KeyChange:
    """One key held by both stores."""

    kernel: str
    device: str
    arch: str
    key_json: str
    before: Side
    now: Side

    @property
    def ratio(self) -> float | None:
        """Now over before (below 1: faster now)."""
        if self.before.ms and self.now.ms:
            return self.now.ms / self.before.ms
        return None

    @property
    def winner_changed(self) -> bool:
        return self.before.config_hash != self.now.config_hash

    def status(self, change: float) -> str:
        r = self.ratio
        if r is None:
            if self.now.ms and not self.before.ms:
                return NEW_WINNER
            return LOST_WINNER if self.before.ms and not self.now.ms else SAME
        return FASTER if r < 1 - change else SLOWER if r > 1 + change else SAME

    def as_dict(self, change: float) -> dict[str, Any]:
        r = self.ratio
        return {
            "kernel": self.kernel,
            "gpu": self.device,
            "arch": self.arch,
            "key": self.key_json,
            "winner_changed": self.winner_changed,
            "status": self.status(change),
            "ratio": None if r is None else round(r, 4),
            "before": {
                "config": self.before.config,
                "ms": self.before.ms,
                "driver": self.before.driver,
                "triton": self.before.triton,
            },
            "now": {"config": self.now.config, "ms": self.now.ms, "driver": self.now.driver, "triton": self.now.triton},
        }


@dataclass
class KernelChange:
    """One kernel's keys, compared."""

    kernel: str
    matched: int = 0
    winners_changed: int = 0
    faster: int = 0
    slower: int = 0
    only_now: int = 0
    only_before: int = 0
    ratios: list[float] = field(default_factory=list)

    @property
    def median_ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    def as_dict(self) -> dict[str, Any]:
        med = self.median_ratio
        return {
            "kernel": self.kernel,
            "matched": self.matched,
            "winners_changed": self.winners_changed,
            "faster": self.faster,
            "slower": self.slower,
            "only_now": self.only_now,
            "only_before": self.only_before,
            "median_ratio": None if med is None else round(med, 4),
            "fastest_ratio": round(min(self.ratios), 4) if self.ratios else None,
            "slowest_ratio": round(max(self.ratios), 4) if self.ratios else None,
        }


@dataclass
class Comparison:
    """Every key both stores hold, the kernels' summaries, and the changed keys."""

    now_label: str
    before_label: str
    change: float
    kernels: list[KernelChange]
    changed: list[KeyChange]  # winner changed, or faster/slower by more than ``change``; largest first

    @property
    def matched(self) -> int:
        return sum(k.matched for k in self.kernels)

    def totals(self) -> dict[str, int]:
        keys = ("matched", "winners_changed", "faster", "slower", "only_now", "only_before")
        return {n: sum(getattr(k, n) for k in self.kernels) for n in keys}

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.now_label,
            "before": self.before_label,
            "ratio": "now winner ms / before winner ms (below 1: faster now)",
            "change": self.change,
            **self.totals(),
            "changed_total": len(self.changed),
            "kernels": [k.as_dict() for k in self.kernels],
            "changed": [c.as_dict(self.change) for c in self.changed[:MAX_JSON_KEYS]],
        }


def config_text(config_json: str | None) -> str:
    """A config as text with every field that may tell two apart (``BLOCK=64 w4 s3 maxnreg=128``)."""
    if not config_json:
        return ""
    try:
        cfg = orjson.loads(config_json)
    except orjson.JSONDecodeError:
        return config_json[:80]
    if not isinstance(cfg, dict):
        return str(cfg)[:80]
    parts = [f"{k}={v}" for k, v in sorted((cfg.get("kwargs") or {}).items())]
    parts += [f"w{cfg['num_warps']}"] if cfg.get("num_warps") is not None else []
    parts += [f"s{cfg['num_stages']}"] if cfg.get("num_stages") is not None else []
    skip = ("kwargs", "num_warps", "num_stages")
    rest = {k: v for k, v in cfg.items() if k not in skip and v is not None and (k, v) != ("num_ctas", 1)}
    parts += [f"{k}={v}" for k, v in sorted(rest.items())]
    return " ".join(parts)


def _rows(store: Store, filters: Any, dated: bool) -> Iterator[Any]:
    last = ""
    while True:
        batch = reports.winners_batch(store, filters, last, BATCH, dated=dated)
        if not batch:
            return
        yield from batch
        last = batch[-1].digest


def _latest(store: Store, filters: Any, dated: bool) -> dict[tuple[str, str, str, str], tuple[dt.datetime, Side]]:
    """(kernel, device, arch, key_json) -> (updated_at, winner) of the most recently updated problem."""
    out: dict[tuple[str, str, str, str], tuple[dt.datetime, Side]] = {}
    for r in _rows(store, filters, dated):
        k = (r.kernel, r.device_name, r.arch, r.key_json)
        side = Side(r.winner_config_hash, config_text(r.config_json), r.winner_ms, r.driver_version, r.triton_version)
        if k not in out or r.updated_at > out[k][0]:
            out[k] = (r.updated_at, side)
    return out


def compare(
    now: Store, before: Store, filters: Any, change: float = DEFAULT_CHANGE, before_label: str | None = None
) -> Comparison:
    """Compare ``now`` with ``before``: ``filters`` (the report's) select the keys of ``now``;
    ``before`` gets the same kernel and target filters but not ``since`` (its keys are older)."""
    if change < 0:
        raise ValueError(f"change must be >= 0, got {change}")
    old = {k: side for k, (_, side) in _latest(before, filters, dated=False).items()}
    cur = _latest(now, filters, dated=True)
    kernels: dict[str, KernelChange] = {}
    changed: list[KeyChange] = []
    for (kernel, device, arch, key), (_, side) in cur.items():
        kc = kernels.setdefault(kernel, KernelChange(kernel))
        prev = old.pop((kernel, device, arch, key), None)
        if prev is None:
            kc.only_now += 1
            continue
        c = KeyChange(kernel, device, arch, key, prev, side)
        kc.matched += 1
        kc.winners_changed += c.winner_changed
        status = c.status(change)
        kc.faster += status == FASTER
        kc.slower += status == SLOWER
        if c.ratio is not None:
            kc.ratios.append(c.ratio)
        if c.winner_changed or status != SAME:
            changed.append(c)
    for kernel, *_ in old:
        kernels.setdefault(kernel, KernelChange(kernel)).only_before += 1
    changed.sort(key=lambda c: (-abs(math.log(c.ratio)) if c.ratio else -math.inf, c.kernel, c.key_json))
    order = sorted(kernels.values(), key=lambda k: (-(k.winners_changed + k.faster + k.slower), k.kernel))
    return Comparison(now.masked_url, before_label or before.masked_url, change, order, changed)


def _e(v: Any) -> str:
    return html.escape(str(v))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def to_html(c: Comparison) -> str:
    """The page's comparison section: every store string escaped."""
    t = c.totals()
    out = [
        f"<p>Now: <code>{_e(c.now_label)}</code>; before: <code>{_e(c.before_label)}</code>. Keys matched by "
        "kernel, GPU and key (not by digest: an upgrade changes it). Ratio: the winner's time now over "
        f"before (below 1: faster now); faster or slower: by more than {c.change:.0%}.</p>",
        f"<p>{t['matched']} keys in both: {t['winners_changed']} winners changed, {t['faster']} faster, "
        f"{t['slower']} slower; {t['only_now']} keys only now, {t['only_before']} only before.</p>",
    ]
    if not c.kernels:
        return "".join(out) + "<p>No problems match.</p>"
    rows = [
        [
            k.kernel,
            k.matched,
            k.winners_changed,
            k.faster,
            k.slower,
            _ratio(k.median_ratio),
            _ratio(min(k.ratios) if k.ratios else None),
            _ratio(max(k.ratios) if k.ratios else None),
            k.only_now,
            k.only_before,
        ]
        for k in c.kernels
    ]
    headers = ["kernel", "keys in both", "winners changed", "faster", "slower", "median ratio", "fastest", "slowest"]
    out.append('<div id="compare-kernels">' + _table([*headers, "only now", "only before"], rows) + "</div>")
    if not c.changed:
        out.append('<p class="good">No key changed: same winners, same times.</p>')
        return "".join(out)
    listed = c.changed[:MAX_LISTED]
    if len(c.changed) > len(listed):
        out.append(
            f'<p class="note">The {len(listed)} largest of {len(c.changed)} changed keys; all of them: '
            "<code>--json</code> (or narrow with <code>--kernel</code>).</p>"
        )
    krows = [
        [
            k.kernel,
            f"{k.device} ({k.arch})",
            k.key_json,
            k.status(c.change),
            _ratio(k.ratio),
            _ms(k.before.ms),
            _ms(k.now.ms),
            k.before.config,
            k.now.config if k.winner_changed else "(same)",
        ]
        for k in listed
    ]
    headers = ["kernel", "GPU", "key", "", "ratio", "before ms", "now ms", "winner before", "winner now"]
    out.append('<div id="compare-keys">' + _table(headers, krows) + "</div>")
    return "".join(out)
