"""Commands that read the store and change nothing: ``info``, ``ls``, ``show``, ``stats`` and ``misses``.

A store they open is never created (a typo in ``--url`` is an error, not a new empty store).
"""

from __future__ import annotations

from typing import Any

import click
import orjson

from tunecache.cli.options import filter_options, json_option, problem_filters, read_store
from tunecache.cli.output import json_out, problem_summary, table
from tunecache.errors import StoreNotFoundError, TunecacheError
from tunecache.problem.model import config_to_json
from tunecache.problem.target import Target
from tunecache.settings import current_mode
from tunecache.trust import trust
from tunecache.tuner import missspool


def _config_label(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return "-"
    kw = " ".join(f"{k}={v}" for k, v in sorted(cfg.get("kwargs", {}).items()))
    opts = f"w{cfg.get('num_warps')} s{cfg.get('num_stages')}"
    hook = " +hook" if cfg.get("pre_hook") else ""
    return f"{kw} {opts}{hook}".strip()


@click.command()
@json_option
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """This machine's target identity, the store URL (password masked), schema revision and counts.
    With no store there yet (a fresh machine), the machine and where its store will be."""
    from tunecache.problem.target import hostname, machine_target
    from tunecache.store.engine import mask_url, resolve_url
    from tunecache.store.migrate import head_revision

    target = machine_target()  # read without torch or Triton: info answers in a fraction of a second
    out: dict[str, Any] = {"mode": current_mode(), "schema_head": head_revision(), "host": hostname()}
    out.update(target=target.as_dict(), target_digest=target.digest)
    try:
        store = read_store(ctx)
    except StoreNotFoundError as e:  # nothing stored here yet: still this machine's identity
        url = resolve_url(ctx.obj.get("url"))
        out.update(store=mask_url(url), store_exists=False, store_missing=str(e), readonly=None)
        out.update(schema_revision=None, counts=None, binaries=None, inductor=None, trust=trust.describe(url))
        if as_json:
            json_out(out)
            return
        click.echo(f"store:     {e}")
        _machine_lines(out, target)
        _trust_lines(out["trust"])
        return
    spooled = len(missspool.read(store.masked_url))  # what `tunecache misses` lists beside the store's own
    counts = store.counts()
    counts.update(open_misses=counts["open_misses"] + spooled, spooled_misses=spooled)
    usage = store.binary_usage().values()
    out.update(store=store.masked_url, store_exists=True, readonly=store.readonly, schema_revision=store.revision())
    out.update(counts=counts, binaries={"count": sum(n for n, _ in usage), "bytes": sum(b for _, b in usage)})
    out.update(inductor=store.inductor_counts(), trust=trust.describe(store.url))
    if as_json:
        json_out(out)
        return
    click.echo(f"store:     {out['store']}{' (read-only)' if store.readonly else ''}")
    click.echo(f"schema:    {out['schema_revision']} (head {out['schema_head']})")
    _machine_lines(out, target)
    shown = ", ".join(f"{k}={v}" for k, v in counts.items() if k != "spooled_misses")
    spool_note = f" ({spooled} of them in this host's spool: tunecache misses)" if spooled else ""
    click.echo(f"counts:    {shown}{spool_note}")
    click.echo(f"binaries:  {out['binaries']['count']} ({out['binaries']['bytes']} bytes)")
    click.echo(f"torch.compile: {_inductor_line(out['inductor'])}")
    _trust_lines(out["trust"])


def _machine_lines(out: dict[str, Any], target: Target) -> None:
    """The mode, the host and this machine's target, field by field."""
    click.echo(f"mode:      {out['mode']}")
    click.echo(f"host:      {out['host']}")
    click.echo(f"target:    {target.digest[:16]}")
    for k, v in target.as_dict().items():
        click.echo(f"  {k:<15} {v}")


def _trust_lines(t: dict[str, Any]) -> None:
    """What this process trusts of the store: keys, its own signing key, the store as a whole."""
    keys = ", ".join(f"{k['key_id']} ({k['from']})" for k in t["trusted_keys"]) or "none"
    click.echo(f"trusted keys: {t['trusted_keys_error'] or keys}")
    sk = t["signing_key"]
    signing_line = (
        "none: rows this host stores are unsigned" if sk is None else sk["error"] or f"{sk['key_id']} ({sk['path']})"
    )
    click.echo(f"signing key:  {signing_line}")
    click.echo(f"store trusted as a whole: {'yes' if t['store_trusted'] else 'no'} ({t['why']})")


def _inductor_line(counts: dict[str, dict[str, int]]) -> str:
    """Entries (and bytes) of each torch.compile cache, on one line."""
    return ", ".join(f"{k}={v['entries']} ({v['bytes']} bytes)" for k, v in counts.items())


@click.command("ls")
@filter_options
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many rows.")
@click.option(
    "--inductor", is_flag=True, help="List torch.compile's cache entries (tunecache.inductor) instead, last used first."
)
@json_option
@click.pass_context
def ls_cmd(
    ctx: click.Context,
    kernel: str,
    arch: str,
    device: str,
    driver: str,
    limit: int | None,
    inductor: bool,
    as_json: bool,
) -> None:
    """List stored problems, newest first (or, with --inductor, torch.compile's cache entries)."""
    store = read_store(ctx)
    if inductor:
        rows = store.list_inductor(limit=limit, arch=arch, device=device, driver=driver)
        if as_json:
            json_out(rows)
            return
        table(
            ["CACHE", "KEY", "ARCH", "DEVICE", "DRIVER", "TORCH", "BYTES", "HITS", "SIGNED"],
            (
                [
                    r["kind"],
                    r["key"][:48],
                    r["arch"],
                    r["device_name"],
                    r["driver_release"] or r["driver_version"] or "-",
                    r["torch_version"],
                    r["size"],
                    r["hit_count"],
                    "yes" if r["signed"] else "no",
                ]
                for r in rows
            ),
        )
        return
    found = store.find_problems(with_configs=True, **problem_filters(kernel, arch, device, driver))
    if limit:
        found = found[:limit]
    if as_json:
        json_out([problem_summary(p) for p in found])
        return
    table(
        ["DIGEST", "KERNEL", "ARCH", "DEVICE", "DRIVER", "KEY", "CONFIGS", "WINNER", "MS", "HITS"],
        (
            [
                p.digest[:12],
                p.kernel,  # the full name, as stats and misses show it (--kernel takes either)
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


@click.command()
@click.argument("digest_prefix", metavar="DIGEST")
@json_option
@click.pass_context
def show(ctx: click.Context, digest_prefix: str, as_json: bool) -> None:
    """Every config of one problem: status, timings and why it failed. DIGEST: its digest, or a
    prefix of it that only it has (ls shows 12 characters)."""
    store = read_store(ctx)
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
        json_out(
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
    table(
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


@click.command()
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Per-kernel hits, misses, benchmarks and seconds saved (persisted by every process), the count
    and bytes of its stored binaries, and which kernels tunecache saw but could not serve
    (COVERED no; see `tunecache misses`)."""
    store = read_store(ctx)
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
        json_out(rows)
        return
    table(
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
    inductor = store.inductor_counts()
    if any(v["entries"] for v in inductor.values()):
        hits = sum(v["hits"] for v in inductor.values())
        click.echo(f"torch.compile entries: {_inductor_line(inductor)}; served {hits} times")
    if n_cov < len(rows):
        click.echo("not covered: their autotuner never reached Autotuner.run (the process logged why once)")


@click.command()
@json_option
@click.pass_context
def misses(ctx: click.Context, as_json: bool) -> None:
    """Keys that missed during a CUDA graph capture or in offline mode (tune them next image build), and
    the first key of kernels tunecache could not serve (reason "uncovered"); with those of this
    store that processes on this host recorded in the local spool because the store was read-only."""
    store = read_store(ctx)
    rows = [{**r, "recorded": "store"} for r in store.list_misses()]
    rows += [{**r, "recorded": "spool"} for r in missspool.read(store.masked_url)]
    if as_json:
        json_out([{**r, "key": orjson.loads(r.pop("key_json"))} for r in rows])
        return
    if not rows:
        click.echo(f"no misses recorded: none in {store.masked_url}, none in this host's spool {missspool.path()}")
        return
    table(
        ["DIGEST", "KERNEL", "REASON", "COUNT", "KEY", "LAST_SEEN", "HOST"],
        (
            [r["digest"][:12], r["kernel"], r["reason"], r["count"], r["key_json"], r["last_seen"], r["host"]]
            for r in rows
        ),
    )
    spooled = sum(r["recorded"] == "spool" for r in rows)
    if spooled:
        click.echo(f"{spooled} of them from {missspool.path()} (this host's misses while the store was read-only)")
