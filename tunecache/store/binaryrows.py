"""Store rows of Triton's compiled kernels (:mod:`tunecache.binaries`): the ``binaries`` table.

A mixin of :class:`tunecache.store.store.Store`, which inherits it: binaries are keyed by Triton's
cache key, not by problem, and are dropped by their own gc (no stored winner's launch spec uses
them), so their queries live apart from the tuning results, through the store's own transactions.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.problem.model import COMPANION_CONFIG, SPEC_BINARY_FIELD, Binary, binary_row, binary_sha256, utcnow
from tunecache.problem.target import hostname
from tunecache.store.schema import binaries, launch_specs, problems
from tunecache.store.signers import not_larger, trusted_slots
from tunecache.trust import signing, trust


class BinaryRows:
    """The compiled-binary queries of :class:`~tunecache.store.store.Store` (heads, get, put, usage, gc)."""

    if TYPE_CHECKING:  # provided by Store

        def _read(self, what: str) -> contextlib.AbstractContextManager[Connection]: ...

        def _write(self, what: str) -> contextlib.AbstractContextManager[Connection]: ...

        def _inserted(self, conn: Connection, table: sa.Table, values: dict[str, Any]) -> bool: ...

    def binary_heads(
        self, triton_keys: Sequence[str], slots: Collection[str] | None = None
    ) -> dict[str, tuple[str, str, str]]:
        """(name, ext, sha256) of a stored binary of each of ``triton_keys`` by a signer of ``slots``
        (None: any; the newest), without their bytes: a restart reads the bytes only of binaries its
        Triton cache lacks."""
        c = binaries.c
        out: dict[str, tuple[str, str, str]] = {}
        keys = sorted(set(triton_keys))
        with self._read("binaries") as conn:
            for i in range(0, len(keys), 500):
                q = sa.select(c.triton_key, c.name, c.ext, c.sha256).where(
                    c.triton_key.in_(keys[i : i + 500]), *trusted_slots(c.signer, slots)
                )
                for k, n, e, h in conn.execute(q.order_by(c.triton_key, c.created_at.desc())):
                    out.setdefault(k, (n, e, h))
        return out

    def binary_signatures(self, triton_keys: Sequence[str], slot: str) -> dict[str, tuple[Any, ...]]:
        """(sha256, name, ext, triton_version, signature) of the binaries of ``triton_keys`` in signer
        ``slot``, without their bytes: what an uploader checks its own rows by (see
        :func:`tunecache.trust.trust.signed_heads`)."""
        c = binaries.c
        cols = (c.triton_key, c.sha256, c.name, c.ext, c.triton_version, c.signature)
        keys = sorted(set(triton_keys))
        out: dict[str, tuple[Any, ...]] = {}
        with self._read("binaries") as conn:
            for i in range(0, len(keys), 500):
                q = sa.select(*cols).where(c.triton_key.in_(keys[i : i + 500]), c.signer == slot)
                out.update((r[0], tuple(r[1:])) for r in conn.execute(q))
        return out

    def binaries_elsewhere(self, triton_keys: Sequence[str], slots: Collection[str]) -> dict[str, str | None]:
        """The signature of one stored binary of each of ``triton_keys`` that no signer of ``slots``
        stored (a reader that trusts other keys says once why it is not placed, reading no bytes)."""
        c = binaries.c
        keys = sorted(set(triton_keys))
        out: dict[str, str | None] = {}
        with self._read("binaries") as conn:
            for i in range(0, len(keys), 500):
                q = sa.select(c.triton_key, c.signature)
                q = q.where(c.triton_key.in_(keys[i : i + 500]), c.signer.not_in(sorted(slots)))
                for k, sig in conn.execute(q):
                    out.setdefault(k, sig)
        return out

    def get_binaries(self, triton_keys: Sequence[str], slots: Collection[str] | None = None) -> list[Binary]:
        """The stored binaries among ``triton_keys`` by the signers of ``slots`` (None: every signer),
        in key order, the newest of each key first, none larger than a binary can be (unverified: see
        tunecache.binaries.binaries)."""
        c = binaries.c
        cols = (c.triton_key, c.sha256, c.name, c.ext, c.triton_version, c.metadata, c.binary, c.signature)
        keys = sorted(set(triton_keys))
        out: list[Binary] = []
        with self._read("binaries") as conn:
            for i in range(0, len(keys), 100):
                q = sa.select(*cols).where(
                    c.triton_key.in_(keys[i : i + 100]),
                    *trusted_slots(c.signer, slots),
                    not_larger(binaries, c.metadata, c.binary),
                )
                q = q.order_by(c.triton_key, c.created_at.desc(), c.signer)
                out += [Binary(k, h, n, e, v, bytes(m), bytes(b), sig) for k, h, n, e, v, m, b, sig in conn.execute(q)]
        return out

    def put_binaries(
        self, kernel: str, source_hash: str, bins: Sequence[Binary], max_kernel_bytes: int | None = None
    ) -> int:
        """Store binaries of one kernel source that this process made, signed with its key, in its
        signer's slot (:meth:`add_binaries`); returns how many were new. With ``max_kernel_bytes``, a
        binary that would take the bytes this signer stored for the kernel past it is left out
        (checked in the writing transaction, by the database's own measure of the rows: concurrent
        uploaders may pass it by a binary each; another signer's rows, planted or not, count for it)."""
        if not bins:
            return 0
        bins = trust.sign_binaries(list(bins), self)  # signed where made
        c = binaries.c
        with self._write("store binaries") as conn:
            used = 0
            if max_kernel_bytes is not None:
                size = sa.func.coalesce(sa.func.sum(sa.func.length(c.metadata) + sa.func.length(c.binary)), 0)
                mine = (c.source_hash == source_hash, c.signer == signing.row_slot(bins[0].signature))
                used = int(conn.execute(sa.select(size).where(*mine)).scalar_one())
            rows = []
            for b in bins:
                if max_kernel_bytes is not None and used + b.size > max_kernel_bytes:
                    continue
                used += b.size
                rows.append(binary_row(kernel, source_hash, b))
            return self.add_binaries(conn, rows)

    def add_binaries(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> int:
        """Insert binaries rows (without host and created_at, stamped here) inside the caller's
        transaction, each in its signer's slot (:mod:`tunecache.store.signers`): a binary that signer
        stored already is kept (the first build of a key stays, as Triton's own cache keeps it), and
        anything else in its slot (a row planted there, or altered, that its key does not verify) is
        replaced. Returns how many were new."""
        now, host = utcnow(), hostname()
        c = binaries.c
        cols = (c.triton_key, c.sha256, c.name, c.ext, c.triton_version, c.metadata, c.binary, c.signature)
        n = 0
        for r in rows:
            slot = signing.row_slot(r.get("signature"))
            mine = (c.triton_key == r["triton_key"], c.signer == slot)
            held = conn.execute(sa.select(*cols).where(*mine)).first()
            if held is not None:
                b = Binary(*held[:5], bytes(held[5]), bytes(held[6]), held[7])
                content = binary_sha256(b.triton_key, b.name, b.ext, b.triton_version, b.metadata, b.binary)
                if (not slot or content == b.sha256) and trust.own_row(slot, b.signature, trust.binary_message(b)):
                    continue
                conn.execute(sa.delete(binaries).where(*mine))
            n += self._inserted(conn, binaries, {**r, "signer": slot, "host": host, "created_at": now})
        return n

    def binary_usage(self) -> dict[str, tuple[int, int]]:
        """(count, bytes) of the stored binaries, by kernel name."""
        c = binaries.c
        q = sa.select(c.kernel, sa.func.count(), sa.func.coalesce(sa.func.sum(c.size), 0)).group_by(c.kernel)
        with self._read("binaries") as conn:
            return {k: (int(n), int(b)) for k, n, b in conn.execute(q)}

    def _unreferenced_binaries(self) -> sa.ColumnElement[bool]:
        """No launch spec that a stored winner (or a companion of a stored kernel and target) uses."""
        s, p = launch_specs.c, problems.c
        same = sa.and_(p.source_hash == s.source_hash, p.target_digest == s.target_digest)
        used = sa.exists().where(
            s.kernel_hash == binaries.c.triton_key,
            sa.or_(
                sa.exists().where(same, p.winner_config_hash == s.config_hash),
                sa.and_(s.config_hash == COMPANION_CONFIG, sa.exists().where(same)),
            ),
        )
        return ~used

    def gc_binaries(self, *, dry_run: bool = False) -> list[tuple[str, str, int]]:
        """Drop the binaries no winner references; returns (triton_key, kernel, size) of each one
        dropped (or that would be)."""
        c = binaries.c
        q = sa.select(c.triton_key, c.kernel, c.size).where(self._unreferenced_binaries()).order_by(c.triton_key)
        if dry_run:
            with self._read("gc binaries") as conn:
                return [(k, n, int(z)) for k, n, z in conn.execute(q)]
        with self._write("gc binaries") as conn:
            gone = [(k, n, int(z)) for k, n, z in conn.execute(q)]
            keys = [g[0] for g in gone]
            for i in range(0, len(keys), 500):
                conn.execute(sa.delete(binaries).where(c.triton_key.in_(keys[i : i + 500])))
        return gone

    def gc_launch_specs(self, *, older_than: dt.datetime, dry_run: bool = False) -> list[tuple[str, str, str]]:
        """Drop the superseded launch specs: where specs of several binaries of one specialisation are
        stored (two texts of a kernel, each healed, :func:`tunecache.binaries.preload.for_binary`),
        every one but the newest recorded before ``older_than``. A host still on a dropped text
        compiles that kernel once and heals it back. Run before :meth:`gc_binaries`, which then drops
        their binaries. Returns (source_hash, target_digest, spec_hash) of each one dropped (or that
        would be)."""
        s = launch_specs.c
        cols = (s.source_hash, s.target_digest, s.spec_hash, s.triton_version, s.spec_json, s.created_at, s.signer)
        marked = sa.select(s.source_hash, s.target_digest).where(s.spec_json.like(f'%"{SPEC_BINARY_FIELD}"%'))
        with self._read("launch specs") as conn:
            pairs = {(a, b) for a, b in conn.execute(marked.distinct())}
            rows = [
                r
                for p in sorted(pairs)
                for r in conn.execute(sa.select(*cols).where(s.source_hash == p[0], s.target_digest == p[1]))
            ]
        groups: dict[tuple[str, ...], list[Any]] = {}
        for r in rows:
            try:
                data = json.loads(r.spec_json)
                data.pop(SPEC_BINARY_FIELD, None)
                same = json.dumps(data, sort_keys=True)
            except (ValueError, AttributeError):
                continue
            # Per signer: a newer spec signed by none or by another key never supersedes a signed one
            # (a dev box's heal on the fleet's store would else get the fleet's spec dropped).
            groups.setdefault((r.source_hash, r.target_digest, r.triton_version, same, r.signer), []).append(r)
        gone = []
        for group in groups.values():
            newest = max(group, key=lambda r: r.created_at)
            gone += [
                (r.source_hash, r.target_digest, r.spec_hash, r.signer)
                for r in group
                if r is not newest and r.created_at < older_than
            ]
        if not dry_run and gone:
            with self._write("gc launch specs") as conn:
                for a, b, h, slot in gone:
                    one = (s.source_hash == a, s.target_digest == b, s.spec_hash == h, s.signer == slot)
                    conn.execute(sa.delete(launch_specs).where(*one))
        return sorted(g[:3] for g in gone)

    def delete_binary_key(self, prefix: str, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Delete the binaries (and host modules) whose Triton key starts with ``prefix``, every
        signer's row (``invalidate --kind binary --key``); return (key, kernel, signer) of each."""
        c = binaries.c
        where = sa.func.substr(c.triton_key, 1, len(prefix)) == prefix
        q = sa.select(c.triton_key.label("key"), c.kernel, c.signer).where(where).order_by(c.triton_key, c.signer)
        with self._write("delete binaries") if not dry_run else self._read("binaries") as conn:
            found = [{str(k): v for k, v in r.items()} for r in conn.execute(q).mappings()]
            if not dry_run:
                conn.execute(sa.delete(binaries).where(where))
        return found

    def delete_spec_key(self, prefix: str, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Delete the launch specs whose spec hash starts with ``prefix``, every signer's row
        (``invalidate --kind launch_spec --key``); return (key, kernel, target_digest, signer) of each."""
        s = launch_specs.c
        where = sa.func.substr(s.spec_hash, 1, len(prefix)) == prefix
        cols = (s.spec_hash.label("key"), s.kernel, s.target_digest, s.signer)
        q = sa.select(*cols).where(where).order_by(s.spec_hash, s.source_hash, s.target_digest, s.signer)
        with self._write("delete launch specs") if not dry_run else self._read("launch specs") as conn:
            found = [{str(k): v for k, v in r.items()} for r in conn.execute(q).mappings()]
            if not dry_run:
                conn.execute(sa.delete(launch_specs).where(where))
        return found
