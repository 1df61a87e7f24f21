"""Commands that move results between stores: ``export``, ``import`` and ``keygen`` (the key that
signs exports), with a progress counter on a terminal."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import click
import orjson

from tunecache.cli.options import (
    AGE,
    AGE_HELP,
    filter_options,
    json_option,
    problem_filters,
    read_store,
    store_for,
    url_option,
)
from tunecache.cli.output import json_out
from tunecache.errors import InterruptedAfterCommit, OutputExistsError, StoreNotFoundError
from tunecache.process import interrupts
from tunecache.store.opening import check_directory, remove_new_store
from tunecache.store.store import Store


@click.command("export")
@click.argument("path")
@filter_options
@click.option("--since", type=AGE, help=f"Only problems updated since then: {AGE_HELP}.")
@click.option(
    "--no-launch-specs",
    is_flag=True,
    help="Leave out the winners' launch specs (what a first start preloads): a version 1 file, which "
    "tunecache versions before format 2 can import.",
)
@click.option(
    "--binaries",
    is_flag=True,
    help="Also write the winners' compiled binaries (format 4, with each row's signature), so that the importing "
    "host compiles nothing. Only rows a trusted key signed (or from a store trusted as a whole) are written.",
)
@click.option(
    "--inductor",
    is_flag=True,
    help="Also write torch.compile's cache entries (format 5, with each row's signature; all of them, whatever the "
    "filters). Only entries this host trusts are written.",
)
@click.option(
    "--sign",
    "sign_key",
    metavar="KEY",
    help="Sign the file with this private key (from `tunecache keygen`); needs the sign extra.",
)
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists (without it, an existing file is refused).")
@json_option
@click.pass_context
def export_cmd(
    ctx: click.Context,
    path: str,
    kernel: str | None,
    arch: str | None,
    device: str | None,
    driver: str | None,
    since: dt.datetime | None,
    no_launch_specs: bool,
    binaries: bool,
    inductor: bool,
    sign_key: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write stored problems with every config row to PATH (JSON Lines; .gz compresses; - is stdout)."""
    from tunecache.exchange import export
    from tunecache.trust.signing import Signer

    if no_launch_specs and (binaries or sign_key or inductor):
        raise click.UsageError("--binaries, --inductor and --sign need the launch specs: drop --no-launch-specs")
    # A file (or a dangling link) would be lost; a directory or a device (/dev/null) is no file to keep.
    if path != "-" and not force and (os.path.isfile(path) or (os.path.islink(path) and not os.path.exists(path))):
        raise OutputExistsError(f"{path} exists; nothing was written: pass --force to overwrite it")
    signer = Signer(sign_key) if sign_key else None  # a bad key fails before the export starts
    store = read_store(ctx)
    with _ExchangeProgress() as progress, _sigterm_unwinds():
        s = export(
            store,
            path,
            **problem_filters(kernel, arch, device, driver),
            since=since,
            progress=progress,
            with_launch_specs=not no_launch_specs,
            with_binaries=binaries,
            signer=signer,
            with_inductor=inductor,
        )
    s["path"] = path
    to_stderr = path == "-"  # stdout carries the file itself
    if as_json:
        click.echo(orjson.dumps(s, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode(), err=to_stderr)
    else:
        click.echo(
            f"exported {s['problems']} problems ({s['configs']} config rows, {s['launch_specs']} launch specs, "
            + (f"{s['binaries']} binaries, " if binaries else "")
            + (f"{s['inductor_entries']} torch.compile entries, " if inductor else "")
            + f"{s['bytes']} bytes) to {path} in {s['seconds']:.1f}s"
            + (f", signed by key {s['signed_by']}" if s["signed_by"] else "")
            + (
                f"; {s['untrusted']} launch specs, binaries or compiled graphs no trusted key signed were left out"
                if s.get("untrusted")
                else ""
            ),
            err=to_stderr,
        )


@click.command("import")
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
    "--inductor",
    is_flag=True,
    help="Also add the file's torch.compile cache entries (format 5). Compiled graphs are code: the file must be "
    "signed by a key in TUNECACHE_TRUSTED_KEYS (or --trust-unsigned).",
)
@click.option(
    "--trust-unsigned",
    is_flag=True,
    help="Add launch specs, binaries and torch.compile entries from a file that no trusted key signed "
    "(one you trust like your store).",
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
    inductor: bool,
    trust_unsigned: bool,
    as_json: bool,
) -> None:
    """Import an export file (PATH, or - for stdin): all of it in one transaction, or nothing.

    Every line is validated first (types, timings, statuses, config shape, recomputed digests); a
    bad file exits 1 naming the line and the reason, and the store is left unchanged.
    """
    from tunecache.exchange import import_

    # First, so that it ends last (after the store's close): from the commit on, a Ctrl-C is
    # recorded, not raised, and the command reports what was committed (tunecache.process.interrupts).
    outcome = ctx.with_resource(interrupts.settled())
    created: list[Store] = []

    def create() -> Store:
        created.append(store_for(ctx, create=True))
        return created[0]

    try:  # an existing store: read-only or too new is said before the file is read
        store: Store | Callable[[], Store] | None = store_for(ctx)
    except StoreNotFoundError:  # created only once the file validated; a dry run never creates it
        if not dry_run:
            check_directory(ctx.obj.get("url"))  # nor a directory for it
        store = None if dry_run else create
    try:
        with _ExchangeProgress() as progress:
            s = import_(
                store,
                path,
                dry_run=dry_run,
                on_conflict=on_conflict,
                progress=progress,
                with_launch_specs=launch_specs,
                with_binaries=binaries,
                with_inductor=inductor,
                trust_unsigned=trust_unsigned,
            )
    except BaseException as e:
        if outcome.committed:  # what was committed stays, and is not said to be undone
            raise
        # before the commit: its one transaction rolled back on the way out, and a store made for it goes too
        if created:
            remove_new_store(created[0])
        if isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt("nothing imported") from None
        raise
    if as_json:
        json_out(s.as_dict())
    else:
        click.echo(
            f"{'dry run, nothing written: ' if dry_run else ''}{s.problems} problems ({s.configs} config rows): "
            f"{s.new} new, {s.updated} updated, {s.skipped} skipped, {s.conflicts} conflicts"
            + (f"; {s.launch_specs} launch specs, {s.launch_specs_new} added" if s.launch_specs else "")
            + (f"; {s.binaries} binaries, {s.binaries_new} added" if s.binaries else "")
            + (f"; {s.inductor_entries} torch.compile entries, {s.inductor_new} added" if s.inductor_entries else "")
            + (f"; signed by key {s.signed_by}" if s.signed_by else "")
        )
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()  # said, whatever ends the process now
    if outcome.interrupted:
        raise InterruptedAfterCommit(f"after the import committed: {s.in_store()}")


@click.command(params=[url_option(hidden=True)])  # it opens no store
@click.argument("path")
@json_option
def keygen(path: str, as_json: bool) -> None:
    """Make an Ed25519 key pair for signing exports: PATH (private, mode 0600) and PATH.pub (public:
    list it in TUNECACHE_TRUSTED_KEYS where exports are imported). Needs the sign extra."""
    from tunecache.trust.signing import keygen as make_key

    out = make_key(path)
    if as_json:
        json_out(out)
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


class _Terminated(BaseException):
    """SIGTERM arrived: unwinds the export as Ctrl-C does, so that it removes its temporary file."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """For the export's duration, SIGTERM raises :class:`_Terminated` instead of killing the process
    on the spot (which left the ``.tmp`` file behind); once the export cleaned up, the process dies
    of the signal as it would have. The previous handler is restored either way. Not where SIGTERM
    is ignored, nor off the main thread (where no handler can be installed)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action ends the process here
        raise SystemExit(128 + signal.SIGTERM) from None  # a previous handler that returned
    finally:
        signal.signal(signal.SIGTERM, previous)
