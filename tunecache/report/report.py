"""Report: what the store knows, as one self-contained HTML page (``tunecache report``).

Per kernel and target, a heat map of configs x tuning keys (time over the key's best, the winner
starred, failures with their reason), the winner per bucket, time saved, capture/offline misses,
and the fleet: each host's timings of identical problems against its peers' (:mod:`tunecache.report.fleet`),
which ``tunecache hosts`` prints as text. Plots are matplotlib SVG inlined in the page
(:mod:`tunecache.report.plots`, the ``report`` extra); the page loads nothing: no script, no font, no CDN.

Bounded on any store: every query filters and limits in SQL. The page shows the largest
``MAX_GROUPS`` kernel/target groups, ``MAX_KEYS`` keys of each (spread evenly over its buckets)
and ``MAX_CONFIGS`` configs, and says so wherever it left something out.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.model import FAILED_STATUSES, utcnow
from tunecache.report import compare, fleet
from tunecache.store import reports
from tunecache.store.store import Store

MAX_GROUPS = 12  # kernel x source x target groups drawn
MAX_SCAN = 5000  # keys of one group read to choose the drawn ones from
MAX_KEYS = 48  # heat-map columns per group
MAX_CONFIGS = 40  # heat-map rows per group
MAX_MISSES = 40  # miss bars
MAX_FLEET_KEYS = 100_000  # keys the fleet analysis reads (in digest order: a hash, so an unbiased sample)
FLEET_BATCH = 500
MAX_DOTS = 1500  # fleet plot: dots per host


@dataclass
class Filters:
    """``--kernel`` (full name or its last part), ``--target`` (arch, device name or target digest
    prefix), ``--since`` (problems updated since; the fleet: timings measured since)."""

    kernel: str | None = None
    target: str | None = None
    since: dt.datetime | None = None

    def describe(self) -> str:
        parts = [f"kernel {self.kernel}" if self.kernel else "", f"target {self.target}" if self.target else ""]
        since = f"{self.since:%Y-%m-%d %H:%M} UTC" if self.since else ""
        parts.append(f"problems updated and fleet timings measured since {since}" if since else "")
        return ", ".join(p for p in parts if p) or "none"


# ---- the fleet ---------------------------------------------------------------------------------


def _target_label(device: str, arch: str, driver: str) -> str:
    return f"{device} ({arch}, driver {driver})" if driver else f"{device} ({arch})"


def iter_fleet_keys(store: Store, filters: Filters, max_keys: int = MAX_FLEET_KEYS) -> Iterator[fleet.KeyTimings]:
    """Every key timed by more than one host, in digest order, at most ``max_keys``, a batch of
    ``FLEET_BATCH`` per query, each packed small (:class:`tunecache.report.fleet.KeyTimings`)."""
    last, seen, shared = "", 0, {}
    while seen < max_keys:
        ids, meta, rows = reports.fleet_batch(store, filters, last, min(FLEET_BATCH, max_keys - seen))
        if not ids:
            return
        for d in ids:
            r = meta[d]
            info = {"digest": d, "kernel": r.kernel, "key_json": r.key_json, "device": r.device_name}
            info["target"] = _target_label(r.device_name, r.arch, r.driver_version)
            yield fleet.pack(info, rows.get(d, []), shared)
        seen += len(ids)
        last = ids[-1]


def hosts(
    store: Store,
    filters: Filters | None = None,
    threshold: float = fleet.DEFAULT_THRESHOLD,
    min_keys: int = fleet.DEFAULT_MIN_KEYS,
    max_keys: int = MAX_FLEET_KEYS,
) -> fleet.FleetAnalysis:
    """The fleet analysis of ``tunecache hosts`` and of the page (:func:`tunecache.report.fleet.judge`)."""
    filters = filters or Filters()
    dates = reports.fleet_dates(store, filters)
    return fleet.judge(iter_fleet_keys(store, filters, max_keys), threshold, min_keys, dates)


# ---- kernel x target groups --------------------------------------------------------------------


@dataclass
class Group:
    kernel: str
    source_hash: str
    target_digest: str
    target: str
    triton: str
    problems: int
    keys: list[dict[str, Any]] = field(default_factory=list)  # the drawn keys, in bucket order
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # digest -> config_hash -> config row


def key_label(key_json: str, bucket: int | None) -> str:
    """Short column label: the batch bucket, else the key's non-dtype values."""
    if bucket is not None:
        return f"b{bucket}"
    try:
        items = orjson.loads(key_json)
        vals = [f"{k}={v}" for k, v in items if not str(k).endswith(".dtype")]
        return " ".join(vals)[:40] or key_json[:40]
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return key_json[:40]


