"""The ``tunecache`` command: a thin layer over the library API.

Exit codes: 0 ok; 1 a user error (one line on stderr, no traceback); 2 usage (click's own; ``hosts``:
an error, as grep); 130 Ctrl-C (one line); 141 when the reader of stdout went away (``tunecache
export - | head``), quietly, as Unix tools do, for every command.

The root group and the entry point; the commands live in modules by what they do: ``browse``
(read the store), ``maintain`` (schema, roles, deletion), ``exchange`` (export, import, keygen),
``tune`` (warm, demo) and ``report`` (report, hosts), on the shared ``options`` and ``output``.
"""

from __future__ import annotations

import click

from tunecache import settings
from tunecache.cli import browse, exchange, maintain, report, tune
from tunecache.cli.options import CommandGroup, group_json_option, url_option


@click.group(
    cls=CommandGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    params=[url_option(), group_json_option()],
)
@click.version_option(package_name="tunecache")
@click.pass_context
def main(ctx: click.Context) -> None:
    """tunecache: keep Triton autotuning results in a shared store."""
    ctx.ensure_object(dict)
    settings.check_all()  # a bad TUNECACHE_* value is refused by every command in one line, as by the library


# Registered here, in the order they were always declared, so no command module imports the root group.
for _command in (
    browse.info,
    maintain.db,
    browse.ls_cmd,
    browse.show,
    browse.stats,
    browse.misses,
    maintain.invalidate,
    maintain.gc,
    tune.warm,
    exchange.export_cmd,
    exchange.import_cmd,
    exchange.keygen,
    report.report,
    report.hosts,
    tune.demo,
):
    main.add_command(_command)
