"""tunecache as the backend of torch.compile's remote caches (issue 28), on torch 2.13 (CPU).

The in-process tests drive Inductor's own cache classes (RemoteFxGraphCache, RemoteAutotuneCache...)
with the backend set through their ``backend_override_cls``, the seam tunecache uses; the
subprocess tests run a real ``torch.compile`` (tests/inductor_prog.py) in fresh processes with empty
local Inductor caches. Older torch versions are not run in CI (it has torch 2.13 only): see the
docs/torch-compile.md for which versions have the seam.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
remote_cache = pytest.importorskip("torch._inductor.remote_cache")

import tunecache  # noqa: E402
from tunecache.inductor import entries as inductor_entries  # noqa: E402
from tunecache.inductor.backend import backend_cls  # noqa: E402
from tunecache.inductor.entries import InductorStore  # noqa: E402
from tunecache.process import counters  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.trust import signing, trust  # noqa: E402

GRAPH = {"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}  # what FxGraphCache puts (JSON)
CONFIG = {"XBLOCK": 128, "num_warps": 4, "num_stages": 1, "configs_hash": "abc", "found_by_coordesc": False}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    for var in ("TUNECACHE_TRUST_STORE", "TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY", "TUNECACHE_INDUCTOR"):
        monkeypatch.delenv(var, raising=False)
    inductor_entries.inductor_target.cache_clear()
    trust.reset_warnings()
    yield
    inductor_entries.inductor_target.cache_clear()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {k: signing.keygen(d / k) for k in ("builder", "attacker")}


def cache(cls_name: str, kind: str, entries: InductorStore, monkeypatch: pytest.MonkeyPatch):
    """Inductor's cache class ``cls_name`` built as Inductor builds it, with tunecache as its backend."""
    cls = getattr(remote_cache, cls_name)
    monkeypatch.setattr(cls, "backend_override_cls", backend_cls(kind, entries))
    return cls("tc-test-v1")


@pytest.fixture
def store(sqlite_url: str):
    s = open_store(sqlite_url)
    yield s
    s.close()


def test_inductor_caches_get_miss_then_what_was_put_for_every_kind(store, monkeypatch):
    entries = InductorStore(store)
    for cls_name, kind, value in (
        ("RemoteFxGraphCache", "fx_graph", GRAPH),
        ("RemoteAOTAutogradCache", "aot_autograd", GRAPH),
        ("RemoteAutotuneCache", "autotune", CONFIG),
        ("RemoteBundledAutotuneCache", "bundled_autotune", {"k1": CONFIG}),
    ):
        c = cache(cls_name, kind, entries, monkeypatch)
        assert c.get("key-1") is None
        c.put("key-1", value)
        assert c.get("key-1") == value
        assert c.get("key-2") is None
    tunecache.flush()  # a hit's use is a deferred write (tunecache.process.writeback)
    counts = store.inductor_counts()
    assert {k: v["entries"] for k, v in counts.items()} == {
        "autotune": 1,
        "bundled_autotune": 1,
        "fx_graph": 1,
        "aot_autograd": 1,
        "triton_kernel": 0,  # tests/test_inductor_kernels.py
    }
    assert all(v["hits"] == 1 for k, v in counts.items() if k != "triton_kernel")
    s = inductor_entries.stats()
    assert (s["inductor_hits"], s["inductor_misses"], s["inductor_puts"]) == (4, 8, 4)


def test_the_backend_keeps_bytes_as_given_and_binds_them_to_the_target(store, monkeypatch):
    # Recorded under a driver (a CPU host has none, and a row bound to no driver is no driver's to delete).
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", '{"driver_version": "13000"}')
    inductor_entries.inductor_target.cache_clear()
    backend = backend_cls("fx_graph", InductorStore(store))()
    blob = bytes(range(256)) * 3  # not UTF-8, not JSON
    backend.put("pt2:fx-graph-v1::k:c1", blob)
    assert backend.get("pt2:fx-graph-v1::k:c1") == blob
    assert backend.get("pt2:autotune::k:c1") is None
    # Another driver (or torch, arch...): Inductor's key is the same, the entry is not served there.
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", '{"driver_version": "99999"}')
    inductor_entries.inductor_target.cache_clear()
    assert backend.get("pt2:fx-graph-v1::k:c1") is None
    gone = store.delete_inductor(not_driver="99999")
    assert [(g["kind"], g["key"]) for g in gone] == [("fx_graph", "pt2:fx-graph-v1::k:c1")]


