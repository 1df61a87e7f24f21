"""Report: what the store knows, as one self-contained HTML page (``tunecache report``).

A summary of the store (counts, time spent and saved, the fleet's verdict) and an index of every
kernel/target group first; per group, a heat map of configs x tuning keys (time over the key's best,
the winner starred, failures with their reason; exact ms on hover through SVG titles, no script), the
winner per key in key order, time spent and saved, capture/offline misses,
and the fleet: each host's timings of identical problems against its peers' (:mod:`tunecache.report.fleet`),
which ``tunecache hosts`` prints as text. Plots are matplotlib SVG inlined in the page
(:mod:`tunecache.report.plots`, the ``report`` extra); the page loads nothing: no script, no font, no CDN.

Bounded on any store: every query filters and limits in SQL. The page draws the largest
``MAX_GROUPS`` kernel/target groups (every other one is listed with its counts and the command that
draws it), ``MAX_KEYS`` keys of each (spread evenly over them in key order) and ``MAX_CONFIGS``
configs, and says how many it left out and how to see them wherever it left something out.
"""

from __future__ import annotations

import datetime as dt
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.problem.model import FAILED_STATUSES, utcnow
from tunecache.report import compare, fleet, fleetpage
from tunecache.report.html import escape, figure, spread, table, utc
from tunecache.report.labels import (
    config_labels,
    key_axis,
    key_order,
    key_text,
)
from tunecache.store import reports
from tunecache.store.store import Store

MAX_GROUPS = 12  # kernel x source x target groups drawn
MAX_SCAN = 5000  # keys of one group read to choose the drawn ones from
MAX_KEYS = 48  # heat-map columns per group
MAX_CONFIGS = 40  # heat-map rows per group
MAX_MISSES = 40  # missed keys drawn
MAX_SAVED_ROWS = 200  # time-saved table rows (kernels)
MAX_SAVED_BARS = 30  # time-saved bars
MAX_OVER_TIME = 8  # kernels in the saved-over-time plot
MAX_FLEET_KEYS = 100_000  # keys the fleet analysis reads (in digest order: a hash, so an unbiased sample)
FLEET_BATCH = 2000


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


def iter_fleet_keys(
    store: Store,
    filters: Filters,
    max_keys: int = MAX_FLEET_KEYS,
    dates: dict[tuple[str, str], tuple[dt.datetime, dt.datetime]] | None = None,
) -> Iterator[fleet.KeyTimings]:
    """Every key timed by more than one host, in digest order, at most ``max_keys``, a batch of
    ``FLEET_BATCH`` per query, each packed small (:class:`tunecache.report.fleet.KeyTimings`).
    ``dates`` gathers, as the keys are read, when each host timed each kernel: ``{(host, kernel):
    (first, last measured_at)}`` over the timings read (the same batches: no second scan)."""
    last, seen, shared = "", 0, {}
    labels: dict[tuple[str, str, str], str] = {}  # a label per target, not per key
    while seen < max_keys:
        ids, meta, rows, batch_dates = reports.fleet_batch(store, filters, last, min(FLEET_BATCH, max_keys - seen))
        if not ids:
            return
        if dates is not None:
            for host, kernel, lo, hi in batch_dates:
                old = dates.get((host, kernel))
                dates[(host, kernel)] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        for d in ids:
            r = meta[d]
            target = labels.get((r.device_name, r.arch, r.driver_version))
            if target is None:
                target = labels[(r.device_name, r.arch, r.driver_version)] = _target_label(
                    r.device_name, r.arch, r.driver_version
                )
            info = {"digest": d, "kernel": r.kernel, "key_json": r.key_json, "device": r.device_name, "target": target}
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
    dates: dict[tuple[str, str], tuple[dt.datetime, dt.datetime]] = {}
    with _no_cycle_collection():
        keys = list(iter_fleet_keys(store, filters, max_keys, dates))  # fills dates before judging
        return fleet.judge(keys, threshold, min_keys, dates)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cycle collector off while the fleet's keys are read and judged: they make no cycles, but
    their hundreds of thousands of small objects would have it walk every held key again and again
    (about a tenth of the analysis on 100k keys); reference counting still frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---- kernel x target groups --------------------------------------------------------------------


