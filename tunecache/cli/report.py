"""Commands that analyse the store across hosts: ``report`` (one HTML page) and ``hosts`` (the
hosts slower than their peers), with the filters and outlier rule they share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import click

from tunecache.cli.options import AGE, AGE_HELP, EXPECTED_ERRORS, error_text, json_option, read_store
from tunecache.cli.output import json_out

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


@click.command()
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@fleet_options
@json_option
@click.pass_context
def report(ctx: click.Context, output: str, threshold: float, min_keys: int, as_json: bool, **filters: Any) -> None:
    """One self-contained HTML page of the store: configs x keys, winners, failures, time saved,
    misses, and hosts slower than their peers (needs the report extra: pip install 'tunecache[report]')."""
    from tunecache.report.report import write_report

    out = write_report(read_store(ctx), output, _report_filters(**filters), threshold, min_keys)
    if as_json:
        json_out(out)
    else:
        click.echo(f"wrote {out['path']} ({out['bytes']} bytes, {out['plots']} plots)")


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
