"""What every command shares on its way in: the root group's behaviour (``--url`` on every
subcommand, expected errors as one line), the shared options and how their values parse.

Its own module so that each command module can use them without importing the root group, which
imports the command modules to register them (no import cycle).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import click

from tunecache.errors import TunecacheError
from tunecache.model import utcnow
from tunecache.store.engine import mask_raw
from tunecache.store.opening import open_store
from tunecache.store.store import Store

#: ``--json``, declared once for every command (as sqlite-utils shares its output options).
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")


def _remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Every ``--url`` lands in the one ``ctx.obj``; the last given (after the subcommand) wins."""
    obj = ctx.ensure_object(dict)
    if value is not None:
        obj["url"] = value
        obj["url_given"] = ctx.get_parameter_source(param.name or "url") != click.core.ParameterSource.ENVIRONMENT
    else:
        obj.setdefault("url", None)


def url_option() -> click.Option:
    """``--url``, accepted before and after every subcommand (``tunecache ls --url URL``); without it
    the store comes from ``TUNECACHE_URL`` through :mod:`tunecache.settings`, like the library's."""
    return click.Option(
        ["--url"],
        expose_value=False,
        callback=_remember_url,
        help="Store URL (SQLAlchemy), before or after the command; default $TUNECACHE_URL or per-user SQLite.",
    )


class CommandGroup(click.Group):
    """Every subcommand gets ``--url``; expected errors become one line and exit 1, never a traceback."""

    group_class = type  # subgroups (db) are CommandGroup too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(p.name == "url" for p in cmd.params):
            cmd.params.insert(0, url_option())
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            ctx.exit(141)
        except (TunecacheError, ValueError, TypeError, OSError) as e:
            msg = mask_raw(str(e)) or type(e).__name__
            click.echo(f"tunecache: error: {msg.splitlines()[0] if msg else msg}", err=True)
            ctx.exit(1)


def _stdout_gone() -> None:
    """The reader of stdout left: send what is still buffered (and the final flush at exit) nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (embedded, captured): nothing to silence
        pass


def store_for(ctx: click.Context, *, create: bool = False, **kw: Any) -> Store:
    """The store for a command; one that only reads never creates it (``create=False``)."""
    store = open_store(ctx.obj.get("url"), create=create, **kw)
    ctx.call_on_close(store.close)
    return store


def parse_age(text: str) -> dt.timedelta:
    """'30d', '12h', '90m', '45s' or a bare number of days."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*", text or "")
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration like 30d, 12h, 90m")
    n, unit = float(m.group(1)), m.group(2) or "d"
    return dt.timedelta(**{{"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[unit]: n})


def parse_since(text: str) -> dt.datetime:
    """An ISO date/time (UTC) or a duration back from now."""
    try:
        t = dt.datetime.fromisoformat(text)
        return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t
    except ValueError:
        return utcnow() - parse_age(text)


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(
        [
            click.option("--kernel", help="Kernel name (full module.qualname, or its last part)."),
            click.option("--arch", help="GPU arch, e.g. sm90."),
            click.option("--device", help="Device name, e.g. 'NVIDIA H200'."),
            click.option("--driver", help="Driver version (numeric like 13000, or release like 580.159.04)."),
        ]
    ):
        fn = opt(fn)
    return fn


def problem_filters(kernel: str | None, arch: str | None, device: str | None, driver: str | None) -> dict[str, Any]:
    return {"kernel": kernel, "arch": arch, "device": device, "driver": driver}