@dataclass
class Group:
    kernel: str
    source_hash: str
    target_digest: str
    target: str
    triton: str
    problems: int
    keys: list[dict[str, Any]] = field(default_factory=list)  # the drawn keys, in key order
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # digest -> config_hash -> config row
    no_working_config: int = 0  # keys of the group without an ok config
    failures: dict[str, int] = field(default_factory=dict)  # config rows by status other than ok
    anchor: str = ""
    drawn: bool = False
    device: str = ""


def _draw_keys(scan: list[Any]) -> list[Any]:
    """The keys drawn of a group: in key order (numeric), ``MAX_KEYS`` spread over them."""
    return spread(sorted(scan, key=lambda r: key_order(r.key_json)), MAX_KEYS)


def load_groups(store: Store, filters: Filters) -> list[Group]:
    """Every kernel/source/target group, largest first; the first ``MAX_GROUPS`` with their drawn
    keys and config rows (``drawn``)."""
    found, every = reports.groups(store, filters, MAX_GROUPS, MAX_SCAN, _draw_keys)
    failures = reports.group_failures(store, filters)
    out = []
    for n, r in enumerate(every):
        g = Group(r.kernel, r.source_hash, r.target_digest, _target_label(r[3], r[4], r[5]), r[6], r.n)
        g.no_working_config = r.no_ok or 0
        g.failures = failures.get((r.source_hash, r.target_digest), {})
        g.anchor, g.device = f"g{n + 1}", r.device_name
        out.append(g)
    for g, (_, keys, rows) in zip(out, found):
        g.keys, g.rows, g.drawn = keys, rows, True
    return out


# ---- the page ------------------------------------------------------------------------------------

#: Nothing may load: no script, no font, no image from anywhere (the SVGs are inline).
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSS = """
body{font-family:sans-serif;margin:1.5em;color:#212121;max-width:1600px}
h1{font-size:1.5em}h2{border-bottom:1px solid #bdbdbd;padding-bottom:.2em;margin-top:2em}h3{font-size:1.05em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #e0e0e0;padding:2px 6px;text-align:left}
td.n{text-align:right}
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.4em .8em;font-size:.9em}
.bad{background:#ffebee;border-left:4px solid #c62828;padding:.4em .8em}.good{color:#2e7d32}
figure.plot{margin:.5em 0;max-width:100%;overflow-x:auto;overflow-y:hidden}
figure.plot svg{max-width:none;height:auto}
#summary th{font-weight:normal;color:#616161}#summary td[data-key]{font-weight:bold}
.index{max-height:32em;overflow-y:auto;display:inline-block}
code{font-size:.85em}
"""


def _cmd(kernel: str, target_digest: str | None = None) -> str:
    """The command that draws one kernel (and target) whole."""
    t = f" --target {target_digest}" if target_digest else ""
    return f"tunecache report --kernel {kernel}{t}"


def failure_text(f: dict[str, Any] | None) -> str:
    """A failed config's reason; OutOfResources with what it needs and the limit."""
    if not f:
        return ""
    if f.get("required") is not None:
        return f"{f.get('resource') or 'resource'}: needs {f['required']}, limit {f.get('limit')}"
    return str(f.get("message") or f.get("error") or f.get("reason") or "")[:160]


def _group_head(g: Group) -> str:
    source = escape(g.source_hash[:10])
    return f'<h3 id="{g.anchor}">{escape(g.kernel)} &middot; source {source} &middot; {escape(g.target)}</h3>'


