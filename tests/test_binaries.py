"""Binaries travel with the results, signed (issue 15): a fresh host compiles nothing.

Real sm90 binaries, compiled offline with Triton's own compiler (tests/binaries_roundtrip.py, as
tests/preload_roundtrip.py does), go through the store, a signed export and an import into an empty
Triton cache; Triton's compile of each winner's specialisation is then a cache hit. Every way a
binary could arrive altered or untrusted is refused, leaving the store unchanged.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import random
import shutil
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from healkernel_runs import kernel_module, run_phase
from processes import run_json
from realcli import cli_process, one_line_error

from tunecache import settings
from tunecache.binaries import binaries
from tunecache.cli import main
from tunecache.errors import ConfigurationError, ImportFormatError, SigningError, TunecacheError
from tunecache.exchange import import_
from tunecache.problem.model import Binary, binary_sha256
from tunecache.store.opening import open_store
from tunecache.trust import signing

TABLES = ("problems", "configs", "launch_specs", "binaries", "misses", "measurements")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store holding two tuned keys' winners with their sm90 binaries (and a companion's), and two
    key pairs: "trusted" and "other"."""
    d = tmp_path_factory.mktemp("built")
    url = f"sqlite:///{d / 'tuned.sqlite3'}"
    r = run_json(["binaries_roundtrip.py", "build"], env={"TRITON_CACHE_DIR": str(d / "cache"), "TUNECACHE_URL": url})
    keys = {k: signing.keygen(d / k) for k in ("trusted", "other")}
    return {**r, "dir": d, "url": url, "keys": keys}


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def ok(res: Any) -> Any:
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def snapshot(url: str) -> dict[str, Any]:
    """Every row of every table (sorted), as one comparable value."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        return {t: sorted(map(repr, c.execute(f"SELECT * FROM {t}"))) for t in TABLES}


def place(store_url: str, cache: Path, launchers: list[str] = ()) -> dict[str, Any]:
    env = {"TRITON_CACHE_DIR": str(cache), "TUNECACHE_URL": store_url, "LAUNCHERS": ",".join(launchers)}
    return run_json(["binaries_roundtrip.py", "place"], env=env)


def signed_export(built: dict[str, Any], path: Path, key: str = "trusted", *extra: str) -> Path:
    args = ["--url", built["url"], "export", str(path), "--binaries", *extra]
    if key:
        args += ["--sign", built["keys"][key]["private_key"]]
    ok(cli(*args))
    return path


def test_tunecache_computes_the_launcher_key_tritons_own_launcher_looks_up(built):
    """Up to Triton 3.6 a launcher is built with gcc per kernel signature and cached under a key of
    its C source; the key tunecache records a launcher under is the one Triton's CudaLauncher asks
    its cache for, for every compiled kernel (3.7+ builds none: tunecache records none)."""
    got = built["launchers"]
    assert len(got["ours"]) == 4 and got["ours"] == got["triton"]
    import triton.backends.nvidia.driver as nv

    if hasattr(nv, "make_launcher"):
        assert all(got["ours"]) and len(set(got["ours"])) == 2  # alignment is no part of it; merge's signature is
        # The tuning process keeps the launchers its winners and the companion need, with the binaries.
        assert built["host_modules_stored"] == sorted(set(got["ours"]))
    else:
        assert got["ours"] == [None] * 4 and built["host_modules_stored"] == []


def test_signed_binaries_round_trip_and_triton_then_compiles_nothing(built, tmp_path, monkeypatch):
    launchers = built["host_modules_stored"]  # Triton <= 3.6: add_one's and merge's launcher
    n = len(launchers)
    assert built["uploaded"] == 3 + n // 2 and built["uploaded_again"] == 0
    # The plain kernel Triton compiled (its jit_post_compile_hook) was filed, once, with the tuned kernel
    # the process resolved: no code named it. Its launcher (Triton <= 3.6) came with it.
    assert built["watching"] and built["companions"].count("binkernel.merge") == 1
    assert len(built["companions"]) == 1 + n // 2 + (n > 0)  # + cuda_utils and add_one's launcher
    assert built["heads"] == built["kernel_hashes"]  # every winner's binary, under Triton's own key
    export = signed_export(built, tmp_path / "tuned.jsonl.gz")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", built["keys"]["trusted"]["public_key"])
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    res = ok(cli("--url", fresh, "import", str(export), "--binaries"))
    assert f"{4 + n} binaries, {4 + n} added" in res.output
    assert f"signed by key {built['keys']['trusted']['key_id']}" in res.output

    r = place(fresh, tmp_path / "empty-triton-cache", launchers)
    # Triton's compile of every winner's specialisation and of the companion (the preload) found them in
    # its cache: not one compile.
    assert r["compiles"] and all(c["cache_hit"] for c in r["compiles"]), r["compiles"]
    everything = sorted({*built["kernel_hashes"], built["merge_hash"]})
    assert sorted({c["hash"] for c in r["compiles_at_preload"]}) == everything
    assert r["loaded"] == 4 and r["stats"]["preloaded"] == 4 and r["groups"] == 4
    assert r["cached"] == built["kernel_hashes"] and r["inits"] == everything
    # The companion sits in Triton's kernel cache before its first launch, which then loads nothing.
    assert r["merge_preloaded"] == [built["merge_hash"]]
    assert r["config_ids_memoised"] == 2  # both configs' identities, off the first launch
    assert r["cubins"] == built["cubins"]  # the very binaries compiled by the tuning process
    assert r["launchers_placed"] == launchers  # where this host's Triton looks before it runs gcc

    # The same start from the same results without the binaries compiles every one of them.
    plain = f"sqlite:///{tmp_path / 'plain.sqlite3'}"
    ok(cli("--url", plain, "import", str(export), "--launch-specs"))
    r = place(plain, tmp_path / "another-empty-cache")
    at_preload = r["compiles_at_preload"]
    assert len(at_preload) == 4 and not any(c["cache_hit"] for c in at_preload), at_preload
    assert r["loaded"] == 4 and r["cubins"] == built["cubins"]


def _rewrite_binary(url: str, key: str, change) -> None:
    """Edit one stored binary (as a writer with access to the database could)."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        row = c.execute("SELECT name, ext, triton_version, metadata, binary FROM binaries WHERE triton_key=?", (key,))
        name, ext, version, md, data = row.fetchone()
        new_key, md, data, recompute = change(key, bytes(md), bytes(data))
        digest = binary_sha256(new_key, name, ext, version, md, data) if recompute else None
        c.execute(
            "UPDATE binaries SET triton_key=?, metadata=?, binary=?, sha256=COALESCE(?, sha256) WHERE triton_key=?",
            (new_key, md, data, digest, key),
        )