def test_readonly_mode_serves_and_never_writes_offline_uses_no_store(store, monkeypatch):
    entries = InductorStore(store)
    c = cache("RemoteFxGraphCache", "fx_graph", entries, monkeypatch)
    c.put("stored", GRAPH)
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    assert c.get("stored") == GRAPH
    c.put("new", GRAPH)
    assert c.get("new") is None
    assert store.inductor_counts()["fx_graph"] == {
        "entries": 1,
        "bytes": len(
            store.get_inductor("fx_graph", "pt2:tc-test-v1::stored:c1", inductor_entries.inductor_target()[0]).value
        ),
        "hits": 0,
    }
    for mode in ("offline", "off"):
        monkeypatch.setenv("TUNECACHE_MODE", mode)
        assert c.get("stored") is None
        c.put("new", GRAPH)
    monkeypatch.delenv("TUNECACHE_MODE")
    assert c.get("new") is None and store.inductor_counts()["fx_graph"]["entries"] == 1


def test_a_store_outage_is_a_miss_and_a_dropped_put_never_an_exception(monkeypatch, caplog, store):
    monkeypatch.setenv("TUNECACHE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/none")  # nothing listens
    monkeypatch.setenv("TUNECACHE_CONNECT_TIMEOUT", "1")
    c = cache("RemoteFxGraphCache", "fx_graph", InductorStore(), monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert c.get("k") is None
        c.put("k", GRAPH)
        assert c.get("k") is None
    assert counters.stats()["store_errors"] >= 2
    said = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(said) == 2 and "get failed" in said[0] and "put failed" in said[1], said  # once each
    # A store closed under it (its file gone, its directory unwritable) is the same: a miss.
    pinned = InductorStore(store)
    c2 = cache("RemoteAutotuneCache", "autotune", pinned, monkeypatch)
    c2.put("k", CONFIG)
    Path(store.url.database).unlink()
    Path(store.url.database).mkdir()  # now a directory: every open fails
    store.engine.dispose()
    assert c2.get("k") is None
    c2.put("k2", CONFIG)


def test_compiled_graphs_are_served_only_when_a_trusted_key_vouches(store, keys, monkeypatch, caplog):
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")  # a shared store: trust by signature only
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["builder"]["public_key"])
    fx = cache("RemoteFxGraphCache", "fx_graph", InductorStore(store), monkeypatch)
    tune = cache("RemoteAutotuneCache", "autotune", InductorStore(store), monkeypatch)

    fx.put("unsigned", GRAPH)  # no TUNECACHE_SIGNING_KEY: stored unsigned
    tune.put("unsigned", CONFIG)
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["attacker"]["private_key"])
    fx.put("by-attacker", GRAPH)
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["builder"]["private_key"])
    fx.put("signed", GRAPH)
    fx.put("altered", GRAPH)
    fx.put("rehashed", GRAPH)

    # Alter two signed rows: one's bytes, and one's bytes with a matching sha256.
    evil = b'{"data": "ZXZpbA==", "time_taken_ms": 1}'
    db = sqlite3.connect(store.url.database)
    db.execute("UPDATE inductor_entries SET value = ? WHERE key LIKE '%::altered:%'", (evil,))
    import hashlib

    db.execute(
        "UPDATE inductor_entries SET value = ?, sha256 = ? WHERE key LIKE '%::rehashed:%'",
        (evil, hashlib.sha256(evil).hexdigest()),
    )
    db.commit()
    db.close()

    fresh = cache("RemoteFxGraphCache", "fx_graph", InductorStore(store), monkeypatch)  # a fresh policy
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert fresh.get("signed") == GRAPH
        for k in ("unsigned", "by-attacker", "altered", "rehashed"):
            assert fresh.get(k) is None, k
        # Autotune entries too: Inductor rebuilds a stored config it never generated (docs/torch-compile.md).
        assert cache("RemoteAutotuneCache", "autotune", InductorStore(store), monkeypatch).get("unsigned") is None
    assert counters.stats()["untrusted"] == 5
    warned = [r for r in caplog.records if "no trusted key signed" in r.getMessage()]
    assert len(warned) == 1

    # The same store trusted as a whole serves the unsigned graph, never the altered bytes.
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    whole = cache("RemoteFxGraphCache", "fx_graph", InductorStore(store), monkeypatch)
    assert whole.get("unsigned") == GRAPH
    assert whole.get("altered") is None


