"""The trust boundary (issue 25): a store that ships code runs only code a trusted key vouches for.

Binaries, host modules and launch specs are signed where they are made (``TUNECACHE_SIGNING_KEY``);
a process places or preloads one only if its signature verifies against a full public key of
``TUNECACHE_TRUSTED_KEYS``, or its store is trusted as a whole (``TUNECACHE_TRUST_STORE``). Real
sm90 binaries are built offline (tests/binaries_roundtrip.py); rows are planted through the public
Store API, as any readwrite worker or ``db grant --tuner`` role could.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from processes import run_json
from realcli import cli_process, one_line_error

from tunecache.binaries.preload import for_binary
from tunecache.cli import main
from tunecache.errors import UntrustedFileError
from tunecache.exchange import SIGNED_ROWS_VERSION, export, import_
from tunecache.problem.model import Binary, LaunchSpec, binary_sha256
from tunecache.store.opening import open_store
from tunecache.trust import signing, trust


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {k: signing.keygen(d / k) for k in ("tuner", "attacker")}


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys) -> dict[str, Any]:
    """Two tuned keys' winners with their sm90 binaries (and a companion's), stored by a tuning process
    that signs with the "tuner" key."""
    d = tmp_path_factory.mktemp("signed")
    url = f"sqlite:///{d / 'tuned.sqlite3'}"
    env = {"TRITON_CACHE_DIR": str(d / "cache"), "TUNECACHE_URL": url}
    env["TUNECACHE_SIGNING_KEY"] = keys["tuner"]["private_key"]
    return {**run_json(["binaries_roundtrip.py", "build"], env=env), "url": url, "dir": d}


def place(url: str, cache: Path, **env: str) -> dict[str, Any]:
    """A fresh serving process with an empty Triton cache: place, then preload (binaries_roundtrip.py)."""
    base = {"TRITON_CACHE_DIR": str(cache), "TUNECACHE_URL": url, "TUNECACHE_TRUSTED_KEYS": ""}
    return run_json(["binaries_roundtrip.py", "place"], env={**base, "TUNECACHE_TRUST_STORE": "auto", **env})


def rows(url: str, source_hash: str) -> tuple[dict[str, list[LaunchSpec]], list[Binary]]:
    s = open_store(url)
    try:
        specs = s.get_specs(source_hash)
        return specs, s.get_binaries([x.kernel_hash for v in specs.values() for x in v] + list(_host_keys(specs)))
    finally:
        s.close()


def _host_keys(specs: dict[str, list[LaunchSpec]]) -> set[str]:
    return {orjson.loads(x.spec_json)["key"] for v in specs.values() for x in v if "host_module" in x.spec_json}


def _untrusted_lines(r: dict[str, Any]) -> list[str]:
    return [w for w in r["warnings"] if "no trusted key signed" in w]


def test_a_tuning_process_signs_every_row_it_makes(signed, keys):
    specs, bins = rows(signed["url"], signed["source_hash"])
    tuner = signing.row_public_key(next(iter(specs.values()))[0].signature or "")
    assert tuner is not None and signing.key_id(tuner) == keys["tuner"]["key_id"]
    every = [s for v in specs.values() for s in v]
    assert len(every) >= 4 and len(bins) >= 4  # the winners' specs, the companion's (and host modules')
    policy = trust.Policy(frozenset({tuner}), False, "test")
    assert all(policy.spec(signed["source_hash"], t, s) is None for t, v in specs.items() for s in v)
    assert all(policy.binary(b) is None for b in bins)


def test_a_row_signature_covers_its_bytes_and_trust_is_by_the_whole_key(signed, keys):
    specs, bins = rows(signed["url"], signed["source_hash"])
    target, spec_rows = next(iter(specs.items()))
    s, b = spec_rows[0], next(b for b in bins if b.ext == "cubin")
    tuner = signing.row_public_key(s.signature or "")
    trusted = trust.Policy(frozenset({tuner}), False, "test")
    assert trusted.spec(signed["source_hash"], target, s) is None and trusted.binary(b) is None
    # Every covered field, changed: the signature no longer verifies.
    data = b.binary[:100] + bytes([b.binary[100] ^ 1]) + b.binary[101:]
    rehashed = binary_sha256(b.triton_key, b.name, b.ext, b.triton_version, b.metadata, data)
    for edited in (dataclasses.replace(b, binary=data, sha256=rehashed), dataclasses.replace(b, name="other")):
        assert "does not verify" in (trusted.binary(edited) or "")
    text = s.spec_json[:-1] + ', "edited": 1}'  # re-hashed: filed under its own hash
    assert "spec hash" in (trusted.spec(signed["source_hash"], target, dataclasses.replace(s, spec_json=text)) or "")
    for edited in (
        dataclasses.replace(s, spec_json=text, spec_hash=hashlib.sha256(text.encode()).hexdigest()),
        dataclasses.replace(s, kernel_hash="0" * 64),
        dataclasses.replace(s, triton_version="9.9.9"),
    ):
        assert "does not verify" in (trusted.spec(signed["source_hash"], target, edited) or ""), edited
    assert "does not verify" in (trusted.spec(signed["source_hash"], "f" * 64, s) or "")  # another target
    # Another key, unsigned, malformed: refused, each with its reason.
    attacker = signing.Signer(keys["attacker"]["private_key"])
    forged = dataclasses.replace(b, signature=attacker.sign_row(trust.binary_message(b)))
    assert "not in TUNECACHE_TRUSTED_KEYS" in (trusted.binary(forged) or "")
    assert trusted.binary(dataclasses.replace(b, signature=None)) == "it is unsigned"
    assert "malformed" in (trusted.binary(dataclasses.replace(b, signature="ed25519:x:y")) or "")
    # A key whose id collides with a trusted one (ids narrowed to one hex digit) is still another key.
    collide = dataclasses.replace(forged)
    narrowed = trust.Policy(frozenset({tuner}), False, "test")
    real_id = signing.key_id
    try:
        signing.key_id = lambda raw: real_id(raw)[:1]  # type: ignore[assignment]
        assert "not in TUNECACHE_TRUSTED_KEYS" in (narrowed.binary(collide) or "")
    finally:
        signing.key_id = real_id  # type: ignore[assignment]
    # A store trusted as a whole takes rows as they are.
    assert trust.Policy(frozenset(), True, "test").binary(dataclasses.replace(b, signature=None)) is None


def test_signed_rows_are_placed_only_where_their_key_is_trusted(signed, keys, tmp_path):
    # Trusted: every binary placed, every spec preloaded; Triton compiles nothing (all cache hits).
    ok = place(
        signed["url"], tmp_path / "c1", TUNECACHE_TRUSTED_KEYS=keys["tuner"]["public_key"], TUNECACHE_TRUST_STORE="no"
    )
    assert ok["loaded"] == 4 and ok["stats"]["untrusted"] == 0
    assert ok["compiles_at_preload"] and all(c["cache_hit"] for c in ok["compiles_at_preload"])
    assert ok["cubins"] == signed["cubins"] and not _untrusted_lines(ok)
    # The same store, the key not trusted: nothing placed or preloaded, counted, said once.
    no = place(
        signed["url"],
        tmp_path / "c2",
        TUNECACHE_TRUSTED_KEYS=keys["attacker"]["public_key"],
        TUNECACHE_TRUST_STORE="no",
    )
    assert no["loaded"] == 0 and no["groups"] == 0 and no["compiles_at_preload"] == []
    specs, _ = rows(signed["url"], signed["source_hash"])
    assert no["stats"]["untrusted"] == sum(map(len, specs.values()))
    assert len(_untrusted_lines(no)) == 1, no["warnings"]
    # Triton then compiles what a launch needs itself, and gets the same binary.
    assert no["cubins"][signed["merge_hash"]] == signed["cubins"][signed["merge_hash"]]
    # No keys at all: a private SQLite file is trusted as a whole (auto), a forced "no" is not.
    assert place(signed["url"], tmp_path / "c3")["loaded"] == 4
    assert place(signed["url"], tmp_path / "c4", TUNECACHE_TRUST_STORE="no")["loaded"] == 0


def _copy_results(src_url: str, dst_url: str, tmp_path: Path) -> None:
    export(open_store(src_url), tmp_path / "results.jsonl")
    import_(open_store(dst_url), tmp_path / "results.jsonl", trust_unsigned=True)


def test_planted_rows_on_a_shared_store_are_not_placed_not_loaded_counted_and_said_once(
    signed, keys, pg_url, tmp_path, monkeypatch
):
    """Rows written through the public Store API by a writer without the tuner's key (any readwrite
    worker): attacker binaries under the tuner's genuine launch specs, then attacker launch specs."""
    _copy_results(signed["url"], pg_url, tmp_path)
    specs, bins = rows(signed["url"], signed["source_hash"])
    store = open_store(pg_url)
    # 1. The genuine signed specs, replayed, and attacker binaries (re-hashed: each row is consistent).
    for t, v in specs.items():
        store.add_specs_signed = None  # the public API only: put_specs keeps a row's signature
        store.put_specs(signed["kernel"], signed["source_hash"], t, v)
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["attacker"]["private_key"])
    evil = []
    for b in bins:
        data = b.binary + b"\x00evil"
        evil.append(
            dataclasses.replace(
                b,
                binary=data,
                sha256=binary_sha256(b.triton_key, b.name, b.ext, b.triton_version, b.metadata, data),
                signature=None,
            )
        )
    assert store.put_binaries(signed["kernel"], signed["source_hash"], evil) == len(evil)
    monkeypatch.delenv("TUNECACHE_SIGNING_KEY")
    r = place(pg_url, tmp_path / "c1", TUNECACHE_TRUSTED_KEYS=keys["tuner"]["public_key"])
    assert r["groups"] == 4  # compiled here, none placed
    assert not any(c["cache_hit"] for c in r["compiles_at_preload"]), r["compiles_at_preload"]
    assert r["cubins"] == signed["cubins"]  # Triton's own binaries, never the attacker's
    cubins = [b for b in evil if b.ext == "cubin"]
    assert r["stats"]["untrusted"] == len(cubins) and len(_untrusted_lines(r)) == 1, r["warnings"]
    # 2. Attacker launch specs (no key at all): none preloaded.
    store2 = open_store(pg_url)
    with store2.engine.begin() as c:
        c.exec_driver_sql("DELETE FROM launch_specs")
    for t, v in specs.items():
        store2.put_specs(
            signed["kernel"], signed["source_hash"], t, [dataclasses.replace(s, signature=None) for s in v]
        )
    r = place(pg_url, tmp_path / "c2", TUNECACHE_TRUSTED_KEYS=keys["tuner"]["public_key"])
    assert r["loaded"] == 0 and r["compiles_at_preload"] == [] and r["groups"] == 0
    assert r["stats"]["untrusted"] == sum(map(len, specs.values())) and len(_untrusted_lines(r)) == 1
    # 3. export --binaries --sign re-verifies: the planted rows are left out, not signed into the file.
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["tuner"]["public_key"])
    signer = signing.Signer(keys["tuner"]["private_key"])
    summary = export(open_store(pg_url), tmp_path / "out.jsonl", with_binaries=True, signer=signer)
    assert summary["launch_specs"] == 0 and summary["binaries"] == 0
    assert summary["untrusted"] == sum(map(len, specs.values()))