def test_a_stored_binary_that_does_not_match_its_record_is_never_placed(built, tmp_path):
    store = tmp_path / "s.sqlite3"
    shutil.copy(built["url"].removeprefix("sqlite:///"), store)
    url = f"sqlite:///{store}"
    k_flip, k_wrong, k_other = built["kernel_hashes"]

    def flip(key: str, md: bytes, data: bytes):  # one byte of the cubin, its sha256 left as recorded
        return key, md, data[:200] + bytes([data[200] ^ 1]) + data[201:], False

    def wrong_key(key: str, md: bytes, data: bytes):  # another winner's binary filed under this key
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as c:
            other_md, other_data = c.execute(
                "SELECT metadata, binary FROM binaries WHERE triton_key=?", (k_other,)
            ).fetchone()
        return key, bytes(other_md), bytes(other_data), True  # a consistent record: only the key is wrong

    _rewrite_binary(url, k_flip, flip)
    _rewrite_binary(url, k_wrong, wrong_key)
    r = place(url, tmp_path / "cache")
    hit = {c["hash"]: c["cache_hit"] for c in r["compiles"]}
    assert hit[k_flip] is False and hit[k_wrong] is False  # refused: Triton compiled them itself
    assert hit[k_other] is True
    assert r["cubins"] == built["cubins"]  # what runs is what Triton compiles, never the altered bytes
    assert r["loaded"] == 4  # the three winners and the companion


# ---- import: every altered or untrusted file is refused, the store unchanged -----------------------


@pytest.fixture
def target(built, tmp_path, monkeypatch) -> str:
    """A store that already holds the problems (plain import), trusting the "trusted" key."""
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", built["keys"]["trusted"]["public_key"])
    url = f"sqlite:///{tmp_path / 'target.sqlite3'}"
    plain = tmp_path / "plain.jsonl"
    ok(cli("--url", built["url"], "export", str(plain)))
    ok(cli("--url", url, "import", str(plain), "--trust-unsigned"))  # the keys are set: unsigned needs saying so
    return url


