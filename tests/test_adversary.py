"""An adversarial store writer (issue 43, items 2, 3 and 6), on SQLite and PostgreSQL.

One fixture plays a process that can write the store (raw SQL on its own connection) and holds no
key the fleet trusts (it has a key of its own). It attacks every kind of row that is code: the
entries of each torch.compile cache (FX graph, AOTAutograd, autotune, bundled autotune, Triton
kernel, and a host module filed as a Triton kernel entry under the host target), kernel binaries
and host modules (table ``binaries``), and launch specs:

- copy: a fleet-signed row copied under another key, kind or target (where the row has one);
- replay: an older fleet-signed row of the same key put back after the fleet replaced it;
- plant first: a row signed by the writer's own key, one with a junk signature, one unsigned, each
  in its own signer's slot and forged into the fleet's, before the fleet stores that key;
- alter: each column of a fleet row changed, one at a time (:data:`COVERAGE` says, column by
  column, whether it is covered by the signature or cannot change what runs);
- oversized: a payload past the largest row of code a store reads, in the fleet's slot.

After each, a serving host (trusting only the fleet's key, ``TUNECACHE_TRUST_STORE=no``) runs only
a payload the fleet made for that very identity, or nothing (then it compiles); for a column that
cannot change what runs it is served the fleet's row unchanged; every look at the store ends within
a time bound; and the fleet's next put of that identity is what the host is served afterwards.

Replay is a residual risk, decided and documented (docs/reliability.md, "Issue 43"): the replayed
row is served (it is what the fleet's key signed for that very identity), until the fleet's next
put of it or the key's retirement from ``TUNECACHE_TRUSTED_KEYS``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from realcli import tc
from sqlalchemy.pool import NullPool

from tunecache import settings
from tunecache.binaries import binaries, hostmodules, preload
from tunecache.inductor.entries import InductorStore
from tunecache.problem.model import INDUCTOR_TARGET_FIELDS, Binary, LaunchSpec, binary_sha256
from tunecache.process import counters
from tunecache.store import schema
from tunecache.store.opening import open_store
from tunecache.trust import signing, trust
from tunecache.tuner.kernelstore import KernelStore

ROOT = Path(__file__).parent.parent
SECONDS = 10.0  # the bound on any one look at the store, or put
TARGETS = [hashlib.sha256(f"target-{i}".encode()).hexdigest() for i in range(2)]
DESC = {f: f"t-{f}" for f in INDUCTOR_TARGET_FIELDS}
SOURCES = [hashlib.sha256(f"source-{i}".encode()).hexdigest() for i in range(2)]
KEYS = ["a" * 64, "e" * 64]  # a Triton key is 64 hex digits (a torch.compile key may be any text)
LIMIT = 64 << 10  # the largest row of code read, in these tests (tunecache.store.signers)

# ---- which column of which table of code is what --------------------------------------------------

#: Every column of every table that holds code: "signed" (covered by the row's signature: changed,
#: the row is not served), "identity" (where the row is filed: changed, it is not found under the
#: key asked for, or its signature, which covers that identity, fails), "slot" (the signer whose row
#: it is: changed, it is read only where that signer is trusted, and must still verify), or "inert"
#: (cannot change what runs: the host is served the row unchanged). docs/reliability.md holds this
#: table, with why (checked below).
COVERAGE: dict[str, dict[str, str]] = {
    "inductor_entries": {
        "kind": "identity",
        "key_hash": "identity",
        "target_digest": "identity",
        "signer": "slot",
        "key": "identity",
        "sha256": "signed",
        "size": "inert",
        "value": "signed",
        "backend": "inert",
        "arch": "inert",
        "device_name": "inert",
        "driver_version": "inert",
        "torch_version": "inert",
        "triton_version": "inert",
        "host": "inert",
        "created_at": "inert",
        "used_at": "inert",
        "hit_count": "inert",
        "signature": "signed",
        "driver_release": "inert",
    },
    "binaries": {
        "triton_key": "identity",
        "signer": "slot",
        "sha256": "signed",
        "source_hash": "inert",
        "kernel": "inert",
        "name": "signed",
        "ext": "signed",
        "triton_version": "signed",
        "size": "inert",
        "metadata": "signed",
        "binary": "signed",
        "host": "inert",
        "created_at": "inert",
        "signature": "signed",
    },
    "launch_specs": {
        "source_hash": "identity",
        "target_digest": "identity",
        "spec_hash": "identity",
        "signer": "slot",
        "kernel": "inert",
        "config_hash": "signed",
        "kernel_hash": "signed",
        "triton_version": "signed",
        "spec_json": "signed",
        "host": "inert",
        "created_at": "inert",
        "signature": "signed",
    },
}


def slot(raw_public: bytes | None) -> str:
    """The ``signer`` column of a row signed by ``raw_public`` ("": unsigned, or a malformed signature)."""
    return base64.b64encode(raw_public).decode() if raw_public else ""


# ---- the adversary: raw SQL, no trusted key -----------------------------------------------------


class Writer:
    """A process that can write the store and holds no key the fleet trusts (it has its own)."""

    def __init__(self, url: str, key: dict[str, str]) -> None:
        self.engine = sa.create_engine(url, poolclass=NullPool if url.startswith("sqlite") else None)
        self.signer = signing.Signer(key["private_key"])
        self.tables: dict[str, sa.Table] = {}

    def table(self, name: str) -> sa.Table:
        if name not in self.tables:
            self.tables[name] = sa.Table(name, sa.MetaData(), autoload_with=self.engine)
        return self.tables[name]

    def _where(self, t: sa.Table, where: dict[str, Any]) -> list[Any]:
        return [t.c[k] == v for k, v in where.items() if k in t.c]

    def rows(self, name: str, **where: Any) -> list[dict[str, Any]]:
        t = self.table(name)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(sa.select(t).where(*self._where(t, where))).mappings()]

    def delete(self, name: str, **where: Any) -> None:
        t = self.table(name)
        with self.engine.begin() as c:
            c.execute(sa.delete(t).where(*self._where(t, where)))

    def insert(self, name: str, row: dict[str, Any], replace: dict[str, Any] | None = None) -> None:
        """Insert ``row`` (only the columns this schema has), first deleting what its key would hit."""
        t = self.table(name)
        row = {k: v for k, v in row.items() if k in t.c}
        with self.engine.begin() as c:
            pk = {col.name: row[col.name] for col in t.primary_key.columns}
            c.execute(sa.delete(t).where(*self._where(t, {**pk, **(replace or {})})))
            c.execute(sa.insert(t), [row])

    def update(self, name: str, where: dict[str, Any], values: dict[str, Any]) -> None:
        t = self.table(name)
        with self.engine.begin() as c:
            c.execute(sa.update(t).where(*self._where(t, where)).values(**values))

    def wipe(self) -> None:
        with self.engine.begin() as c:
            for name in ("inductor_entries", "binaries", "launch_specs"):
                c.execute(sa.delete(self.table(name)))


# ---- the kinds of rows of code, as the fleet makes them and a serving host uses them -------------


@dataclasses.dataclass
class Family:
    """One kind of row of code: how the fleet puts one, and what a serving host then runs."""

    name: str
    table: str
    identities: list[Any]  # [X, other key, other kind or None, other target or None]
    attacks: tuple[str, ...]
    keeps_first: bool = False  # a signer's put keeps its own row of the identity (else: last writer wins)

    def where(self, ident: Any) -> dict[str, Any]:
        raise NotImplementedError

    def payload(self, ident: Any, n: Any) -> Any:
        raise NotImplementedError

    def put(self, ctx: Ctx, ident: Any, payload: Any) -> None:
        raise NotImplementedError

    def served(self, ctx: Ctx, ident: Any) -> set[bytes]:
        """What a serving host runs of ``ident`` (empty: nothing, it compiles)."""
        raise NotImplementedError

    def made(self, payload: Any) -> bytes:
        """The bytes of ``payload`` that :meth:`served` answers with."""
        raise NotImplementedError

    def forged(self, ctx: Ctx, ident: Any, signature: str | None, big: int = 0) -> dict[str, Any]:
        """A row of the writer's own code under ``ident``, signed ``signature`` (a sentinel: by its key)."""
        raise NotImplementedError


