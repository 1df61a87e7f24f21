"""Plots for ``tunecache report``: matplotlib figures rendered to SVG text, to inline in the page.

Needs the ``report`` extra (matplotlib). No pyplot (no global figure state, no GUI backend): each
function builds a :class:`~matplotlib.figure.Figure` and returns its SVG. Text stays text
(``svg.fonttype: none``, drawn by the browser's own sans-serif, so no font is embedded or fetched)
and every figure gets its own id salt, so the ids of many SVGs in one page never collide.

Every label is store text (kernel names, key values, configs, hosts): it is drawn verbatim, never
read as TeX, since matplotlib takes ``$...$`` for math and mangles it or fails on math it cannot parse.
"""

from __future__ import annotations

import functools
import io
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

try:
    import matplotlib
    from matplotlib.figure import Figure
except ImportError as e:  # pragma: no cover - exercised by users without the extra
    from tunecache.errors import TunecacheError

    raise TunecacheError("tunecache report needs matplotlib: pip install 'tunecache[report]'") from e

_ids = itertools.count()
#: Relative times at or above this are drawn in the darkest colour.
HEAT_CAP = 2.0
FAILED_CODES = {"out_of_resources": "OOR", "compile_error": "CE", "runtime_error": "RE", "pruned": "pr"}


_F = TypeVar("_F", bound=Callable[..., str])
#: Text objects read this when they are made, tick labels as late as the drawing: both happen inside.
_PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}


def _plain_text(fn: _F) -> _F:
    """Build and draw the figure with math parsing off, for this figure only (no global rcParams change)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        with matplotlib.rc_context(_PLAIN_TEXT):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    rc = {"svg.fonttype": "none", "svg.hashsalt": f"tc{next(_ids)}", "font.family": "sans-serif"}
    with matplotlib.rc_context(rc):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]  # no XML declaration or DOCTYPE inside HTML


def _fig(w: float, h: float) -> Figure:
    return Figure(figsize=(max(w, 3.0), max(h, 2.0)), layout="constrained")


@_plain_text
def heatmap(
    configs: Sequence[str],
    keys: Sequence[str],
    rel: Sequence[Sequence[float | None]],
    winners: Sequence[int | None],
    failed: dict[tuple[int, int], str],
) -> str:
    """Configs (rows) x keys (columns); each cell the config's time over the key's best (1.0 = the
    best), the winner starred, failed cells grey with their status code."""
    fig = _fig(max(6.0, 3.0 + 0.28 * len(keys)), 1.2 + 0.26 * len(configs))
    ax = fig.add_subplot()
    data = [[math.nan if v is None else min(v, HEAT_CAP) for v in row] for row in rel]
    cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad="#ffffff")
    im = ax.imshow(data, aspect="auto", cmap=cmap, vmin=1.0, vmax=HEAT_CAP, interpolation="nearest")
    for (i, j), status in failed.items():
        ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#9e9e9e"))
        ax.text(j, i, FAILED_CODES.get(status, "?"), ha="center", va="center", fontsize=6, color="white")
    wx = [j for j, i in enumerate(winners) if i is not None]
    wy = [i for i in winners if i is not None]
    ax.scatter(wx, wy, marker="*", s=60, c="#1a237e", label="winner")
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
    ax.set_yticks(range(len(configs)), configs, fontsize=7)
    ax.set_xlabel("tuning key (batch bucket)")
    cb = fig.colorbar(im, ax=ax, shrink=0.8)
    cb.set_label(f"time / key's best (capped at {HEAT_CAP:g}x)")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=7, frameon=False)
    return _svg(fig)


@_plain_text
def winner_line(keys: Sequence[str], times: Sequence[float], winners: Sequence[str]) -> str:
    """The winner's time per key, in bucket order, coloured by which config wins."""
    fig = _fig(min(14.0, max(6.0, 2.0 + 0.3 * len(keys))), 3.2)
    ax = fig.add_subplot()
    xs = list(range(len(keys)))
    ax.plot(xs, times, color="#9e9e9e", linewidth=1, zorder=1)
    for n, label in enumerate(dict.fromkeys(winners)):
        pts = [(x, t) for x, t, w in zip(xs, times, winners) if w == label]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=f"C{n % 10}", label=label, zorder=2)
    ax.set_xticks(xs, keys, rotation=90, fontsize=7)
    ax.set_ylabel("winner median (ms)")
    if times and min(times) > 0 and max(times) / min(times) > 20:
        ax.set_yscale("log")
    ax.legend(fontsize=7, title="winning config", title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _svg(fig)


@_plain_text
def saved_bars(kernels: Sequence[str], saved: Sequence[float], spent: Sequence[float]) -> str:
    """Per kernel: seconds saved (hits x tuning seconds) next to seconds spent tuning."""
    fig = _fig(7.0, 0.8 + 0.35 * len(kernels))
    ax = fig.add_subplot()
    ys = list(range(len(kernels)))
    ax.barh([y - 0.2 for y in ys], saved, height=0.4, label="saved: hits x tuning seconds", color="#2e7d32")
    ax.barh([y + 0.2 for y in ys], spent, height=0.4, label="spent tuning", color="#ef6c00")
    ax.set_yticks(ys, kernels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7)
    return _svg(fig)


@_plain_text
def saved_over_time(series: dict[str, tuple[Sequence[Any], Sequence[float]]]) -> str:
    """Cumulative seconds saved per kernel, by the date its problems were tuned."""
    fig = _fig(7.0, 3.0)
    ax = fig.add_subplot()
    for name, (dates, values) in series.items():
        ax.step(dates, values, where="post", label=name, marker="o", markersize=3)
    ax.set_ylabel("cumulative seconds saved")
    ax.set_xlabel("date tuned")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    return _svg(fig)


@_plain_text
def miss_bars(labels: Sequence[str], capture: Sequence[int], offline: Sequence[int]) -> str:
    """Misses per key, capture and offline stacked: what the next image build should tune."""
    fig = _fig(8.0, 0.8 + 0.28 * len(labels))
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    ax.barh(ys, capture, color="#6a1b9a", label="capture (CUDA graph)")
    ax.barh(ys, offline, left=capture, color="#0277bd", label="offline")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("misses")
    ax.legend(fontsize=7)
    return _svg(fig)


@_plain_text
def fleet_strip(
    hosts: Sequence[str],
    ratios: Sequence[Sequence[float]],
    threshold: float,
    outliers: set[str],
    medians: Sequence[float],
) -> str:
    """Each host's time relative to its peers' median, one dot per key (as given: the caller samples);
    the host's median over all its keys as a bar; the threshold dashed."""
    fig = _fig(7.0, 0.9 + 0.45 * len(hosts))
    ax = fig.add_subplot()
    for y, (host, rs) in enumerate(zip(hosts, ratios)):
        jitter = [y + ((k * 0.618) % 1 - 0.5) * 0.5 for k in range(len(rs))]
        ax.scatter(rs, jitter, s=9, alpha=0.6, color="#c62828" if host in outliers else "#1565c0")
        ax.plot([medians[y]] * 2, [y - 0.35, y + 0.35], color="black", linewidth=2)
    ax.axvline(1.0, color="#616161", linewidth=1)
    ax.axvline(1.0 + threshold, color="#c62828", linestyle="--", linewidth=1, label=f"threshold {1 + threshold:.2f}x")
    ax.set_yticks(range(len(hosts)), hosts, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time / median of the other hosts on the same key (bar: the host's median)")
    ax.legend(fontsize=7, loc="lower right")
    return _svg(fig)
