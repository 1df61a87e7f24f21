"""The tuner's rows of code follow the rule of torch.compile's entries (issue 35, item 4;
tunecache/store/signers.py): a heal that replaces a launch spec never replaces a signed one with an
unsigned one or another key's, and a signed binary or launch spec replaces an unsigned one of its
key (the first host to store a key, signing with none, would else keep the fleet's out for good)."""

from __future__ import annotations

import contextlib

import pytest

from tunecache import signing
from tunecache.model import Binary, LaunchSpec, binary_sha256
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


def test_a_heal_never_replaces_a_signed_launch_spec_with_an_unsigned_or_another_keys(store, keys, monkeypatch):
    def stored() -> tuple[str, bool]:
        (s,) = store.get_specs("src" * 8)["t" * 64]
        return s.kernel_hash, s.signature is not None

    put = lambda k: store.put_specs("m.k", "src" * 8, "t" * 64, [spec(k)], replace=True)  # noqa: E731
    as_signer(monkeypatch, keys["fleet"]["private_key"])
    put("a" * 64)
    as_signer(monkeypatch, None)  # a dev box's heal: another text of the source
    put("b" * 64)
    assert stored() == ("a" * 64, True)
    as_signer(monkeypatch, keys["other"]["private_key"])
    put("c" * 64)
    assert stored() == ("a" * 64, True)
    as_signer(monkeypatch, keys["fleet"]["private_key"])  # the fleet's own heal still replaces
    put("d" * 64)
    assert stored() == ("d" * 64, True)


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
