"""Commands that analyse the store across hosts: ``report`` (one HTML page) and ``hosts`` (the
hosts slower than their peers), with the filters and outlier rule they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from tunecache.cli.options import json_option, parse_since, store_for
from tunecache.cli.output import json_out


def _report_filters(kernel: str | None, target: str | None, since: str | None) -> Any:
    from tunecache.report.report import Filters

    return Filters(kernel=kernel, target=target, since=parse_since(since) if since else None)


def fleet_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters and the outlier rule shared by ``report`` and ``hosts``."""
    from tunecache.report.fleet import DEFAULT_MIN_KEYS, DEFAULT_THRESHOLD

    for opt in reversed(
        [
            click.option("--kernel", help="Kernel name (full module.qualname, or its last part)."),
            click.option("--target", help="Target: arch (sm90), device name ('NVIDIA H200') or target digest."),
            click.option("--since", help="Only problems updated in the last DAYS days (or 12h, or since an ISO date)."),
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

    out = write_report(store_for(ctx), output, _report_filters(**filters), threshold, min_keys)
    if as_json:
        json_out(out)
    else:
        click.echo(f"wrote {out['path']} ({out['bytes']} bytes, {out['plots']} plots)")


@click.command()
@fleet_options
@json_option
@click.pass_context
def hosts(ctx: click.Context, threshold: float, min_keys: int, as_json: bool, **filters: Any) -> None:
    """Hosts that time identical problems slower than their peers (a degraded GPU); exit 1 if any."""
    from tunecache.report.fleet import explain
    from tunecache.report.report import hosts as fleet_hosts

    analysis = fleet_hosts(store_for(ctx), _report_filters(**filters), threshold, min_keys)
    if as_json:
        json_out(analysis.as_dict())
    else:
        click.echo("\n".join(explain(analysis)))
    if analysis.outliers:
        ctx.exit(1)
