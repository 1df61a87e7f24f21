"""Plots for ``tunecache report``: matplotlib figures rendered to SVG text, to inline in the page.

Needs the ``report`` extra (matplotlib). No pyplot (no global figure state, no GUI backend): each
function builds a :class:`~matplotlib.figure.Figure` and returns its SVG. Text stays text
(``svg.fonttype: none``, drawn by the browser's own sans-serif, so no font is embedded or fetched)
and every figure gets its own id salt, so the ids of many SVGs in one page never collide.

Every label is store text (kernel names, key values, configs, hosts): it is drawn verbatim, never
read as TeX, since matplotlib takes ``$...$`` for math and mangles it or fails on math it cannot parse.
"""

from __future__ import annotations

import contextlib
import functools
import html
import io
import itertools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

try:
    import matplotlib
    import matplotlib.textpath
    from matplotlib.figure import Figure
except ImportError as e:  # pragma: no cover - exercised by users without the extra
    from tunecache.errors import MissingDependencyError
    from tunecache.extras import install_line

    raise MissingDependencyError(f"tunecache report needs matplotlib: {install_line('matplotlib')}") from e

_ids = itertools.count()
#: Relative times at or above this are drawn in the darkest colour.
HEAT_CAP = 2.0
FAILED_CODES = {"out_of_resources": "OOR", "compile_error": "CE", "runtime_error": "RE", "pruned": "pr"}
#: A figure's size besides its labels and legend (the axis titles, padding, room for the plot itself):
#: figures sized without their labels' length left the axes none, and matplotlib dropped its layout.
HEAT_MARGIN_IN = 1.2
HEAT_SIDES_IN = 1.5  # the colour bar and its title
HEAT_COLUMN_IN = 0.17  # a key's column, at least: its label turned upright, with room between
CODE_PT = 6  # a failed cell's status code
CODE_PAD_IN = 4 / 72  # room beside a code within its cell: the cells of a run of failures apart
LINE_MARGIN_IN = 2.6


_F = TypeVar("_F", bound=Callable[..., str])
#: Text objects read this when they are made, tick labels as late as the drawing: both happen inside.
_PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}