def put_as(entries: InductorStore, monkeypatch, driver: str, kind: str, key: str, value: bytes) -> None:
    """Store an entry as a process on a host with driver ``driver`` would."""
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", json.dumps({"driver_version": driver}))
    inductor_entries.inductor_target.cache_clear()
    entries.put(kind, key, value)
    monkeypatch.delenv("TUNECACHE_TARGET_OVERRIDE")
    inductor_entries.inductor_target.cache_clear()


def test_ls_info_stats_show_entries_and_invalidate_gc_drop_them(sqlite_url, monkeypatch):
    from click.testing import CliRunner

    from tunecache.cli import main

    def run(*args: str) -> str:
        r = CliRunner().invoke(main, ["--url", sqlite_url, *args])
        assert r.exit_code == 0, r.output
        return r.output

    s = open_store(sqlite_url)
    entries = InductorStore(s)
    put_as(entries, monkeypatch, "12080", "fx_graph", "pt2:fx-graph-v1::old:c1", b"x" * 10)
    put_as(entries, monkeypatch, "13000", "fx_graph", "pt2:fx-graph-v1::new:c1", b"y" * 20)
    put_as(entries, monkeypatch, "13000", "autotune", "pt2:autotune::k:c1", b"{}")
    listed = json.loads(run("ls", "--inductor", "--json"))
    assert sorted((r["kind"], r["driver_version"]) for r in listed) == [
        ("autotune", "13000"),
        ("fx_graph", "12080"),
        ("fx_graph", "13000"),
    ]
    assert "pt2:fx-graph-v1::old:c1" in run("ls", "--inductor")
    info = json.loads(run("info", "--json"))["inductor"]
    assert info["fx_graph"] == {"entries": 2, "bytes": 30, "hits": 0} and info["autotune"]["entries"] == 1
    assert "torch.compile entries: autotune=1 (2 bytes), bundled_autotune=0 (0 bytes), fx_graph=2" in run("stats")
    # A driver upgrade: what the old driver's hosts stored goes, the rest stays.
    assert "1 torch.compile cache entries would be deleted" in run("invalidate", "--driver", "12080", "--dry-run")
    gone = json.loads(run("invalidate", "--driver", "12080", "--json"))["inductor"]
    assert gone == {"count": 1, "entries": [{"cache": "fx_graph", "key": "pt2:fx-graph-v1::old:c1"}]}
    assert s.inductor_counts()["fx_graph"]["entries"] == 1
    assert json.loads(run("gc", "--older-than", "1d", "--json"))["inductor"]["count"] == 0
    assert json.loads(run("gc", "--older-than", "0m", "--json"))["inductor"]["count"] == 2
    assert sum(v["entries"] for v in s.inductor_counts().values()) == 0
    s.close()