def _refused(url: str, path: Path, *flags: str) -> str:
    before = snapshot(url)
    with pytest.raises(TunecacheError) as e:
        import_(
            open_store(url),
            path,
            with_binaries="--binaries" in flags,
            with_launch_specs="--launch-specs" in flags,
            trust_unsigned="--trust-unsigned" in flags,
        )
    assert snapshot(url) == before
    return str(e.value)


def test_a_flipped_byte_anywhere_is_refused_and_the_store_is_unchanged(built, target, tmp_path):
    good = signed_export(built, tmp_path / "good.jsonl").read_bytes()
    lines = good.split(b"\n")
    header_end, sig_start = len(lines[0]) + 1, len(good) - len(lines[-2]) - 1
    rnd = random.Random(15)
    positions = sorted(
        {*range(header_end), *range(sig_start, len(good)), *rnd.sample(range(header_end, sig_start), 150)}
    )
    for pos in positions:
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(good[:pos] + bytes([good[pos] ^ 0x01]) + good[pos + 1 :])
        _refused(target, bad, "--binaries")
    # The unaltered file imports.
    s = import_(open_store(target), tmp_path / "good.jsonl", with_binaries=True)
    assert s.binaries_new == 4 + len(built["host_modules_stored"])
    assert s.signed_by == built["keys"]["trusted"]["key_id"]


def _flipped(good: bytes, pos: int) -> bytes:
    """``good`` with one bit flipped at ``pos`` or the first position after it where the flip alters
    the file: some bits of a gzip stream decode to the same bytes (a member header's mtime and OS,
    unused bits of a deflate block; 79 of 9,659 positions in one export), and that file is the
    export unchanged, which import rightly accepts."""
    text = gzip.decompress(good)
    for p in range(pos, len(good)):
        bad = good[:p] + bytes([good[p] ^ 0x01]) + good[p + 1 :]
        try:
            if gzip.decompress(bad) == text:
                continue
        except (OSError, EOFError, zlib.error):
            pass
        return bad
    raise AssertionError(f"no flip from byte {pos} on alters the file")