def config_label(cfg: dict[str, Any]) -> str:
    kw = " ".join(f"{k}={v}" for k, v in sorted(cfg.get("kwargs", {}).items()))
    return f"{kw} w{cfg.get('num_warps')} s{cfg.get('num_stages')}".strip()


def _spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items evenly spread over a sorted list, the first and the last included."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def load_groups(store: Store, filters: Filters) -> tuple[list[Group], int]:
    """The largest ``MAX_GROUPS`` kernel/source/target groups with their drawn keys and config
    rows, and how many groups match in all."""
    found, n = reports.groups(store, filters, MAX_GROUPS, MAX_SCAN, lambda scan: _spread(scan, MAX_KEYS))
    out = []
    for r, keys, rows in found:
        g = Group(r.kernel, r.source_hash, r.target_digest, _target_label(r[3], r[4], r[5]), r[6], r.n)
        g.keys, g.rows = keys, rows
        out.append(g)
    return out, n


# ---- the page ------------------------------------------------------------------------------------

#: Nothing may load: no script, no font, no image from anywhere (the SVGs are inline).
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSS = """
body{font-family:sans-serif;margin:1.5em;color:#212121;max-width:1600px}
h1{font-size:1.5em}h2{border-bottom:1px solid #bdbdbd;padding-bottom:.2em;margin-top:2em}h3{font-size:1.05em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #e0e0e0;padding:2px 6px;text-align:left}
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.4em .8em;font-size:.9em}
.bad{background:#ffebee;border-left:4px solid #c62828;padding:.4em .8em}.good{color:#2e7d32}
figure.plot{margin:.5em 0;overflow-x:auto}figure.plot svg{max-width:none;height:auto}
code{font-size:.85em}
"""


def _e(v: Any) -> str:
    return html.escape(str(v))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _plot(svg: str, title: str) -> str:
    return f'<figure class="plot" data-title="{_e(title)}">{svg}</figure>'


def failure_text(f: dict[str, Any] | None) -> str:
    """A failed config's reason; OutOfResources with what it needs and the limit."""
    if not f:
        return ""
    if f.get("required") is not None:
        return f"{f.get('resource') or 'resource'}: needs {f['required']}, limit {f.get('limit')}"
    return str(f.get("message") or f.get("error") or f.get("reason") or "")[:160]


def _group_section(g: Group, plots: Any) -> str:
    keys = g.keys
    labels = [key_label(k["key_json"], k["batch_bucket"]) for k in keys]
    cfgs: dict[str, dict[str, Any]] = {}
    for k in keys:
        for ch, row in g.rows.get(k["digest"], {}).items():
            cfgs.setdefault(ch, orjson.loads(row["config_json"]))
    wins = {k["winner_config_hash"] for k in keys}
    best = {k["digest"]: k["winner_ms"] for k in keys}

    def rank(ch: str) -> tuple[int, float]:  # winners first, then by mean relative time
        rel = [
            r["median_ms"] / best[d]
            for d, rows in g.rows.items()
            if (r := rows.get(ch)) and r["median_ms"] and best.get(d)
        ]
        return (ch not in wins, sum(rel) / len(rel) if rel else float("inf"))

    order = sorted(cfgs, key=rank)
    shown = order[:MAX_CONFIGS]
    rel, failed, reasons = [], {}, {}
    for i, ch in enumerate(shown):
        line = []
        for j, k in enumerate(keys):
            r = g.rows.get(k["digest"], {}).get(ch)
            ok = r is not None and r["status"] == "ok" and r["median_ms"] and k["winner_ms"]
            line.append(r["median_ms"] / k["winner_ms"] if ok else None)
            if r is not None and r["status"] != "ok":
                failed[(i, j)] = r["status"]
                why = failure_text(orjson.loads(r["failure"]) if r["failure"] else None)
                reasons.setdefault((config_label(cfgs[ch]), r["status"], why), []).append(labels[j])
        rel.append(line)
    winners = [shown.index(k["winner_config_hash"]) if k["winner_config_hash"] in shown else None for k in keys]
    parts = [f"<h3>{_e(g.kernel)} &middot; source {_e(g.source_hash[:10])} &middot; {_e(g.target)}</h3>"]
    parts.append(f"<p>{g.problems} keys stored, Triton {_e(g.triton)}.")
    if g.problems > len(keys):
        parts.append(f' <span class="note">Sampled: {len(keys)} of {g.problems} keys, spread over the buckets.</span>')
    if len(order) > len(shown):
        parts.append(f' <span class="note">{len(shown)} of {len(order)} configs: winners first.</span>')
    parts.append("</p>")
    if not keys or not shown:
        return "".join(parts) + "<p>No config rows.</p>"
    cfg_labels = [config_label(cfgs[ch]) for ch in shown]
    parts.append(_plot(plots.heatmap(cfg_labels, labels, rel, winners, failed), f"heatmap {g.kernel}"))
    if reasons:
        rows = [
            [c, st, why, len(ks), ", ".join(ks[:12]) + (" ..." if len(ks) > 12 else "")]
            for (c, st, why), ks in reasons.items()
        ]
        parts.append("<p>Failed configs (grey cells):</p>")
        parts.append(_table(["config", "status", "reason", "keys", "which"], rows))
    line = [(lab, k) for lab, k in zip(labels, keys) if k["winner_ms"]]
    if line:
        names = [config_label(cfgs.get(k["winner_config_hash"], {})) for _, k in line]
        svg = plots.winner_line([lab for lab, _ in line], [k["winner_ms"] for _, k in line], names)
        parts.append(_plot(svg, f"winners {g.kernel}"))
        rows = [[lab, name, f"{k['winner_ms']:.4g}"] for (lab, k), name in zip(line, names)]
        parts.append("<details><summary>Winner per key (table)</summary>")
        parts.append(_table(["key", "winner", "ms"], rows) + "</details>")
    return "".join(parts)