def test_a_signed_export_carries_row_signatures_to_a_fresh_host(signed, keys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["tuner"]["public_key"])
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    signer = signing.Signer(keys["tuner"]["private_key"])
    path = tmp_path / "signed.jsonl"
    summary = export(open_store(signed["url"]), path, with_binaries=True, signer=signer)
    assert summary["version"] == SIGNED_ROWS_VERSION and summary["untrusted"] == 0 and summary["binaries"] >= 4
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    carried = [x for x in lines[1:-1] if "spec" in x or "binary" in x]
    assert carried and all(signing.row_public_key(x["signature"]) == signer.raw_public for x in carried)
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    import_(open_store(fresh), path, with_binaries=True)
    r = place(fresh, tmp_path / "cache", TUNECACHE_TRUSTED_KEYS=keys["tuner"]["public_key"], TUNECACHE_TRUST_STORE="no")
    assert r["loaded"] == 4 and all(c["cache_hit"] for c in r["compiles_at_preload"]) and r["stats"]["untrusted"] == 0


def _unsigned_with_edited_timing(signed: dict[str, Any], keys, tmp_path: Path) -> Path:
    """What an attacker makes of a signed export: the signature line cut off, the header made
    unsigned, a timing edited and the body hash recomputed."""
    path = tmp_path / "signed.jsonl"
    export(open_store(signed["url"]), path, signer=signing.Signer(keys["tuner"]["private_key"]))
    header, *body = path.read_bytes().splitlines()[:-1]  # the signature line: gone
    p = orjson.loads(body[0])
    p["configs"][0]["median_ms"] = 1e-6
    p["winner_ms"] = min(p["winner_ms"] or 1, 1e-6)
    body[0] = orjson.dumps(p)
    h = orjson.loads(header)
    h["signed_by"] = None
    h["body_sha256"] = hashlib.sha256(b"".join(x + b"\n" for x in body)).hexdigest()
    out = tmp_path / "stripped.jsonl"
    out.write_bytes(b"".join(x + b"\n" for x in [orjson.dumps(h), *body]))
    return out