def test_a_flipped_byte_in_a_compressed_file_and_a_cut_signature_are_refused(built, target, tmp_path):
    good = signed_export(built, tmp_path / "good.jsonl.gz").read_bytes()
    for pos in (len(good) // 3, len(good) // 2, len(good) - 30):
        bad = tmp_path / "bad.jsonl.gz"
        bad.write_bytes(_flipped(good, pos))
        _refused(target, bad, "--binaries")
    text = gzip.decompress(good)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(text[: text.rstrip(b"\n").rfind(b"\n") + 1])  # the signature line removed
    assert "signature line is missing" in _refused(target, cut, "--binaries")


def _resign(built: dict[str, Any], text: bytes, edit) -> bytes:
    """``text`` with its body lines edited by ``edit`` and the header's hash and signature made good
    again with the trusted key: only the checks of the content itself can refuse it."""
    lines = text.rstrip(b"\n").split(b"\n")
    header, body = orjson.loads(lines[0]), [orjson.loads(ln) for ln in lines[1:-1]]
    body = edit(body)
    body_bytes = b"".join(orjson.dumps(o) + b"\n" for o in body)
    header["body_sha256"] = hashlib.sha256(body_bytes).hexdigest()
    head = orjson.dumps(header) + b"\n"
    sig = signing.Signer(built["keys"]["trusted"]["private_key"]).sign(head)
    return head + body_bytes + orjson.dumps({"signature": sig}) + b"\n"


def test_a_binary_under_a_wrong_key_is_refused_even_when_signed(built, target, tmp_path):
    text = signed_export(built, tmp_path / "good.jsonl").read_bytes()

    def swap(body: list[dict[str, Any]]) -> list[dict[str, Any]]:
        bins = [o for o in body if "triton_key" in o]
        a, b = bins[0], bins[1]  # a's record keeps its key, takes b's binary and metadata
        a["metadata"], a["binary"] = b["metadata"], b["binary"]
        raw = base64.b64decode(a["binary"])
        a["sha256"] = binary_sha256(
            a["triton_key"], a["name"], a["ext"], a["triton_version"], a["metadata"].encode(), raw
        )
        return body

    bad = tmp_path / "wrong-key.jsonl"
    bad.write_bytes(_resign(built, text, swap))
    msg = one_line_error(cli_process("--url", target, "import", str(bad), "--binaries"))
    assert "metadata says Triton key" in msg, msg

    def traversal(body: list[dict[str, Any]]) -> list[dict[str, Any]]:
        a = next(o for o in body if "triton_key" in o)
        a["name"] = "../../evil"
        a["sha256"] = binary_sha256(
            a["triton_key"],
            a["name"],
            a["ext"],
            a["triton_version"],
            a["metadata"].encode(),
            base64.b64decode(a["binary"]),
        )
        return body

    bad.write_bytes(_resign(built, text, traversal))
    assert "is not a kernel name" in _refused(target, bad, "--binaries")


def test_unsigned_and_untrusted_files_are_refused_unless_trust_unsigned(built, target, tmp_path, monkeypatch):
    unsigned = signed_export(built, tmp_path / "unsigned.jsonl", "")
    other = signed_export(built, tmp_path / "other.jsonl", "other")
    for flag in ("--binaries", "--launch-specs"):
        msg = one_line_error(cli_process("--url", target, "import", str(unsigned), flag))
        assert "from an unsigned file" in msg and "--trust-unsigned" in msg, msg
        msg = one_line_error(cli_process("--url", target, "import", str(other), flag))
        assert f"signed by key {built['keys']['other']['key_id']}, which is not in TUNECACHE_TRUSTED_KEYS" in msg
    assert "unsigned file" in _refused(target, unsigned, "--binaries")
    assert "not in TUNECACHE_TRUSTED_KEYS" in _refused(target, other, "--binaries")
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")  # nothing trusted at all
    assert "not in TUNECACHE_TRUSTED_KEYS (empty)" in _refused(target, other, "--binaries")
    # A plain import (results only) of either file is fine; --trust-unsigned installs them.
    s = import_(open_store(target), unsigned, with_binaries=True, trust_unsigned=True)
    assert s.binaries_new == 4 + len(built["host_modules_stored"]) and s.signed_by is None


def test_keys_are_private_and_a_bad_trusted_key_entry_is_an_error(built, tmp_path, monkeypatch):
    k = built["keys"]["trusted"]
    assert Path(k["private_key"]).stat().st_mode & 0o777 == 0o600
    with pytest.raises(SigningError, match="exists"):
        signing.keygen(k["private_key"])
    pub = Path(k["public_key"]).read_text().strip()
    assert pub.startswith("tunecache-ed25519 ") and pub.endswith(k["key_id"])
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", f"{pub}, {built['keys']['other']['public_key']}")
    assert set(signing.trusted_keys()) == {k["key_id"], built["keys"]["other"]["key_id"]}
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(tmp_path / "missing.pub"))
    with pytest.raises(ConfigurationError, match="cannot read the public key file"):
        signing.trusted_keys()
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", "tunecache-ed25519 AAAA")
    with pytest.raises(ConfigurationError, match="not 32 bytes"):
        signing.trusted_keys()
    with pytest.raises(SigningError, match="not an unencrypted PEM"):
        signing.Signer(k["public_key"])


# ---- the checks, gc, limits, info and stats -------------------------------------------------------


def fake_binary(key: str, name: str = "k", ext: str = "cubin", size: int = 100, **md: Any) -> Binary:
    meta = json.dumps({"hash": key, "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, **md}).encode()
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    return Binary(key, binary_sha256(key, name, ext, "3.9.0", meta, data), name, ext, "3.9.0", meta, data)


def rekey(b: Binary, key: str) -> Binary:
    """``b`` filed under another key, its sha256 recomputed: a consistent record of the wrong key."""
    digest = binary_sha256(key, b.name, b.ext, b.triton_version, b.metadata, b.binary)
    return Binary(key, digest, b.name, b.ext, b.triton_version, b.metadata, b.binary)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda b: b, None),
        (lambda b: Binary(b.triton_key, b.sha256, "../x", b.ext, b.triton_version, b.metadata, b.binary), "name"),
        (lambda b: Binary(b.triton_key, b.sha256, b.name, b.ext, b.triton_version, b.metadata, b"x"), "sha256"),
        (lambda b: fake_binary("a" * 64, ext="hsaco"), "backend"),
        (lambda b: fake_binary("a" * 64, triton_version="3.8.0"), "Triton 3.8.0"),
        (lambda b: rekey(b, "b" * 64), "metadata says Triton key aaaa"),
    ],
)
def test_what_makes_a_binary_unplaceable(edit, why):
    b = edit(fake_binary("a" * 64))
    got = binaries.problems_of(b)
    assert (got is None) if why is None else (why in got), got