def test_export_import_carry_entries_with_their_signatures(tmp_path, keys, monkeypatch):
    from tunecache.errors import UntrustedFileError
    from tunecache.exchange import export, import_

    src = open_store(f"sqlite:///{tmp_path / 'src.sqlite3'}")
    made = InductorStore(src)
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["builder"]["private_key"])
    made.put("fx_graph", "pt2:fx-graph-v1::signed:c1", b"graph-bytes")
    made.put("autotune", "pt2:autotune::k:c1", b'{"XBLOCK": 64}')
    monkeypatch.delenv("TUNECACHE_SIGNING_KEY")
    made.put("fx_graph", "pt2:fx-graph-v1::unsigned:c1", b"planted")
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["builder"]["public_key"])

    plain = export(src, tmp_path / "plain.jsonl")  # without --inductor: the file is what it was
    assert plain["version"] == 2 and plain["inductor_entries"] == 0
    signer = signing.Signer(keys["builder"]["private_key"])
    out = export(src, tmp_path / "x.jsonl.gz", with_inductor=True, signer=signer)
    assert (out["version"], out["inductor_entries"], out["untrusted"]) == (5, 2, 1)  # the unsigned graph left out

    dst = open_store(f"sqlite:///{tmp_path / 'dst.sqlite3'}")
    s = import_(dst, tmp_path / "x.jsonl.gz")  # entries validated, not added unless asked
    assert (s.inductor_entries, s.inductor_new) == (2, 0)
    s = import_(dst, tmp_path / "x.jsonl.gz", with_inductor=True)
    assert (s.inductor_entries, s.inductor_new, s.signed_by) == (2, 2, signer.key_id)
    fresh = InductorStore(dst)
    assert fresh.get("fx_graph", "pt2:fx-graph-v1::signed:c1") == b"graph-bytes"  # its row signature came along
    assert fresh.get("autotune", "pt2:autotune::k:c1") == b'{"XBLOCK": 64}'
    assert fresh.get("fx_graph", "pt2:fx-graph-v1::unsigned:c1") is None

    # An unsigned file may not bring compiled graphs, unless trusted like one's own store.
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    export(src, tmp_path / "unsigned.jsonl", with_inductor=True)
    other = open_store(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    with pytest.raises(UntrustedFileError, match="torch.compile entries"):
        import_(other, tmp_path / "unsigned.jsonl", with_inductor=True)
    assert import_(other, tmp_path / "unsigned.jsonl", with_inductor=True, trust_unsigned=True).inductor_new == 3
    for s_ in (src, dst, other):
        s_.close()


def test_an_fx_graph_over_4_mib_travels_and_only_the_entries_section_may_be_that_long(tmp_path, monkeypatch):
    """A max-autotune FX graph bundles its kernels' binaries: on the H200 two entries of the bench
    passed the 4 MiB of an export line and a host built from the export compiled everything."""
    from tunecache.errors import ImportFormatError
    from tunecache.exchange import MAX_LINE_BYTES, export, import_

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    src = open_store(f"sqlite:///{tmp_path / 'src.sqlite3'}")
    graph = os.urandom(MAX_LINE_BYTES)  # base64 in the line: 5.3 MiB
    InductorStore(src).put("fx_graph", "pt2:fx-graph-v1::big:c1", graph)
    out = export(src, tmp_path / "big.jsonl.gz", with_inductor=True)
    assert (out["inductor_entries"], out["inductor_too_large"]) == (1, 0)
    dst = open_store(f"sqlite:///{tmp_path / 'dst.sqlite3'}")
    assert import_(dst, tmp_path / "big.jsonl.gz", with_inductor=True, trust_unsigned=True).inductor_new == 1
    assert InductorStore(dst).get("fx_graph", "pt2:fx-graph-v1::big:c1") == graph

    # The header says which lines are entries: a line that long anywhere else is still refused.
    import gzip

    lines = gzip.decompress((tmp_path / "big.jsonl.gz").read_bytes()).split(b"\n")
    header = json.loads(lines[0])
    header["problems"], header["inductor_entries"] = 1, 0  # the same line, now where a problem goes
    bad = b"\n".join([json.dumps(header).encode(), *lines[1:]])
    (tmp_path / "bad.jsonl").write_bytes(bad)
    with pytest.raises(ImportFormatError, match="line 2: line longer than"):
        import_(dst, tmp_path / "bad.jsonl", with_inductor=True, trust_unsigned=True)
    src.close()
    dst.close()


def compile_in_fresh_process(tmp_path: Path, name: str, url: str, *, hook: bool, **env: str) -> dict:
    """tests/inductor_prog.py in a new process with empty local Inductor caches, on store ``url``;
    tunecache enabled by the start-up hook (``hook``) or by enable() in code."""
    from processes import run_json

    full = {
        "TUNECACHE_URL": url,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
        "TUNECACHE_INDUCTOR": "1",
        "TUNECACHE_INSTALL": "1" if hook else "0",
        **env,
    }
    return run_json(["inductor_prog.py"] + ([] if hook else ["--enable"]), env=full, timeout=600)


def test_torch_compile_in_a_fresh_process_gets_its_graph_from_a_shared_store_and_an_import(
    tmp_path, pg_url, keys, monkeypatch
):
    """A real torch.compile (CPU): one process compiles and fills a shared PostgreSQL store, signing
    what it makes; a second process, with empty local Inductor caches, gets the FX graph from the
    store (Inductor's own hit counter) and the same outputs; an export of that store, imported into
    a new SQLite file, does the same for a third (the fresh host of an image build)."""
    from tunecache.exchange import export, import_

    trusted = {"TUNECACHE_TRUSTED_KEYS": keys["builder"]["public_key"]}
    first = compile_in_fresh_process(
        tmp_path, "a", pg_url, hook=True, TUNECACHE_SIGNING_KEY=keys["builder"]["private_key"]
    )
    assert first["fx_backend"] == "TunecacheFxGraphBackend"  # the start-up hook set the seam
    assert first["fxgraph_cache_miss"] == 1 and first["tunecache"]["inductor_puts"] >= 1
    second = compile_in_fresh_process(tmp_path, "b", pg_url, hook=False, **trusted)
    assert second["fxgraph_cache_hit"] == 1 and second["fxgraph_cache_miss"] == 0, second
    assert second["tunecache"]["inductor_hits"] >= 1 and "untrusted" not in second["tunecache"]
    assert second["out"] == first["out"]

    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["builder"]["public_key"])
    shared = open_store(pg_url)
    assert shared.inductor_counts()["fx_graph"]["entries"] >= 1
    out = export(
        shared, tmp_path / "graphs.jsonl.gz", with_inductor=True, signer=signing.Signer(keys["builder"]["private_key"])
    )
    shared.close()
    assert out["inductor_entries"] >= 1 and out["untrusted"] == 0
    image = f"sqlite:///{tmp_path / 'image.sqlite3'}"
    store = open_store(image)
    assert import_(store, tmp_path / "graphs.jsonl.gz", with_inductor=True).inductor_new == out["inductor_entries"]
    store.close()
    third = compile_in_fresh_process(tmp_path, "c", image, hook=True, **trusted)
    assert third["fxgraph_cache_hit"] == 1 and third["out"] == first["out"], third


