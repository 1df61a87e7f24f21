"""Commands that change the store's shape or drop its rows: ``db upgrade``/``current``/``seal``/``grant``
(schema, the one file of a SQLite store, roles), ``invalidate`` and ``gc`` (deleting what is stale)."""

from __future__ import annotations

import base64
import datetime as dt
import os
from typing import Any

import click

from tunecache.cli.options import (
    AGE,
    AGE_HELP,
    CommandGroup,
    filter_options,
    json_option,
    problem_filters,
    store_for,
)
from tunecache.cli.output import json_out, problem_summary
from tunecache.errors import StoreNotFoundError, StoreReadOnlyError, TunecacheError
from tunecache.problem.model import INDUCTOR_KINDS, Problem, utcnow
from tunecache.store.opening import connect
from tunecache.trust import signing

#: What ``invalidate --kind`` names: a torch.compile cache, a binary (or host module), a launch spec.
CODE_KINDS = (*INDUCTOR_KINDS, "binary", "launch_spec")


@click.group(cls=CommandGroup)
def db() -> None:
    """Schema management (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@json_option
@click.pass_context
def db_upgrade(ctx: click.Context, revision: str, as_json: bool) -> None:
    """Create or migrate the schema (creates a SQLite store and its directory)."""
    from tunecache.store.migrate import head_revision

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
        json_out({"store": store.masked_url, "before": before, "after": after, "readonly": store.readonly})
        return
    click.echo(
        f"{store.masked_url}: {before or 'empty'} -> {after}{' (read-only, nothing to do)' if store.readonly else ''}"
    )


@db.command("current")
@json_option
@click.pass_context
def db_current(ctx: click.Context, as_json: bool) -> None:
    """Show the schema revision of the store (and whether it is head)."""
    from tunecache.store.migrate import head_revision

    store = connect(ctx.obj.get("url"), create=False)
    ctx.call_on_close(store.close)
    rev = store.revision()
    head = head_revision()
    if as_json:
        json_out({"store": store.masked_url, "revision": rev, "head": head, "is_head": rev == head})
        return
    click.echo(f"{rev or 'none'}{' (head)' if rev == head else f' (head is {head})'}")


@db.command("seal")
@json_option
@click.pass_context
def db_seal(ctx: click.Context, as_json: bool) -> None:
    """SQLite: make the store one whole file, to copy into an image or mark read-only: its
    write-ahead log folded into it and emptied, waiting for the processes that use it. Every writer
    does this as the last of them closes; seal makes sure (a writer killed, one still running)."""
    from tunecache.store.migrate import head_revision

    store = connect(ctx.obj.get("url"), create=False)
    ctx.call_on_close(store.close)
    revision = store.revision() if store.dialect == "sqlite" else None  # a server's: refused by seal()
    if store.dialect == "sqlite" and revision is None:
        raise StoreNotFoundError(f"no store at {store.masked_url}: it has no tunecache schema; nothing was sealed")
    out: dict[str, Any] = {"store": store.masked_url, "revision": revision, **store.seal()}
    out["problems"] = out["configs"] = None  # counted at head only: an older schema's tables differ
    if revision == head_revision():
        whole = connect(store.url, readonly=True)  # what the file says now
        try:
            n = whole.counts()
        finally:
            whole.close()
        out["problems"], out["configs"] = n["problems"], n["configs"]
    if as_json:
        json_out(out)
        return
    held = f"{out['problems']} problems ({out['configs']} config rows)" if out["problems"] is not None else ""
    beside = (
        ""
        if out["journal_mode"] == "delete"
        else f"; its {out['path']}-wal stays, empty, while another process has the store open"
    )
    click.echo(
        f"sealed {out['path']}: {held + ' in ' if held else ''}one file of {out['bytes']} bytes, to copy alone"
        + (f" (schema at {revision}: `tunecache db upgrade` brings it to {head_revision()})" if not held else "")
        + beside
    )


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
    `db upgrade` (and which is never made a reader or tuner itself). A reader that can still write
    (a writers group, pg_write_all_data, PUBLIC, superuser) gets a warning naming each cause."""
    from tunecache.store.roles import grant

    if not readers and not tuners:
        raise click.UsageError("give --reader ROLE and/or --tuner ROLE")
    store = connect(ctx.obj.get("url"), create=False)
    ctx.call_on_close(store.close)
    done = grant(store, readers=readers, tuners=tuners, create=not no_create)
    if as_json:
        json_out({"store": store.masked_url, "roles": done})
        return
    for r in done:
        still = ", but it can still write (see the warning)" if r["kind"] == "reader" and not r["read_only"] else ""
        click.echo(f"{r['role']}: {r['kind']}{' (created)' if r['created'] else ''}{still}")
    for r in done:
        for line in r["warnings"]:
            click.echo(f"tunecache: warning: {line}", err=True)


