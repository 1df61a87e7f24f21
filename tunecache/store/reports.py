"""The report's queries: the fleet's shared keys, the kernel x target groups, time saved, misses.

Kept in the store layer (the only one that writes SQL) so that :mod:`tunecache.report.report` keeps
only the analysis and the page. Every function reads in one snapshot of ``store`` and returns plain
rows; ``filters`` is anything with ``kernel``, ``target`` and ``since`` (the report's ``Filters``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Row

from tunecache.store.schema import configs, kernel_stats, measurements, misses, problems
from tunecache.store.store import Store


class ReportFilters(Protocol):
    kernel: str | None
    target: str | None
    since: dt.datetime | None


def clauses(filters: ReportFilters, t: sa.Table = problems, *, dated: bool = True) -> list[Any]:
    """The WHERE clauses of ``--kernel`` (full name or its last part), ``--target`` (arch, device name
    or target digest prefix) and ``--since`` on table ``t`` (``problems`` or ``misses``)."""
    c = t.c
    w: list[Any] = []
    if filters.kernel:
        esc = filters.kernel.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        w.append(sa.or_(c.kernel == filters.kernel, c.kernel.like("%." + esc, escape="\\")))
    if filters.target and t is problems:
        w.append(sa.or_(c.arch == filters.target, c.device_name == filters.target, c.target_digest == filters.target))
    elif filters.target:
        w.append(c.target_digest == filters.target)
    if filters.since and dated:
        w.append((c.updated_at if t is problems else c.last_seen) >= filters.since)
    return w


def fleet_batch(
    store: Store, filters: ReportFilters, after: str, limit: int
) -> tuple[list[str], dict[str, Row], dict[str, list[tuple[str, str, float]]]]:
    """The next ``limit`` digests after ``after`` that more than one host measured, their problems'
    rows (digest, kernel, key_json, device_name, arch, driver_version) and ``{digest: [(host,
    config_hash, median_ms)]}`` (the dates: :func:`fleet_dates`, not one datetime per row).

    ``filters.since`` applies to the timings (``measured_at``), not to the problems: a host's old
    timings of a problem that another host re-tuned today must not count as recent evidence."""
    m, p = measurements.c, problems.c
    recent = [m.measured_at >= filters.since] if filters.since else []
    with store.snapshot("fleet") as conn:
        ids = (
            conn.execute(
                sa.select(m.digest)
                .join(problems, p.digest == m.digest)
                .where(*clauses(filters, dated=False), *recent, m.digest > after)
                .group_by(m.digest)
                .having(sa.func.count(sa.distinct(m.host)) > 1)
                .order_by(m.digest)
                .limit(limit)
            )
            .scalars()
            .all()
        )
        if not ids:
            return [], {}, {}
        meta = {
            r.digest: r
            for r in conn.execute(
                sa.select(p.digest, p.kernel, p.key_json, p.device_name, p.arch, p.driver_version).where(
                    p.digest.in_(ids)
                )
            )
        }
        rows: dict[str, list[tuple[str, str, float]]] = {}
        q = sa.select(m.digest, m.host, m.config_hash, m.median_ms).where(m.digest.in_(ids), *recent)
        for d, host, ch, ms in conn.execute(q):
            rows.setdefault(d, []).append((host, ch, ms))
    return list(ids), meta, rows


def fleet_dates(store: Store, filters: ReportFilters) -> dict[tuple[str, str], tuple[dt.datetime, dt.datetime]]:
    """When each host timed each kernel: ``{(host, kernel): (first, last measured_at)}`` over the
    timings :func:`fleet_batch` reads (keys more than one host measured, ``since`` on the timings).
    One aggregate in SQL: parsing a datetime per measurement row would double the fleet's time."""
    m, p = measurements.c, problems.c
    recent = [m.measured_at >= filters.since] if filters.since else []
    shared = (
        sa.select(m.digest)
        .where(*recent)
        .group_by(m.digest)
        .having(sa.func.count(sa.distinct(m.host)) > 1)
        .scalar_subquery()
    )
    q = (
        sa.select(m.host, p.kernel, sa.func.min(m.measured_at), sa.func.max(m.measured_at))
        .join(problems, p.digest == m.digest)
        .where(*clauses(filters, dated=False), *recent, m.digest.in_(shared))
        .group_by(m.host, p.kernel)
    )
    with store.snapshot("fleet") as conn:
        return {(host, kernel): (lo, hi) for host, kernel, lo, hi in conn.execute(q)}


