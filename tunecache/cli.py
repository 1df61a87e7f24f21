"""The ``tunecache`` command: a thin layer over the library API.

Exit codes: 0 ok; 1 a user error (one line on stderr, no traceback); 2 usage (click's own); 141
when the reader of stdout went away (``tunecache export - | head``), quietly, as Unix tools do.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import click
import orjson

from tunecache import settings
from tunecache.engine import mask_raw
from tunecache.errors import StoreReadOnlyError, TunecacheError
from tunecache.model import Problem, config_to_json, problem_to_json, utcnow
from tunecache.opening import connect, open_store
from tunecache.settings import current_mode
from tunecache.store import Store

log = logging.getLogger("tunecache")

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


class _Group(click.Group):
    """Every subcommand gets ``--url``; expected errors become one line and exit 1, never a traceback."""

    group_class = type  # subgroups (db) are _Group too

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


def _open(ctx: click.Context, *, create: bool = False, **kw: Any) -> Store:
    """The store for a command; one that only reads never creates it (``create=False``)."""
    store = open_store(ctx.obj.get("url"), create=create, **kw)
    ctx.call_on_close(store.close)
    return store


def _json_out(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=_default).decode())


def _default(o: Any) -> Any:
    if isinstance(o, dt.datetime):
        return o.isoformat()
    raise TypeError(type(o).__name__)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    rows = [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


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


def _filters(kernel: str | None, arch: str | None, device: str | None, driver: str | None) -> dict[str, Any]:
    return {"kernel": kernel, "arch": arch, "device": device, "driver": driver}


def problem_summary(p: Problem) -> dict[str, Any]:
    """One problem in ``ls --json``, ``show --json`` and ``invalidate --json``: the export shape
    (:func:`tunecache.model.problem_to_json`) without its config rows, plus the winner's config."""
    win = p.winner
    return {**problem_to_json(p, configs=False), "winner": win.config if win else None}


def _config_label(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return "-"
    kw = " ".join(f"{k}={v}" for k, v in sorted(cfg.get("kwargs", {}).items()))
    opts = f"w{cfg.get('num_warps')} s{cfg.get('num_stages')}"
    hook = " +hook" if cfg.get("pre_hook") else ""
    return f"{kw} {opts}{hook}".strip()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, params=[url_option()])
@click.version_option(package_name="tunecache")
@click.pass_context
def main(ctx: click.Context) -> None:
    """tunecache: keep Triton autotuning results in a shared store."""
    ctx.ensure_object(dict)
    settings.check_all()  # a bad TUNECACHE_* value is refused by every command in one line, as by the library


@main.command()
@json_option
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """This machine's target identity, the store URL (password masked), schema revision and counts."""
    from tunecache.migrate import head_revision
    from tunecache.target import detect_target, hostname

    store = _open(ctx)
    target = detect_target()
    out = {
        "store": store.masked_url,
        "readonly": store.readonly,
        "mode": current_mode(),
        "schema_revision": store.revision(),
        "schema_head": head_revision(),
        "host": hostname(),
        "target": target.as_dict(),
        "target_digest": target.digest,
        "counts": store.counts(),
    }
    usage = store.binary_usage().values()
    out["binaries"] = {"count": sum(n for n, _ in usage), "bytes": sum(b for _, b in usage)}
    if as_json:
        _json_out(out)
        return
    click.echo(f"store:     {out['store']}{' (read-only)' if store.readonly else ''}")
    click.echo(f"schema:    {out['schema_revision']} (head {out['schema_head']})")
    click.echo(f"mode:      {out['mode']}")
    click.echo(f"host:      {out['host']}")
    click.echo(f"target:    {target.digest[:16]}")
    for k, v in target.as_dict().items():
        click.echo(f"  {k:<15} {v}")
    click.echo("counts:    " + ", ".join(f"{k}={v}" for k, v in out["counts"].items()))
    click.echo(f"binaries:  {out['binaries']['count']} ({out['binaries']['bytes']} bytes)")


