"""Least privilege on a shared PostgreSQL: the roles ``tunecache db grant`` makes.

A serving worker only reads (``TUNECACHE_MODE=readonly`` or ``offline``), so it logs in as a
*reader*, which may SELECT and nothing else: a worker that is compromised, or misconfigured into
readwrite mode, cannot change the winners (or the binaries) the rest of the fleet loads. Tuning jobs
log in as a *tuner*, which may also INSERT, UPDATE and DELETE rows. Neither may change the schema;
the tables' owner (who ran ``tunecache db upgrade``) runs ``db grant``. A store opened by a reader is
read-only (:meth:`tunecache.store.store.Store.select_only`), so it never even attempts a write.

Default privileges are granted too, so tables a later migration adds (created by the same owner)
are readable by the readers and writable by the tuners without running ``db grant`` again.

Granting SELECT does not make a role read-only: it may still write through a group it inherits
from (a writers role, ``pg_write_all_data``, the owner), a grant to PUBLIC, or by being a superuser.
So after granting, a reader's *effective* privileges are read back, and each way it can still write
is named in a warning with the statement that removes it. The tables' owner and the role running
the grant are never made a reader or a tuner: REVOKE ALL would strip their own rights.

MySQL: not managed here (the error says what to grant by hand); a SELECT-only MySQL login is not
detected as read-only either, so serving workers there need ``TUNECACHE_MODE=readonly``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from tunecache.errors import RoleError, StoreError, TunecacheError, driver_message
from tunecache.store.store import Store

#: What each kind of role may do with the store's rows.
PRIVILEGES = {"reader": "SELECT", "tuner": "SELECT, INSERT, UPDATE, DELETE"}
#: Privileges that change rows: a reader must have none of them, from any source.
WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: The relations ``GRANT ... ON ALL TABLES IN SCHEMA`` covers, in the schema %(s)s.
_TABLES = (
    "c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(s)s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
)
_Sql = Callable[..., Any]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _refuse(store: Store) -> None:
    if store.dialect == "mysql":
        raise TunecacheError(
            f"db grant manages PostgreSQL roles only; {store.masked_url} is MySQL: create the users yourself "
            "(serving: GRANT SELECT ON <db>.* TO 'serving'@'%'; tuning: GRANT SELECT, INSERT, UPDATE, DELETE) and "
            "run serving workers with TUNECACHE_MODE=readonly (a SELECT-only MySQL login is not detected)"
        )
    raise TunecacheError(
        f"db grant: roles are for a shared PostgreSQL store; {store.masked_url} is {store.dialect} "
        "(a SQLite store is protected by its file's permissions: mount it read-only on serving hosts)"
    )


def grant(
    store: Store, *, readers: Sequence[str] = (), tuners: Sequence[str] = (), create: bool = True
) -> list[dict[str, Any]]:
    """Create (unless ``create`` is False) and grant the given roles; returns what was done, per role,
    with ``read_only`` (whether a reader really cannot write now) and ``warnings`` (one line per way
    it still can, or per other hole found).

    A role granted before gets exactly its kind's privileges on every table now (a tuner made a
    reader loses its own writes; writes it inherits are reported, not revoked: they belong to the
    group). Raises :class:`RoleError`, having changed nothing, for the tables' owner or the role
    running the grant.
    """
    if store.dialect != "postgresql":
        _refuse(store)
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
            db, schema, me = sql("SELECT current_database(), current_schema(), current_user").one()
            if sql("SELECT to_regclass('problems')").scalar() is None:
                raise TunecacheError(
                    f"db grant: {store.masked_url} has no tunecache tables: run `tunecache db upgrade` first"
                )
            owners = set(
                sql(
                    f"SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c WHERE {_TABLES}", {"s": schema}
                ).scalars()
            )
            for role, kind in wanted:
                _check_not_owner(role, kind, me, owners)
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
                defaults = f"ALTER DEFAULT PRIVILEGES FOR ROLE {_q(me)} IN SCHEMA {_q(schema)}"
                sql(f"{defaults} REVOKE ALL ON TABLES FROM {r}")
                sql(f"{defaults} GRANT {PRIVILEGES[kind]} ON TABLES TO {r}")
                done.append({"role": role, "kind": kind, "created": not exists, "privileges": PRIVILEGES[kind]})
            # Read back only once every role is granted: one named here may inherit from another.
            for d in done:
                role = d["role"]
                writes = _writes(sql, role, schema) if d["kind"] == "reader" else []
                d["read_only"] = d["kind"] == "reader" and not writes
                if sql("SELECT rolsuper FROM pg_roles WHERE rolname = %(r)s", {"r": role}).scalar():
                    d["warnings"] = [
                        f"{role} is a superuser, which bypasses every privilege: it can write rows and change "
                        f"the schema whatever db grant grants (ALTER ROLE {_q(role)} NOSUPERUSER)"
                    ]
                    continue
                d["warnings"] = _why_writes(sql, role, schema, writes) if writes else []
                can_create = sql(
                    "SELECT has_schema_privilege(%(r)s, %(s)s, 'CREATE')", {"r": role, "s": schema}
                ).scalar()
                if can_create:  # PostgreSQL before 15 lets every role CREATE in the public schema.
                    d["warnings"].append(
                        f"{role} may still CREATE tables in schema {schema}: REVOKE CREATE ON SCHEMA "
                        f"{schema} FROM PUBLIC"
                    )
    except SQLAlchemyError as e:
        raise StoreError(f"db grant failed on {store.masked_url}: {driver_message(e)}") from None
    return done


def _check_not_owner(role: str, kind: str, me: str, owners: set[str]) -> None:
    """REVOKE ALL on the owner takes its own rights on its tables (and on the tables it creates
    later), and the role running the grant would lock itself out: refuse both, before any change."""
    if role != me and role not in owners:
        return
    what = "owns the store's tables" if role in owners else "is the role running db grant"
    raise RoleError(
        f"db grant: {role} {what}: making it a {kind} would revoke its own rights on them; grant "
        "--reader/--tuner to roles of their own (e.g. --reader serving --tuner tuning). Nothing was changed."
    )


def _writes(sql: _Sql, role: str, schema: str) -> list[tuple[str, str]]:
    """(table, privilege) for every row write ``role`` can still make, from whatever source."""
    q = (
        "SELECT c.relname, p.priv FROM pg_class c CROSS JOIN unnest(%(w)s::text[]) AS p(priv) "
        f"WHERE {_TABLES} AND has_table_privilege(%(r)s, c.oid, p.priv) ORDER BY 1"
    )
    return [tuple(x) for x in sql(q, {"r": role, "s": schema, "w": list(WRITES)})]


def _what(pairs: Sequence[tuple[str, str]]) -> str:
    """``INSERT, DELETE on configs, problems`` or ``... on 9 tables``."""
    privs = [p for p in WRITES if any(x == p for _, x in pairs)]
    tables = sorted({t for t, _ in pairs})
    on = ", ".join(tables) if len(tables) <= 3 else f"{len(tables)} tables"
    return f"{', '.join(privs)} on {on}"


def _why_writes(sql: _Sql, role: str, schema: str, writes: list[tuple[str, str]]) -> list[str]:
    """One line per cause of ``writes`` (of a role that is not a superuser): each role it inherits
    writes from (a group granted them, ``pg_write_all_data``, the tables' owner), PUBLIC; each with
    the statement that removes it."""
    head = f"{role} is a reader but can still write ({_what(writes)})"
    args = {"r": role, "s": schema, "w": list(WRITES)}
    # Roles whose own grants (not theirs inherited in turn) give the writes, so each source is one line.
    sources: dict[str, list[tuple[str, str]]] = {}
    for g, t, p in sql(
        "SELECT g.rolname, c.relname, p.priv FROM pg_roles r "
        "JOIN pg_roles g ON g.oid <> r.oid AND pg_has_role(r.oid, g.oid, 'USAGE') "
        "CROSS JOIN pg_class c CROSS JOIN unnest(%(w)s::text[]) AS p(priv) "
        f"WHERE r.rolname = %(r)s AND {_TABLES} AND has_table_privilege(g.oid, c.oid, p.priv) "
        "AND (c.relowner = g.oid OR g.rolname = 'pg_write_all_data' OR EXISTS "
        "(SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = g.oid AND a.privilege_type = p.priv)) "
        "ORDER BY 1, 2",
        args,
    ):
        sources.setdefault(g, []).append((t, p))
    lines = []
    for g, pairs in sources.items():
        vias = list(
            sql(
                "SELECT d.rolname FROM pg_auth_members m JOIN pg_roles d ON d.oid = m.roleid "
                "WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = %(r)s) "
                "AND pg_has_role(d.oid, %(g)s, 'USAGE') ORDER BY 1",
                {"r": role, "g": g},
            ).scalars()
        )
        if g in vias:
            why = f"it is a member of {g}, which may {_what(pairs)} (REVOKE {_q(g)} FROM {_q(role)})"
        else:
            fix = "; ".join(f"REVOKE {_q(v)} FROM {_q(role)}" for v in vias)
            why = f"it inherits {g}'s {_what(pairs)} through its membership of {', '.join(vias)} ({fix})"
        lines.append(f"{head}: {why}")
    public = [
        tuple(x)
        for x in sql(
            "SELECT c.relname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
            f"WHERE {_TABLES} AND a.grantee = 0 AND a.privilege_type = ANY(%(w)s::text[]) ORDER BY 1",
            args,
        )
    ]
    if public:
        tables = ", ".join(sorted({t for t, _ in public}))
        privs = ", ".join(p for p in WRITES if any(x == p for _, x in public))
        lines.append(f"{head}: PUBLIC (every role) may {_what(public)} (REVOKE {privs} ON {tables} FROM PUBLIC)")
    if not lines:
        lines.append(f"{head}: through a grant db grant could not trace (look at \\dp and \\du in psql)")
    return lines


__all__ = ["PRIVILEGES", "WRITES", "grant"]
