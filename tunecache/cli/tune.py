"""Commands that run kernels so that they get tuned: ``warm`` (a module's warmup(), ahead of time,
with progress per key) and ``demo`` (the bundled kernel, twice)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from tunecache import extras, settings
from tunecache.cli.options import error_text, json_option, url_option
from tunecache.cli.output import json_out
from tunecache.errors import TunecacheError

log = logging.getLogger("tunecache")


@click.command()
@click.argument("module")
@json_option
@click.pass_context
def warm(ctx: click.Context, module: str, as_json: bool) -> None:
    """Tune ahead of time: import MODULE and call its warmup() (e.g. during an image build).

    MODULE is imported as `python -m` would (the current directory first on sys.path), with
    tunecache installed: plain @triton.autotune kernels and libraries' own Autotuners are
    served and tuned into the store too. Progress per key goes to stderr (a bar on a terminal);
    without a GPU, kernels run under the Triton interpreter (TRITON_INTERPRET=1 is set before
    triton is imported).
    """
    import tunecache

    with _log_to_stderr(logging.INFO):
        _interpreter_without_gpu()
        if ctx.obj.get("url"):
            settings.put("TUNECACHE_URL", ctx.obj["url"])
        with _installed(), _cwd_on_path():
            mod = _import(module)
            fn = getattr(mod, "warmup", None)
            if not callable(fn):
                raise TunecacheError(f"module {module!r} has no warmup() function")
            t0 = time.perf_counter()
            with _WarmProgress(module, quiet=as_json) as progress:
                try:
                    result = fn(progress=progress) if _takes_progress(fn) else fn()
                except Exception as e:  # noqa: BLE001  the user's code: any error, one line naming it
                    log.debug("tunecache: %s.warmup() failed", module, exc_info=True)
                    raise TunecacheError(f"{module}.warmup() failed: {type(e).__name__}: {error_text(e)}") from None
            tunecache.flush()
    out = {"module": module, "seconds": round(time.perf_counter() - t0, 3), "stats": tunecache.stats()}
    if isinstance(result, dict):
        out["buckets"] = len(result)
    if as_json:
        json_out(out)
    else:
        s = out["stats"]
        fallbacks = s["offline_fallbacks"] + s["capture_fallbacks"]
        click.echo(
            f"warmed {module} in {out['seconds']:.1f}s: {s['hits']} hits, {s['misses']} misses, "
            + (f"{fallbacks} fallbacks (not tuned: see `tunecache misses`), " if fallbacks else "")
            + f"{s['benchmarks']} configs benchmarked"
        )


@contextlib.contextmanager
def _installed() -> Iterator[None]:
    """``tunecache.install()`` while MODULE is imported and warmed, so that the Autotuners it builds
    without naming tunecache are tuned into the store (not only ``@tunecache.autotune`` ones);
    undone afterwards if it was not installed before (the command may run inside another program)."""
    from tunecache.tuner.decorator import install, installed, uninstall

    ours = not installed()
    install()
    try:
        yield
    finally:
        if ours:
            uninstall()


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    """The current directory first on sys.path, as ``python -m`` has it: the ``tunecache`` script's
    sys.path starts with its own bin directory, so a module next to the user was not found."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _import(module: str) -> Any:
    """Import the user's module; whatever its import raises becomes one line naming it."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  the user's code: a SyntaxError, a RuntimeError at import, ...
        log.debug("tunecache: importing %s failed", module, exc_info=True)
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and (module == e.name or module.startswith(e.name + ".")):
            hint = " (run from the directory that holds it, or put that directory on PYTHONPATH)"
        raise TunecacheError(f"cannot import {module!r}: {type(e).__name__}: {e}{hint}") from None


def _interpreter_without_gpu() -> None:
    """On a machine without a GPU, run kernels under Triton's interpreter, as the demo does. numpy,
    which the interpreter imports, is checked first: one line naming it, not Triton's traceback."""
    from tunecache.problem.target import interpreting

    # Unless the user chose, or it is too late: triton reads TRITON_INTERPRET at import.
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        from tunecache.cli.demo import gpu_available

        if not gpu_available():
            extras.require("numpy")
            os.environ["TRITON_INTERPRET"] = "1"
            log.info("tunecache: no GPU found: running kernels under the Triton interpreter (TRITON_INTERPRET=1)")
    if interpreting():
        extras.require("numpy")