def groups(
    store: Store, filters: ReportFilters, max_groups: int, max_scan: int, draw: Any
) -> tuple[list[tuple[Row, list[dict[str, Any]], dict[str, dict[str, Any]]]], int]:
    """The largest ``max_groups`` kernel/source/target groups, each as (its row: kernel, source_hash,
    target_digest, device_name, arch, driver_version, triton_version, n; the keys ``draw`` picks of
    its first ``max_scan`` in bucket order; ``{digest: {config_hash: config row}}`` of those keys), and
    how many groups match in all."""
    p, c = problems.c, configs.c
    cols = (p.kernel, p.source_hash, p.target_digest, p.device_name, p.arch, p.driver_version, p.triton_version)
    out = []
    with store.snapshot("report") as conn:
        found = conn.execute(
            sa.select(*cols, sa.func.count().label("n"))
            .where(*clauses(filters))
            .group_by(*cols)
            .order_by(sa.func.count().desc(), p.kernel)
        ).all()
        for r in found[:max_groups]:
            scan = conn.execute(
                sa.select(p.digest, p.key_json, p.batch_bucket, p.winner_config_hash, p.winner_ms)
                .where(p.source_hash == r.source_hash, p.target_digest == r.target_digest, *clauses(filters))
                .order_by(p.batch_bucket, p.key_json)
                .limit(max_scan)
            ).all()
            keys = [dict(k._mapping) for k in draw(list(scan))]
            rows: dict[str, dict[str, Any]] = {}
            q = sa.select(c.digest, c.config_hash, c.config_json, c.status, c.median_ms, c.failure, c.host)
            for row in conn.execute(q.where(c.digest.in_([k["digest"] for k in keys]))):
                rows.setdefault(row.digest, {})[row.config_hash] = dict(row._mapping)
            out.append((r, keys, rows))
    return out, len(found)


def saved(store: Store, filters: ReportFilters) -> tuple[list[Row], list[Row], dict[str, float]]:
    """Time saved: per kernel (kernel, hits, tuning s, hits x tuning s), the 30 largest; by kernel and
    day tuned for the 8 largest (kernel, date, saved); and the live-counted saved seconds per kernel."""
    p = problems.c
    saved_s = sa.func.sum(p.hit_count * p.tuning_seconds)
    with store.snapshot("report") as conn:
        per_kernel = conn.execute(
            sa.select(p.kernel, sa.func.sum(p.hit_count), sa.func.sum(p.tuning_seconds), saved_s)
            .where(*clauses(filters))
            .group_by(p.kernel)
            .order_by(saved_s.desc(), p.kernel)
            .limit(30)
        ).all()
        day = sa.func.date(p.created_at)
        by_day = conn.execute(
            sa.select(p.kernel, day, saved_s)
            .where(*clauses(filters), p.kernel.in_([r[0] for r in per_kernel[:8]]))
            .group_by(p.kernel, day)
            .order_by(p.kernel, day)
            .limit(5000)
        ).all()
        measured = {r.kernel: r.saved_seconds for r in conn.execute(sa.select(kernel_stats))}
    return per_kernel, by_day, measured


def missed(store: Store, filters: ReportFilters, limit: int) -> tuple[int, list[Row]]:
    """How many missed keys match, and the ``limit`` most frequent (kernel, key_json, reason, count,
    host, last_seen)."""
    mc = misses.c
    with store.snapshot("report") as conn:
        total = conn.execute(
            sa.select(sa.func.count()).select_from(misses).where(*clauses(filters, misses))
        ).scalar_one()
        rows = conn.execute(
            sa.select(mc.kernel, mc.key_json, mc.reason, mc.count, mc.host, mc.last_seen)
            .where(*clauses(filters, misses))
            .order_by(mc.count.desc(), mc.kernel, mc.key_json)
            .limit(limit)
        ).all()
    return total, rows


def winners_batch(store: Store, filters: ReportFilters, after: str, limit: int, *, dated: bool = True) -> list[Row]:
    """The next ``limit`` problems after digest ``after`` (``tunecache report --compare``): digest,
    kernel, key_json, device_name, arch, driver_version, triton_version, updated_at, winner_config_hash,
    winner_ms and the winner's config_json (None without a winner). ``dated=False`` ignores
    ``filters.since`` (the store compared with keeps its older keys)."""
    p, c = problems.c, configs.c
    win = sa.and_(c.digest == p.digest, c.config_hash == p.winner_config_hash)
    q = (
        sa.select(
            p.digest,
            p.kernel,
            p.key_json,
            p.device_name,
            p.arch,
            p.driver_version,
            p.triton_version,
            p.updated_at,
            p.winner_config_hash,
            p.winner_ms,
            c.config_json,
        )
        .select_from(problems.outerjoin(configs, win))
        .where(*clauses(filters, dated=dated), p.digest > after)
        .order_by(p.digest)
        .limit(limit)
    )
    with store.snapshot("compare") as conn:
        return conn.execute(q).all()