def _plain_text(fn: _F) -> _F:
    """Build and draw the figure with math parsing off, for this figure only (no global rcParams change)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        with matplotlib.rc_context(_PLAIN_TEXT), measured_once():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


_measuring: list[bool] = []  # set while measured_once is active (the outermost one holds the cache)


@contextlib.contextmanager
def measured_once() -> Iterator[None]:
    """Each string measured once, not once per renderer: saving an SVG lays a figure out with three
    renderers (the layout's, the tight box's dry run, the output's) and matplotlib's metrics cache is
    per renderer, so every tick label went through FreeType three or four times (a second or more of
    the 100k-store report: 48 distinct key labels per figure, shared by a group's two figures).

    The SVG renderer measures text with :class:`matplotlib.textpath.TextToPath` at a fixed scale and
    DPI: the result depends only on the string, the font properties (by their hash, which is
    matplotlib's own equality) and ``ismath``, all in the key, and on the rcParams that resolve a
    font family, which nothing here changes while it is active. Every plot function enters it (one
    figure); the page enters it around all of its figures; the outermost one restores matplotlib."""
    if _measuring:
        yield
        return
    cls = matplotlib.textpath.TextToPath
    measure = cls.get_text_width_height_descent
    memo: dict[tuple[str, int, Any], Any] = {}

    def once(self: Any, s: str, prop: Any, ismath: Any) -> Any:
        key = (s, hash(prop), ismath)
        got = memo.get(key)
        if got is None:
            got = memo[key] = measure(self, s, prop, ismath)
        return got

    cls.get_text_width_height_descent = once  # type: ignore[method-assign]
    _measuring.append(True)
    try:
        yield
    finally:
        _measuring.pop()
        cls.get_text_width_height_descent = measure  # type: ignore[method-assign]


class _Titles:
    """Hover text for a figure's artists, without JavaScript: each artist gets an id (``gid``) and
    the SVG an SVG ``<title>`` per element drawn for it (one per patch, one per point or cell of a
    collection, in the order drawn), which browsers show as a tooltip."""

    def __init__(self) -> None:
        self.by_gid: dict[str, Sequence[str]] = {}

    def add(self, artist: Any, titles: Sequence[str] | str) -> None:
        gid = f"tct{next(_ids)}"
        artist.set_gid(gid)
        self.by_gid[gid] = [titles] if isinstance(titles, str) else list(titles)

    def apply(self, svg: str) -> str:
        for gid, titles in self.by_gid.items():
            start = svg.find(f'<g id="{gid}">')
            if start < 0 or not titles:
                continue
            pos = start + len(f'<g id="{gid}">')
            defs_end = svg.find("</defs>", pos)
            if defs_end >= 0 and svg[pos:defs_end].lstrip().startswith("<defs>"):
                pos = defs_end + len("</defs>")
            out, n = [svg[:pos]], 0
            for m in _ELEMENT.finditer(svg, pos):
                if n == len(titles):
                    break
                out.append(svg[pos : m.start()])
                out.append(f"{m.group(1)}><title>{html.escape(titles[n], quote=False)}</title></{m.group(2)}>")
                pos, n = m.end(), n + 1
            out.append(svg[pos:])
            svg = "".join(out)
        return svg


#: A drawn element of an artist's group: a path (a patch, a mesh cell) or a use (a scatter point).
_ELEMENT = re.compile(r"(<(path|use)\b[^>]*?)\s*/>")


_PATH_D = re.compile(r' d="[^"]*"')
_DECIMALS = re.compile(r"(\.\d\d)\d+")


def _svg(fig: Figure, titles: _Titles | None = None) -> str:
    buf = io.StringIO()
    rc = {"svg.fonttype": "none", "svg.hashsalt": f"tc{next(_ids)}", "font.family": "sans-serif"}
    with matplotlib.rc_context(rc):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # no XML declaration or DOCTYPE inside HTML
    # Path coordinates to 0.01 pt (matplotlib writes 6 decimals): a heat map of 1,920 vector cells halves.
    text = _PATH_D.sub(lambda m: _DECIMALS.sub(r"\1", m.group(0)), text)
    return titles.apply(text) if titles else text


def _fig(w: float, h: float) -> Figure:
    return Figure(figsize=(max(w, 3.0), max(h, 2.0)), layout="constrained")


def _text_inches(strings: Sequence[str], points: float) -> float:
    """The longest of ``strings`` set in ``points``-point sans-serif, in inches, measured as the SVG
    writer measures it: tick labels turned upright take that much of the figure's height, and a
    figure sized without them left its axes no room (matplotlib dropped its layout and warned)."""
    prop = matplotlib.font_manager.FontProperties(family="sans-serif", size=points)
    measure = matplotlib.textpath.TextToPath().get_text_width_height_descent
    return max((measure(s, prop, False)[0] for s in strings), default=0.0) / 72.0


def _legend_outside(ax: Any, **kw: Any) -> None:
    """A legend right of the axes, never over the data."""
    if ax.get_legend_handles_labels()[0] or kw.get("handles"):
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, frameon=False, **kw)


@_plain_text
def heatmap(
    configs: Sequence[str],
    keys: Sequence[str],
    rel: Sequence[Sequence[float | None]],
    winners: Sequence[int | None],
    failed: dict[tuple[int, int], str],
    titles: Sequence[Sequence[str]] | None = None,
    key_axis: str = "tuning key",
    winner_titles: Sequence[str] | None = None,
) -> str:
    """Configs (rows) x keys (columns); each cell the config's time over the key's best (1.0 = the
    best), the winner starred, failed cells grey with their status code. ``titles[i][j]``: the
    cell's hover text; ``key_axis``: what the columns are."""
    import numpy as np

    titles_ = _Titles()
    codes = "\n".join(f"{c}: {s.replace('_', ' ')}" for s, c in FAILED_CODES.items())
    entries = ["stored winner", f"did not run:\n{codes}", "not timed for that key"]  # the legend, on top
    rows = 0.22 * len(configs)
    legend_h = (len(FAILED_CODES) + 1) * 7 * 1.3 / 72  # its tallest entry: a line per code
    # A column as wide as the widest code drawn in it needs ("OOR" is wider than a key's label is
    # tall): with the most keys drawn, a config failing on adjacent keys ran its codes together.
    codes = {FAILED_CODES.get(status, "?") for status in failed.values()}
    column = max(HEAT_COLUMN_IN, _text_inches(sorted(codes), CODE_PT) + CODE_PAD_IN) if codes else HEAT_COLUMN_IN
    fig = _fig(
        max(6.0, _text_inches(configs, 7) + column * len(keys) + HEAT_SIDES_IN),
        max(2.2 + rows, rows + _text_inches(keys, 7) + legend_h + HEAT_MARGIN_IN),
    )
    ax = fig.add_subplot()
    data = np.array([[math.nan if v is None else min(v, HEAT_CAP) for v in row] for row in rel], dtype=float)
    for i, j in failed:
        data[i, j] = HEAT_CAP * 10  # drawn in the colour map's "over" colour: grey
    cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad="#ffffff", over="#9e9e9e")
    xs, ys = np.arange(len(keys) + 1) - 0.5, np.arange(len(configs) + 1) - 0.5
    mesh = ax.pcolormesh(xs, ys, np.ma.masked_invalid(data), cmap=cmap, vmin=1.0, vmax=HEAT_CAP)
    if titles is not None:
        titles_.add(mesh, [t for row in titles for t in row])
    for (i, j), status in failed.items():
        ax.text(j, i, FAILED_CODES.get(status, "?"), ha="center", va="center", fontsize=CODE_PT, color="white")
    wx = [j for j, i in enumerate(winners) if i is not None]
    wy = [i for i in winners if i is not None]
    stars = ax.scatter(wx, wy, marker="*", s=60, c="#1a237e", label=entries[0])
    if winner_titles is not None:
        titles_.add(stars, [t for t, i in zip(winner_titles, winners) if i is not None])
    ax.set_xlim(-0.5, len(keys) - 0.5)
    ax.set_ylim(len(configs) - 0.5, -0.5)
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
    ax.set_yticks(range(len(configs)), configs, fontsize=7)
    ax.set_xlabel(key_axis)
    cb = fig.colorbar(mesh, ax=ax, shrink=0.8, extend="neither")
    cb.set_label(f"time / key's best (capped at {HEAT_CAP:g}x)")
    patch = matplotlib.patches.Patch
    handles = [
        *ax.get_legend_handles_labels()[0],
        patch(facecolor="#9e9e9e", label=entries[1]),
        patch(facecolor="#ffffff", edgecolor="#9e9e9e", label=entries[2]),
    ]
    fig.legend(handles=handles, loc="outside upper left", fontsize=7, frameon=False, ncols=3)
    return _svg(fig, titles_)


@_plain_text
def winner_line(
    keys: Sequence[str],
    times: Sequence[float],
    winners: Sequence[str],
    key_axis: str = "tuning key",
    titles: Sequence[str] | None = None,
) -> str:
    """The winner's time per key, in key order, coloured by which config wins."""
    titles_ = _Titles()
    fig = _fig(min(14.0, max(6.0, 2.0 + 0.25 * len(keys))), max(3.2, _text_inches(keys, 7) + LINE_MARGIN_IN))
    ax = fig.add_subplot()
    xs = list(range(len(keys)))
    ax.plot(xs, times, color="#9e9e9e", linewidth=1, zorder=1)
    for n, label in enumerate(dict.fromkeys(winners)):
        idx = [x for x, w in zip(xs, winners) if w == label]
        dots = ax.scatter(idx, [times[x] for x in idx], color=f"C{n % 10}", label=label, zorder=2)
        if titles is not None:
            titles_.add(dots, [titles[x] for x in idx])
    ax.set_xticks(xs, keys, rotation=90, fontsize=7)
    ax.set_xlabel(key_axis)
    ax.set_ylabel("winner median (ms)")
    if times and min(times) > 0 and max(times) / min(times) > 20:
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
    _legend_outside(ax, title="winning config", title_fontsize=7)
    return _svg(fig, titles_)


def _plain_log_labels(axis: Any) -> None:
    """Label a log axis with plain numbers (0.01, 2, 100): its default formatter writes TeX
    (``$\\mathdefault{10^{2}}$``), which math text off (:func:`_plain_text`) prints raw."""
    from matplotlib.ticker import FuncFormatter

    def major(v: float, _pos: Any) -> str:
        return f"{v:g}"

    def minor(v: float, _pos: Any) -> str:  # 2 and 5 of each decade: enough to read a value off
        lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6) if v > 0 else 0
        return f"{v:g}" if lead in (2, 5) else ""

    axis.set_major_formatter(FuncFormatter(major))
    axis.set_minor_formatter(FuncFormatter(minor))


def _bar_titles(titles_: _Titles, bars: Any, texts: Sequence[str] | None) -> None:
    if texts is not None:
        for bar, text in zip(bars.patches, texts):
            titles_.add(bar, text)


@_plain_text
def saved_bars(
    kernels: Sequence[str],
    saved: Sequence[float],
    spent: Sequence[float],
    titles: Sequence[str] | None = None,
) -> str:
    """Per kernel: seconds saved (hits x tuning seconds) next to seconds spent tuning."""
    titles_ = _Titles()
    fig = _fig(9.0, 0.9 + 0.35 * len(kernels))
    ax = fig.add_subplot()
    ys = list(range(len(kernels)))
    a = ax.barh([y - 0.2 for y in ys], saved, height=0.4, label="saved: hits x tuning s", color="#2e7d32")
    b = ax.barh([y + 0.2 for y in ys], spent, height=0.4, label="spent: every host's tuning", color="#ef6c00")
    _bar_titles(titles_, a, titles)
    _bar_titles(titles_, b, titles)
    ax.set_yticks(ys, kernels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    _legend_outside(ax)
    return _svg(fig, titles_)


@_plain_text
def saved_over_time(series: dict[str, tuple[Sequence[Any], Sequence[float]]]) -> str:
    """Cumulative seconds saved per kernel, by the date its problems were tuned."""
    fig = _fig(9.0, 3.0)
    ax = fig.add_subplot()
    for name, (dates, values) in series.items():
        ax.step(dates, values, where="post", label=name, marker="o", markersize=3)
    ax.set_ylabel("cumulative seconds saved")
    ax.set_xlabel("date tuned (UTC)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    _legend_outside(ax)
    return _svg(fig)


#: Miss reasons, in the order stacked, with their colours and legend labels.
MISS_REASONS = {
    "capture": ("#6a1b9a", "capture (CUDA graph)"),
    "offline": ("#0277bd", "offline"),
    "readonly": ("#ef6c00", "read-only store (benchmarked, not kept)"),
    "uncovered": ("#9e9e9e", "uncovered (tunecache could not serve the kernel)"),
}


@_plain_text
def miss_bars(labels: Sequence[str], counts: dict[str, Sequence[int]], titles: Sequence[str] | None = None) -> str:
    """Misses per key, one bar per key, its reasons stacked (``counts``: reason -> count per key), in
    the order given (the caller sorts): what the next image build should tune."""
    titles_ = _Titles()
    fig = _fig(9.0, 0.9 + 0.28 * len(labels))
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    left = [0] * len(labels)
    for reason, values in counts.items():
        if not any(values):
            continue
        colour, text = MISS_REASONS.get(reason, ("#616161", reason))
        bars = ax.barh(ys, values, left=left, color=colour, label=text)
        _bar_titles(titles_, bars, titles)
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("misses (launches that found no stored winner)")
    _legend_outside(ax)
    return _svg(fig, titles_)


@_plain_text
def fleet_strip(
    hosts: Sequence[str],
    ratios: Sequence[Sequence[float]],
    threshold: float,
    outliers: set[str],
    medians: Sequence[float],
    titles: Sequence[Sequence[str]] | None = None,
) -> str:
    """Each host's time relative to its peers' median, one dot per key (as given: the caller samples);
    the host's median over all its keys as a bar; the threshold dashed. ``titles[y]``: hover text of
    host ``y``'s dots."""
    titles_ = _Titles()
    fig = _fig(8.0, 0.9 + 0.45 * len(hosts))
    ax = fig.add_subplot()
    for y, (host, rs) in enumerate(zip(hosts, ratios)):
        jitter = [y + ((k * 0.618) % 1 - 0.5) * 0.5 for k in range(len(rs))]
        dots = ax.scatter(rs, jitter, s=9, alpha=0.6, color="#c62828" if host in outliers else "#1565c0")
        if titles is not None:
            titles_.add(dots, titles[y])
        bar = ax.plot([medians[y]] * 2, [y - 0.35, y + 0.35], color="black", linewidth=2)[0]
        titles_.add(bar, f"{host}: median {medians[y]:.3f}x its peers")
    ax.axvline(1.0, color="#616161", linewidth=1)
    ax.axvline(1.0 + threshold, color="#c62828", linestyle="--", linewidth=1, label=f"threshold {1 + threshold:.2f}x")
    ax.set_yticks(range(len(hosts)), hosts, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time / median of the other hosts on the same key (bar: the host's median)")
    _legend_outside(ax)
    return _svg(fig, titles_)
