"""Store: the queries and writes of tuning results, over the tables of :mod:`tunecache.store.schema`.

One SQL schema serves the embedded SQLite default and a shared PostgreSQL or MySQL. Queries are
SQLAlchemy Core (no ORM objects: a warm start builds hundreds of rows and must stay cheap), and
every write is one transaction, so a reader sees a problem with all its config rows or not at all.

The engine, its SQLite settings and URL handling are :mod:`tunecache.store.engine`; the rows of
compiled binaries and of torch.compile's cache entries, :mod:`tunecache.store.binaryrows` and
:mod:`tunecache.store.inductorrows`.

A store whose file or directory is not writable (an image with a read-only root filesystem) is
opened read-only (:func:`tunecache.store.sqlitefile.readonly_connect`): no lock files, no writes;
every write raises :class:`StoreReadOnlyError`, which the autotuner treats as "store unavailable
for writing". Every process closes its writable SQLite stores as it ends, and the last one to
close a file folds its log into it, so a copied or baked file is whole
(:mod:`tunecache.store.sqlitefile`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import threading
import weakref
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from tunecache import settings
from tunecache.errors import StoreError, StoreReadOnlyError, driver_message
from tunecache.problem.configidentity import search_space_hash
from tunecache.problem.model import (
    CONFIG_ROW_COLUMNS,
    FAILED_STATUSES,
    STATUSES,
    ConfigResult,
    LaunchSpec,
    Problem,
    launch_spec_row,
    miss_fields,
    new_config_row,
    new_problem_row,
    pick_winner,
    problems_from_rows,
    utcnow,
)
from tunecache.problem.target import hostname
from tunecache.process import counters, forks, interrupts, processend
from tunecache.store import breaker, dbclock, forkgate
from tunecache.store.binaryrows import BinaryRows
from tunecache.store.bulk import BulkWriter, bulk_writer
from tunecache.store.engine import mask_url, scrub, sqlite_path, store_error
from tunecache.store.filters import filter_clauses
from tunecache.store.inductorrows import InductorRows
from tunecache.store.leases import lease_host, pid_alive
from tunecache.store.migrate import (
    apply,
    check_target,
    cross_process_lock,
    current_revision,
    head_revision,
    in_process_lock,
)
from tunecache.store.schema import (
    configs,
    kernel_stats,
    launch_specs,
    leases,
    measurements,
    misses,
    problems,
)
from tunecache.store.signers import not_larger, trusted_slots
from tunecache.store.sqlitefile import fold_log, seal
from tunecache.trust import signing, trust

log = logging.getLogger("tunecache")


_live_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_inherited_pools: list[Any] = []  # a forked child's copies of its parent's pools: never used, never closed


class Store(BinaryRows, InductorRows):
    """A connection to one tuning-results database. Thread-safe; cheap to keep for a process.

    The rows of compiled binaries and of Inductor's entries are queried by its mixins
    (:mod:`tunecache.store.binaryrows`, :mod:`tunecache.store.inductorrows`)."""

    def __init__(self, url: URL, engine: Engine, readonly: bool) -> None:
        self.url = url
        self.engine = engine
        self.readonly = readonly
        self.dialect = engine.dialect.name
        self._lock = threading.Lock()
        self._names: tuple[int, frozenset[str]] | None = None  # (pid, kernel_names()): see there
        _live_stores.add(self)

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    def __repr__(self) -> str:
        return f"Store({self.masked_url}{', read-only' if self.readonly else ''})"

    def close(self) -> None:
        """Close this store's connections. A writable SQLite file then holds every row in its main
        file, unless another process still uses it (whose close will): SQLite folds the log into
        it as the last connection closes, and :func:`~tunecache.store.sqlitefile.fold_log` does
        what it can without waiting where this process could not close one. Never raises."""
        self.engine.dispose()
        path = sqlite_path(self.url) if self.dialect == "sqlite" and not self.readonly else None
        if path is not None:
            fold_log(path)

    def seal(self) -> dict[str, Any]:
        """SQLite: fold the whole log into the main file, waiting (up to the busy timeout) for the
        processes that use it, so that the one file can be copied: ``tunecache db seal``."""
        path = sqlite_path(self.url) if self.dialect == "sqlite" else None
        if path is None:
            raise StoreError(
                f"store {self.masked_url} is not a SQLite file: there is no file to seal "
                "(`tunecache export` writes a server's rows to one file)"
            )
        if self.readonly:
            raise StoreReadOnlyError(
                f"store {self.masked_url} is read-only here: run `tunecache db seal` where it is writable"
            )
        self.engine.dispose()  # this process's own connections closed first
        with self._guard("sealing"):
            return seal(path, settings.get("TUNECACHE_SQLITE_BUSY_MS"))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn driver errors into StoreError with the host named and the password hidden."""
        try:
            yield
        except StoreError:
            raise
        except (SQLAlchemyError, sqlite3.Error, OSError) as e:
            raise store_error(what, e, self.url) from None

    @contextlib.contextmanager
    def _connect(self) -> Iterator[Connection]:
        """A connection, through this process's breaker of the server (:mod:`tunecache.store.breaker`):
        refused at once while a server that did not answer is left alone."""
        with breaker.attempt(self.url):
            conn = self.engine.connect()
        with conn:
            yield conn

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        if self.readonly:
            raise StoreReadOnlyError(f"{what}: store {self.masked_url} is opened read-only")
        gate = forkgate.writing() if self.dialect == "sqlite" else contextlib.nullcontext()
        if self.dialect == "sqlite":
            processend.arm()  # a multiprocessing child closes it too as it ends (_close_at_end)
        self._names = None  # this process may store a problem of a kernel it has not stored before
        with gate, self._guard(what), self._connect() as conn:
            conn.execution_options(tunecache_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with self._guard(what), self._connect() as conn:
            yield conn

    @contextlib.contextmanager
    def snapshot(self, what: str) -> Iterator[Connection]:
        """A read-only transaction in which every statement sees the same committed state.

        For reads of several statements that must agree with each other (an export's problems and
        their configs): without it, a ``gc`` committing in between leaves a problem whose winner's
        config row is gone. SQLite: a deferred BEGIN (WAL keeps the snapshot of its first read);
        PostgreSQL: REPEATABLE READ, READ ONLY; MySQL/MariaDB: REPEATABLE READ (InnoDB's consistent
        read). Writers are not blocked on any of them.
        """
        with self._guard(what), self._connect() as conn:
            if self.dialect == "sqlite":
                conn.execution_options(tunecache_snapshot=True)
            elif self.dialect == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            else:
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    # ---- schema ---------------------------------------------------------------------------

    def revision(self) -> str | None:
        with self._read("reading the schema revision") as conn:
            return current_revision(conn)

    def select_only(self) -> bool:
        """PostgreSQL: whether this login may only read the tables (a ``tunecache db grant --reader``
        role). Such a store is opened read-only, as a read-only SQLite file is: a serving worker then
        never attempts a write the server would refuse (hits, counters, specs)."""
        q = "SELECT to_regclass('problems') IS NOT NULL AND NOT has_table_privilege(to_regclass('problems'), 'INSERT')"
        with self._read("reading the role's privileges") as conn:
            return bool(conn.exec_driver_sql(q).scalar())

    def upgrade(self, revision: str = "head") -> None:
        """Apply migrations (see :mod:`tunecache.store.migrate`); concurrent callers serialise on a lock and
        only the first migrates. A store already there takes no lock (one beside a SQLite file would be
        created for nothing, or fail in a read-only directory)."""
        check_target(revision)
        if self.revision() == (head_revision() if revision == "head" else revision):
            return
        with (
            in_process_lock(),
            self._guard("migrating the schema"),
            cross_process_lock(self),
            self._write("migrating the schema") as conn,
        ):
            apply(self, conn, revision)

    # ---- reads ----------------------------------------------------------------------------

    _problem_cols = [c for c in problems.c]

    def _select_full(self) -> sa.Select:
        cfg_cols = [configs.c[n].label(f"config_{n}") for n in CONFIG_ROW_COLUMNS]  # labels: both tables have host
        return sa.select(*self._problem_cols, *cfg_cols).select_from(
            problems.outerjoin(configs, configs.c.digest == problems.c.digest)
        )

    def get(self, digest: str) -> Problem | None:
        """The problem with all its config rows, or None."""
        with self._read("get") as conn:
            found = problems_from_rows(conn.execute(self._select_full().where(problems.c.digest == digest)))
        return found[0] if found else None

    def get_many(self, source_hash: str, target_digest: str | None = None) -> list[Problem]:
        """Every problem of one kernel (on one target, or on all), with config rows, in ONE query."""
        with self._read("bulk fetch") as conn:
            q = self._select_full().where(problems.c.source_hash == source_hash)
            if target_digest is not None:
                q = q.where(problems.c.target_digest == target_digest)
            return problems_from_rows(conn.execute(q))

    def kernel_names(self) -> frozenset[str]:
        """The names of the kernels that have stored problems: a process defining hundreds of kernels
        prefetches only those (tunecache.tuner.kernelstore). One indexed query per process, kept until this
        process writes; a kernel another process tunes meanwhile is found by its first launch's lookup."""
        memo = self._names
        if memo is not None and memo[0] == os.getpid():
            return memo[1]
        with self._read("kernel names") as conn:
            names = frozenset(r[0] for r in conn.execute(sa.select(problems.c.kernel).distinct()))
        self._names = (os.getpid(), names)
        return names

    def get_kernel_problems(self, kernel: str) -> list[Problem]:
        """Every problem of every source version of one kernel (by ``module.qualname``, all
        targets), with config rows, in ONE query: a prefetch before the source can be hashed."""
        with self._read("bulk fetch") as conn:
            return problems_from_rows(conn.execute(self._select_full().where(problems.c.kernel == kernel[:255])))

    def find(self, digest_prefix: str) -> list[Problem]:
        """Problems whose digest starts with a prefix (as typed by a user), with config rows."""
        prefix = digest_prefix.strip().lower()
        if len(prefix) > 64:
            raise ValueError(f"digest prefix of {len(prefix)} characters is too long: a digest has 64")
        if not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
            shown = repr(digest_prefix) if len(digest_prefix) <= 70 else repr(digest_prefix[:64]) + "..."
            raise ValueError(f"digest prefix {shown} is not hexadecimal")
        with self._read("find") as conn:
            q = self._select_full().where(problems.c.digest.like(prefix + "%")).order_by(problems.c.digest)
            return problems_from_rows(conn.execute(q))

    def find_problems(self, *, with_configs: bool = False, limit: int | None = None, **filters: Any) -> list[Problem]:
        """Problems matching filters (see :func:`filter_clauses`), newest first."""
        where = filter_clauses(**filters)
        with self._read("find_problems") as conn:
            if with_configs:
                q = self._select_full().where(*where).order_by(problems.c.updated_at.desc(), problems.c.digest)
            else:
                q = (
                    sa.select(*self._problem_cols)
                    .where(*where)
                    .order_by(problems.c.updated_at.desc(), problems.c.digest)
                )
                if limit:
                    q = q.limit(limit)
            return problems_from_rows(conn.execute(q))

    def iter_problems(self, batch: int = 2000, **filters: Any) -> Iterator[Problem]:
        """Every matching problem with its configs, streamed in digest order (for export)."""
        where = filter_clauses(**filters)
        last = ""
        while True:
            with self._read("export") as conn:
                ids = (
                    conn.execute(
                        sa.select(problems.c.digest)
                        .where(*where, problems.c.digest > last)
                        .order_by(problems.c.digest)
                        .limit(batch)
                    )
                    .scalars()
                    .all()
                )
                if not ids:
                    return
                q = self._select_full().where(problems.c.digest.in_(ids)).order_by(problems.c.digest)
                found = problems_from_rows(conn.execute(q))
            yield from found
            last = ids[-1]

    def counts(self, **filters: Any) -> dict[str, int]:
        where = filter_clauses(**filters)
        with self.snapshot("counts") as conn:  # four counts of one state
            n_problems = conn.execute(sa.select(sa.func.count()).select_from(problems).where(*where)).scalar_one()
            sub = sa.select(problems.c.digest).where(*where)
            cfg = configs.c.digest.in_(sub) if where else sa.true()
            n_configs = conn.execute(sa.select(sa.func.count()).select_from(configs).where(cfg)).scalar_one()
            n_failed = conn.execute(
                sa.select(sa.func.count()).select_from(configs).where(cfg, configs.c.status.in_(FAILED_STATUSES))
            ).scalar_one()
            n_misses = conn.execute(sa.select(sa.func.count()).select_from(misses)).scalar_one()
        return {"problems": n_problems, "configs": n_configs, "failed_configs": n_failed, "open_misses": n_misses}

    # ---- writes ---------------------------------------------------------------------------

    def _insert_ignore(self, table: sa.Table) -> Any:
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert

            return insert(table).on_conflict_do_nothing()
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert

            return insert(table).on_conflict_do_nothing()
        return sa.insert(table).prefix_with("IGNORE")

    def _inserted(self, conn: Connection, table: sa.Table, values: dict[str, Any]) -> bool:
        """Insert unless the key exists; True if this call inserted (rowcount is unreliable on psycopg)."""
        stmt = self._insert_ignore(table).values(values)  # a value may be a SQL expression (dbclock.now)
        if self.dialect in ("postgresql", "sqlite"):
            return conn.execute(stmt.returning(*table.primary_key.columns)).first() is not None
        return conn.execute(stmt).rowcount == 1

    def put(self, problem: Problem, results: Sequence[ConfigResult], *, replace: bool = False) -> Problem:
        """Store a problem and its config rows in one transaction; return what is stored now.

        An upsert: concurrent puts of one digest never fail or duplicate. New config rows are added;
        rows already stored are kept unless ``replace``. The first complete winner stays unless
        ``replace`` (used when a search space grew or a winner turned out broken). The winner is
        ``problem.winner_config_hash`` when that names a stored ok config, else the fastest.
        """
        now = utcnow()
        host = problem.host or hostname()
        with self._write("put") as conn:
            conn.execute(self._insert_ignore(problems), [new_problem_row(problem, host, now)])
            if self.dialect != "sqlite":  # SQLite's BEGIN IMMEDIATE already serialises writers
                conn.execute(sa.select(problems.c.digest).where(problems.c.digest == problem.digest).with_for_update())
            rows = [new_config_row(problem.digest, r, host, now) for r in results]
            if rows:
                if replace:
                    conn.execute(
                        sa.delete(configs).where(
                            configs.c.digest == problem.digest,
                            configs.c.config_hash.in_([r["config_hash"] for r in rows]),
                        )
                    )
                conn.execute(self._insert_ignore(configs), rows)
                self._add_measurements(conn, problem.digest, rows)
            stored = problems_from_rows(conn.execute(self._select_full().where(problems.c.digest == problem.digest)))[0]
            proposed = stored.config_map().get(problem.winner_config_hash or "")
            # The tuner's choice (see pick_winner's prefer) when it is a stored ok config.
            best = proposed if proposed is not None and proposed.ok else pick_winner(stored.configs)
            values: dict[str, Any] = {
                "search_space_hash": search_space_hash([c.config_hash for c in stored.configs]),
                "updated_at": now,
            }
            if replace or stored.winner_config_hash is None:
                values.update(
                    winner_config_hash=best.config_hash if best else None,
                    winner_ms=best.median_ms if best else None,
                    tuning_seconds=problem.tuning_seconds,
                    host=host,
                )
            elif stored.winner_config_hash and best and stored.winner is None:
                values.update(winner_config_hash=best.config_hash, winner_ms=best.median_ms)
            conn.execute(sa.update(problems).where(problems.c.digest == problem.digest).values(**values))
            conn.execute(sa.delete(misses).where(misses.c.digest == problem.digest))
            return problems_from_rows(conn.execute(self._select_full().where(problems.c.digest == problem.digest)))[0]

    def _add_measurements(self, conn: Connection, digest: str, rows: Sequence[dict[str, Any]]) -> None:
        """Record each host's ok timings of this put (config value rows) in ``measurements``, replacing
        that host's earlier timing of the same config: kept even when ``configs`` keeps another host's."""
        ok = [r for r in rows if r["status"] == "ok" and r["median_ms"] is not None]
        if not ok:
            return
        m = measurements.c
        for host in sorted({r["host"] for r in ok}):
            hashes = [r["config_hash"] for r in ok if r["host"] == host]
            conn.execute(sa.delete(measurements).where(m.digest == digest, m.host == host, m.config_hash.in_(hashes)))
        keys = ("config_hash", "median_ms", "p20_ms", "p80_ms", "samples", "measured_at", "host")
        conn.execute(sa.insert(measurements), [{"digest": digest, **{k: r[k] for k in keys}} for r in ok])

    def mark_config(self, digest: str, config_hash: str, status: str, failure: dict[str, Any]) -> None:
        """Record that a stored config failed after all (a poisoned winner), and re-pick the winner."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        with self._write("mark config") as conn:
            conn.execute(
                sa.update(configs)
                .where(configs.c.digest == digest, configs.c.config_hash == config_hash)
                .values(
                    status=status,
                    failure=orjson.dumps(failure).decode(),
                    median_ms=None,
                    p20_ms=None,
                    p80_ms=None,
                    measured_at=utcnow(),
                    host=hostname(),
                )
            )
            stored = problems_from_rows(conn.execute(self._select_full().where(problems.c.digest == digest)))
            if stored:
                best = pick_winner(stored[0].configs)
                conn.execute(
                    sa.update(problems)
                    .where(problems.c.digest == digest)
                    .values(
                        winner_config_hash=best.config_hash if best else None,
                        winner_ms=best.median_ms if best else None,
                        updated_at=utcnow(),
                    )
                )

    def delete(self, *, dry_run: bool = False, **filters: Any) -> list[Problem]:
        """Delete matching problems with their config rows; return what was (or would be) deleted."""
        where = filter_clauses(**filters)
        if not where:
            raise ValueError("refusing to delete every problem without a filter")
        found = self.find_problems(**filters)
        if dry_run or not found:
            return found
        digests = [p.digest for p in found]
        with self._write("delete") as conn:
            for i in range(0, len(digests), 500):
                chunk = digests[i : i + 500]
                conn.execute(sa.delete(configs).where(configs.c.digest.in_(chunk)))
                conn.execute(sa.delete(measurements).where(measurements.c.digest.in_(chunk)))
                conn.execute(sa.delete(problems).where(problems.c.digest.in_(chunk)))
            orphan = ~sa.exists().where(
                problems.c.source_hash == launch_specs.c.source_hash,
                problems.c.target_digest == launch_specs.c.target_digest,
            )
            conn.execute(sa.delete(launch_specs).where(orphan))
        return found

    def record_hits(self, hits: Mapping[str, int]) -> None:
        if not hits:
            return
        now = utcnow()
        with self._write("record hits") as conn:
            conn.execute(
                sa.update(problems)
                .where(problems.c.digest == sa.bindparam("d"))
                .values(hit_count=problems.c.hit_count + sa.bindparam("n"), last_hit_at=now),
                # In digest order: processes flushing hits for the same rows take their row locks in
                # the same order, or PostgreSQL and MySQL abort them as deadlocked.
                [{"d": d, "n": n} for d, n in sorted(hits.items())],
            )

    def bump_stats(self, deltas: Mapping[str, Mapping[str, float]]) -> None:
        """Add per-kernel counters (hits, misses, benchmarks, bench_seconds, saved_seconds)."""
        if not deltas:
            return
        now = utcnow()
        cols = ("hits", "misses", "benchmarks", "bench_seconds", "saved_seconds")
        with self._write("record stats") as conn:
            for kernel, d in sorted(deltas.items()):  # one lock order for every process (no deadlock)
                vals = {
                    c: kernel_stats.c[c] + float(d.get(c, 0))
                    if "seconds" in c
                    else kernel_stats.c[c] + int(d.get(c, 0))
                    for c in cols
                }
                update = sa.update(kernel_stats).where(kernel_stats.c.kernel == kernel).values(**vals, updated_at=now)
                row = {"kernel": kernel, **{c: d.get(c, 0) for c in cols}, "updated_at": now}
                self._add_or_insert(conn, update, kernel_stats, row)

    def _add_or_insert(self, conn: Connection, update: Any, table: sa.Table, row: dict[str, Any]) -> None:
        """A counter upsert that loses no increment: add to the row; if there is none, insert it; if
        another process inserted it in between, add to that row."""
        if conn.execute(update).rowcount == 0 and not self._inserted(conn, table, row):
            conn.execute(update)

    def kernel_counters(self) -> list[dict[str, Any]]:
        with self._read("stats") as conn:
            rows = conn.execute(sa.select(kernel_stats).order_by(kernel_stats.c.kernel)).mappings().all()
        return [{str(k): v for k, v in r.items()} for r in rows]

    def record_miss(self, problem: Problem, reason: str) -> None:
        now = utcnow()
        with self._write("record miss") as conn:
            update = (
                sa.update(misses)
                .where(misses.c.digest == problem.digest, misses.c.reason == reason)
                .values(count=misses.c.count + 1, last_seen=now, host=hostname())  # the last host to miss
            )
            row = {
                **miss_fields(problem, reason),
                "count": 1,
                "host": hostname(),
                "first_seen": now,
                "last_seen": now,
            }
            self._add_or_insert(conn, update, misses, row)

    def list_misses(self) -> list[dict[str, Any]]:
        with self._read("misses") as conn:
            rows = conn.execute(sa.select(misses).order_by(misses.c.kernel, misses.c.last_seen.desc())).mappings()
            return [{str(k): v for k, v in r.items()} for r in rows]

    # ---- launch specialisations (preload) ------------------------------------------------------

    def put_specs(self, kernel: str, source_hash: str, target_digest: str, specs: Sequence[LaunchSpec]) -> int:
        """Record this process's winners' specialisations, signed with its key, in its signer's slot
        (idempotent: a spec it stored already is kept); returns how many were new. Never replaces
        another spec: a spec of another text's binary is added beside it
        (:func:`tunecache.binaries.preload.for_binary`, see :mod:`tunecache.tuner.heal`), and
        :meth:`gc_launch_specs` drops the superseded ones."""
        if not specs:
            return 0
        specs = trust.sign_specs(source_hash, target_digest, list(specs), self)  # signed where made
        rows = [launch_spec_row(kernel[:255], source_hash, target_digest, sp) for sp in specs]
        with self._write("record launch specs") as conn:
            return self.add_specs(conn, rows)

    def add_specs(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> int:
        """Insert launch_specs rows (without host and created_at, stamped here) inside the caller's
        transaction, e.g. a :meth:`bulk_load`'s, each in its signer's slot: a spec that signer stored
        already is kept (another binary's is added beside it under its own hash), anything else in
        its slot is replaced (as binaries: see :meth:`add_binaries`). Returns how many were new."""
        now, host = utcnow(), hostname()
        c = launch_specs.c
        cols = (c.spec_hash, c.config_hash, c.kernel_hash, c.spec_json, c.triton_version, c.signature)
        n = 0
        for r in rows:
            slot = signing.row_slot(r.get("signature"))
            mine = [c[k] == r[k] for k in ("source_hash", "target_digest", "spec_hash")] + [c.signer == slot]
            held = conn.execute(sa.select(*cols).where(*mine)).first()
            if held is not None:
                s = LaunchSpec(*held)
                filed = not slot or hashlib.sha256(s.spec_json.encode()).hexdigest() == s.spec_hash
                message = trust.spec_message(r["source_hash"], r["target_digest"], s)
                if filed and trust.own_row(slot, s.signature, message):
                    continue
                conn.execute(sa.delete(launch_specs).where(*mine))
            n += self._inserted(conn, launch_specs, {**r, "signer": slot, "host": host, "created_at": now})
        return n

    @contextlib.contextmanager
    def bulk_load(self, what: str) -> Iterator[BulkWriter]:
        """One write transaction for loading many rows, through the database's fastest path (see
        :mod:`tunecache.store.bulk`); its ``conn`` reads and deletes inside the same transaction."""
        dbapi_error = getattr(self.engine.dialect.dbapi, "Error", ())
        with interrupts.held() as hold:  # a Ctrl-C during the commit is raised once it is known done
            with self._write(what) as conn:
                try:
                    writer = bulk_writer(conn, self.dialect)  # takes its locks before the caller reads
                    try:
                        yield writer
                    finally:
                        writer.close()
                except dbapi_error as e:  # raw driver calls (COPY) bypass SQLAlchemy's error wrapping
                    msg = f"{what} failed on {self.masked_url}: {scrub(driver_message(e), self.url)}"
                    raise StoreError(msg) from None
                hold()
            writer.committed = True

    def get_specs(self, source_hash: str, slots: Collection[str] | None = None) -> dict[str, list[LaunchSpec]]:
        """Every recorded specialisation of one kernel by the signers of ``slots`` (None: every
        signer; :mod:`tunecache.store.signers`), by target digest, in one query, unverified (see
        :meth:`tunecache.trust.trust.Policy.specs`)."""
        c = launch_specs.c
        cols = (c.spec_hash, c.config_hash, c.kernel_hash, c.spec_json, c.triton_version, c.signature)
        q = sa.select(c.target_digest, *cols).where(
            c.source_hash == source_hash, *trusted_slots(c.signer, slots), not_larger(launch_specs, c.spec_json)
        )
        out: dict[str, list[LaunchSpec]] = {}
        with self._read("launch specs") as conn:
            for t, *rest in conn.execute(q.order_by(c.spec_hash, c.created_at.desc(), c.signer)):
                out.setdefault(t, []).append(LaunchSpec(*rest))
        return out

    def specs_elsewhere(self, source_hash: str, slots: Collection[str]) -> tuple[int, tuple[str, str | None] | None]:
        """How many launch specs of the kernel no signer of ``slots`` stored, and (spec_hash, signature)
        of one of them: a reader that trusts other keys counts them and says once why it does not
        preload them, reading none."""
        c = launch_specs.c
        where = (c.source_hash == source_hash, c.signer.not_in(sorted(slots)))
        with self._read("launch specs") as conn:
            n = int(conn.execute(sa.select(sa.func.count()).select_from(launch_specs).where(*where)).scalar_one())
            one = conn.execute(sa.select(c.spec_hash, c.signature).where(*where).limit(1)).first() if n else None
        return n, None if one is None else (one[0], one[1])

    # ---- leases (one benchmark per key across hosts) --------------------------------------

    def try_lease(self, digest: str, holder: str, ttl: float) -> bool:
        """Take the benchmark lease of a digest if it is free, expired, or held by a dead pid of this
        very process namespace (see :func:`tunecache.store.leases.lease_host`). Expiry is the
        database's clock (:mod:`tunecache.store.dbclock`), never a host's: hosts' clocks may differ."""
        host = lease_host()
        now = dbclock.now(self.dialect)
        with self._write("lease") as conn:
            values = {"digest": digest, "holder": holder, "host": host, "pid": os.getpid(), "expires_at": now + ttl}
            if self._inserted(conn, leases, values):
                return True
            row = conn.execute(self._lease_row(digest)).mappings().first()
            if row is None:
                return False
            # Its holder's death first: a lease orphaned by a crash may be found only after it expired.
            gone = row["host"] == host and not pid_alive(row["pid"])
            if not gone and row["expires_in"] >= 0:
                return False
            # Expired by the database's clock as the takeover is written: a renewal since the read keeps it.
            still = [] if gone else [leases.c.expires_at < now]
            res = conn.execute(
                sa.update(leases)
                .where(leases.c.digest == digest, leases.c.holder == row["holder"], *still)
                .values(holder=holder, host=host, pid=os.getpid(), expires_at=now + ttl)
            )
            if res.rowcount == 1:
                counters.count(None, None, lease_takeovers=1)
                log.warning(
                    "tunecache: took over the benchmark lease of %s from %s (%s)",
                    digest[:12],
                    row["holder"],
                    "its process is gone" if gone else "expired",
                )
            return res.rowcount == 1

    def _lease_row(self, digest: str) -> sa.Select[Any]:
        """The lease row of a digest with ``expires_in``: its seconds left by the database's clock."""
        left = (leases.c.expires_at - dbclock.now(self.dialect)).label("expires_in")
        return sa.select(leases, left).where(leases.c.digest == digest)

    def lease_of(self, digest: str) -> dict[str, Any] | None:
        """The lease row of a digest (holder, host, pid, expires_at as a Unix time of the database's
        clock), with ``expires_in``: the seconds it has left by that clock (negative: lapsed). Compare
        ``expires_in``, never ``expires_at`` with this host's time (see :mod:`tunecache.store.dbclock`)."""
        with self._read("lease") as conn:
            row = conn.execute(self._lease_row(digest)).mappings().first()
        return None if row is None else dict(row)

    def renew_lease(self, digest: str, holder: str, ttl: float) -> bool:
        """Extend ``holder``'s lease of a digest to ``ttl`` seconds from now by the database's clock;
        False when it holds it no more (taken over, or released by a put)."""
        with self._write("renew lease") as conn:
            res = conn.execute(
                sa.update(leases)
                .where(leases.c.digest == digest, leases.c.holder == holder)
                .values(expires_at=dbclock.now(self.dialect) + ttl)
            )
            return res.rowcount == 1

    def release_lease(self, digest: str, holder: str | None) -> None:
        """Release the lease of a digest held by ``holder``; None: whoever holds it (its result is
        stored, as after a put of a torch.compile entry, so no one need wait on it)."""
        q = sa.delete(leases).where(leases.c.digest == digest)
        with self._write("release lease") as conn:
            conn.execute(q if holder is None else q.where(leases.c.holder == holder))


def _after_fork_in_child() -> None:
    """A forked child must neither use nor close its parent's pooled connections.

    They are the parent's sockets (closing one ends the parent's session), so their pools are kept
    aside unreferenced by any engine and each engine gets an empty pool; a lock that a parent's
    thread held at the fork is replaced, as that thread does not exist in the child.
    """
    for s in list(_live_stores):
        s._lock = threading.Lock()
        _inherited_pools.append(s.engine.pool)
        with contextlib.suppress(Exception):
            s.engine.dispose(close=False)


forks.register(__name__, _after_fork_in_child)


def _close_at_end() -> None:
    """As the process ends, however it ends: close every writable SQLite store it opened, so that
    the last process to close one leaves every row in its main file (:mod:`tunecache.store.sqlitefile`).
    A process that leaves by ``os._exit`` (a multiprocessing child), or whose store a daemon thread
    still references, never closed its connections, and its rows stayed in the log."""
    for s in list(_live_stores):
        if s.dialect == "sqlite" and not s.readonly:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - never fail an exit
                log.debug("tunecache: closing %s at process end failed", s.masked_url, exc_info=True)


processend.at_end(__name__, _close_at_end, order=2)  # after the final flush, the last write


# Kept for callers that want a copy of a problem with other fields.
__all__ = ["ConfigResult", "Problem", "Store", "replace", "pick_winner", "STATUSES"]