def test_gc_drops_the_binaries_no_winner_references(built, tmp_path):
    store_path = tmp_path / "s.sqlite3"
    shutil.copy(built["url"].removeprefix("sqlite:///"), store_path)
    url = f"sqlite:///{store_path}"
    s = open_store(url)
    s.put_binaries("k", "f" * 64, [fake_binary("e" * 64)])  # referenced by no launch spec
    assert len(s.binary_heads([*built["kernel_hashes"], built["merge_hash"], "e" * 64])) == 5
    res = ok(cli("--url", url, "gc", "--days", "100000", "--json"))
    assert json.loads(res.output)["binaries"]["triton_keys"] == ["e" * 64]
    # One key's problem goes (the 4096 bucket, winner 64/4w): its binary goes, the rest stays.
    big = [p for p in s.find_problems() if "4096" in p.key_json]
    s.delete(digests=[big[0].digest])
    gone = s.gc_binaries()
    assert len(gone) == 1 and gone[0][0] in built["kernel_hashes"]
    left = s.binary_heads([*built["kernel_hashes"], built["merge_hash"]])
    assert built["merge_hash"] in left and len(left) == 3  # the companion stays with its kernel's problems
    launchers = built["host_modules_stored"]  # companions too: they stay and go with the kernel's problems
    assert sorted(s.binary_heads(launchers)) == launchers
    s.delete(kernel=built["kernel"])
    assert len(s.gc_binaries()) == 3 + len(launchers) and s.binary_usage() == {}
    s.close()


def test_size_limits_per_binary_and_per_kernel(sqlite_url, monkeypatch, caplog):
    s = open_store(sqlite_url)
    bins = [fake_binary(f"{i:064x}", size=1000) for i in range(1, 5)]
    monkeypatch.setattr(binaries, "collect", lambda fn, keys: [b for b in bins if b.triton_key in set(keys)])
    specs = [type("S", (), {"kernel_hash": b.triton_key})() for b in bins]
    monkeypatch.setenv("TUNECACHE_BINARY_MAX_BYTES", "512")
    assert binaries.upload(s, None, "k", "f" * 64, specs) == 0
    assert "over TUNECACHE_BINARY_MAX_BYTES=512" in caplog.text
    monkeypatch.setenv("TUNECACHE_BINARY_MAX_BYTES", "2K")
    monkeypatch.setenv("TUNECACHE_KERNEL_BINARIES_MAX_BYTES", str(3 * bins[0].size))
    assert binaries.upload(s, None, "k", "f" * 64, specs) == 3  # the fourth would pass the kernel's limit
    monkeypatch.setenv("TUNECACHE_BINARIES", "0")
    s.gc_binaries()
    assert binaries.upload(s, None, "k", "f" * 64, specs) == 0
    monkeypatch.setenv("TUNECACHE_BINARY_MAX_BYTES", "3M")  # would not fit an export line
    with pytest.raises(ConfigurationError, match="between 1 byte and"):
        settings.get("TUNECACHE_BINARY_MAX_BYTES")


def test_info_and_stats_show_count_and_size(built):
    info = json.loads(ok(cli("--url", built["url"], "info", "--json")).output)
    size = info["binaries"]["bytes"]
    n = 4 + len(built["host_modules_stored"])  # the kernels', and up to Triton 3.6 their launchers
    assert info["binaries"]["count"] == n and size > 4 * 1000
    rows = json.loads(ok(cli("--url", built["url"], "stats", "--json")).output)
    assert [(r["kernel"], r["binaries"], r["binary_bytes"]) for r in rows] == [(built["kernel"], n, size)]
    assert "BINARIES" in ok(cli("--url", built["url"], "stats")).output