BY_WRITER = "by-writer"  # forged(): signed by the writer's own key


class Inductor(Family):
    def __init__(self, name: str, kind: str, other_kind: str, target: int = 0) -> None:
        keys = [f"{name}-graph-a", f"{name}-graph-b"]
        t0, t1 = TARGETS[target], TARGETS[1 - target]
        idents = [(kind, keys[0], t0), (kind, keys[1], t0), (other_kind, keys[0], t0), (kind, keys[0], t1)]
        attacks = ("copy-key", "copy-kind", "copy-target")
        super().__init__(name, "inductor_entries", idents, attacks)

    def where(self, ident: Any) -> dict[str, Any]:
        kind, key, target = ident
        return {"kind": kind, "key_hash": hashlib.sha256(key.encode()).hexdigest(), "target_digest": target}

    def payload(self, ident: Any, n: Any) -> bytes:
        return f"{ident[0]}:{ident[1]}:{ident[2][:8]}:v{n}".encode()

    def put(self, ctx: Ctx, ident: Any, payload: bytes) -> None:
        ctx.entries().put(ident[0], ident[1], payload, target=(ident[2], DESC))

    def served(self, ctx: Ctx, ident: Any) -> set[bytes]:
        value, _ = ctx.entries().lookup(ident[0], ident[1], target=ident[2])
        return set() if value is None else {value}

    def made(self, payload: bytes) -> bytes:
        return payload

    def forged(self, ctx: Ctx, ident: Any, signature: str | None, big: int = 0) -> dict[str, Any]:
        from tunecache.problem.model import InductorEntry

        value = b"EVIL" * (big // 4 + 1) if big else b"EVIL:" + self.payload(ident, "w")
        entry = InductorEntry(ident[0], ident[1], ident[2], value, DESC)
        if signature == BY_WRITER:
            signature = ctx.writer.signer.sign_row(trust.inductor_message(entry))
        now = dt.datetime(2026, 1, 1)
        return {
            **self.where(ident),
            "key": ident[1],
            "sha256": entry.sha256,
            "size": 10,  # a lie: the size column is not what a read trusts
            "value": value,
            **DESC,
            "host": "writer",
            "created_at": now,
            "used_at": now,
            "hit_count": 0,
            "signature": signature,
        }


def _binary(key: str, n: Any, host_module: bool) -> Binary:
    version = preload.triton_version()
    if host_module:
        name, ext, md = "cuda_utils", hostmodules.EXT, hostmodules.metadata(key, "cuda_utils")
    else:
        name, ext = "k", "cubin"
        md = json.dumps({"hash": key, "name": "k", "target": {"backend": "cuda", "arch": 90, "warp_size": 32}})
        md = md.encode()
    data = f"\x7fELF:{key[:8]}:v{n}".encode()
    return Binary(key, binary_sha256(key, name, ext, version, md, data), name, ext, version, md, data)


class Binaries(Family):
    def __init__(self, name: str, host_module: bool) -> None:
        self.host_module = host_module
        super().__init__(name, "binaries", [KEYS[0], KEYS[1], None, None], ("copy-key", "budget"), keeps_first=True)

    def where(self, ident: Any) -> dict[str, Any]:
        return {"triton_key": ident}

    def payload(self, ident: Any, n: Any) -> Binary:
        return _binary(ident, n, self.host_module)

    def put(self, ctx: Ctx, ident: Any, payload: Binary) -> None:
        budget = settings.get("TUNECACHE_KERNEL_BINARIES_MAX_BYTES")  # as binaries.upload puts them
        ctx.store.put_binaries("m.k", SOURCES[0], [payload], budget)

    def served(self, ctx: Ctx, ident: Any) -> set[bytes]:
        """Place into an empty Triton cache (binaries.place, what a fresh host does), then read it."""
        ctx.caches += 1
        cache = ctx.tmp / f"cache-{ctx.caches}"
        ctx.monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
        spec = LaunchSpec("s" * 64, "c" * 32, ident, "{}", preload.triton_version())
        binaries.place(ctx.store, [spec], trust.policy(ctx.store))
        return {p.read_bytes() for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".json")}

    def made(self, payload: Binary) -> bytes:
        return payload.binary

    def forged(self, ctx: Ctx, ident: Any, signature: str | None, big: int = 0) -> dict[str, Any]:
        b = _binary(ident, "w", self.host_module)
        data = b"\x7fELF" + b"EVIL" * (big // 4 + 1) if big else b"EVIL:" + b.binary
        sha = binary_sha256(ident, b.name, b.ext, b.triton_version, b.metadata, data)
        b = dataclasses.replace(b, binary=data, sha256=sha)
        if signature == BY_WRITER:
            signature = ctx.writer.signer.sign_row(trust.binary_message(b))
        return {
            "triton_key": ident,
            "sha256": b.sha256,
            "source_hash": SOURCES[0],
            "kernel": "m.k",
            "name": b.name,
            "ext": b.ext,
            "triton_version": b.triton_version,
            "size": 10,
            "metadata": b.metadata,
            "binary": b.binary,
            "host": "writer",
            "created_at": dt.datetime(2026, 1, 1),
            "signature": signature,
        }


def _spec(ident: Any, n: Any) -> LaunchSpec:
    text = json.dumps({"spec": f"{ident[0][:8]}:{ident[1][:8]}:v{n}"})
    return LaunchSpec(hashlib.sha256(text.encode()).hexdigest(), "c" * 32, "f" * 64, text, "3.9.0")


class Specs(Family):
    def __init__(self) -> None:
        idents = [(SOURCES[0], TARGETS[0]), (SOURCES[1], TARGETS[0]), None, (SOURCES[0], TARGETS[1])]
        super().__init__("launch_spec", "launch_specs", idents, ("copy-key", "copy-target", "copy-spec-hash"))

    def where(self, ident: Any) -> dict[str, Any]:
        return {"source_hash": ident[0], "target_digest": ident[1]}

    def payload(self, ident: Any, n: Any) -> LaunchSpec:
        return _spec(ident, n)

    def put(self, ctx: Ctx, ident: Any, payload: LaunchSpec) -> None:
        ctx.store.put_specs("m.k", ident[0], ident[1], [payload])

    def served(self, ctx: Ctx, ident: Any) -> set[bytes]:
        """The specs a restarting host reads to preload (and whose binaries it places)."""
        ks = KernelStore("m.k", ctx.store)
        ks.read_specs(ctx.store, ident[0])
        return {s.spec_json.encode() for s in (ks.specs or {}).get(ident[1], [])}

    def made(self, payload: LaunchSpec) -> bytes:
        return payload.spec_json.encode()

    def forged(self, ctx: Ctx, ident: Any, signature: str | None, big: int = 0) -> dict[str, Any]:
        """The spec the fleet will put first (the same text and hash, the writer's Triton key), or an
        oversized one."""
        text = json.dumps({"evil": "x" * big}) if big else _spec(ident, 1).spec_json
        s = LaunchSpec(hashlib.sha256(text.encode()).hexdigest(), "c" * 32, "0" * 64, text, "3.9.0")
        if signature == BY_WRITER:
            signature = ctx.writer.signer.sign_row(trust.spec_message(ident[0], ident[1], s))
        return {
            "source_hash": ident[0],
            "target_digest": ident[1],
            "spec_hash": s.spec_hash,
            "kernel": "m.k",
            "config_hash": s.config_hash,
            "kernel_hash": s.kernel_hash,
            "triton_version": s.triton_version,
            "spec_json": s.spec_json,
            "host": "writer",
            "created_at": dt.datetime(2026, 1, 1),
            "signature": signature,
        }


FAMILIES = [
    Inductor("fx_graph", "fx_graph", "aot_autograd"),
    Inductor("aot_autograd", "aot_autograd", "fx_graph"),
    Inductor("autotune", "autotune", "bundled_autotune"),
    Inductor("bundled_autotune", "bundled_autotune", "autotune"),
    Inductor("triton_kernel", "triton_kernel", "fx_graph"),
    Inductor("host_module_entry", "triton_kernel", "autotune", target=1),  # under the host target
    Binaries("binary", host_module=False),
    Binaries("host_module", host_module=True),
    Specs(),
]


# ---- one attack at a time ------------------------------------------------------------------------


@dataclasses.dataclass
class Ctx:
    store: Any
    writer: Writer
    fleet_slot: str
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    caches: int = 0
    looks: int = 0
    made_by_fleet: dict[Any, set[bytes]] = dataclasses.field(default_factory=dict)

    def entries(self) -> InductorStore:
        return InductorStore(self.store)


@contextlib.contextmanager
def bounded(what: str) -> Iterator[None]:
    """``what`` must end within SECONDS: a hang is a failure, not a stuck suite."""

    def alarm(*_: Any) -> None:
        raise TimeoutError(f"{what} did not end within {SECONDS} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Attack:
    """One attack on one family: runs it, checking every look of the serving host."""

    def __init__(self, ctx: Ctx, fam: Family, name: str) -> None:
        self.ctx, self.fam, self.name = ctx, fam, name
        self.failures: list[str] = []
        self.version = 0

    def fleet_put(self, ident: Any) -> bytes:
        self.version += 1
        p = self.fam.payload(ident, self.version)
        with bounded(f"{self.name}: the fleet's put"):
            self.fam.put(self.ctx, ident, p)
        made = self.fam.made(p)
        self.ctx.made_by_fleet.setdefault(ident, set()).add(made)
        return made

    def look(self, ident: Any, what: str) -> set[bytes]:
        """What the serving host runs of ``ident``; a failure if it is not the fleet's for that identity."""
        self.ctx.looks += 1
        with bounded(f"{self.name}: {what}"):
            got = self.fam.served(self.ctx, ident)
        foreign = got - self.ctx.made_by_fleet.get(ident, set())
        if foreign:
            self.failures.append(f"{what}: the host runs foreign code {sorted(foreign)[0][:60]!r}")
        return got

    def expect(self, cond: bool, what: str) -> None:
        if not cond:
            self.failures.append(what)

    def next_put_wins(self, ident: Any) -> None:
        """The fleet (missing, or refused, the row) puts it again: the host is then served that, or,
        where a signer's first row of an identity stays (binaries, as Triton's cache keeps the first
        build of a key), the fleet's row of that identity."""
        made = self.fleet_put(ident)
        got = self.look(ident, "after the fleet's next put")
        self.expect(bool(got) if self.fam.keeps_first else made in got, "the fleet's next put did not win")


def run_attack(ctx: Ctx, fam: Family, name: str) -> list[str]:
    ctx.writer.wipe()
    ctx.made_by_fleet.clear()
    a = Attack(ctx, fam, name)
    x, other_key, other_kind, other_target = fam.identities
    w = ctx.writer
    if name.startswith("copy-"):
        a.fleet_put(x)
        (row,) = w.rows(fam.table, **fam.where(x))
        if name == "copy-spec-hash":
            y = x
            w.insert(fam.table, {**row, "spec_hash": "f" * 64})
        else:
            y = {"copy-key": other_key, "copy-kind": other_kind, "copy-target": other_target}[name]
            w.insert(fam.table, {**row, **fam.where(y)})
        a.look(y, "the copy")
        a.next_put_wins(y)
    elif name == "replay":
        a.fleet_put(x)
        (old,) = w.rows(fam.table, **fam.where(x))
        a.fleet_put(x)  # the fleet replaces it (binaries, launch specs: beside or over it)
        w.delete(fam.table, **fam.where(x))
        w.insert(fam.table, old)
        a.look(x, "the replayed row")  # served: it is the fleet's, for this identity (residual risk)
        a.next_put_wins(x)
    elif name.startswith("plant-"):
        _, how, where = name.split("-", 2)
        signature = {"key": BY_WRITER, "junk": "x", "unsigned": None}[how]
        row = fam.forged(ctx, x, signature)
        own = slot(signing.row_public_key(row["signature"] or "")) if how == "key" else ""
        w.insert(fam.table, {**row, "signer": ctx.fleet_slot if where == "fleet-slot" else own})
        a.expect(not a.look(x, "the planted row"), "the planted row was served")
        a.next_put_wins(x)
    elif name.startswith("alter-"):
        column = name[len("alter-") :]
        made = a.fleet_put(x)
        (row,) = w.rows(fam.table, **fam.where(x))
        if column not in row:
            return [f"{fam.name} / {name}: the table has no column {column}"]
        w.update(fam.table, {**fam.where(x), "signer": row.get("signer")}, {column: hostile(fam, column, row)})
        got = a.look(x, f"{column} altered")
        if COVERAGE[fam.table][column] == "inert":
            a.expect(got == {made}, f"altering the inert column {column} changed what the host is served: {got}")
        else:
            a.expect(not got, f"altered {column} ({COVERAGE[fam.table][column]}): the row was still served")
        a.next_put_wins(x)
    elif name == "budget":  # rows of the fleet's kernel claiming its whole byte budget, in every slot
        for where, key in (("fleet", other_key), ("own", "d" * 64)):
            row = fam.forged(ctx, key, "x")
            w.insert(fam.table, {**row, "size": 2**31 - 1, "signer": ctx.fleet_slot if where == "fleet" else ""})
        a.next_put_wins(x)
    elif name == "oversized":
        ctx.writer.wipe()
        before = counters.stats().get("untrusted", 0)
        row = fam.forged(ctx, x, "x", big=2 * LIMIT)
        w.insert(fam.table, {**row, "signer": ctx.fleet_slot})
        a.expect(not a.look(x, "the oversized row"), "the oversized row was served")
        a.expect(counters.stats().get("untrusted", 0) == before, "the oversized row was read (and refused)")
        a.next_put_wins(x)
    else:  # pragma: no cover
        raise AssertionError(name)
    return [f"{fam.name} / {name}: {f}" for f in a.failures]


def hostile(fam: Family, column: str, row: dict[str, Any]) -> Any:
    """A value a writer could put in ``column`` of ``row``."""
    v = row[column]
    if column == "signature":
        return "x"
    if column == "signer":
        return "" if v else "A" * 43 + "="
    if column == "kind":
        return "autotune" if v != "autotune" else "fx_graph"
    if column == "key":
        return "another graph"
    if column == "ext":
        return "so" if v != "so" else "cubin"
    if isinstance(v, bytes):
        return bytes([v[0] ^ 1]) + v[1:]
    if isinstance(v, int):
        return 2**31 - 1
    if isinstance(v, dt.datetime):
        return dt.datetime(2099, 1, 1)
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v):
        return ("f" if v[0] != "f" else "0") * 64
    if column == "spec_json":
        return json.dumps({"spec": "altered"})
    length = getattr(getattr(fam_table(fam.table).c[column], "type", None), "length", None) or 40
    return "x' OR '1'='1"[:length]


def fam_table(name: str) -> sa.Table:
    return schema.metadata.tables[name]


ATTACKS_ALL = (
    "replay",
    "plant-key-own-slot",
    "plant-key-fleet-slot",
    "plant-junk-own-slot",
    "plant-junk-fleet-slot",
    "plant-unsigned-own-slot",
    "plant-unsigned-fleet-slot",
    "oversized",
)


def attacks_of(fam: Family) -> list[str]:
    return [*fam.attacks, *ATTACKS_ALL, *(f"alter-{c}" for c in COVERAGE[fam.table])]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {k: signing.keygen(d / k) for k in ("fleet", "writer")}


@pytest.mark.sql_variants("raw SQL and the serving host's reads; Triton's part (binaries.place) runs in the SQLite one")
@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_an_adversarial_writer_never_gets_foreign_code_run_nor_keeps_the_fleet_out(
    fam: Family, store_url: str, keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
):
    from tunecache.store import signers

    monkeypatch.setattr(signers, "MAX_ROW_BYTES", dict.fromkeys(COVERAGE, LIMIT), raising=False)
    for k, v in {
        "TUNECACHE_SIGNING_KEY": keys["fleet"]["private_key"],  # the fleet's process, and the serving host
        "TUNECACHE_TRUSTED_KEYS": keys["fleet"]["public_key"],
        "TUNECACHE_TRUST_STORE": "no",
        "TUNECACHE_WAIT_SECONDS": "0",
        "TUNECACHE_BINARIES": "1",
    }.items():
        monkeypatch.setenv(k, v)
    fleet_slot = slot(signing.parse_public(Path(keys["fleet"]["public_key"]).read_text(), "fleet"))
    with contextlib.closing(open_store(store_url)) as store:
        ctx = Ctx(store, Writer(store_url, keys["writer"]), fleet_slot, tmp_path, monkeypatch)
        failures: list[str] = []
        names = attacks_of(fam)
        t0 = time.monotonic()
        for name in names:
            failures += run_attack(ctx, fam, name)
        ctx.writer.engine.dispose()
    backend = store_url.split(":")[0].split("+")[0]
    failed = len({f.split(":")[0] for f in failures})  # "family / attack: what went wrong"
    line = (
        f"adversary [{backend}] {fam.name}: {len(names)} attacks, {ctx.looks} looks by the serving host, "
        f"{failed} attacks failed, {time.monotonic() - t0:.1f} s"
    )
    request.node.user_properties.append(("summary", line))  # printed by tests/conftest.py, xdist or not
    assert not failures, "\n".join(failures)


def test_every_column_of_every_table_of_code_is_signed_or_cannot_change_what_runs():
    """The coverage table: every column of every table of code is classified (a new column must be
    classified, and is then attacked above), and docs/reliability.md holds the same table."""
    for name, cols in COVERAGE.items():
        assert set(cols) == {c.name for c in fam_table(name).c}, name
    doc = (ROOT / "docs" / "reliability.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \| (signed|identity|slot|inert) \|", doc, flags=re.M))
    assert rows == {(t, c, k) for t, cols in COVERAGE.items() for c, k in cols.items()}
    assert set(COVERAGE) == {"inductor_entries", "binaries", "launch_specs"}  # every table of code