def test_where_keys_are_trusted_every_import_must_be_signed(signed, keys, tmp_path, monkeypatch):
    stripped = _unsigned_with_edited_timing(signed, keys, tmp_path)
    url = f"sqlite:///{tmp_path / 'target.sqlite3'}"
    env = {**os.environ, "TUNECACHE_TRUSTED_KEYS": keys["tuner"]["public_key"]}
    msg = one_line_error(cli_process("--url", url, "import", str(stripped), env=env))
    assert "unsigned file" in msg and "TUNECACHE_TRUSTED_KEYS is set" in msg and "--trust-unsigned" in msg, msg
    assert open_store(url).counts()["problems"] == 0
    # Nothing trusted: results from any file, as before; and --trust-unsigned says "this file is mine".
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["tuner"]["public_key"])
    with pytest.raises(UntrustedFileError):
        import_(open_store(url), stripped)
    assert import_(open_store(url), stripped, trust_unsigned=True).new == 2
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")
    other = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    assert import_(open_store(other), stripped).new == 2


def test_a_file_signed_by_a_key_whose_id_collides_with_a_trusted_one_is_refused(signed, keys, tmp_path, monkeypatch):
    real_id = signing.key_id
    # Ids narrowed to one hex digit of sixteen (still 16 digits long): collisions are easy to find.
    monkeypatch.setattr(signing, "key_id", lambda raw: "0" * 15 + real_id(raw)[0])
    trusted = signing.Signer(keys["tuner"]["private_key"])
    d = tmp_path / "k"
    d.mkdir()
    for i in range(400):  # find an attacker key with the trusted key's (narrowed) id
        k = signing.keygen(d / f"a{i}")
        if k["key_id"] == trusted.key_id:
            attacker = signing.Signer(k["private_key"])
            break
    else:  # pragma: no cover - 16 ids: 400 tries miss with probability 1e-11
        pytest.fail("no colliding key")
    path = tmp_path / "x.jsonl"
    export(open_store(signed["url"]), path, signer=attacker)
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["tuner"]["public_key"])
    with pytest.raises(UntrustedFileError, match="not in TUNECACHE_TRUSTED_KEYS"):
        import_(open_store(f"sqlite:///{tmp_path / 't.sqlite3'}"), path, with_launch_specs=True)