def _saved_section(store: Store, filters: Filters, plots: Any) -> str:
    per_kernel, by_day, measured = reports.saved(store, filters)
    if not per_kernel:
        return "<p>No problems match.</p>"
    rows = [[k, hits, f"{spent:.1f}", f"{s or 0:.1f}", f"{measured.get(k, 0):.1f}"] for k, hits, spent, s in per_kernel]
    out = [_table(["kernel", "hits", "tuning s spent", "saved s (hits x tuning s)", "saved s (counted live)"], rows)]
    out.append(
        _plot(
            plots.saved_bars(
                [r[0] for r in per_kernel], [r[3] or 0 for r in per_kernel], [r[2] or 0 for r in per_kernel]
            ),
            "saved",
        )
    )
    series: dict[str, tuple[list[Any], list[float]]] = {}
    for kernel, d, s in by_day:
        dates, vals = series.setdefault(kernel, ([], []))
        dates.append(d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)[:10]))
        vals.append((vals[-1] if vals else 0.0) + (s or 0.0))
    if any(len(d) > 1 for d, _ in series.values()):
        out.append("<p>Over time, by the date each problem was tuned (the store keeps a hit count, not hit dates):</p>")
        out.append(_plot(plots.saved_over_time(series), "saved over time"))
    else:
        out.append("<p>All these problems were tuned on one day: no plot over time.</p>")
    return "".join(out)


def _misses_section(store: Store, filters: Filters, plots: Any) -> str:
    total, rows = reports.missed(store, filters, MAX_MISSES)
    if not rows:
        return '<p class="good">No capture or offline misses: every key the fleet launched was tuned.</p>'
    by_key: dict[str, list[int]] = {}
    for r in rows:
        counts = by_key.setdefault(f"{r.kernel.rsplit('.', 1)[-1]} {key_label(r.key_json, None)}", [0, 0])
        counts[0 if r.reason == "capture" else 1] += r.count
    out = []
    if total > len(rows):
        out.append(f'<p class="note">The {len(rows)} most frequent of {total} missed keys.</p>')
    out.append(
        _plot(plots.miss_bars(list(by_key), [c[0] for c in by_key.values()], [c[1] for c in by_key.values()]), "misses")
    )
    out.append(_table(["kernel", "key", "reason", "count", "host", "last seen"], [list(r) for r in rows]))
    return "".join(out)


MAX_KERNEL_ROWS = 500  # fleet: host x kernel verdict rows listed


