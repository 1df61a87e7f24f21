"""Least privilege on a shared PostgreSQL: the roles ``tunecache db grant`` makes.

A serving worker only reads (``TUNECACHE_MODE=readonly`` or ``offline``), so it logs in as a
*reader*, which may SELECT and nothing else: a worker that is compromised, or misconfigured into
readwrite mode, cannot change the winners (or the binaries) the rest of the fleet loads. Tuning jobs
log in as a *tuner*, which may also INSERT, UPDATE and DELETE rows. Neither may change the schema;
the tables' owner (who ran ``tunecache db upgrade``) runs ``db grant``. A store opened by a reader is
read-only (:meth:`tunecache.store.Store.select_only`), so it never even attempts a write.

Default privileges are granted too, so tables a later migration adds (created by the same owner)
are readable by the readers and writable by the tuners without running ``db grant`` again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from tunecache.errors import StoreError, TunecacheError, driver_message
from tunecache.store import Store

#: What each kind of role may do with the store's rows.
PRIVILEGES = {"reader": "SELECT", "tuner": "SELECT, INSERT, UPDATE, DELETE"}
_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def grant(
    store: Store, *, readers: Sequence[str] = (), tuners: Sequence[str] = (), create: bool = True
) -> list[dict[str, Any]]:
    """Create (unless ``create`` is False) and grant the given roles; returns what was done, per role.

    A role granted before gets exactly its kind's privileges on every table now (a tuner made a
    reader loses its writes).
    """
    if store.dialect != "postgresql":
        raise TunecacheError(
            f"db grant: roles are for a shared PostgreSQL store; {store.masked_url} is {store.dialect} "
            "(a SQLite store is protected by its file's permissions: mount it read-only on serving hosts)"
        )
    wanted = [(r, "reader") for r in readers] + [(r, "tuner") for r in tuners]
    for role, _ in wanted:
        if not _ROLE.fullmatch(role):
            raise TunecacheError(f"db grant: {role!r} is not a plain role name (lowercase letters, digits, _)")
    if len({r for r, _ in wanted}) != len(wanted):
        raise TunecacheError("db grant: a role is named twice")
    done = []
    try:
        with store.engine.begin() as conn:
            sql = conn.exec_driver_sql
            db, schema, owner = sql("SELECT current_database(), current_schema(), current_user").one()
            if sql("SELECT to_regclass('problems')").scalar() is None:
                raise TunecacheError(
                    f"db grant: {store.masked_url} has no tunecache tables: run `tunecache db upgrade` first"
                )
            for role, kind in wanted:
                exists = sql("SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": role}).first() is not None
                if not exists:
                    if not create:
                        raise TunecacheError(f"db grant: role {role} does not exist (and --no-create was given)")
                    sql(f"CREATE ROLE {_q(role)} LOGIN")
                r = _q(role)
                sql(f"GRANT CONNECT ON DATABASE {_q(db)} TO {r}")
                sql(f"GRANT USAGE ON SCHEMA {_q(schema)} TO {r}")
                sql(f"REVOKE ALL ON ALL TABLES IN SCHEMA {_q(schema)} FROM {r}")
                sql(f"GRANT {PRIVILEGES[kind]} ON ALL TABLES IN SCHEMA {_q(schema)} TO {r}")
                defaults = f"ALTER DEFAULT PRIVILEGES FOR ROLE {_q(owner)} IN SCHEMA {_q(schema)}"
                sql(f"{defaults} REVOKE ALL ON TABLES FROM {r}")
                sql(f"{defaults} GRANT {PRIVILEGES[kind]} ON TABLES TO {r}")
                can_create = sql(
                    "SELECT has_schema_privilege(%(r)s, %(s)s, 'CREATE')", {"r": role, "s": schema}
                ).scalar()
                done.append(
                    {
                        "role": role,
                        "kind": kind,
                        "created": not exists,
                        "privileges": PRIVILEGES[kind],
                        # PostgreSQL before 15 lets every role CREATE in the public schema.
                        "warning": f"{role} may still CREATE tables in schema {schema}: REVOKE CREATE ON SCHEMA "
                        f"{schema} FROM PUBLIC"
                        if can_create
                        else None,
                    }
                )
    except SQLAlchemyError as e:
        raise StoreError(f"db grant failed on {store.masked_url}: {driver_message(e)}") from None
    return done


__all__ = ["PRIVILEGES", "grant"]
