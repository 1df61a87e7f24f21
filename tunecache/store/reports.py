"""The report's queries: the summary counts, the fleet's shared keys, the kernel x target groups,
time spent and saved, misses.

Kept in the store layer (the only one that writes SQL) so that :mod:`tunecache.report.report` keeps
only the analysis and the page. Every function reads in one snapshot of ``store`` and returns plain
rows; ``filters`` is anything with ``kernel``, ``target`` and ``since`` (the report's ``Filters``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Row

from tunecache.store.schema import configs, measurements, misses, problems
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
) -> tuple[list[str], dict[str, Row], dict[str, list[Any]], list[tuple[str, str, Any, Any]]]:
    """The next ``limit`` digests after ``after`` that more than one host measured, their problems'
    rows (digest, kernel, key_json, device_name, arch, driver_version), ``{digest: [(host,
    config_hash, median_ms, ...)]}`` (the rows as read, those three first) and when each host timed
    each kernel among them (host, kernel, first and last ``measured_at``: one aggregate over the
    batch, not one datetime per row).

    ``filters.since`` applies to the timings (``measured_at``), not to the problems: a host's old
    timings of a problem that another host re-tuned today must not count as recent evidence.

    Two queries: the digests with their problems' fields (one join), then every timing of the
    digest range they span (the primary key's order; a digest of the range that is not in the batch
    is skipped), whose ``measured_at`` is read as stored and compared as read (what ``min``/``max``
    do in SQL), then converted once per (host, kernel): no join and no datetime per row."""
    m, p = measurements.c, problems.c
    recent = [m.measured_at >= filters.since] if filters.since else []
    shared = (
        sa.select(m.digest)
        .join(problems, p.digest == m.digest)
        .where(*clauses(filters, dated=False), *recent, m.digest > after)
        .group_by(m.digest)
        .having(sa.func.count(sa.distinct(m.host)) > 1)
        .order_by(m.digest)
        .limit(limit)
        .subquery()
    )
    with store.snapshot("fleet") as conn:
        found = conn.execute(
            sa.select(p.digest, p.kernel, p.key_json, p.device_name, p.arch, p.driver_version)
            .join(shared, shared.c.digest == p.digest)
            .order_by(p.digest)
        ).all()
        if not found:
            return [], {}, {}, []
        meta = {r.digest: r for r in found}
        when = sa.type_coerce(m.measured_at, sa.String)  # as stored: no datetime made per row
        q = (
            sa.select(m.host, m.config_hash, m.median_ms, when, m.digest)
            .where(m.digest > after, m.digest <= found[-1].digest, *recent)
            .order_by(m.digest)  # the primary key's order: no sort
        )
        rows: dict[str, list[Any]] = {}
        span: dict[str, dict[str, list[Any]]] = {}  # kernel -> host -> [first, last]
        for d, timings in itertools.groupby(conn.execute(q).all(), key=operator.itemgetter(4)):
            r = meta.get(d)
            if r is None:  # in the range, not shared
                continue
            ts = rows[d] = list(timings)
            hosts = span.get(r.kernel)
            if hosts is None:
                hosts = span[r.kernel] = {}
            for host, _, _, at, _ in ts:
                s = hosts.get(host)
                if s is None:
                    hosts[host] = [at, at]
                elif at < s[0]:
                    s[0] = at
                elif at > s[1]:
                    s[1] = at
        proc = measurements.c.measured_at.type.dialect_impl(conn.dialect).result_processor(conn.dialect, None)

        def stamp(v: Any) -> Any:  # a string where the driver gives one (SQLite), as the column would read
            return proc(v) if proc is not None and isinstance(v, str) else v

        dates = [(h, k, stamp(lo), stamp(hi)) for k, hosts in span.items() for h, (lo, hi) in hosts.items()]
    return [r.digest for r in found], meta, rows, dates


def groups(
    store: Store, filters: ReportFilters, max_groups: int, max_scan: int, draw: Any
) -> tuple[list[tuple[Row, list[dict[str, Any]], dict[str, dict[str, Any]]]], list[Row]]:
    """Every kernel/source/target group, largest first (its row: kernel, source_hash, target_digest,
    device_name, arch, driver_version, triton_version, n keys, no_ok: keys without a winner, i.e. without
    an ok config), and
    the first ``max_groups`` of them with their drawn keys (those ``draw`` picks of the group's first
    ``max_scan`` rows) and ``{digest: {config_hash: config row}}`` of those keys."""
    p, c = problems.c, configs.c
    cols = (p.kernel, p.source_hash, p.target_digest, p.device_name, p.arch, p.driver_version, p.triton_version)
    # No stored winner: the store picks the fastest ok config, none where every config failed (a
    # NOT EXISTS over configs per problem costs 1 s more on 100k problems and says the same).
    no_ok = sa.func.sum(sa.case((p.winner_config_hash.is_(None), 1), else_=0)).label("no_ok")
    out = []
    with store.snapshot("report") as conn:
        found = conn.execute(
            sa.select(*cols, sa.func.count().label("n"), no_ok)
            .where(*clauses(filters))
            .group_by(*cols)
            .order_by(sa.func.count().desc(), p.kernel, p.source_hash, p.target_digest)
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
    return out, found


def group_failures(store: Store, filters: ReportFilters) -> dict[tuple[str, str], dict[str, int]]:
    """Config rows that did not run, per (source_hash, target_digest): ``{status: rows}``."""
    p, c = problems.c, configs.c
    out: dict[tuple[str, str], dict[str, int]] = {}
    with store.snapshot("report") as conn:
        q = (
            sa.select(p.source_hash, p.target_digest, c.status, sa.func.count())
            .join(problems, p.digest == c.digest)
            .where(*clauses(filters), c.status != "ok")
            .group_by(p.source_hash, p.target_digest, c.status)
        )
        for src, tgt, status, n in conn.execute(q):
            out.setdefault((src, tgt), {})[status] = n
    return out


def kernel_times(store: Store, filters: ReportFilters) -> list[Row]:
    """Per kernel, most time saved first: (kernel, keys, hits, host_benchmarks, spent, saved).

    ``host_benchmarks``: each host's benchmark of a key (the hosts in ``measurements`` for it, or 1
    where none is recorded); ``spent``: each of those at the key's tuning seconds (the store keeps one
    tuning time per key, the winner's host's); ``saved``: hits x the key's tuning seconds."""
    p, m = problems.c, measurements.c
    per_key = sa.select(m.digest, sa.func.count(sa.distinct(m.host)).label("hosts")).group_by(m.digest).subquery()
    benches = sa.func.coalesce(per_key.c.hosts, 1)
    saved_s = sa.func.sum(p.hit_count * p.tuning_seconds)
    with store.snapshot("report") as conn:
        return list(
            conn.execute(
                sa.select(
                    p.kernel,
                    sa.func.count().label("keys"),
                    sa.func.sum(p.hit_count).label("hits"),
                    sa.func.sum(benches).label("host_benchmarks"),
                    sa.func.sum(benches * p.tuning_seconds).label("spent"),
                    saved_s.label("saved"),
                )
                .select_from(problems.outerjoin(per_key, per_key.c.digest == p.digest))
                .where(*clauses(filters))
                .group_by(p.kernel)
                .order_by(saved_s.desc(), p.kernel)
            )
        )