def _evidence_table(worst: list[fleet.Evidence]) -> str:
    if not worst:
        return "<p>No key where it was slower.</p>"
    rows = [[w.kernel, w.key_json, w.target, f"{w.ratio:.2f}x", f"{w.host_ms:.4g}", f"{w.peers_ms:.4g}"] for w in worst]
    return _table(["kernel", "key", "target", "ratio", "host ms", "peers ms"], rows)


def _fleet_section(a: fleet.FleetAnalysis, plots: Any, max_keys: int) -> str:
    """The fleet's verdicts: the same :func:`tunecache.report.fleet.verdict` as ``tunecache hosts``."""
    if not a.hosts:
        return (
            "<p>No key was timed by more than one host yet (hosts record their own timings in the "
            "<code>measurements</code> table whenever they benchmark): nothing to compare.</p>"
        )
    out = [
        f"<p>{a.keys_compared} keys timed by more than one host. A key's ratio: the host's median time over "
        "the configs it shares with its peers, over the peers' median time on those configs; a host's ratio: "
        f"the median of its per-key ratios. Outlier: above {1 + a.threshold:.2f}x over at least {a.min_keys} "
        "keys, overall or on one kernel; fewer keys: too few to judge.</p>"
    ]
    if a.keys_compared >= max_keys:
        out.append(
            f'<p class="note">Sampled: the first {max_keys} keys in digest order (a hash: an unbiased sample).</p>'
        )
    for h in a.outliers:
        when = fleet.measured_text(h.first_measured, h.last_measured)
        if h.outlier:
            out.append(
                f'<p class="bad"><b>Outlier: {_e(h.host)}</b> ({_e(", ".join(h.gpus))}): '
                f"{_e(h.verdict.ratio_text())} over {h.keys} keys; slower by more than {a.threshold:.0%} on "
                f"{h.slower_share:.0%} of them; timings measured {_e(when)} UTC. "
                "Keys where it was slower, worst first:</p>"
            )
            out.append(_evidence_table(h.worst))
            if len(h.slow_kernels) > 1:
                names = ", ".join(k.kernel for k in h.slow_kernels)
                out.append(f"<p>{_e(h.host)} is an outlier on each of: {_e(names)}.</p>")
            continue
        for k in h.slow_kernels:
            out.append(
                f'<p class="bad"><b>Outlier on {_e(k.kernel)}: {_e(h.host)}</b>: {_e(k.verdict.ratio_text())} over '
                f"{k.verdict.keys} keys; timings measured {_e(fleet.measured_text(k.first_measured, k.last_measured))} "
                "UTC. Worst keys:</p>"
            )
            out.append(_evidence_table(k.worst))
    for h in a.too_few:
        out.append(
            f'<p class="note"><b>Too few keys to judge: {_e(h.host)}</b>: {h.keys} of the {a.min_keys} keys needed '
            f"({_e(h.verdict.ratio_text())}; timings measured "
            f"{_e(fleet.measured_text(h.first_measured, h.last_measured))} UTC).</p>"
        )
    if not a.outliers and not a.too_few:
        out.append(
            f'<p class="good">No outlier: every host shared {a.min_keys}+ keys with its peers and none is more than '
            f"{a.threshold:.0%} slower, overall or on one kernel.</p>"
        )
    elif not a.outliers:
        out.append(f"<p>No outlier among the {len(a.hosts) - len(a.too_few)} hosts that could be judged.</p>")
    if a.excluded:
        out.append(
            "<p>Peers' baselines leave out the flagged hosts ("
            + _e(", ".join(sorted(a.excluded)))
            + ") wherever another host timed the same config: a slow peer would make healthy hosts look faster "
            "than 1.0x. A healthy host below 1.0x shared those keys with a flagged host only.</p>"
        )
    names = [h.host for h in a.hosts]
    dots = {n: _spread(a.ratios[n], MAX_DOTS) for n in names}  # the medians and the table use every key
    if any(len(dots[n]) < len(a.ratios[n]) for n in names):
        out.append(f'<p class="note">The plot draws at most {MAX_DOTS} keys per host; its bars use them all.</p>')
    out.append(
        _plot(
            plots.fleet_strip(
                names,
                [dots[n] for n in names],
                a.threshold,
                {h.host for h in a.outliers},
                [h.median_ratio for h in a.hosts],
            ),
            "fleet",
        )
    )
    rows = []
    for h in a.hosts:
        v = h.verdict
        slow = ", ".join(k.kernel for k in h.slow_kernels)
        rows.append(
            [
                h.host,
                ", ".join(h.gpus),
                v.keys,
                f"{v.ratio:.3f}x",
                f"{v.host_ms:.4g}",
                f"{v.peers_ms:.4g}",
                f"{h.slower_share:.0%}",
                fleet.measured_text(h.first_measured, h.last_measured),
                v.text(),
                slow,
            ]
        )
    headers = ["host", "GPU", "keys shared", "ratio", "host ms", "peers ms", "keys slower than threshold"]
    table = _table([*headers, "measured (UTC)", "verdict", "outlier on kernels"], rows)
    out.append(f'<div id="fleet-hosts">{table}</div>')
    per_kernel = [(h, k) for h in a.hosts for k in h.kernels]
    krows = [
        [
            k.kernel,
            h.host,
            k.verdict.keys,
            f"{k.verdict.ratio:.3f}x",
            f"{k.verdict.host_ms:.4g}",
            f"{k.verdict.peers_ms:.4g}",
            fleet.measured_text(k.first_measured, k.last_measured),
            k.verdict.text(),
        ]
        for h, k in sorted(per_kernel, key=lambda hk: (hk[1].kernel, hk[0].host))[:MAX_KERNEL_ROWS]
    ]
    out.append(f"<details><summary>Verdicts per kernel and host ({len(per_kernel)})</summary>")
    if len(per_kernel) > len(krows):
        out.append(f'<p class="note">The first {len(krows)} of {len(per_kernel)} rows: use --kernel to see one.</p>')
    kheaders = ["kernel", "host", "keys", "ratio", "host ms", "peers ms", "measured (UTC)", "verdict"]
    out.append(_table(kheaders, krows) + "</details>")
    return "".join(out)


