"""Commands that analyse the store across hosts: ``report`` (one HTML page) and ``hosts`` (the
hosts slower than their peers), with the filters and outlier rule they share."""

from __future__ import annotations

import contextlib
import datetime as dt
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tunecache.cli.options import AGE, AGE_HELP, EXPECTED_ERRORS, error_text, json_option, read_store
from tunecache.cli.output import json_out
from tunecache.errors import ImportFormatError
from tunecache.store.opening import open_store
from tunecache.store.store import Store

EXIT_HOSTS_ERROR = 2  #: `hosts` as grep: 0 none, 1 found (an outlier), 2 it could not tell


def _report_filters(kernel: str | None, target: str | None, since: dt.datetime | None) -> Any:
    from tunecache.report.report import Filters

    return Filters(kernel=kernel, target=target, since=since)


def fleet_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters and the outlier rule shared by ``report`` and ``hosts``."""
    from tunecache.report.fleet import DEFAULT_MIN_KEYS, DEFAULT_THRESHOLD

    for opt in reversed(
        [
            click.option("--kernel", help="Kernel name (full module.qualname, or its last part)."),
            click.option("--target", help="Target: arch (sm90), device name ('NVIDIA H200') or target digest."),
            click.option(
                "--since",
                type=AGE,
                help=f"Only problems updated since then (the fleet: timings measured since then): {AGE_HELP}.",
            ),
            click.option(
                "--threshold",
                type=click.FloatRange(min=0),
                default=DEFAULT_THRESHOLD,
                show_default=True,
                help="Outlier: slower than its peers' median by more than this fraction...",
            ),
            click.option(
                "--min-keys",
                type=click.IntRange(min=1),
                default=DEFAULT_MIN_KEYS,
                show_default=True,
                help="...over at least this many keys timed by other hosts too.",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


_SQLITE_MAGIC = b"SQLite format 3\x00"


def open_other(spec: str, stack: contextlib.ExitStack) -> Store:
    """``--compare OTHER``: a store URL, a SQLite store file, or an export file (imported into a
    throw-away SQLite store that ``stack`` removes; nothing of it is ever loaded or run, so an
    unsigned file is fine). Whatever is wrong with it is a usage error (exit 2), before anything
    is written; the other store is only read, never created nor migrated."""
    from tunecache.exchange import import_

    param = "--compare"
    try:
        if "://" in spec:
            store = open_store(spec, create=False, migrate=False)
        else:
            path = Path(spec)
            if not path.is_file():
                raise click.BadParameter(
                    f"{spec}: no such file (give a store URL, a SQLite store or an export)", param_hint=param
                )
            with open(path, "rb") as f:
                sqlite = f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
            if sqlite:
                store = open_store(f"sqlite:///{path.resolve()}", create=False, migrate=False, readonly=True)
            else:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tunecache-compare-"))
                url = f"sqlite:///{Path(tmp) / 'other.sqlite3'}"
                try:
                    import_(lambda: open_store(url), str(path), trust_unsigned=True)
                except ImportFormatError as e:
                    raise click.BadParameter(
                        f"{spec} is neither a SQLite store nor an export file: {error_text(e)}", param_hint=param
                    ) from None
                store = open_store(url, create=False)
        stack.callback(store.close)
        return store
    except EXPECTED_ERRORS as e:
        raise click.BadParameter(error_text(e), param_hint=param) from None


@click.command()
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@click.option(
    "--compare",
    "other",
    metavar="OTHER",
    help="Compare with another store (URL or SQLite file) or an export file, the 'before' side: changed "
    "winners and how much faster or slower each key got, per kernel (in the page and in --json).",
)
@fleet_options
@json_option
@click.pass_context
def report(
    ctx: click.Context,
    output: str,
    other: str | None,
    threshold: float,
    min_keys: int,
    as_json: bool,
    **filters: Any,
) -> None:
    """One self-contained HTML page of the store: configs x keys, winners, failures, time saved,
    misses, and hosts slower than their peers (needs the report extra: pip install '.[report]' in the
    tunecache checkout)."""
    from tunecache.report import compare
    from tunecache.report.report import write_report

    with contextlib.ExitStack() as stack:
        store, chosen = read_store(ctx), _report_filters(**filters)
        comparison = None
        if other is not None:
            comparison = compare.compare(store, open_other(other, stack), chosen, before_label=other)
        out = write_report(store, output, chosen, threshold, min_keys, comparison=comparison)
    if comparison is not None:
        out["compare"] = comparison.as_dict()
    if as_json:
        json_out(out)
        return
    click.echo(f"wrote {out['path']} ({out['bytes']} bytes, {out['plots']} plots)")
    if comparison is not None:
        t = comparison.totals()
        click.echo(
            f"compared with {other}: {t['matched']} keys in both, {t['winners_changed']} winners changed, "
            f"{t['faster']} faster, {t['slower']} slower (by more than {comparison.change:.0%}); "
            f"{t['only_now']} only now, {t['only_before']} only before"
        )


@click.command()
@fleet_options
@json_option
@click.pass_context
def hosts(ctx: click.Context, threshold: float, min_keys: int, as_json: bool, **filters: Any) -> None:
    """Hosts that time identical problems slower than their peers (a degraded GPU).

    Exit 0: no outlier; 1: an outlier; 2: an error (the store unreachable: with --json, {"error": ...}),
    so that cron tells a slow GPU from a database outage.
    """
    from tunecache.report.fleet import explain
    from tunecache.report.report import hosts as fleet_hosts

    try:
        analysis = fleet_hosts(read_store(ctx), _report_filters(**filters), threshold, min_keys)
    except EXPECTED_ERRORS as e:
        if as_json:
            json_out({"error": error_text(e)})
        click.echo(f"tunecache: error: {error_text(e)}", err=True)
        ctx.exit(EXIT_HOSTS_ERROR)
    if as_json:
        json_out(analysis.as_dict())
    else:
        click.echo("\n".join(explain(analysis)))
    if analysis.outliers:
        ctx.exit(1)