def _group_section(g: Group, plots: Any) -> str:
    keys = sorted(g.keys, key=lambda k: key_order(k["key_json"]))
    axis = key_axis([k["key_json"] for k in keys])
    labels, full = axis.labels, [key_text(k["key_json"]) for k in keys]
    cfgs: dict[str, dict[str, Any]] = {}
    for k in keys:
        for ch, row in g.rows.get(k["digest"], {}).items():
            cfgs.setdefault(ch, orjson.loads(row["config_json"]))
    wins = {k["winner_config_hash"] for k in keys}
    best = {k["digest"]: k["winner_ms"] for k in keys}

    def rank(ch: str) -> tuple[int, float, str]:  # winners first, then by mean relative time
        rel = [
            r["median_ms"] / best[d]
            for d, rows in g.rows.items()
            if (r := rows.get(ch)) and r["median_ms"] and best.get(d)
        ]
        return (ch not in wins, sum(rel) / len(rel) if rel else float("inf"), ch)

    order = sorted(cfgs, key=rank)
    shown = order[:MAX_CONFIGS]
    names, same = config_labels([cfgs[ch] for ch in order], order)
    name = dict(zip(order, names))
    rel, failed, reasons, titles = [], {}, {}, []
    for i, ch in enumerate(shown):
        line, tline = [], []
        for j, k in enumerate(keys):
            r = g.rows.get(k["digest"], {}).get(ch)
            ok = r is not None and r["status"] == "ok" and r["median_ms"] and k["winner_ms"]
            line.append(r["median_ms"] / k["winner_ms"] if ok else None)
            head = f"{name[ch]}\nkey {full[j]}"
            if r is None:
                tline.append(f"{head}\nnot timed for this key")
            elif ok:
                tline.append(
                    f"{head}\n{r['median_ms']:.4g} ms = {r['median_ms'] / k['winner_ms']:.3f}x the key's best "
                    f"({k['winner_ms']:.4g} ms)\nmeasured on {r['host']}"
                )
            else:
                why = failure_text(orjson.loads(r["failure"]) if r["failure"] else None)
                tline.append(f"{head}\n{r['status']}{': ' + why if why else ''}\non {r['host']}")
            if r is not None and r["status"] != "ok":
                failed[(i, j)] = r["status"]
                reasons.setdefault((name[ch], r["status"], why), []).append(labels[j])
        rel.append(line)
        titles.append(tline)
    winners = [shown.index(k["winner_config_hash"]) if k["winner_config_hash"] in shown else None for k in keys]
    parts = [_group_head(g)]
    parts.append(f"<p>{g.problems} keys stored, Triton {escape(g.triton)}.")
    if axis.constant:
        parts.append(f" Every key has {escape(', '.join(axis.constant))}.")
    if same:
        parts.append(f" Every config has {escape(', '.join(same))}.")
    if g.problems > len(keys):
        parts.append(
            f' <span class="note">Drawn: {len(keys)} of {g.problems} keys, spread over '
            f"{'them' if g.problems <= MAX_SCAN else f'the first {MAX_SCAN} by bucket'} in key order "
            f"({g.problems - len(keys)} left out; every key: "
            f"<code>tunecache ls --kernel {escape(g.kernel)}</code>).</span>"
        )
    if len(order) > len(shown):
        parts.append(
            f' <span class="note">{len(shown)} of {len(order)} configs drawn: winners first, then by time '
            f"({len(order) - len(shown)} left out).</span>"
        )
    parts.append("</p>")
    if not keys or not shown:
        return "".join(parts) + "<p>No config rows.</p>"
    svg = plots.heatmap(
        [name[ch] for ch in shown],
        labels,
        rel,
        winners,
        failed,
        titles=titles,
        key_axis=axis.title,
        winner_titles=[
            f"stored winner for key {f}: {name.get(k['winner_config_hash'], '?')}, {k['winner_ms']:.4g} ms"
            if k["winner_ms"]
            else f"key {f}: no winner"
            for f, k in zip(full, keys)
        ],
    )
    parts.append(figure(svg, f"heatmap {g.kernel}"))
    dead = [labels[j] for j, k in enumerate(keys) if not k["winner_config_hash"]]
    if dead:
        parts.append(
            f'<p class="note">Every config failed for {len(dead)} drawn key(s), a grey column: '
            f"{escape(', '.join(dead[:20]))}{' ...' if len(dead) > 20 else ''}. Nothing stored can run there: "
            "Triton's own autotuning runs on such keys (see the reasons below).</p>"
        )
    if reasons:
        rows = [
            [c, st, why, len(ks), ", ".join(ks[:12]) + (f" ... ({len(ks) - 12} more)" if len(ks) > 12 else "")]
            for (c, st, why), ks in reasons.items()
        ]
        parts.append("<p>Configs that did not run (grey cells):</p>")
        parts.append(table(["config", "status", "reason", "keys", "which"], rows))
    line = [(lab, f, k) for lab, f, k in zip(labels, full, keys) if k["winner_ms"]]
    if line:
        wn = [name.get(k["winner_config_hash"], "?") for _, _, k in line]
        svg = plots.winner_line(
            [lab for lab, _, _ in line],
            [k["winner_ms"] for _, _, k in line],
            wn,
            key_axis=axis.title,
            titles=[f"key {f}: {w}, {k['winner_ms']:.4g} ms" for (_, f, k), w in zip(line, wn)],
        )
        parts.append(figure(svg, f"winners {g.kernel}"))
        rows = [[lab, w, f"{k['winner_ms']:.4g}"] for (lab, _, k), w in zip(line, wn)]
        parts.append("<details><summary>Winner per key (table)</summary>")
        parts.append(table([axis.title, "winner", "ms"], rows) + "</details>")
    return "".join(parts)