@click.command()
@filter_options
@click.option(
    "--driver-not-current",
    is_flag=True,
    help="Entries for any driver other than this machine's (another CUDA driver version or release).",
)
@click.option("--older-than", type=AGE, help=f"Entries not updated since then: {AGE_HELP}.")
@click.option("--kind", type=click.Choice(CODE_KINDS), help="With --key: the kind of stored code it names.")
@click.option(
    "--key",
    "key_prefix",
    metavar="PREFIX",
    help="One stored entry of code by name, every signer's row of it: a torch.compile key, a binary's Triton "
    "key or a launch spec's hash (as warnings and `ls --inductor` show them), or their start; with --kind.",
)
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
    older_than: dt.datetime | None,
    kind: str | None,
    key_prefix: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete stored problems (e.g. after a driver upgrade), and torch.compile's cache entries of the same
    target filters (--arch, --device, --driver, --driver-not-current, --older-than). At least one filter is
    required. Or delete one stored entry of code by name (--kind and --key), e.g. one no trusted key signed."""
    if kind is not None or key_prefix is not None:
        if any((kernel, arch, device, driver, driver_not_current, older_than)):
            raise click.UsageError("--key selects one entry by name: give it only with --kind (and --dry-run)")
        _invalidate_key(ctx, kind, key_prefix, dry_run, as_json)
        return
    filters = problem_filters(kernel, arch, device, driver)
    if driver_not_current:
        from tunecache.problem.target import detect_target

        t = detect_target()  # as `info` shows it: TUNECACHE_TARGET_OVERRIDE included
        if not t.driver_version:
            raise TunecacheError("--driver-not-current needs a GPU to read the current driver; use --driver X")
        filters["not_driver"] = (t.driver_version, t.driver_release)  # a release may change, not the version
    if older_than:
        filters["older_than"] = older_than
    if not any(v is not None and v is not False for v in filters.values()):
        raise click.UsageError(
            "give at least one filter (--driver, --driver-not-current, --arch, --device, --kernel, --older-than)"
        )
    store = store_for(ctx)
    gone = store.delete(dry_run=dry_run, **filters)
    graphs = _inductor_deleted(store, dry_run, filters)
    kept = _driverless_kept(store, filters)
    _report_deleted(gone, dry_run, as_json, graphs, "--kernel selects none" if filters.get("kernel") else "", kept)


def _invalidate_key(ctx: click.Context, kind: str | None, prefix: str | None, dry_run: bool, as_json: bool) -> None:
    """``invalidate --kind KIND --key PREFIX``: every signer's row of the entries of code so named."""
    if kind is None or not prefix:
        raise click.UsageError("--key needs --kind (and --kind needs --key): one entry of code, by its kind and name")
    if kind in ("binary", "launch_spec") and not (len(prefix) <= 64 and all(ch in "0123456789abcdef" for ch in prefix)):
        raise click.UsageError(f"--key {prefix[:70]!r}: a {kind}'s key is up to 64 lowercase hex digits")
    store = store_for(ctx)
    if kind == "binary":
        gone = store.delete_binary_key(prefix, dry_run=dry_run)
    elif kind == "launch_spec":
        gone = store.delete_spec_key(prefix, dry_run=dry_run)
    else:
        gone = store.delete_inductor_key(kind, prefix, dry_run=dry_run)
    for g in gone:
        g["signer"] = signing.key_id(base64.b64decode(g["signer"])) if g["signer"] else "unsigned"
    if as_json:
        json_out({"dry_run": dry_run, "kind": kind, "key": prefix, "count": len(gone), "entries": gone})
        return
    for g in gone:
        where = f" target {g['target_digest'][:12]}" if g.get("target_digest") else ""
        click.echo(f"{'would delete' if dry_run else 'deleted'} {kind} {g['key'][:80]}{where} signed by {g['signer']}")
    click.echo(f"{len(gone)} {kind} rows {'would be ' if dry_run else ''}deleted")


def _inductor_deleted(store: Any, dry_run: bool, filters: dict[str, Any]) -> list[dict[str, Any]]:
    """torch.compile's entries matching the target filters (a kernel filter selects none of them)."""
    if filters.get("kernel"):
        return []
    keep = ("arch", "device", "driver", "not_driver", "no_driver")
    picked = {k: filters[k] for k in keep if filters.get(k) is not None}
    if filters.get("older_than") is not None:
        picked["unused_since"] = filters["older_than"]
    return store.delete_inductor(dry_run=dry_run, **picked) if picked else []


