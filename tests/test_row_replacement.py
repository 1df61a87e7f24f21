"""The tuner's rows of code follow the rule of torch.compile's entries (issues 35 and 43;
tunecache/store/signers.py): a heal adds launch specs and gc never drops a signed one for a newer
unsigned one or another key's, and each signer keeps its own row of a binary or launch spec: the
first host to store a key, signing with none (or another key), never keeps the fleet's out, and the
fleet's never evicts it."""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest

from tunecache.binaries.preload import for_binary
from tunecache.problem.model import Binary, LaunchSpec, binary_sha256, utcnow
from tunecache.store.opening import open_store
from tunecache.trust import signing


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {k: signing.keygen(d / k) for k in ("fleet", "other")}


@pytest.fixture
def store(store_url: str):
    with contextlib.closing(open_store(store_url)) as s:
        yield s


def as_signer(monkeypatch, key: str | None) -> None:
    if key is None:
        monkeypatch.delenv("TUNECACHE_SIGNING_KEY", raising=False)
    else:
        monkeypatch.setenv("TUNECACHE_SIGNING_KEY", key)


def spec(kernel_hash: str) -> LaunchSpec:
    return LaunchSpec("s" * 64, "c" * 32, kernel_hash, '{"spec": 1}', "3.6")


def test_a_heal_never_removes_a_signed_launch_spec_and_gc_keeps_the_newest_of_each_signer(store, keys, monkeypatch):
    """Heal adds (issue 35, item 8): a dev box's unsigned spec of another text, and another key's, are
    added beside the fleet's signed one; gc then drops a signer's superseded specs, never the fleet's
    newest signed one because another signer's spec is newer."""

    def stored() -> dict[str, str | None]:
        return {s.kernel_hash[:1]: signing.row_slot(s.signature) for s in store.get_specs("src" * 8)["t" * 64]}

    put = lambda k: store.put_specs("m.k", "src" * 8, "t" * 64, [for_binary(spec(k))])  # noqa: E731
    as_signer(monkeypatch, keys["fleet"]["private_key"])
    put("a" * 64)
    fleet = stored()["a"]
    assert fleet is not None
    as_signer(monkeypatch, None)  # a dev box's heal: another text of the source
    put("b" * 64)
    as_signer(monkeypatch, keys["other"]["private_key"])
    put("c" * 64)
    assert set(stored()) == {"a", "b", "c"} and stored()["a"] == fleet
    assert store.gc_launch_specs(older_than=utcnow() + dt.timedelta(days=1)) == []  # one spec per signer
    as_signer(monkeypatch, keys["fleet"]["private_key"])  # the fleet's own new text supersedes its old one
    put("d" * 64)
    gone = store.gc_launch_specs(older_than=utcnow() + dt.timedelta(days=1))
    assert len(gone) == 1 and set(stored()) == {"b", "c", "d"} and stored()["d"] == fleet


def test_each_signer_keeps_its_own_binary_and_launch_spec_and_reads_only_trusted_ones(store, keys, monkeypatch):
    meta, data = b'{"name": "k"}', b"\x7fELF"
    b = Binary("k" * 64, binary_sha256("k" * 64, "k", "cubin", "3.6", meta, data), "k", "cubin", "3.6", meta, data)
    as_signer(monkeypatch, None)  # the first host to store them signs with no key
    assert store.put_binaries("m.k", "src" * 8, [b]) == 1
    assert store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)]) == 1
    as_signer(monkeypatch, keys["fleet"]["private_key"])  # the fleet's are stored beside them
    assert store.put_binaries("m.k", "src" * 8, [b]) == 1
    assert store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)]) == 1
    as_signer(monkeypatch, None)  # and the unsigned host's next puts are its own rows again, kept
    assert store.put_binaries("m.k", "src" * 8, [b]) == 0
    assert store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)]) == 0
    fleet = signing.key_slot(signing.parse_public(Path(keys["fleet"]["public_key"]).read_text(), "fleet"))
    assert {signing.row_slot(x.signature) for x in store.get_binaries(["k" * 64])} == {"", fleet}
    assert [signing.row_slot(x.signature) for x in store.get_binaries(["k" * 64], [fleet])] == [fleet]
    assert [signing.row_slot(x.signature) for x in store.get_specs("src" * 8, [fleet])["t" * 64]] == [fleet]
    assert [x.signature for x in store.get_specs("src" * 8, [""])["t" * 64]] == [None]


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def any_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param.replace('postgresql', 'pg')}_url")