@main.group()
def db() -> None:
    """Schema management (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@json_option
@click.pass_context
def db_upgrade(ctx: click.Context, revision: str, as_json: bool) -> None:
    """Create or migrate the schema (creates a SQLite store and its directory)."""
    from tunecache.migrate import head_revision

    store = connect(ctx.obj.get("url"))
    ctx.call_on_close(store.close)
    before = store.revision()
    if store.readonly:
        if before != (head_revision() if revision == "head" else revision):
            raise StoreReadOnlyError(
                f"store {store.masked_url} is read-only (its file or directory is not writable by uid "
                f"{os.geteuid()}) and is at {before or 'no schema'}: run `tunecache db upgrade` where it is writable"
            )
    else:
        store.upgrade(revision)
    after = store.revision()
    if as_json:
        _json_out({"store": store.masked_url, "before": before, "after": after, "readonly": store.readonly})
        return
    click.echo(
        f"{store.masked_url}: {before or 'empty'} -> {after}{' (read-only, nothing to do)' if store.readonly else ''}"
    )


@db.command("current")
@json_option
@click.pass_context
def db_current(ctx: click.Context, as_json: bool) -> None:
    """Show the schema revision of the store (and whether it is head)."""
    from tunecache.migrate import head_revision

    store = connect(ctx.obj.get("url"), create=False)
    ctx.call_on_close(store.close)
    rev = store.revision()
    head = head_revision()
    if as_json:
        _json_out({"store": store.masked_url, "revision": rev, "head": head, "is_head": rev == head})
        return
    click.echo(f"{rev or 'none'}{' (head)' if rev == head else f' (head is {head})'}")


@db.command("grant")
@click.option("--reader", "readers", multiple=True, metavar="ROLE", help="May only SELECT: serving workers.")
@click.option("--tuner", "tuners", multiple=True, metavar="ROLE", help="May read and write rows: tuning jobs.")
@click.option("--no-create", is_flag=True, help="Grant to roles that exist; do not create missing ones.")
@json_option
@click.pass_context
def db_grant(
    ctx: click.Context, readers: tuple[str, ...], tuners: tuple[str, ...], no_create: bool, as_json: bool
) -> None:
    """PostgreSQL: create login roles (no password: set one with ALTER ROLE, or use your auth) and grant
    them least privilege on the store's tables: a reader may only SELECT, a tuner may also INSERT,
    UPDATE and DELETE rows. Neither may change the schema: run it as the tables' owner, which also runs
    `db upgrade`."""
    from tunecache.roles import grant

    if not readers and not tuners:
        raise click.UsageError("give --reader ROLE and/or --tuner ROLE")
    store = connect(ctx.obj.get("url"), create=False)
    ctx.call_on_close(store.close)
    done = grant(store, readers=readers, tuners=tuners, create=not no_create)
    if as_json:
        _json_out({"store": store.masked_url, "roles": done})
        return
    for r in done:
        click.echo(f"{r['role']}: {r['kind']}{' (created)' if r['created'] else ''}")


@main.command("ls")
@filter_options
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many rows.")
@json_option
@click.pass_context
def ls_cmd(
    ctx: click.Context, kernel: str, arch: str, device: str, driver: str, limit: int | None, as_json: bool
) -> None:
    """List stored problems, newest first."""
    store = _open(ctx)
    found = store.find_problems(with_configs=True, **_filters(kernel, arch, device, driver))
    if limit:
        found = found[:limit]
    if as_json:
        _json_out([problem_summary(p) for p in found])
        return
    _table(
        ["DIGEST", "KERNEL", "ARCH", "DEVICE", "DRIVER", "KEY", "CONFIGS", "WINNER", "MS", "HITS"],
        (
            [
                p.digest[:12],
                p.kernel.rsplit(".", 1)[-1],
                p.target.arch,
                p.target.device_name,
                p.target.driver_release or p.target.driver_version or "-",
                ",".join(f"{k}={v}" for k, v in orjson.loads(p.key_json) if not str(k).endswith(".dtype")),
                len(p.configs),
                _config_label(p.winner.config if p.winner else None),
                f"{p.winner_ms:.4f}" if p.winner_ms is not None else "-",
                p.hit_count,
            ]
            for p in found
        ),
    )


@main.command()
@click.argument("digest_prefix")
@json_option
@click.pass_context
def show(ctx: click.Context, digest_prefix: str, as_json: bool) -> None:
    """Every config of one problem: status, timings and why it failed."""
    store = _open(ctx)
    found = store.find(digest_prefix)
    if not found:
        raise TunecacheError(f"no problem with a digest starting {digest_prefix!r}")
    if len(found) > 1:
        raise TunecacheError(
            f"{len(found)} problems start with {digest_prefix!r}: "
            + ", ".join(p.digest[:16] for p in found[:5])
            + ("..." if len(found) > 5 else "")
            + "; give more characters"
        )
    p = found[0]
    rows = sorted(p.configs, key=lambda r: (not r.ok, r.median_ms or 0.0, r.config_hash))
    if as_json:
        _json_out(
            {
                **problem_summary(p),
                "configs": [config_to_json(r) for r in rows],
            }
        )
        return
    click.echo(f"digest:  {p.digest}")
    click.echo(f"kernel:  {p.kernel}  (source {p.source_hash[:12]})")
    t = p.target
    click.echo(
        f"target:  {t.device_name} {t.arch}, driver {t.driver_release or t.driver_version}, triton {t.triton_version}"
    )
    click.echo(f"key:     {p.key_json}")
    click.echo(f"tuned:   {p.tuning_seconds:.2f}s on {p.host} at {p.updated_at}; {p.hit_count} hits")
    _table(
        ["", "CONFIG", "STATUS", "MEDIAN_MS", "P20", "P80", "N", "REASON"],
        (
            [
                "*" if r.config_hash == p.winner_config_hash else "",
                _config_label(r.config),
                r.status,
                f"{r.median_ms:.4f}" if r.median_ms is not None else "-",
                f"{r.p20_ms:.4f}" if r.p20_ms is not None else "-",
                f"{r.p80_ms:.4f}" if r.p80_ms is not None else "-",
                r.samples,
                _failure_text(r.failure),
            ]
            for r in rows
        ),
    )


def _failure_text(f: dict[str, Any] | None) -> str:
    if not f:
        return ""
    if f.get("required") is not None:
        return f"{f.get('resource') or 'resource'}: needs {f['required']}, limit {f.get('limit')}"
    return str(f.get("message") or f.get("reason") or f.get("error") or "")[:80]


@main.command()
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Per-kernel hits, misses, benchmarks and seconds saved (persisted by every process), the count
    and bytes of its stored binaries, and which kernels tunecache saw but could not serve
    (``covered`` false; see ``tunecache misses``)."""
    store = _open(ctx)
    rows = [{**r, "covered": True} for r in store.kernel_counters()]
    zero = {"hits": 0, "misses": 0, "benchmarks": 0, "bench_seconds": 0.0, "saved_seconds": 0.0, "updated_at": None}
    usage = store.binary_usage()
    known = {r["kernel"]: r for r in rows}
    for k in usage:  # binaries of a kernel that no process has counted yet (an imported store)
        if k not in known:
            known[k] = {"kernel": k, **zero, "covered": True}
            rows.append(known[k])
    uncovered = sorted({m["kernel"] for m in store.list_misses() if m["reason"] == "uncovered"})
    for k in uncovered:
        if k in known:
            known[k]["covered"] = False  # served in some processes (another version?), not in others
        else:
            rows.append({"kernel": k, **zero, "covered": False})
    for r in rows:
        r["binaries"], r["binary_bytes"] = usage.get(r["kernel"], (0, 0))
    rows.sort(key=lambda r: r["kernel"])
    if as_json:
        _json_out(rows)
        return
    _table(
        ["KERNEL", "HITS", "MISSES", "BENCHMARKS", "BENCH_S", "SAVED_S", "BINARIES", "BIN_BYTES", "COVERED"],
        (
            [
                r["kernel"],
                r["hits"],
                r["misses"],
                r["benchmarks"],
                f"{r['bench_seconds']:.1f}",
                f"{r['saved_seconds']:.1f}",
                r["binaries"],
                r["binary_bytes"],
                "yes" if r["covered"] else "NO",
            ]
            for r in rows
        ),
    )
    n_cov = sum(r["covered"] for r in rows)
    click.echo(f"kernels seen: {len(rows)}, covered by tunecache: {n_cov}")
    if n_cov < len(rows):
        click.echo("not covered: their autotuner never reached Autotuner.run (the process logged why once)")