def _undrawn_section(g: Group) -> str:
    failed = ", ".join(f"{n} {s}" for s, n in sorted(g.failures.items())) or "none"
    return (
        _group_head(g) + f"<p>{g.problems} keys stored, Triton {escape(g.triton)}; keys with no working config: "
        f"{g.no_working_config}; config rows that did not run: {escape(failed)}. Not drawn: draw it with "
        f"<code>{escape(_cmd(g.kernel, g.target_digest))}</code>.</p>"
    )


# ---- summary, index, time, misses ------------------------------------------------------------------------


@dataclass
class Summary:
    """The page's header: what the store holds under the filters."""

    kernels: int
    keys: int
    hosts: int
    devices: int
    targets: int
    statuses: dict[str, int]
    no_working_config: int
    miss_keys: int
    miss_launches: int
    host_benchmarks: int
    spent_s: float
    hits: int
    saved_s: float

    @property
    def failed(self) -> int:
        return sum(n for s, n in self.statuses.items() if s in FAILED_STATUSES)


#: Time saved, the one definition the page uses, shown next to the number.
SAVED_DEFINITION = (
    "hits x the key's tuning seconds: each hit is a process that found the key's winner stored instead "
    "of tuning it, counted at what tuning that key took. Computed from the rows the page shows, so it "
    "follows the filters and survives export and import (the hosts' live counters in "
    "`tunecache stats` do neither)."
)
SPENT_DEFINITION = (
    "every host's tuning of every key: a key counts once per host that benchmarked it (its timings in "
    "the measurements table; once where none is recorded), each at the key's stored tuning seconds (the "
    "store keeps one tuning time per key)."
)


def load_summary(store: Store, filters: Filters, per_kernel: list[Any], groups: list[Group]) -> Summary:
    """The header's figures: per kernel sums (keys, time), per group sums (failures, keys with no
    working config, GPUs: every matching problem is in exactly one group), and the store's hosts and
    misses."""
    s = reports.summary(store, filters)
    statuses: dict[str, int] = {}
    for g in groups:
        for st, n in g.failures.items():
            statuses[st] = statuses.get(st, 0) + n
    return Summary(
        kernels=len(per_kernel),
        keys=sum(r.keys for r in per_kernel),
        hosts=s["hosts"],
        devices=len({g.device for g in groups}),
        targets=len({g.target_digest for g in groups}),
        statuses=statuses,
        no_working_config=sum(g.no_working_config for g in groups),
        miss_keys=s["miss_keys"],
        miss_launches=int(s["miss_launches"] or 0),
        host_benchmarks=int(sum(r.host_benchmarks or 0 for r in per_kernel)),
        spent_s=float(sum(r.spent or 0 for r in per_kernel)),
        hits=int(sum(r.hits or 0 for r in per_kernel)),
        saved_s=float(sum(r.saved or 0 for r in per_kernel)),
    )


