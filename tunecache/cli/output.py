"""How commands print: JSON (one shape for every command), aligned tables, and the summary of a
problem that ``ls``, ``show``, ``invalidate`` and ``gc`` share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import click
import orjson

from tunecache.problem.model import Problem, problem_to_json


def json_out(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=_default).decode())


def _default(o: Any) -> Any:
    if isinstance(o, dt.datetime):
        return o.isoformat()
    raise TypeError(type(o).__name__)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    rows = [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


def problem_summary(p: Problem) -> dict[str, Any]:
    """One problem in ``ls --json``, ``show --json`` and ``invalidate --json``: the export shape
    (:func:`tunecache.problem.model.problem_to_json`) without its config rows, plus the winner's config."""
    win = p.winner
    return {**problem_to_json(p, configs=False), "winner": win.config if win else None}