@main.command()
@json_option
@click.pass_context
def misses(ctx: click.Context, as_json: bool) -> None:
    """Keys that missed during a CUDA graph capture or in offline mode (tune them next image build), and
    the first key of kernels tunecache could not serve (reason ``uncovered``)."""
    store = _open(ctx)
    rows = store.list_misses()
    if as_json:
        _json_out([{**r, "key": orjson.loads(r.pop("key_json"))} for r in rows])
        return
    _table(
        ["DIGEST", "KERNEL", "REASON", "COUNT", "KEY", "LAST_SEEN", "HOST"],
        (
            [r["digest"][:12], r["kernel"], r["reason"], r["count"], r["key_json"], r["last_seen"], r["host"]]
            for r in rows
        ),
    )


@main.command()
@filter_options
@click.option("--driver-not-current", is_flag=True, help="Entries for any driver other than this machine's.")
@click.option("--older-than", help="Entries not updated for this long (30d, 12h) or since an ISO date.")
@click.option("--dry-run", is_flag=True, help="List what would be deleted, delete nothing.")
@json_option
@click.pass_context
def invalidate(
    ctx: click.Context,
    kernel: str,
    arch: str,
    device: str,
    driver: str,
    driver_not_current: bool,
    older_than: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete stored problems (e.g. after a driver upgrade). At least one filter is required."""
    filters = _filters(kernel, arch, device, driver)
    if driver_not_current:
        from tunecache.target import detect_target

        t = detect_target()
        if t.backend == "cpu":
            raise TunecacheError("--driver-not-current needs a GPU to read the current driver; use --driver X")
        filters["not_driver"] = t.driver_version
    if older_than:
        filters["older_than"] = parse_since(older_than)
    if not any(v is not None and v is not False for v in filters.values()):
        raise click.UsageError(
            "give at least one filter (--driver, --driver-not-current, --arch, --kernel, --older-than)"
        )
    store = _open(ctx)
    gone = store.delete(dry_run=dry_run, **filters)
    _report_deleted(gone, dry_run, as_json)


def _report_deleted(gone: list[Problem], dry_run: bool, as_json: bool) -> None:
    if as_json:
        _json_out({"dry_run": dry_run, "count": len(gone), "problems": [problem_summary(p) for p in gone]})
        return
    for p in gone:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {p.digest[:12]} {p.kernel} {p.key_json}")
    click.echo(f"{len(gone)} problem(s) {'would be ' if dry_run else ''}deleted")


@main.command()
@click.option(
    "--days",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Delete problems with no hit (and no update) for this many days.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted, delete nothing.")
@json_option
@click.pass_context
def gc(ctx: click.Context, days: float, dry_run: bool, as_json: bool) -> None:
    """Remove problems nobody has used for N days (last hit, or last update if never hit), then the
    binaries no stored winner references any more."""
    store = _open(ctx)
    gone = store.delete(dry_run=dry_run, no_hit_since=utcnow() - dt.timedelta(days=days))
    # On a dry run the problems are still there, so this lists only binaries unreferenced already.
    bins = store.gc_binaries(dry_run=dry_run)
    dropped = {"count": len(bins), "bytes": sum(b[2] for b in bins)}
    if as_json:
        _json_out(
            {
                "dry_run": dry_run,
                "count": len(gone),
                "problems": [problem_summary(p) for p in gone],
                "binaries": {**dropped, "triton_keys": [b[0] for b in bins]},
            }
        )
        return
    _report_deleted(gone, dry_run, False)
    click.echo(
        f"{dropped['count']} binaries ({dropped['bytes']} bytes) no winner references "
        f"{'would be ' if dry_run else ''}dropped"
    )


@main.command()
@click.argument("module")
@json_option
@click.pass_context
def warm(ctx: click.Context, module: str, as_json: bool) -> None:
    """Tune ahead of time: import MODULE and call its warmup() (e.g. during an image build).

    Progress per key goes to stderr (a bar on a terminal); without a GPU, kernels run under the
    Triton interpreter (TRITON_INTERPRET=1 is set before triton is imported).
    """
    import tunecache

    with _log_to_stderr(logging.INFO):
        _interpreter_without_gpu()
        if ctx.obj.get("url"):
            os.environ["TUNECACHE_URL"] = ctx.obj["url"]
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise TunecacheError(f"cannot import {module!r}: {e}") from None
        fn = getattr(mod, "warmup", None)
        if not callable(fn):
            raise TunecacheError(f"module {module!r} has no warmup() function")
        t0 = time.perf_counter()
        with _WarmProgress(module, quiet=as_json) as progress:
            result = fn(progress=progress) if _takes_progress(fn) else fn()
        tunecache.flush()
    out = {"module": module, "seconds": round(time.perf_counter() - t0, 3), "stats": tunecache.stats()}
    if isinstance(result, dict):
        out["buckets"] = len(result)
    if as_json:
        _json_out(out)
    else:
        s = out["stats"]
        fallbacks = s["offline_fallbacks"] + s["capture_fallbacks"]
        click.echo(
            f"warmed {module} in {out['seconds']:.1f}s: {s['hits']} hits, {s['misses']} misses, "
            + (f"{fallbacks} fallbacks (not tuned: see `tunecache misses`), " if fallbacks else "")
            + f"{s['benchmarks']} configs benchmarked"
        )


def _interpreter_without_gpu() -> None:
    """On a machine without a GPU, run kernels under Triton's interpreter, as the demo does."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return  # the user chose, or it is too late: triton reads it at import
    from tunecache.demo import gpu_available

    if not gpu_available():
        os.environ["TRITON_INTERPRET"] = "1"
        log.info("tunecache: no GPU found: running kernels under the Triton interpreter (TRITON_INTERPRET=1)")


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


@main.command("export")
@click.argument("path")
@filter_options
@click.option("--since", help="Only problems updated since an ISO date/time (UTC) or for a duration (30d, 12h).")
@click.option(
    "--no-launch-specs",
    is_flag=True,
    help="Leave out the winners' launch specs (what a first start preloads): a version 1 file, which "
    "tunecache versions before format 2 can import.",
)
@click.option(
    "--binaries",
    is_flag=True,
    help="Also write the winners' compiled binaries (format 3), so that the importing host compiles nothing.",
)
@click.option(
    "--sign",
    "sign_key",
    metavar="KEY",
    help="Sign the file with this private key (from `tunecache keygen`); needs tunecache[sign].",
)
@json_option
@click.pass_context
def export_cmd(
    ctx: click.Context,
    path: str,
    kernel: str | None,
    arch: str | None,
    device: str | None,
    driver: str | None,
    since: str | None,
    no_launch_specs: bool,
    binaries: bool,
    sign_key: str | None,
    as_json: bool,
) -> None:
    """Write stored problems with every config row to PATH (JSON Lines; .gz compresses; - is stdout)."""
    from tunecache.exchange import export
    from tunecache.signing import Signer

    if no_launch_specs and (binaries or sign_key):
        raise click.UsageError("--binaries and --sign need the launch specs: drop --no-launch-specs")
    signer = Signer(sign_key) if sign_key else None  # a bad key fails before the export starts
    store = _open(ctx)
    with _ExchangeProgress() as progress:
        s = export(
            store,
            path,
            **_filters(kernel, arch, device, driver),
            since=parse_since(since) if since else None,
            progress=progress,
            with_launch_specs=not no_launch_specs,
            with_binaries=binaries,
            signer=signer,
        )
    s["path"] = path
    to_stderr = path == "-"  # stdout carries the file itself
    if as_json:
        click.echo(orjson.dumps(s, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode(), err=to_stderr)
    else:
        click.echo(
            f"exported {s['problems']} problems ({s['configs']} config rows, {s['launch_specs']} launch specs, "
            + (f"{s['binaries']} binaries, " if binaries else "")
            + f"{s['bytes']} bytes) to {path} in {s['seconds']:.1f}s"
            + (f", signed by key {s['signed_by']}" if s["signed_by"] else ""),
            err=to_stderr,
        )


@main.command("import")
@click.argument("path")
@click.option("--dry-run", is_flag=True, help="Validate the file and count what would change; write nothing.")
@click.option(
    "--on-conflict",
    type=click.Choice(["keep", "replace", "faster"]),
    default="keep",
    show_default=True,
    help="For a problem already stored: keep it, replace it, or replace it if the incoming winner is faster.",
)
@click.option(
    "--launch-specs",
    is_flag=True,
    help="Also add the file's launch specs, so the first start preloads the winners' binaries. They steer "
    "what Triton compiles: the file must be signed by a key in TUNECACHE_TRUSTED_KEYS (or --trust-unsigned).",
)
@click.option(
    "--binaries",
    is_flag=True,
    help="Also add the file's compiled binaries (and launch specs), so that this store's hosts compile nothing. "
    "They are code every GPU runs: the file must be signed by a key in TUNECACHE_TRUSTED_KEYS.",
)
@click.option(
    "--trust-unsigned",
    is_flag=True,
    help="Add launch specs and binaries from a file that no trusted key signed (one you trust like your store).",
)
@json_option
@click.pass_context
def import_cmd(
    ctx: click.Context,
    path: str,
    dry_run: bool,
    on_conflict: str,
    launch_specs: bool,
    binaries: bool,
    trust_unsigned: bool,
    as_json: bool,
) -> None:
    """Import an export file (PATH, or - for stdin): all of it in one transaction, or nothing.

    Every line is validated first (types, timings, statuses, config shape, recomputed digests); a
    bad file exits 1 naming the line and the reason, and the store is left unchanged.
    """
    from tunecache.exchange import import_

    store = _open(ctx, create=True)
    with _ExchangeProgress() as progress:
        s = import_(
            store,
            path,
            dry_run=dry_run,
            on_conflict=on_conflict,
            progress=progress,
            with_launch_specs=launch_specs,
            with_binaries=binaries,
            trust_unsigned=trust_unsigned,
        )
    if as_json:
        _json_out(s.as_dict())
        return
    click.echo(
        f"{'dry run, nothing written: ' if dry_run else ''}{s.problems} problems ({s.configs} config rows): "
        f"{s.new} new, {s.updated} updated, {s.skipped} skipped, {s.conflicts} conflicts"
        + (f"; {s.launch_specs} launch specs, {s.launch_specs_new} added" if s.launch_specs else "")
        + (f"; {s.binaries} binaries, {s.binaries_new} added" if s.binaries else "")
        + (f"; signed by key {s.signed_by}" if s.signed_by else "")
    )


@main.command()
@click.argument("path")
@json_option
def keygen(path: str, as_json: bool) -> None:
    """Make an Ed25519 key pair for signing exports: PATH (private, mode 0600) and PATH.pub (public:
    list it in TUNECACHE_TRUSTED_KEYS where exports are imported). Needs tunecache[sign]."""
    from tunecache.signing import keygen as make_key

    out = make_key(path)
    if as_json:
        _json_out(out)
    else:
        click.echo(
            f"wrote {out['private_key']} (private: keep it secret) and {out['public_key']} (key {out['key_id']})"
        )


class _ExchangeProgress:
    """A one-line counter on stderr for export/import, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.used = False

    def __enter__(self) -> Callable[[str, int, int], None] | None:
        return self.show if sys.stderr.isatty() else None

    def show(self, phase: str, done: int, total: int) -> None:
        self.used = True
        pct = f" {100 * done // total:3d}%" if total else ""
        click.echo(f"\r  {phase}: {done}/{total} problems{pct}   ", nl=False, err=True)

    def __exit__(self, *exc: object) -> None:
        if self.used:
            click.echo("", err=True)


def _report_filters(kernel: str | None, target: str | None, since: str | None) -> Any:
    from tunecache.report import Filters

    return Filters(kernel=kernel, target=target, since=parse_since(since) if since else None)


def fleet_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters and the outlier rule shared by ``report`` and ``hosts``."""
    from tunecache.fleet import DEFAULT_MIN_KEYS, DEFAULT_THRESHOLD

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


@main.command()
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@fleet_options
@json_option
@click.pass_context
def report(ctx: click.Context, output: str, threshold: float, min_keys: int, as_json: bool, **filters: Any) -> None:
    """One self-contained HTML page of the store: configs x keys, winners, failures, time saved,
    misses, and hosts slower than their peers (needs the report extra: pip install 'tunecache[report]')."""
    from tunecache.report import write_report

    out = write_report(_open(ctx), output, _report_filters(**filters), threshold, min_keys)
    if as_json:
        _json_out(out)
    else:
        click.echo(f"wrote {out['path']} ({out['bytes']} bytes, {out['plots']} plots)")


@main.command()
@fleet_options
@json_option
@click.pass_context
def hosts(ctx: click.Context, threshold: float, min_keys: int, as_json: bool, **filters: Any) -> None:
    """Hosts that time identical problems slower than their peers (a degraded GPU); exit 1 if any."""
    from tunecache.fleet import explain
    from tunecache.report import hosts as fleet_hosts

    analysis = fleet_hosts(_open(ctx), _report_filters(**filters), threshold, min_keys)
    if as_json:
        _json_out(analysis.as_dict())
    else:
        click.echo("\n".join(explain(analysis)))
    if analysis.outliers:
        ctx.exit(1)


@main.command()
@click.option("--buckets", "bucket_list", default=None, help="Comma-separated batch buckets (default: per device).")
@json_option
@click.pass_context
def demo(ctx: click.Context, bucket_list: str | None, as_json: bool) -> None:
    """Run the bundled sparse MLA decode kernel twice, each in a fresh process, on one store.

    The store is a fresh SQLite file in a temporary directory, removed afterwards, unless --url is
    given (not $TUNECACHE_URL: the demo stays off your real store).
    """
    from tunecache.demo import run_demo

    buckets = [int(b) for b in bucket_list.split(",")] if bucket_list else None
    run_demo(url=ctx.obj.get("url") if ctx.obj.get("url_given") else None, buckets=buckets, as_json=as_json)


if __name__ == "__main__":  # pragma: no cover
    main()