def _driverless_kept(store: Any, filters: dict[str, Any]) -> dict[str, int] | None:
    """With --driver or --driver-not-current: how many problems and torch.compile entries the other
    filters select that are bound to no driver (host modules, interpreter timings), which no driver
    filter deletes (every driver loads them); None without a driver filter."""
    if filters.get("driver") is None and filters.get("not_driver") is None:
        return None
    rest = {k: v for k, v in filters.items() if k not in ("driver", "not_driver")}
    graphs = _inductor_deleted(store, True, {**rest, "no_driver": True})
    return {"problems": store.counts(**rest, no_driver=True)["problems"], "inductor": len(graphs)}


def _report_deleted(
    gone: list[Problem],
    dry_run: bool,
    as_json: bool,
    graphs: list[dict[str, Any]],
    why_none: str = "",
    kept: dict[str, int] | None = None,
) -> None:
    """What was (or would be) deleted; the count of torch.compile's entries is always said, 0 too;
    what a driver filter kept (``kept``, see :func:`_driverless_kept`), where one was given."""
    inductor = {"count": len(graphs), "entries": [{"cache": g["kind"], "key": g["key"]} for g in graphs]}
    if as_json:
        json_out(
            {
                "dry_run": dry_run,
                "count": len(gone),
                "problems": [problem_summary(p) for p in gone],
                "inductor": inductor,
                **({"kept_driver_independent": kept} if kept is not None else {}),
            }
        )
        return
    for p in gone:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {p.digest[:12]} {p.kernel} {p.key_json}")
    click.echo(f"{len(gone)} problem(s) {'would be ' if dry_run else ''}deleted")
    note = f" ({why_none})" if why_none and not graphs else ""
    click.echo(f"{len(graphs)} torch.compile cache entries {'would be ' if dry_run else ''}deleted{note}")
    if kept is not None:
        click.echo(
            f"kept {kept['problems']} problem(s) and {kept['inductor']} torch.compile cache entries bound to no "
            "driver (host modules, interpreter timings: every driver loads them)"
        )


@click.command()
@click.option(
    "--older-than",
    type=AGE,
    default="30d",
    show_default=True,
    help=f"Delete problems with no hit (and no update) since then: {AGE_HELP}.",
)
@click.option("--days", type=click.FloatRange(min=0), hidden=True, help="The old spelling: --older-than DAYSd.")
@click.option("--dry-run", is_flag=True, help="List what would be deleted, delete nothing.")
@json_option
@click.pass_context
def gc(ctx: click.Context, older_than: dt.datetime, days: float | None, dry_run: bool, as_json: bool) -> None:
    """Remove problems nobody has used since --older-than (last hit, or last update if never hit), then the
    binaries no stored winner references any more, and torch.compile's cache entries not used since then."""
    store = store_for(ctx)
    cutoff = utcnow() - dt.timedelta(days=days) if days is not None else older_than
    gone = store.delete(dry_run=dry_run, no_hit_since=cutoff)
    graphs = store.delete_inductor(dry_run=dry_run, unused_since=cutoff)
    # Superseded launch specs (another text of a kernel, healed beside it) first: their binaries then
    # go with the unreferenced ones. On a dry run the problems and specs are still there, so this
    # lists only binaries unreferenced already.
    specs = store.gc_launch_specs(older_than=cutoff, dry_run=dry_run)
    bins = store.gc_binaries(dry_run=dry_run)
    dropped = {"count": len(bins), "bytes": sum(b[2] for b in bins)}
    if as_json:
        json_out(
            {
                "dry_run": dry_run,
                "count": len(gone),
                "problems": [problem_summary(p) for p in gone],
                "binaries": {**dropped, "triton_keys": [b[0] for b in bins]},
                "launch_specs": {"count": len(specs)},
                "inductor": {"count": len(graphs), "entries": [{"cache": g["kind"], "key": g["key"]} for g in graphs]},
            }
        )
        return
    _report_deleted(gone, dry_run, False, graphs)
    click.echo(f"{len(specs)} superseded launch specs {'would be ' if dry_run else ''}dropped")
    click.echo(
        f"{dropped['count']} binaries ({dropped['bytes']} bytes) no winner references "
        f"{'would be ' if dry_run else ''}dropped"
    )
