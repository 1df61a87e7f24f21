"""Store rows of torch.compile's remote caches (:mod:`tunecache.inductor`): Inductor's entries.

A mixin of :class:`tunecache.store.store.Store`, which inherits it: the ``inductor_entries`` table
is read and written apart from the tuning results (its own keys, one row per identity and signer
with the last writer winning within a signer's, :mod:`tunecache.store.signers`; its own gc), so its
queries live here, through the store's own connections and transactions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.problem.model import INDUCTOR_KINDS, INDUCTOR_TARGET_FIELDS, InductorEntry, utcnow
from tunecache.problem.target import hostname
from tunecache.store.filters import bound_to_no_driver, not_this_driver, this_driver
from tunecache.store.schema import inductor_entries
from tunecache.store.signers import not_larger, trusted_slots
from tunecache.trust import signing


class InductorRows:
    """The Inductor-entry queries of :class:`~tunecache.store.store.Store` (get, put, list, export, delete)."""

    if TYPE_CHECKING:  # provided by Store

        def _read(self, what: str) -> contextlib.AbstractContextManager[Connection]: ...

        def _write(self, what: str) -> contextlib.AbstractContextManager[Connection]: ...

        def _inserted(self, conn: Connection, table: sa.Table, values: dict[str, Any]) -> bool: ...

    def _inductor_entry(self, r: Any) -> InductorEntry:
        target = {k: r[k] for k in INDUCTOR_TARGET_FIELDS}
        return InductorEntry(
            r["kind"], r["key"], r["target_digest"], bytes(r["value"]), target, r["signature"], r["sha256"]
        )

    def get_inductor(
        self, kind: str, key: str, target_digest: str, slots: Collection[str] | None = None
    ) -> InductorEntry | None:
        """The newest of :meth:`get_inductor_rows`, or None."""
        found = self.get_inductor_rows(kind, key, target_digest, slots)
        return found[0] if found else None

    def get_inductor_rows(
        self, kind: str, key: str, target_digest: str, slots: Collection[str] | None = None
    ) -> list[InductorEntry]:
        """The entries of one Inductor cache under ``key`` for one target, one per signer of ``slots``
        (None: every signer; :mod:`tunecache.store.signers`), newest first, unverified (see
        :mod:`tunecache.inductor.entries`). Each is the lookup's: its kind, key and target are the ones
        asked for, which its signature must then cover, never what a row says of itself; and a row
        is found only under the key it names (its key hash alone is a column anyone can write)."""
        e = inductor_entries.c
        key_hash = InductorEntry(kind, key, target_digest, b"", {}).key_hash
        q = sa.select(inductor_entries).where(
            e.kind == kind,
            e.key_hash == key_hash,
            e.target_digest == target_digest,
            e.key == key,
            *trusted_slots(e.signer, slots),
            not_larger(inductor_entries, e.value),
        )
        with self._read("inductor entry") as conn:
            rows = conn.execute(q.order_by(e.created_at.desc(), e.signer)).mappings().all()
        return [
            InductorEntry(
                kind,
                key,
                target_digest,
                bytes(r["value"]),
                {k: r[k] for k in INDUCTOR_TARGET_FIELDS},
                r["signature"],
                r["sha256"],
            )  # fmt: skip
            for r in rows
        ]

    def inductor_signatures_elsewhere(
        self, kind: str, key: str, target_digest: str, slots: Collection[str]
    ) -> list[str | None]:
        """The signature of one entry under ``key`` that no signer of ``slots`` stored, if any (a
        reader that trusts other keys says once why it is not served it, without reading its bytes)."""
        e = inductor_entries.c
        key_hash = InductorEntry(kind, key, target_digest, b"", {}).key_hash
        q = sa.select(e.signature).where(
            e.kind == kind, e.key_hash == key_hash, e.target_digest == target_digest, e.signer.not_in(sorted(slots))
        )
        with self._read("inductor entry") as conn:
            return list(conn.execute(q.limit(1)).scalars())

    def touch_inductor(self, uses: Mapping[tuple[str, str, str], int]) -> None:
        """Record uses of entries, ``{(kind, key_hash, target_digest): hits}``, in one transaction
        (their used_at and hit counts: gc keeps what is used)."""
        e = inductor_entries.c
        now = utcnow()
        with self._write("record inductor hits") as conn:
            for (kind, key_hash, target), n in uses.items():
                conn.execute(
                    sa.update(inductor_entries)
                    .where(e.kind == kind, e.key_hash == key_hash, e.target_digest == target)
                    .values(used_at=now, hit_count=e.hit_count + n)
                )

    def put_inductor(self, entry: InductorEntry) -> None:
        """Store ``entry`` (signed by the caller where it is made) under its kind, key and target, in
        its signer's slot (:mod:`tunecache.store.signers`).

        Inductor's remote caches are last-writer-wins, as with Redis, within one signer: the entry
        replaces what its signer's slot held (a stale entry, or one planted there), and no other
        signer's. A host that signs with no key, or with another, never evicts the fleet's entry,
        nor does a row planted first keep the fleet's out."""
        with self._write("store inductor entry") as conn:
            self._put_entry(conn, entry)

    def add_inductor(self, conn: Connection, entries: Sequence[InductorEntry], *, replace: bool = False) -> int:
        """Insert entries inside the caller's transaction (an import's), each in its signer's slot; an
        entry already stored there is kept, unless ``replace``. Returns how many were written."""
        n = 0
        for en in entries:
            if replace:
                self._put_entry(conn, en)
                n += 1
            else:
                n += self._inserted(conn, inductor_entries, self._inductor_row(en))
        return n

    def _put_entry(self, conn: Connection, en: InductorEntry) -> None:
        """Replace what ``en``'s signer's slot holds for its identity with ``en``."""
        e = inductor_entries.c
        row = self._inductor_row(en)
        same = [e.kind == en.kind, e.key_hash == en.key_hash, e.target_digest == en.target_digest]
        for _ in range(3):
            conn.execute(sa.delete(inductor_entries).where(*same, e.signer == row["signer"]))
            if self._inserted(conn, inductor_entries, row):
                return
            # The same signer's put landed between the delete and the insert (committed now): again.

    def _inductor_row(self, en: InductorEntry) -> dict[str, Any]:
        now = utcnow()
        return {
            "kind": en.kind,
            "key_hash": en.key_hash,
            "target_digest": en.target_digest,
            "signer": signing.row_slot(en.signature),
            "key": en.key,
            "sha256": en.sha256,
            "size": en.size,
            "value": en.value,
            **{k: str(en.target.get(k, ""))[: inductor_entries.c[k].type.length] for k in INDUCTOR_TARGET_FIELDS},
            "host": hostname(),
            "created_at": now,
            "used_at": now,
            "hit_count": 0,
            "signature": en.signature,
        }

    def _inductor_where(
        self,
        *,
        kinds: Sequence[str] | None = None,
        arch: str | None = None,
        device: str | None = None,
        driver: str | None = None,
        not_driver: str | tuple[str, str] | None = None,
        no_driver: bool = False,
        target_digest: str | None = None,
        unused_since: Any = None,
    ) -> list[Any]:
        e = inductor_entries.c
        w: list[Any] = []
        if kinds:
            w.append(e.kind.in_(list(kinds)))
        if arch:
            w.append(e.arch == arch)
        if device:
            w.append(e.device_name == device)
        if driver:
            w.append(this_driver(e.driver_version, e.driver_release, driver))
        if not_driver is not None:
            w.append(not_this_driver(e.driver_version, e.driver_release, not_driver))
        if no_driver:
            w.append(bound_to_no_driver(e.driver_version))
        if target_digest:
            w.append(e.target_digest == target_digest)
        if unused_since is not None:
            w.append(e.used_at < unused_since)
        return w

    def inductor_counts(self) -> dict[str, dict[str, int]]:
        """Count, bytes and hits of the stored Inductor entries, by kind (every kind listed)."""
        e = inductor_entries.c
        q = sa.select(
            e.kind,
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(e.size), 0),
            sa.func.coalesce(sa.func.sum(e.hit_count), 0),
        )
        out = {k: {"entries": 0, "bytes": 0, "hits": 0} for k in INDUCTOR_KINDS}
        with self._read("inductor entries") as conn:
            for kind, n, size, hits in conn.execute(q.group_by(e.kind)):
                out[kind] = {"entries": int(n), "bytes": int(size), "hits": int(hits)}
        return out

    def list_inductor(self, limit: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """The matching entries without their bytes, most recently used first (``tunecache ls --inductor``)."""
        e = inductor_entries.c
        cols = (e.kind, e.key, e.target_digest, *(e[k] for k in INDUCTOR_TARGET_FIELDS), e.size, e.hit_count)
        q = sa.select(*cols, e.used_at, e.host, (e.signature.is_not(None)).label("signed"))
        q = q.where(*self._inductor_where(**filters)).order_by(e.used_at.desc(), e.kind, e.key)
        if limit:
            q = q.limit(limit)
        with self._read("inductor entries") as conn:
            return [{str(k): v for k, v in r.items()} for r in conn.execute(q).mappings()]

    def iter_inductor(self, batch: int = 200, **filters: Any) -> Iterator[InductorEntry]:
        """Every matching entry, streamed in (kind, key, target) order (for export)."""
        e = inductor_entries.c
        where = self._inductor_where(**filters)
        last: tuple[str, ...] = ("", "", "", "")
        order = (e.kind, e.key_hash, e.target_digest, e.signer)
        while True:
            with self._read("export inductor entries") as conn:
                q = sa.select(inductor_entries).where(*where, sa.tuple_(*order) > sa.tuple_(*last))
                rows = conn.execute(q.order_by(*order).limit(batch)).mappings().all()
            if not rows:
                return
            yield from (self._inductor_entry(r) for r in rows)
            last = tuple(rows[-1][c.name] for c in order)

    def delete_inductor(self, *, dry_run: bool = False, **filters: Any) -> list[dict[str, Any]]:
        """Delete matching Inductor entries (invalidate, gc); return (kind, key, target, size) of each
        one deleted (or that would be). Refuses no filter at all, as :meth:`delete` does."""
        e = inductor_entries.c
        where = self._inductor_where(**filters)
        if not where:
            raise ValueError("refusing to delete every inductor entry without a filter")
        cols = (e.kind, e.key, e.target_digest, e.driver_version, e.driver_release, e.size)
        q = sa.select(*cols).where(*where).order_by(e.kind, e.key)
        if dry_run:
            with self._read("delete inductor entries") as conn:
                return [dict(r) for r in conn.execute(q).mappings()]
        with self._write("delete inductor entries") as conn:
            gone = [dict(r) for r in conn.execute(q).mappings()]
            conn.execute(sa.delete(inductor_entries).where(*where))
        return gone

    def delete_inductor_key(self, kind: str, prefix: str, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Delete the entries of cache ``kind`` whose key starts with ``prefix``, every signer's row of
        each (``invalidate --kind --key``); return (kind, key, target_digest, signer) of each one
        deleted (or that would be)."""
        e = inductor_entries.c
        where = (e.kind == kind, sa.func.substr(e.key, 1, len(prefix)) == prefix)
        q = sa.select(e.kind, e.key, e.target_digest, e.signer).where(*where).order_by(e.key, e.target_digest, e.signer)
        with self._write("delete inductor entries") if not dry_run else self._read("inductor entries") as conn:
            found = [{str(k): v for k, v in r.items()} for r in conn.execute(q).mappings()]
            if not dry_run:
                conn.execute(sa.delete(inductor_entries).where(*where))
        return found