def test_migration_0009_moves_each_row_of_code_into_its_signers_slot_and_back(any_url, keys, monkeypatch):
    """A store at 0008 holding signed, unsigned and malformed-signature rows of every table of code:
    upgraded, each row is in the slot its signature names and still serves a host that trusts the
    key (the signed messages did not change); a second signer's row of the same identity can then be
    added beside it; a downgrade keeps one row per identity again."""
    import sqlalchemy as sa
    from alembic import command

    from tunecache.inductor.entries import InductorStore
    from tunecache.problem.model import InductorEntry, binary_row, launch_spec_row
    from tunecache.store.migrate import alembic_config
    from tunecache.store.opening import connect

    s = connect(any_url)
    s.upgrade("0008")
    fleet = signing.Signer(keys["fleet"]["private_key"])
    meta = b'{"hash": "%s", "target": {"backend": "cuda"}}' % (b"a" * 64)
    b = Binary("a" * 64, binary_sha256("a" * 64, "k", "cubin", "3.9.0", meta, b"\x7fELF"), "k", "cubin", "3.9.0",
               meta, b"\x7fELF")  # fmt: skip
    sp = for_binary(spec("a" * 64))  # filed under its own hash
    en = InductorEntry("fx_graph", "graph", "t" * 64, b"compiled", {f: "x" for f in ("backend", "arch")})
    from tunecache.trust import trust

    signed_rows = {
        "binaries": [
            binary_row("m.k", "src" * 8, replace(b, signature=fleet.sign_row(trust.binary_message(b)))),
            binary_row("m.k", "src" * 8, replace(b, triton_key="b" * 64, signature="ed25519:junk:x")),
        ],
        "launch_specs": [
            launch_spec_row(
                "m.k",
                "src" * 8,
                "t" * 64,
                replace(sp, signature=fleet.sign_row(trust.spec_message("src" * 8, "t" * 64, sp))),
            ),  # fmt: skip
            launch_spec_row("m.k", "src" * 8, "t" * 64, replace(sp, spec_hash="e" * 64, signature=None)),
        ],
    }
    now = utcnow()
    with s.engine.begin() as c:  # as the 0008 code wrote them
        for table, rs in signed_rows.items():
            t = sa.table(table, *(sa.column(k) for k in [*rs[0], "host", "created_at"]))
            c.execute(sa.insert(t), [{**r, "host": "old", "created_at": now} for r in rs])
        cols = dict(kind=en.kind, key_hash=en.key_hash, target_digest=en.target_digest, key=en.key,
                    sha256=en.sha256, size=8, value=en.value, host="old", created_at=now, used_at=now, hit_count=0,
                    **dict.fromkeys(("backend", "arch", "device_name", "driver_version", "torch_version",
                                     "triton_version", "driver_release"), ""))  # fmt: skip
        t = sa.table("inductor_entries", *(sa.column(k) for k in [*cols, "signature"]))
        c.execute(sa.insert(t), [{**cols, "signature": fleet.sign_row(trust.inductor_message(en))}])
    s.close()
    s = open_store(any_url)  # migrates to head
    slot = signing.key_slot(fleet.raw_public)
    with s.engine.connect() as c:
        got = {t: sorted(c.exec_driver_sql(f"SELECT signer FROM {t}").scalars()) for t in signed_rows}
        got["inductor_entries"] = list(c.exec_driver_sql("SELECT signer FROM inductor_entries").scalars())
    assert got == {"binaries": ["", slot], "launch_specs": ["", slot], "inductor_entries": [slot]}, got
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["fleet"]["public_key"])
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    policy = trust.policy(s)
    assert [policy.binary(x) for x in s.get_binaries(["a" * 64], policy.slots)] == [None]
    assert [x.spec_hash for x in policy.stored_specs(s, "src" * 8)["t" * 64]] == [sp.spec_hash]
    assert InductorStore(s).lookup("fx_graph", "graph", target="t" * 64)[0] == b"compiled"
    # Another signer's row of the same identity now goes beside the fleet's.
    as_signer(monkeypatch, keys["other"]["private_key"])
    assert s.put_binaries("m.k", "src" * 8, [b]) == 1 and len(s.get_binaries(["a" * 64])) == 2
    with s.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0008")
    with s.engine.connect() as c:
        n = c.exec_driver_sql("SELECT count(*) FROM binaries WHERE triton_key = '%s'" % ("a" * 64)).scalar()
    assert n == 1
    s.close()