def _summary_section(s: Summary, a: fleet.FleetAnalysis) -> str:
    pruned = s.statuses.get("pruned", 0)
    by = ", ".join(f"{n} {st}" for st, n in sorted(s.statuses.items()) if st in FAILED_STATUSES)
    # The same verdicts as the Fleet section and `tunecache hosts` (fleet.FleetAnalysis).
    judged = len(a.hosts) - len(a.too_few)
    if a.outliers:
        flagged = [
            f"{h.host} ({h.verdict.ratio_text()})"
            if h.outlier
            else f"{h.host} on {', '.join(k.kernel for k in h.slow_kernels)}"
            for h in a.outliers
        ]
        verdict = "outlier: " + "; ".join(flagged)
    elif a.hosts and judged:
        verdict = f"no outlier among the {judged} hosts judged over {a.keys_compared} shared keys"
    elif a.hosts:
        verdict = f"too few keys to judge any of the {len(a.hosts)} hosts ({a.min_keys} needed)"
    else:
        verdict = "no key timed by two hosts: nothing to compare"
    if a.too_few and (a.outliers or judged):
        verdict += f"; too few keys to judge: {', '.join(h.host for h in a.too_few)}"
    rows = [
        ("kernels", s.kernels, ""),
        ("keys", s.keys, "tuning keys stored (problems)"),
        ("hosts", s.hosts, "hosts that benchmarked a key"),
        ("GPUs", s.devices, f"device models, on {s.targets} targets (device, driver, Triton)"),
        ("configs failed", s.failed, f"config rows that failed ({by or 'none'}); {pruned} more pruned"),
        (
            "keys with no working config",
            s.no_working_config,
            "no stored winner, every config failed: Triton's own choice runs",
        ),
        ("open misses", s.miss_keys, f"keys launched untuned ({s.miss_launches:,} launches): tune them"),
        ("time spent tuning", f"{s.spent_s:,.1f} s", f"{s.host_benchmarks:,} host benchmarks: {SPENT_DEFINITION}"),
        ("time saved", f"{s.saved_s:,.1f} s", f"{s.hits:,} hits; {SAVED_DEFINITION}"),
        ("fleet", verdict, "see Fleet below"),
    ]
    cells = "".join(
        f'<tr><th>{escape(k)}</th><td data-key="{escape(k)}">{escape(f"{v:,}" if isinstance(v, int) else v)}</td>'
        f"<td>{escape(why)}</td></tr>"
        for k, v, why in rows
    )
    cls = "bad" if a.outliers else ("note" if a.too_few else "good")
    return f'<h2 id="summary-h">Summary</h2><table id="summary" class="{cls}-sum">{cells}</table>'


def _index_section(groups: list[Group]) -> str:
    rows = []
    for g in groups:
        failed = sum(n for s, n in g.failures.items() if s in FAILED_STATUSES)
        rows.append(
            f'<tr><td><a href="#{g.anchor}">{escape(g.kernel)}</a></td><td>{escape(g.target)}</td>'
            f'<td class="n">{g.problems}</td><td class="n">{failed}</td><td class="n">{g.no_working_config}</td>'
            f"<td>{'drawn' if g.drawn else 'not drawn'}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("kernel", "target", "keys", "configs failed", "keys with no working config", "")
    )
    out = [f'<h2 id="index">Index: {len(groups)} kernel/target groups</h2>']
    out.append(
        '<p><a href="#fleet">Fleet</a> &middot; <a href="#groups">Configs x keys</a> &middot; '
        '<a href="#saved">Time saved</a> &middot; <a href="#misses">Misses</a></p>'
    )
    drawn = sum(g.drawn for g in groups)
    if drawn < len(groups):
        out.append(
            f'<p class="note">Heat maps drawn for the {drawn} largest of {len(groups)} groups; '
            f"{len(groups) - drawn} left out are listed with their counts and the command that draws them "
            f"(<code>tunecache report --kernel NAME --target DIGEST</code>).</p>"
        )
    out.append(f'<div class="index"><table>{"<tr>" + head + "</tr>"}{"".join(rows)}</table></div>')
    return "".join(out)