def test_export_of_a_store_without_trusted_rows_warns_and_leaves_them_out_through_the_cli(signed, keys, tmp_path):
    env = {**os.environ, "TUNECACHE_TRUSTED_KEYS": keys["attacker"]["public_key"], "TUNECACHE_TRUST_STORE": "no"}
    out = tmp_path / "o.jsonl"
    r = cli_process("--url", signed["url"], "export", str(out), "--binaries", env=env)
    assert r.returncode == 0, r.stderr
    assert "left out" in r.stderr
    header = orjson.loads(out.read_bytes().splitlines()[0])
    assert header["launch_specs"] == 0 and header["binaries"] == 0 and header["problems"] == 2
    res = CliRunner().invoke(main, ["--url", signed["url"], "export", str(tmp_path / "p.jsonl"), "--binaries"])
    assert res.exit_code == 0  # the tuner's own private SQLite file: trusted as a whole (auto)


def test_one_bad_binary_row_never_keeps_the_good_ones_out(signed, tmp_path):
    """A row whose Triton key Triton's cache manager cannot take (not hex) sits beside good ones: the
    good ones are still placed (before, the cache manager raised first and nothing was placed)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    shutil.copy(signed["url"].removeprefix("sqlite:///"), tmp_path / "store.sqlite3")
    specs, bins = rows(url, signed["source_hash"])
    target, v = next(iter(specs.items()))
    bad_key = "Z" * 64
    good = next(b for b in bins if b.ext == "cubin")
    s = open_store(url)
    s.put_specs(
        signed["kernel"],
        signed["source_hash"],
        target,
        [for_binary(dataclasses.replace(v[0], kernel_hash=bad_key))],  # its own spec (hash) for that key
    )
    s.put_binaries(signed["kernel"], signed["source_hash"], [dataclasses.replace(good, triton_key=bad_key)])
    r = place(url, tmp_path / "cache")
    assert r["loaded"] == 4 and r["compiles_at_preload"], r
    assert all(c["cache_hit"] for c in r["compiles_at_preload"]), r["compiles_at_preload"]
    assert any("not placed" in w and "64 hex" in w for w in r["warnings"]), r["warnings"]