def test_import_format_error_for_a_signature_by_another_key_than_the_header_names(built, target, tmp_path):
    text = signed_export(built, tmp_path / "good.jsonl").read_bytes().rstrip(b"\n").split(b"\n")
    sig = orjson.loads(text[-1])
    sig["signature"]["key_id"] = built["keys"]["other"]["key_id"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([*text[:-1], orjson.dumps(sig)]) + b"\n")
    with pytest.raises(ImportFormatError, match="the header says"):
        import_(open_store(target), bad)  # a signed file is checked by every import, --binaries or not


@pytest.mark.sql_variants("the store's put, get and gc of binary rows: SQL alone, nothing of Triton's")
@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql"])
def test_the_store_keeps_binaries_byte_for_byte_on_every_backend(backend, request):
    url = request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url", "mysql": "mysql_url"}[backend])
    s = open_store(url)
    big = fake_binary("a" * 64, size=2 << 20)  # 2 MiB: MySQL's BLOB would stop at 64 KiB
    small = fake_binary("b" * 64)
    assert s.put_binaries("k", "f" * 64, [big, small]) == 2
    assert s.put_binaries("k", "f" * 64, [big]) == 0  # idempotent
    assert s.get_binaries(["a" * 64, "b" * 64, "c" * 64]) == [big, small]
    assert s.binary_heads(["a" * 64]) == {"a" * 64: ("k", "cubin", big.sha256)}
    assert s.binary_usage() == {"k": (2, big.size + small.size)}
    assert len(s.gc_binaries()) == 2 and s.get_binaries(["a" * 64]) == []
    s.close()


def test_a_signature_with_a_flipped_unused_base64_bit_is_refused(tmp_path):
    """The last character of a 64-byte signature's base64 carries 4 unused bits, which decoders
    ignore: flipped there, the signature still decoded to the same bytes and verified (seen as a
    flaky pass of the flipped-byte test above). Only the canonical spelling verifies."""
    signing.keygen(tmp_path / "k")
    head = b'{"format":"tunecache-export"}\n'
    sig = signing.Signer(tmp_path / "k").sign(head)
    assert signing.verify(sig, head)
    v = sig["value"]
    assert v.endswith("==")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = v[-3]
    flipped = alphabet[alphabet.index(last) ^ 0x01]
    forged = {**sig, "value": v[:-3] + flipped + "=="}
    assert base64.b64decode(forged["value"]) == base64.b64decode(v)  # the same bytes...
    assert not signing.verify(forged, head)  # ...but not the signature that was written


# ---- host modules: what Triton builds with gcc (its driver utilities; launchers up to 3.6) ------------

_MODULE_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(ANSWER); }
static PyMethodDef M[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "__triton_launcher", NULL, -1, M};
PyMODINIT_FUNC PyInit___triton_launcher(void) { return PyModule_Create(&D); }
"""


def test_a_host_module_travels_and_triton_loads_it_without_building_it(tmp_path, monkeypatch, sqlite_url):
    """A module Triton built with gcc on the tuning host (here a small one through Triton's own
    compile_module_from_src, as its launcher is) is found under the key tunecache computes, stored,
    placed into another host's empty Triton cache, and Triton then loads it there without building."""
    import triton.runtime.build as build

    from tunecache.binaries import hostmodules, preload

    src = _MODULE_C.replace("ANSWER", str(random.randrange(10**6)))  # a module no cache holds yet
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tuner-cache"))
    want = build.compile_module_from_src(src, "__triton_launcher").answer()
    key = hostmodules.module_key(src)
    if hasattr(build, "_get_cache_manager"):  # Triton 3.9 keys modules by their build flags too:
        # the 3.4-3.6 key does not find what it built, so tunecache computes none and records nothing.
        from triton.runtime.cache import get_cache_manager

        old = hashlib.sha256((src + build.platform_key()).encode()).hexdigest()
        assert get_cache_manager(old).get_file(f"__triton_launcher{hostmodules.ext_suffix()}") is None
        assert key is None and hostmodules.utils_key() is None
        return
    b = binaries.host_module(key, "__triton_launcher", preload.triton_version())
    assert b is not None  # Triton filed it under the key tunecache computes
    spec = binaries.host_module_spec(key, "__triton_launcher", preload.triton_version())
    assert binaries.problems_of(b) is None and b.ext == hostmodules.EXT
    store = open_store(sqlite_url)
    store.put_specs("k", "s" * 64, "t" * 64, [spec])
    store.put_binaries("k", "s" * 64, [b])

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-cache"))
    assert binaries.place(store, [spec]) == (1, 0)
    assert binaries.place(store, [spec]) == (0, 0)  # it is in the cache now: nothing read twice

    def no_compiler(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Triton built the module instead of loading the placed one")

    monkeypatch.setattr(build, "_build", no_compiler)
    assert build.compile_module_from_src(src, "__triton_launcher").answer() == want
    store.close()


def _host_record(**md_changes: Any) -> Binary:
    from tunecache.binaries import hostmodules

    key = "ab" * 32
    md = {**json.loads(hostmodules.metadata(key, "__triton_launcher")), **md_changes}
    raw = json.dumps(md).encode()
    return Binary(
        key,
        binary_sha256(key, "__triton_launcher", "so", "3.6.0", raw, b"\x7fELF"),
        "__triton_launcher",
        "so",
        "3.6.0",
        raw,
        b"\x7fELF",
    )


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"ext_suffix": "/../../evil.so"}, "extension suffix"),
        ({"ext_suffix": ".cpython-312-x86_64-linux-gnu.py"}, "extension suffix"),
        ({"platform": None}, "no platform"),
        ({"hash": "cd" * 32}, "Triton key"),
    ],
)
def test_what_makes_a_host_module_unplaceable(edit, why):
    assert binaries.problems_of(_host_record()) is None
    assert why in (binaries.problems_of(_host_record(**edit)) or "")


