"""The tuner's rows of code follow the rule of torch.compile's entries (issue 35, item 4;
tunecache/store/signers.py): a heal adds launch specs and gc never drops a signed one for a newer
unsigned one or another key's, and a signed binary or launch spec replaces an unsigned one of its
key (the first host to store a key, signing with none, would else keep the fleet's out for good)."""

from __future__ import annotations

import contextlib
import datetime as dt

import pytest

from tunecache import signing
from tunecache.binaries.preload import for_binary
from tunecache.model import Binary, LaunchSpec, binary_sha256, utcnow
from tunecache.store.opening import open_store


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
        return {s.kernel_hash[:1]: signing.row_signer(s.signature) for s in store.get_specs("src" * 8)["t" * 64]}

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


def test_a_signed_binary_or_launch_spec_replaces_an_unsigned_one_never_the_reverse(store, keys, monkeypatch):
    meta, data = b'{"name": "k"}', b"\x7fELF"
    b = Binary("k" * 64, binary_sha256("k" * 64, "k", "cubin", "3.6", meta, data), "k", "cubin", "3.6", meta, data)
    as_signer(monkeypatch, None)
    assert store.put_binaries("m.k", "src" * 8, [b]) == 1
    store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)])
    as_signer(monkeypatch, keys["fleet"]["private_key"])
    assert store.put_binaries("m.k", "src" * 8, [b]) == 1
    store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)])
    assert store.get_binaries(["k" * 64])[0].signature is not None
    assert store.get_specs("src" * 8)["t" * 64][0].signature is not None
    as_signer(monkeypatch, None)
    assert store.put_binaries("m.k", "src" * 8, [b]) == 0
    store.put_specs("m.k", "src" * 8, "t" * 64, [spec("k" * 64)])
    assert store.get_binaries(["k" * 64])[0].signature is not None
    assert store.get_specs("src" * 8)["t" * 64][0].signature is not None