def _saved_section(store: Store, filters: Filters, per_kernel: list[Any], plots: Any) -> str:
    if not per_kernel:
        return "<p>No problems match.</p>"
    out = [f"<p>Saved: {escape(SAVED_DEFINITION)} Spent: {escape(SPENT_DEFINITION)}</p>"]
    shown = per_kernel[:MAX_SAVED_ROWS]
    rows = [
        [r.kernel, r.keys, r.hits or 0, r.host_benchmarks or 0, f"{r.spent or 0:.1f}", f"{r.saved or 0:.1f}"]
        for r in shown
    ]
    if len(per_kernel) > len(shown):
        out.append(
            f'<p class="note">The {len(shown)} kernels that saved most of {len(per_kernel)} '
            f"({len(per_kernel) - len(shown)} left out; the summary's totals count them all; one kernel: "
            "<code>tunecache report --kernel NAME</code>).</p>"
        )
    hdr = ["kernel", "keys", "hits", "host benchmarks", "spent tuning s", "saved s"]
    out.append(table(hdr, rows))
    bars = per_kernel[:MAX_SAVED_BARS]
    short = _short_names([r.kernel for r in bars])  # the full names: the table, the hover text
    if len(per_kernel) > len(bars):
        out.append(
            f'<p class="note">The plot draws the {len(bars)} kernels that saved most of {len(per_kernel)} '
            f"({len(per_kernel) - len(bars)} left out of the plot; the table has them).</p>"
        )
    out.append(
        figure(
            plots.saved_bars(
                [short[r.kernel] for r in bars],
                [r.saved or 0 for r in bars],
                [r.spent or 0 for r in bars],
                titles=[
                    f"{r.kernel}: saved {r.saved or 0:.1f} s over {r.hits or 0} hits, spent {r.spent or 0:.1f} s"
                    for r in bars
                ],
            ),
            "saved",
        )
    )
    top = [r.kernel for r in per_kernel[:MAX_OVER_TIME]]
    series: dict[str, tuple[list[Any], list[float]]] = {}
    for kernel, d, s in reports.saved_by_day(store, filters, top):
        dates, vals = series.setdefault(kernel, ([], []))
        dates.append(d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)[:10]))
        vals.append((vals[-1] if vals else 0.0) + (s or 0.0))
    if any(len(d) > 1 for d, _ in series.values()):
        out.append(
            "<p>Over time, by the UTC date each problem was tuned (the store keeps a hit count, not hit dates):</p>"
        )
        if len(per_kernel) > len(top):
            out.append(
                f'<p class="note">The {len(top)} kernels that saved most of {len(per_kernel)} '
                f"({len(per_kernel) - len(top)} left out; one kernel: <code>tunecache report --kernel NAME</code>).</p>"
            )
        names = _short_names(list(series))
        out.append(figure(plots.saved_over_time({names[k]: v for k, v in series.items()}), "saved over time"))
    else:
        out.append("<p>All these problems were tuned on one day: no plot over time.</p>")
    return "".join(out)


def _short_names(kernels: list[str]) -> dict[str, str]:
    """Each kernel's shortest dotted suffix that no other kernel shares (``a.decode`` and ``b.decode``
    stay apart)."""
    out = {}
    for k in kernels:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            short = ".".join(parts[-n:])
            if not any(o != k and (o == short or o.endswith("." + short)) for o in kernels):
                break
        out[k] = short
    return out


def _counts(e: dict[str, Any]) -> str:
    return ", ".join(f"{n} {r}" for r, n in e["counts"].items())