def test_only_the_modules_triton_builds_are_host_modules():
    b = _host_record()
    other = Binary(
        b.triton_key,
        binary_sha256(b.triton_key, "evil", "so", "3.6.0", b.metadata, b.binary),
        "evil",
        "so",
        "3.6.0",
        b.metadata,
        b.binary,
    )
    assert "not a module Triton builds" in (binaries.problems_of(other) or "")
    flipped = Binary(*[*vars(b).values()][:6], b"\x7fELG")  # a flipped byte: its sha256 no longer matches
    assert "does not match its sha256" in (binaries.problems_of(flipped) or "")


# ---- a comment edit: the first compile of a stored winner records its binary (issue 25, item 5) ------


def test_after_a_comment_edit_a_hit_records_its_winners_binary_so_the_fleet_stops_compiling(tmp_path):
    """Triton's key covers comments, tunecache's source hash does not: after a comment edit every stored
    problem still hits, but the stored spec and binary sit under the old Triton key. The first compile
    of a hit's winner (once per process) records its spec and binary under the new key; from then on a
    fresh host places and preloads them and compiles nothing."""
    url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    tuned = run_phase("tune", kernel_module(tmp_path / "v1", "in range"), tmp_path / "tuner-cache", url)
    assert tuned["stats"]["benchmarks"] == 2 and len(tuned["spec_kernel_hashes"]) == 1
    old = tuned["spec_kernel_hashes"]
    assert tuned["binaries"] == old

    edited = kernel_module(tmp_path / "v2", "the lanes inside N")
    r = run_phase("restart", edited, tmp_path / "host-b-cache", url)
    assert r["source_hash"] == tuned["source_hash"] and r["cache_key"] != tuned["cache_key"]
    assert r["stats"]["hits"] == 1 and r["stats"]["benchmarks"] == 0
    # The stored spec names the binary of the old text: the preload compiles it, finds another binary, drops it.
    assert r["loaded"] == 0 and r["stats"]["preload_skipped"] == 1
    new = r["launched"]
    assert len(new) == 1 and new != old
    compiled = [c for c in r["compiles_at_preload"] + r["compiles_at_launch"] if not c["cache_hit"]]
    assert [c["hash"] for c in compiled] == new  # the winner, compiled once on this host
    # ... and recorded: its spec and its binary, under this Triton's key, beside the old text's (issue 35, item 8).
    assert r["spec_kernel_hashes"] == sorted(old + new) and r["binaries"] == sorted(old + new)

    # A fresh host with the edited source: places the binary, preloads it, compiles nothing, skips nothing.
    fresh = run_phase("restart", edited, tmp_path / "host-c-cache", url)
    assert fresh["stats"]["hits"] == 1 and fresh["stats"]["benchmarks"] == 0
    assert fresh["loaded"] == 1 and fresh["stats"]["preload_skipped"] == 0
    assert fresh["compiles_at_preload"] == [{"hash": new[0], "cache_hit": True}]
    assert fresh["compiles_at_launch"] == [] and fresh["launched"] == new and fresh["inits"] == new
    assert fresh["spec_kernel_hashes"] == r["spec_kernel_hashes"]  # nothing left to record