def render(
    store: Store,
    filters: Filters | None = None,
    threshold: float = fleet.DEFAULT_THRESHOLD,
    min_keys: int = fleet.DEFAULT_MIN_KEYS,
    title: str | None = None,
    comparison: compare.Comparison | None = None,
) -> str:
    """The report page as one HTML string; with ``comparison`` (:func:`tunecache.report.compare.compare`),
    its section."""
    from tunecache.report import plots

    filters = filters or Filters()
    groups, n_groups = load_groups(store, filters)
    analysis = hosts(store, filters, threshold, min_keys)
    now = utcnow()
    body = [f"<h1>{_e(title or 'tunecache report')}</h1>"]
    body.append(
        f"<p>Store <code>{_e(store.masked_url)}</code>, {now:%Y-%m-%d %H:%M} UTC. "
        f"Filters: {_e(filters.describe())}.</p>"
    )
    if comparison is not None:
        body.append('<h2 id="compare">Compared with another store</h2>' + compare.to_html(comparison))
    body.append("<h2>Fleet: hosts against their peers</h2>" + _fleet_section(analysis, plots, MAX_FLEET_KEYS))
    body.append("<h2>Configs x keys, per kernel and target</h2>")
    body.append(
        "<p>Each cell: the config's median time over the key's best (1.0 = the best); "
        f"&#9733; the stored winner; grey: failed ({', '.join(f'{v} {k}' for k, v in plots.FAILED_CODES.items())}); "
        "white: not timed for that key.</p>"
    )
    if n_groups > len(groups):
        body.append(f'<p class="note">The {len(groups)} largest of {n_groups} kernel/target groups.</p>')
    body.extend(_group_section(g, plots) for g in groups)
    if not groups:
        body.append("<p>No problems match.</p>")
    body.append("<h2>Time saved</h2>" + _saved_section(store, filters, plots))
    body.append(
        "<h2>Capture and offline misses: tune these in the next image build</h2>"
        + _misses_section(store, filters, plots)
    )
    body.append(f"<p style='font-size:.8em;color:#757575'>Failure statuses: {', '.join(FAILED_STATUSES)}.</p>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{_e(title or 'tunecache report')}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def write_report(
    store: Store,
    path: str,
    filters: Filters | None = None,
    threshold: float = fleet.DEFAULT_THRESHOLD,
    min_keys: int = fleet.DEFAULT_MIN_KEYS,
    title: str | None = None,
    comparison: compare.Comparison | None = None,
) -> dict[str, Any]:
    """Write the page to ``path``; returns what the CLI prints (path, bytes, plots)."""
    from pathlib import Path

    page = render(store, filters, threshold, min_keys, title, comparison)
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return {"path": str(out), "bytes": len(page.encode()), "plots": page.count('<figure class="plot"')}
