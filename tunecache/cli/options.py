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

from tunecache import extras
from tunecache.errors import TunecacheError
from tunecache.problem.model import utcnow
from tunecache.store.engine import mask_raw
from tunecache.store.opening import open_store
from tunecache.store.store import Store

_JSON_DECLS = ["--json", "as_json"]  # declared once for every command (as sqlite-utils shares its output options)
_JSON_HELP = "Machine-readable output (JSON), before or after the command."


def _json_value(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """A command's ``--json``, or one given to a group before it (``tunecache --json stats``)."""
    return bool(value or (ctx.obj or {}).get("json"))


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """A group's ``--json`` lands in the one ``ctx.obj`` that its subcommands read."""
    if value:
        ctx.ensure_object(dict)["json"] = True


EXIT_PIPE = 141  #: the reader of stdout went away: 128 + SIGPIPE, quietly, as `seq 1e6 | head` ends
EXIT_INTERRUPTED = 130  #: Ctrl-C: 128 + SIGINT, as shells report it

#: ``--json`` on a command: ``@json_option``.
json_option = click.option(*_JSON_DECLS, is_flag=True, callback=_json_value, help=_JSON_HELP)


def group_json_option() -> click.Option:
    """``--json`` on a group, handed to the subcommand: every shared option works before the command too."""
    return click.Option(_JSON_DECLS, is_flag=True, expose_value=False, callback=_remember_json, help=_JSON_HELP)


def _remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Every ``--url`` lands in the one ``ctx.obj``; the last given (after the subcommand) wins."""
    obj = ctx.ensure_object(dict)
    if value is not None:
        obj["url"] = value
        obj["url_given"] = ctx.get_parameter_source(param.name or "url") != click.core.ParameterSource.ENVIRONMENT
    else:
        obj.setdefault("url", None)


URL_HELP = "Store URL (SQLAlchemy), before or after the command; default $TUNECACHE_URL or per-user SQLite."


def url_option(help: str = URL_HELP, hidden: bool = False) -> click.Option:
    """``--url``, accepted before and after every subcommand (``tunecache ls --url URL``); without it
    the store comes from ``TUNECACHE_URL`` through :mod:`tunecache.settings`, like the library's.
    A command that opens no store (``keygen``) takes it hidden; ``demo`` says what it means there."""
    return click.Option(["--url"], expose_value=False, callback=_remember_url, help=help, hidden=hidden)


class CommandGroup(click.Group):
    """Every subcommand gets ``--url`` (every subgroup ``--json`` too, for its subcommands); expected
    errors, and a missing optional dependency (:mod:`tunecache.extras`), become one line and exit 1,
    never a traceback."""

    group_class = type  # subgroups (db) are CommandGroup too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(p.name == "url" for p in cmd.params):
            cmd.params.insert(0, url_option())
        if isinstance(cmd, click.Group) and not any(p.name == "as_json" for p in cmd.params):
            cmd.params.insert(1, group_json_option())
        super().add_command(cmd, name)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any):
        """Parsing prints too (``--help``, ``--version``): a closed pipe or Ctrl-C there ends as everywhere."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            _stdout_gone()
            raise click.exceptions.Exit(EXIT_PIPE) from None
        except KeyboardInterrupt as e:
            _interrupted(e)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            ctx.exit(EXIT_PIPE)
        except KeyboardInterrupt as e:
            _interrupted(e)
            ctx.exit(EXIT_INTERRUPTED)
        except EXPECTED_ERRORS as e:
            click.echo(f"tunecache: error: {error_text(e)}", err=True)
            ctx.exit(1)
        except ModuleNotFoundError as e:  # an extra not installed: what to install, not a traceback
            line = extras.missing(e)
            if line is None:
                raise
            click.echo(f"tunecache: error: {line}", err=True)
            ctx.exit(1)


#: What a command may raise for a user to act on: one line, no traceback.
EXPECTED_ERRORS = (TunecacheError, ValueError, TypeError, OSError)


def error_text(e: BaseException) -> str:
    """An error as one line: its message's first non-empty line, the password masked."""
    lines = [ln.strip() for ln in mask_raw(str(e)).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _interrupted(e: KeyboardInterrupt) -> None:
    """Ctrl-C: one line (what the command undid, if it says: ``KeyboardInterrupt("nothing imported")``)."""
    try:
        click.echo(f"tunecache: interrupted{f', {e}' if str(e) else ''}", err=True)
    except OSError:  # stderr gone too
        pass


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


def read_store(ctx: click.Context) -> Store:
    """The store for a command that only reads it: never created, never migrated (an outdated store
    is named with the command that upgrades it), so that looking changes nothing."""
    return store_for(ctx, migrate=False)


AGE_HELP = "a duration back from now (30d, 12h, 90m, 45s; a bare number is days) or an ISO date/time (UTC)"


def parse_age(text: str) -> dt.timedelta:
    """'30d', '12h', '90m', '45s' or a bare number of days."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*", text or "", re.I)
    if not m:
        raise click.BadParameter(f"{text!r} is not {AGE_HELP}")
    n, unit = float(m.group(1)), (m.group(2) or "d").lower()
    return dt.timedelta(**{{"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[unit]: n})


def parse_since(text: str) -> dt.datetime:
    """An ISO date/time (UTC) or a duration back from now: the one reading of every age filter."""
    try:
        t = dt.datetime.fromisoformat(text.strip())
        return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t
    except ValueError:
        return utcnow() - parse_age(text)


class Age(click.ParamType):
    """Every age filter (``export/report/hosts --since``, ``invalidate/gc --older-than``): one
    spelling, one parser, a usage error naming the option; the command gets the UTC cut-off."""

    name = "AGE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            return parse_since(str(value))
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


AGE = Age()


MAX_FILTER = 255  #: the longest value the store's name columns hold


def _short(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A filter longer than any stored value matches nothing: say so, not the database's 'pattern too complex'."""
    if value is not None and len(value) > MAX_FILTER:
        raise click.BadParameter(f"too long ({len(value)} characters; at most {MAX_FILTER})")
    return value


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(
        [
            click.option("--kernel", callback=_short, help="Kernel name (full module.qualname, or its last part)."),
            click.option("--arch", callback=_short, help="GPU arch, e.g. sm90."),
            click.option("--device", callback=_short, help="Device name, e.g. 'NVIDIA H200'."),
            click.option(
                "--driver",
                callback=_short,
                help="Driver version (numeric like 13000, or release like 580.159.04).",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


def problem_filters(kernel: str | None, arch: str | None, device: str | None, driver: str | None) -> dict[str, Any]:
    return {"kernel": kernel, "arch": arch, "device": device, "driver": driver}