def test_after_a_comment_edit_a_companions_new_binary_is_filed_beside_the_old_one(tmp_path):
    """A plain kernel launched beside the tuned one (a companion) also compiles to a new binary after a
    comment edit. The upgraded host files it with a spec of its own, beside the old text's (the two
    specs of one specialisation differ only in their binary): a fresh host of the new text then places
    and preloads it and compiles nothing (GPU run BD: 4 compiles per fresh upgraded host before)."""
    url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    v1 = kernel_module(tmp_path / "v1", "in range")
    tuned = run_phase("tune", v1, tmp_path / "tuner-cache", url, TC_COMPANION="1")
    assert tuned["stats"]["benchmarks"] == 2 and len(tuned["companion_launched"]) == 1
    assert set(tuned["companion_launched"]) <= set(tuned["spec_kernel_hashes"]) & set(tuned["binaries"])

    edited = kernel_module(tmp_path / "v2", "the lanes inside N")
    r = run_phase("restart", edited, tmp_path / "host-b-cache", url, TC_COMPANION="1")
    assert r["stats"]["benchmarks"] == 0 and r["companion_launched"] != tuned["companion_launched"]
    assert set(r["companion_launched"]) <= set(r["spec_kernel_hashes"]) & set(r["binaries"])

    fresh = run_phase("restart", edited, tmp_path / "host-c-cache", url, TC_COMPANION="1")
    assert fresh["stats"]["benchmarks"] == 0 and fresh["companion_launched"] == r["companion_launched"]
    assert [c for c in fresh["compiles_at_preload"] + fresh["compiles_at_launch"] if not c["cache_hit"]] == []
    assert fresh["spec_kernel_hashes"] == r["spec_kernel_hashes"]  # nothing left to record


def test_a_stored_winners_first_launch_finds_its_binary_placed_before_any_preload(tmp_path):
    """A fresh host whose first launch comes before its background prefetch or preload placed the
    stored binaries (no prefetch here; on the GPU, a module the prefetch could not hash yet) must not
    compile the winner the store holds: the first resolution from the store places them first (GPU
    run of 2026-12-06: the rolling upgrade's fresh hosts compiled the very binary placed a moment later)."""
    url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    v1 = kernel_module(tmp_path / "v1", "in range")
    tuned = run_phase("tune", v1, tmp_path / "tuner-cache", url, TC_COMPANION="1")
    fresh = run_phase("launch", v1, tmp_path / "fresh-cache", url, TC_COMPANION="1", TUNECACHE_PREFETCH="0")
    assert fresh["stats"]["hits"] == 1 and fresh["stats"]["benchmarks"] == 0 and fresh["compiles_at_preload"] == []
    assert fresh["launched"] and set(fresh["launched"]) <= set(tuned["spec_kernel_hashes"])
    assert [c for c in fresh["compiles_at_launch"] if not c["cache_hit"]] == []  # the winner and its companion


def test_a_comment_edit_records_nothing_from_a_process_that_must_not_write(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    tuned = run_phase("tune", kernel_module(tmp_path / "v1", "in range"), tmp_path / "tuner-cache", url)
    edited = kernel_module(tmp_path / "v2", "the lanes inside N")
    r = run_phase("restart", edited, tmp_path / "cache-readonly", url, TUNECACHE_MODE="readonly")
    assert r["stats"]["hits"] == 1 and r["stats"]["benchmarks"] == 0 and r["launched"] != tuned["spec_kernel_hashes"]
    assert r["spec_kernel_hashes"] == tuned["spec_kernel_hashes"] and r["binaries"] == tuned["binaries"]
    # TUNECACHE_BINARIES=0: the spec is recorded (a preload then loads the kernel early), not the binary.
    r = run_phase("restart", edited, tmp_path / "cache-nobin", url, TUNECACHE_BINARIES="0")
    assert r["spec_kernel_hashes"] == sorted(tuned["spec_kernel_hashes"] + r["launched"])
    assert r["binaries"] == tuned["binaries"]