def summary(store: Store, filters: ReportFilters) -> dict[str, Any]:
    """The page's header counts that the groups do not give: the hosts that benchmarked a matching
    problem (the problems', config rows' and measurements' hosts) and the open misses (keys and
    launches)."""
    p, c, m, mc = problems.c, configs.c, measurements.c, misses.c
    w = clauses(filters)

    def of_problems(q: Any, digest: Any) -> Any:  # unfiltered: no join (4x faster on 100k problems)
        return q.join(problems, p.digest == digest).where(*w) if w else q

    with store.snapshot("report") as conn:
        hosts = sa.union(
            sa.select(p.host).where(*w),
            of_problems(sa.select(c.host), c.digest),
            of_problems(sa.select(m.host), m.digest),
        ).subquery()
        n_hosts = conn.execute(sa.select(sa.func.count()).select_from(hosts)).scalar_one()
        miss_keys, miss_launches = conn.execute(
            sa.select(sa.func.count(sa.distinct(mc.digest)), sa.func.coalesce(sa.func.sum(mc.count), 0)).where(
                *clauses(filters, misses)
            )
        ).one()
    return {"hosts": n_hosts, "miss_keys": miss_keys, "miss_launches": miss_launches}


def saved_by_day(store: Store, filters: ReportFilters, kernels: list[str]) -> list[Row]:
    """Seconds saved (hits x tuning seconds) by kernel and UTC day tuned, for ``kernels``."""
    p = problems.c
    day = sa.func.date(p.created_at)
    with store.snapshot("report") as conn:
        return list(
            conn.execute(
                sa.select(p.kernel, day, sa.func.sum(p.hit_count * p.tuning_seconds))
                .where(*clauses(filters), p.kernel.in_(kernels))
                .group_by(p.kernel, day)
                .order_by(p.kernel, day)
                .limit(5000)
            )
        )


def missed(store: Store, filters: ReportFilters, limit: int) -> tuple[int, list[Row], dict[str, Row]]:
    """How many keys missed, the ``limit`` most frequent miss rows (digest, kernel, target_digest,
    key_json, reason, count, host: the last host to miss, last_seen), and the targets they name as
    ``{target_digest: (device_name, arch, driver_version)}`` where a stored problem knows them."""
    mc, p = misses.c, problems.c
    with store.snapshot("report") as conn:
        total = conn.execute(
            sa.select(sa.func.count(sa.distinct(mc.digest))).where(*clauses(filters, misses))
        ).scalar_one()
        rows = conn.execute(
            sa.select(mc.digest, mc.kernel, mc.target_digest, mc.key_json, mc.reason, mc.count, mc.host, mc.last_seen)
            .where(*clauses(filters, misses))
            .order_by(mc.count.desc(), mc.kernel, mc.key_json)
            .limit(limit)
        ).all()
        wanted = sorted({r.target_digest for r in rows})
        targets = {
            r.target_digest: r
            for r in conn.execute(
                sa.select(p.target_digest, p.device_name, p.arch, p.driver_version)
                .where(p.target_digest.in_(wanted))
                .distinct()
            )
        }
    return total, rows, targets


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