def test_enable_sets_the_seam_and_only_the_switches_left_unset_and_disable_undoes_it(monkeypatch):
    from torch._functorch import config as functorch_config
    from torch._inductor import config

    from tunecache.inductor import enable

    monkeypatch.setattr(config, "fx_graph_remote_cache", None)
    monkeypatch.setattr(config, "autotune_remote_cache", False)  # the user turned it off
    monkeypatch.setattr(config, "bundled_autotune_remote_cache", None)
    monkeypatch.setattr(functorch_config, "enable_remote_autograd_cache", None)
    for name in ("RemoteAutotuneCache", "RemoteBundledAutotuneCache", "RemoteFxGraphCache", "RemoteAOTAutogradCache"):
        monkeypatch.setattr(getattr(remote_cache, name), "backend_override_cls", None)
    try:
        assert enable.enable() == ["autotune", "bundled_autotune", "fx_graph", "aot_autograd"]
        assert remote_cache.RemoteFxGraphCache.backend_override_cls.kind == "fx_graph"
        assert remote_cache.RemoteAOTAutogradCache.backend_override_cls.kind == "aot_autograd"
        assert config.fx_graph_remote_cache is True and functorch_config.enable_remote_autograd_cache is True
        assert config.autotune_remote_cache is False
        assert config.bundled_autotune_remote_cache is None  # backed, not turned on (enable.SWITCHED_ON)
    finally:
        enable.disable()
    assert remote_cache.RemoteFxGraphCache.backend_override_cls is None
    assert config.fx_graph_remote_cache is None and functorch_config.enable_remote_autograd_cache is None


def test_the_start_up_hook_loads_no_inductor_until_the_process_does(tmp_path):
    import subprocess
    import sys

    prog = (
        "import sys, json, torch\n"
        "before = sorted(m for m in sys.modules if m.startswith(('torch._inductor', 'tunecache.inductor')))\n"
        "from torch._inductor import remote_cache\n"
        "b = remote_cache.RemoteFxGraphCache.backend_override_cls\n"
        "print(json.dumps({'before': before, 'backend': getattr(b, '__name__', None)}))\n"
    )
    env = {**os.environ, "TUNECACHE_INSTALL": "1", "TUNECACHE_INDUCTOR": "1"}
    env["TUNECACHE_URL"] = f"sqlite:///{tmp_path / 's.sqlite3'}"
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"before": [], "backend": "TunecacheFxGraphBackend"}


def test_what_the_hook_runs_does_nothing_unless_the_setting_says_so(monkeypatch):
    from tunecache.inductor import enable

    monkeypatch.setattr(remote_cache.RemoteFxGraphCache, "backend_override_cls", None)
    for value in (None, "0", "bogus"):  # unset, off, a typo (one warning, stock Inductor)
        if value is None:
            monkeypatch.delenv("TUNECACHE_INDUCTOR", raising=False)
        else:
            monkeypatch.setenv("TUNECACHE_INDUCTOR", value)
        enable.activate()
        assert remote_cache.RemoteFxGraphCache.backend_override_cls is None
