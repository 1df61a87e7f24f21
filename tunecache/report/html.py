"""The report page's HTML pieces: escaping, tables, figures, times, and evenly spread picks of
what is drawn; shared by the page (:mod:`tunecache.report.report`) and its fleet section."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any


def spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items evenly spread over a sorted list, the first and the last included."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def escape(v: Any) -> str:
    return html.escape(str(v))


def table(headers: list[str], rows: list[list[Any]], attrs: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table{attrs}><tr>{head}</tr>{body}</table>"


def figure(svg: str, title: str) -> str:
    return f'<figure class="plot" data-title="{escape(title)}">{svg}</figure>'


def utc(v: Any) -> str:
    """A stored time (naive UTC) as ``YYYY-MM-DD HH:MM:SS UTC``, no microseconds."""
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v)
    return f"{v:%Y-%m-%d %H:%M:%S} UTC" if v else ""