# ---- one entry removed by name ---------------------------------------------------------------


@pytest.mark.sql_variants("`tunecache invalidate` deletes rows: SQL alone, nothing of Triton's")
def test_invalidate_removes_one_entry_by_key_and_kind_dry_run_first(store_url, keys, tmp_path, monkeypatch):
    """`invalidate --kind K --key PREFIX`: a dry run lists the rows (every signer's) and deletes
    nothing; the run deletes them and nothing else; a prefix of nothing, or a kind it does not know,
    is one line."""
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["fleet"]["private_key"])
    with contextlib.closing(open_store(store_url)) as store:
        w = Writer(store_url, keys["writer"])
        entries = InductorStore(store)
        for key in ("graph-planted", "graph-kept"):
            entries.put("fx_graph", key, b"fleet", target=(TARGETS[0], DESC))
        ctx = Ctx(store, w, "", tmp_path, monkeypatch)
        planted = Inductor("x", "fx_graph", "autotune").forged(ctx, ("fx_graph", "graph-planted", TARGETS[0]), "x")
        w.insert("inductor_entries", {**planted, "signer": ""}, replace={"signer": "", "signature": "x"})
        store.put_binaries("m.k", SOURCES[0], [_binary(KEYS[0], 1, False), _binary(KEYS[1], 1, False)])
        store.put_specs("m.k", SOURCES[0], TARGETS[0], [_spec((SOURCES[0], TARGETS[0]), 1)])
        url = store.url.render_as_string(hide_password=False)

        def count(table: str, **where: Any) -> int:
            return len(w.rows(table, **where))

        before = {t: count(t) for t in ("inductor_entries", "binaries", "launch_specs")}
        assert before["inductor_entries"] == 3
        r = tc("--url", url, "invalidate", "--kind", "fx_graph", "--key", "graph-pl", "--dry-run", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["dry_run"] and out["count"] == 2 and {e["key"] for e in out["entries"]} == {"graph-planted"}
        assert {t: count(t) for t in before} == before  # nothing deleted
        r = tc("--url", url, "invalidate", "--kind", "fx_graph", "--key", "graph-pl")
        assert r.returncode == 0 and "2 fx_graph rows deleted" in r.stdout, (r.stdout, r.stderr)
        assert count("inductor_entries") == 1 and w.rows("inductor_entries")[0]["key"] == "graph-kept"
        r = tc("--url", url, "invalidate", "--kind", "binary", "--key", KEYS[0][:12])
        assert r.returncode == 0 and "1 binary rows deleted" in r.stdout, (r.stdout, r.stderr)
        assert [b["triton_key"] for b in w.rows("binaries")] == [KEYS[1]]
        spec_hash = w.rows("launch_specs")[0]["spec_hash"]
        r = tc("--url", url, "invalidate", "--kind", "launch_spec", "--key", spec_hash[:10])
        assert r.returncode == 0 and "1 launch_spec rows deleted" in r.stdout, (r.stdout, r.stderr)
        assert count("launch_specs") == 0
        for args, says in (
            (("--kind", "fx_graph", "--key", "nothing-like-it"), "0 fx_graph rows deleted"),
            (("--key", "graph"), "--key needs --kind"),
            (("--kind", "nonsense", "--key", "g"), "nonsense"),
            (("--kind", "fx_graph", "--key", "g", "--arch", "sm90"), "--key selects"),
        ):
            r = tc("--url", url, "invalidate", *args)
            assert says in r.stdout + r.stderr, (args, r.stdout, r.stderr)
            assert "Traceback" not in r.stderr
        w.engine.dispose()