class _StderrHandler(logging.Handler):
    """Log lines on the current ``sys.stderr`` (looked up per record: tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


@contextlib.contextmanager
def _log_to_stderr(level: int) -> Iterator[None]:
    """Show tunecache's log lines at ``level`` and above while a command runs, unless logging is set up."""
    if log.handlers or logging.getLogger().handlers:
        yield
        return
    handler, old_level = _StderrHandler(), log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def _takes_progress(fn: Callable[..., Any]) -> bool:
    import inspect

    return "progress" in inspect.signature(fn).parameters


class _WarmProgress:
    """warmup()'s ``progress(item, seconds=None, total=None)``: what each key cost, from the counters.

    A click progress bar on a terminal; one plain line per key otherwise (a build log). Both on
    stderr, so stdout keeps the summary (or the JSON).
    """

    def __init__(self, module: str, quiet: bool) -> None:
        import tunecache

        self.module = module
        self.quiet = quiet
        self.stats = tunecache.stats
        self.last = self.stats()
        self.n = 0
        self.bar: Any = None
        self.tty = sys.stderr.isatty()

    def __enter__(self) -> _WarmProgress:
        return self

    def __call__(self, item: Any = None, seconds: float | None = None, total: int | None = None, **_: Any) -> None:
        now = self.stats()
        what = _what_it_cost({k: now[k] - self.last.get(k, 0) for k in now})
        self.last = now
        self.n += 1
        if self.quiet:
            return
        took = f" ({seconds:.2f}s)" if seconds is not None else ""
        if not self.tty:
            click.echo(f"  {self.n}{f'/{total}' if total else ''} {item}  {what}{took}", err=True)
            return
        if self.bar is None:
            self.bar = click.progressbar(
                length=total,
                iterable=None if total else iter(int, 1),  # no total: a counter instead of a filling bar
                label=f"warming {self.module}",
                file=sys.stderr,
                show_pos=True,
                item_show_func=lambda x: x,
            )
            self.bar.__enter__()
        self.bar.update(1, f"{item}  {what}{took}")

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _what_it_cost(d: dict[str, float]) -> str:
    parts = []
    if d["hits"]:
        parts.append("from the store" if d["hits"] == 1 else f"{d['hits']} keys from the store")
    if d["benchmarks"]:
        parts.append(f"benchmarked {d['benchmarks']} configs")
    if d["waits"]:
        parts.append("waited for another process's benchmark")
    fallbacks = d["offline_fallbacks"] + d["capture_fallbacks"]
    if fallbacks:
        parts.append(f"{fallbacks} fallback{'s' if fallbacks > 1 else ''} (not tuned)")
    return ", ".join(parts) or "resolved"


def _positive_ints(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """``--buckets 1,4,16``: checked here, not as a traceback in the demo's child process."""
    if not value:
        return None
    try:
        out = [int(b) for b in value.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value[:40]!r} is not a list of positive batch sizes like 1,4,16")
    return out


@click.command(
    params=[
        url_option(
            help="Store URL for the demo; default a fresh SQLite file in a temporary directory, removed "
            "afterwards (never $TUNECACHE_URL: the demo stays off your real store)."
        )
    ]
)
@click.option(
    "--buckets",
    "buckets",
    default=None,
    callback=_positive_ints,
    help="Comma-separated batch buckets (default: per device).",
)
@json_option
@click.pass_context
def demo(ctx: click.Context, buckets: list[int] | None, as_json: bool) -> None:
    """Run the bundled sparse MLA decode kernel twice, each in a fresh process, on one store
    (see --url)."""
    from tunecache.cli.demo import run_demo

    run_demo(url=ctx.obj.get("url") if ctx.obj.get("url_given") else None, buckets=buckets, as_json=as_json)