def _misses_section(store: Store, filters: Filters, plots: Any) -> str:
    total, rows, targets = reports.missed(store, filters, MAX_MISSES)
    if not rows:
        return '<p class="good">No capture or offline misses: every key the fleet launched was tuned.</p>'
    by_key: dict[str, dict[str, Any]] = {}
    for r in rows:  # one entry per missed key (digest: full kernel source, target and key)
        e = by_key.setdefault(r.digest, {"kernel": r.kernel, "target_digest": r.target_digest, "counts": {}})
        e.setdefault("key", key_text(r.key_json))
        e["counts"][r.reason] = e["counts"].get(r.reason, 0) + r.count
        seen = r.last_seen if not isinstance(r.last_seen, str) else dt.datetime.fromisoformat(r.last_seen)
        if e.get("last") is None or seen > e["last"]:
            e["last"], e["host"] = seen, r.host
    entries = sorted(by_key.values(), key=lambda e: (-sum(e["counts"].values()), e["kernel"], e["key"]))
    reasons = list(dict.fromkeys([*plots.MISS_REASONS, *(r for e in entries for r in e["counts"])]))
    short = _short_names(sorted({e["kernel"] for e in entries}))
    multi_target = len({e["target_digest"] for e in entries}) > 1

    def target(e: dict[str, Any]) -> str:
        t = targets.get(e["target_digest"])
        return _target_label(t.device_name, t.arch, t.driver_version) if t else f"target {e['target_digest'][:12]}"

    labels = [f"{short[e['kernel']]} {e['key']}" + (f" [{target(e)}]" if multi_target else "") for e in entries]
    out = []
    if total > len(entries):
        out.append(
            f'<p class="note">The {len(entries)} most frequent of {total} missed keys ({total - len(entries)} '
            "left out; all of them: <code>tunecache misses</code>; one kernel: "
            "<code>tunecache report --kernel NAME</code>).</p>"
        )
    out.append(
        figure(
            plots.miss_bars(
                labels,
                {r: [e["counts"].get(r, 0) for e in entries] for r in reasons},
                titles=[
                    f"{e['kernel']}\nkey {e['key']}\n{target(e)}\n{_counts(e)}\nlast: {e['host']} at {utc(e['last'])}"
                    for e in entries
                ],
            ),
            "misses",
        )
    )
    out.append(
        table(
            ["kernel", "key", "GPU (target)", "misses", "last host to miss", "last seen"],
            [[e["kernel"], e["key"], target(e), _counts(e), e["host"], utc(e["last"])] for e in entries],
        )
    )
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

    with plots.measured_once():  # the figures' strings measured once for the page
        return _render(store, plots, filters or Filters(), threshold, min_keys, title, comparison)


def _render(
    store: Store,
    plots: Any,
    filters: Filters,
    threshold: float,
    min_keys: int,
    title: str | None,
    comparison: compare.Comparison | None,
) -> str:
    groups = load_groups(store, filters)
    per_kernel = reports.kernel_times(store, filters)
    summary = load_summary(store, filters, per_kernel, groups)
    analysis = hosts(store, filters, threshold, min_keys)
    now = utcnow()
    body = [f"<h1>{escape(title or 'tunecache report')}</h1>"]
    body.append(
        f"<p>Store <code>{escape(store.masked_url)}</code>, {now:%Y-%m-%d %H:%M} UTC. "
        f"Filters: {escape(filters.describe())}.</p>"
    )
    body.append(_summary_section(summary, analysis))
    body.append(_index_section(groups))
    if comparison is not None:
        body.append('<h2 id="compare">Compared with another store</h2>' + compare.to_html(comparison))
    body.append(
        '<h2 id="fleet">Fleet: hosts against their peers</h2>'
        + fleetpage.fleet_section(analysis, plots, MAX_FLEET_KEYS)
    )
    body.append('<h2 id="groups">Configs x keys, per kernel and target</h2>')
    body.append(
        "<p>Each cell: the config's median time over the key's best (1.0 = the best); "
        "&#9733; the stored winner; grey: did not run "
        f"({escape(', '.join(f'{v} {k}' for k, v in plots.FAILED_CODES.items()))}); "
        "white: not timed for that key. Hover a cell for its time in ms, config, key and host.</p>"
    )
    drawn = [g for g in groups if g.drawn]
    if len(groups) > len(drawn):
        body.append(
            f'<p class="note">Drawn: the {len(drawn)} largest of {len(groups)} kernel/target groups; '
            f"the {len(groups) - len(drawn)} others follow with their counts and the command that draws them.</p>"
        )
    body.extend(_group_section(g, plots) for g in drawn)
    body.extend(_undrawn_section(g) for g in groups if not g.drawn)
    if not groups:
        body.append("<p>No problems match.</p>")
    body.append('<h2 id="saved">Time spent and saved</h2>' + _saved_section(store, filters, per_kernel, plots))
    body.append(
        '<h2 id="misses">Capture and offline misses: tune these in the next image build</h2>'
        + _misses_section(store, filters, plots)
    )
    body.append(
        "<p style='font-size:.8em;color:#757575'>Statuses of configs that did not run: "
        f"{', '.join(FAILED_STATUSES)} (failed), pruned (skipped by the kernel's prune hook).</p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{escape(title or 'tunecache report')}</title><style>{_CSS}</style></head><body>"
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
