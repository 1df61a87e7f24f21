"""The store's rows of torch.compile's entries in a fleet (issue 35, items 4-6; issue 43).

- Each signer keeps its own entry of a key: a host that trusts no key (a dev box on the fleet's
  store) puts its own beside the fleet's, never evicting them, and the two sides never evict each
  other (real processes with their own TUNECACHE_HOST_ID).
- ``export --inductor`` reads the entries in bounded pages, as it reads problems and binaries.
- ``invalidate --driver RELEASE`` and ``--driver-not-current`` select entries by driver release,
  through the real command, and the entries' count is always said; never an entry or a problem
  bound to no driver (a host module: issue 43, item 5), and the run says how many it kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import warmpool

pytest.importorskip("torch._inductor.remote_cache")

from realcli import tc  # noqa: E402

from tunecache.inductor import entries as inductor_entries  # noqa: E402
from tunecache.inductor.entries import InductorStore  # noqa: E402
from tunecache.process import counters, writeback  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.trust import signing, trust  # noqa: E402

HERE = Path(__file__).parent
SETTINGS = ("TUNECACHE_TRUST_STORE", "TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY", "TUNECACHE_INDUCTOR")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    for var in SETTINGS:
        monkeypatch.delenv(var, raising=False)
    inductor_entries.inductor_target.cache_clear()
    trust.reset_warnings()
    counters.reset_warnings()
    yield
    inductor_entries.inductor_target.cache_clear()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("keys")
    return {k: signing.keygen(d / k) for k in ("fleet", "other")}


@pytest.fixture
def store(store_url: str):
    with contextlib.closing(open_store(store_url)) as s:
        yield s


# ---- a hit's use is recorded off the compile's path --------------------------------------------


def test_a_hit_is_served_without_waiting_for_the_store_to_record_it(store, monkeypatch):
    """A hit's use (``used_at``, ``hit_count``: what gc keeps by) is written by the deferred writes:
    a store whose writes wait (a fleet's puts of megabytes hold its write lock) never delays the
    bytes a fresh host's compile waits for; the use lands at the next flush."""
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")  # unsigned entries, served as on a trusted store
    entries = InductorStore(store)
    entries.put("fx_graph", "k", b"graph")
    real, release = store.touch_inductor, threading.Event()

    def waits(*args):
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(store, "touch_inductor", waits)
    t = time.monotonic()
    assert entries.get("fx_graph", "k") == b"graph"
    assert time.monotonic() - t < 5, "the hit waited for the store to record it"
    release.set()
    writeback.flush()
    assert [e["hit_count"] for e in store.list_inductor()] == [1]


# ---- item 4: an untrusted put never evicts a signed entry ------------------------------------


def host(url: str, name: str, env: dict[str, str], **args) -> subprocess.Popen:
    """tests/inductor_put_prog.py as host ``name`` of a fleet sharing store ``url`` (a shared store:
    trusted by signature only, as PostgreSQL is). Forked from the warm pool's Inductor server (it
    imports Inductor's remote caches first thing): it compiles nothing, so its local Inductor cache
    directory is the pool's, where it writes nothing; what it is served comes from the store alone."""
    full = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    full.update(
        TUNECACHE_URL=url,
        TUNECACHE_HOST_ID=name,
        TUNECACHE_TRUST_STORE="no",
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p),
        **env,
    )
    argv = [str(HERE / "inductor_put_prog.py"), json.dumps({"host": name, **args})]
    return warmpool.popen(argv, full, inductor=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen) -> tuple[dict, str]:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_a_host_that_trusts_no_key_never_evicts_the_fleets_signed_entries(store, keys, tmp_path, monkeypatch):
    """A dev box (no signing key, no trusted key) on the fleet's store, started with a fleet host:
    it is never served the fleet's entries (it trusts none) and puts its own, each in its own
    (unsigned) slot, beside the fleet's: neither evicts the other's; a fresh fleet host is then served
    every entry the first host made (issue 43: each signer keeps its own row)."""
    fleet = {
        "TUNECACHE_SIGNING_KEY": keys["fleet"]["private_key"],
        "TUNECACHE_TRUSTED_KEYS": keys["fleet"]["public_key"],
    }
    graphs = [f"graph-{i}" for i in range(4)]
    done = tmp_path / "fleet-a.done"
    start_at = time.time() + 4
    store_url = store.url.render_as_string(hide_password=False)
    a = host(store_url, "fleet-a", fleet, keys=graphs, rounds=3, start_at=start_at, done=str(done))
    dev = host(store_url, "dev-box", {}, keys=graphs, rounds=3, start_at=start_at, last_round_after=str(done))
    (ra, _), (rd, dev_err) = result(a), result(dev)
    # fleet-a computed each graph once; its later rounds were served its own entries, never evicted.
    assert ra["computed"] == 4 and ra["served"] == ["fleet-a"] * 8, ra
    # Another fleet host (this process, through Inductor's own cache class) is served every graph.
    from torch._inductor.remote_cache import RemoteFxGraphCache

    from tunecache.inductor.backend import backend_cls

    for k, v in {**fleet, "TUNECACHE_TRUST_STORE": "no", "TUNECACHE_HOST_ID": "fleet-b"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(RemoteFxGraphCache, "backend_override_cls", backend_cls("fx_graph", InductorStore(store)))
    served = [RemoteFxGraphCache("tc-fleet-v1").get(k) for k in graphs]
    assert served == [{"by": "fleet-a", "round": 0}] * 4, served  # the fleet's entries are all there
    # The dev box compiled everything itself, stored every put (its own slot), and said once why it
    # was served nothing.
    assert rd["served"] == [] and rd["computed"] == 12 and rd["stats"]["inductor_puts"] == 12, rd
    said = [ln for ln in dev_err.splitlines() if "no trusted key signed" in ln]
    assert len(said) == 1, dev_err[-3000:]
    rows = store.list_inductor()
    per_graph = sorted((r["key"].split("::")[1].split(":")[0], bool(r["signed"])) for r in rows)  # pt2:...::KEY:c1
    assert per_graph == sorted((g, s) for g in graphs for s in (False, True)), per_graph


def put(entries: InductorStore, monkeypatch, signer: str | None, value: bytes, key: str = "k") -> None:
    if signer is None:
        monkeypatch.delenv("TUNECACHE_SIGNING_KEY", raising=False)
    else:
        monkeypatch.setenv("TUNECACHE_SIGNING_KEY", signer)
    entries.put("fx_graph", key, value)


def slot_of(public_key_file: str) -> str:
    return signing.key_slot(signing.parse_public(Path(public_key_file).read_text(), "key"))


def stored(store, key: str = "k", slot: str | None = None) -> bytes:
    entry = store.get_inductor("fx_graph", key, inductor_entries.inductor_target()[0], None if slot is None else [slot])
    return entry.value


def test_a_put_replaces_its_own_signers_entry_never_another_signers(store, keys, monkeypatch):
    """The rule, put by put (issue 43): each signer's put replaces that signer's entry (last writer
    wins, as in Inductor's Redis) and no other's; no put is refused; a host that trusts the fleet's
    key is served the fleet's entry whatever else is stored."""
    entries, fleet, other = InductorStore(store), keys["fleet"]["private_key"], keys["other"]["private_key"]
    put(entries, monkeypatch, None, b"unsigned-1")
    put(entries, monkeypatch, None, b"unsigned-2")
    assert stored(store, slot="") == b"unsigned-2"
    put(entries, monkeypatch, fleet, b"fleet-1")
    put(entries, monkeypatch, fleet, b"fleet-2")
    fleet_slot = slot_of(keys["fleet"]["public_key"])
    assert stored(store, slot=fleet_slot) == b"fleet-2" and stored(store, slot="") == b"unsigned-2"
    put(entries, monkeypatch, None, b"unsigned-3")
    put(entries, monkeypatch, other, b"other-1")
    assert stored(store, slot=fleet_slot) == b"fleet-2"  # neither replaced the fleet's entry
    assert stored(store, slot="") == b"unsigned-3" and stored(store, slot=slot_of(keys["other"]["public_key"]))
    assert counters.stats()["inductor_puts"] == 6
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["fleet"]["public_key"])
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    assert InductorStore(store).get("fx_graph", "k") == b"fleet-2"


def test_an_import_adds_each_line_to_its_signers_entry_never_replacing_anothers(store_url, keys, tmp_path, monkeypatch):
    from tunecache.exchange import export, import_

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")  # the export writes every entry it holds
    src = open_store(f"sqlite:///{tmp_path / 'src.sqlite3'}")
    made = InductorStore(src)
    put(made, monkeypatch, None, b"unsigned", "g1")
    put(made, monkeypatch, keys["other"]["private_key"], b"by-other", "g2")
    put(made, monkeypatch, None, b"new", "g3")
    export(src, tmp_path / "x.jsonl", with_inductor=True)
    src.close()
    fleet_slot = slot_of(keys["fleet"]["public_key"])
    with contextlib.closing(open_store(store_url)) as dst:
        mine = InductorStore(dst)
        put(mine, monkeypatch, keys["fleet"]["private_key"], b"fleet-1", "g1")
        put(mine, monkeypatch, keys["fleet"]["private_key"], b"fleet-2", "g2")
        monkeypatch.delenv("TUNECACHE_SIGNING_KEY")
        s = import_(dst, tmp_path / "x.jsonl", with_inductor=True, trust_unsigned=True, on_conflict="replace")
        assert s.inductor_new == 3  # each line in its own signer's slot
        assert (stored(dst, "g1", fleet_slot), stored(dst, "g2", fleet_slot)) == (b"fleet-1", b"fleet-2")
        assert (stored(dst, "g1", ""), stored(dst, "g3", "")) == (b"unsigned", b"new")


# ---- item 5: export --inductor reads its entries in bounded pages -----------------------------


def test_an_export_of_entries_reads_them_in_bounded_pages(store, tmp_path, monkeypatch):
    """PostgreSQL's driver fetches a query's whole result into the client: one query for every entry
    held the table in memory (RSS +603 MiB for 256 MiB of entries). Each query that reads entries'
    bytes must return a bounded number of them: at most 50, and at most 8 MiB (one entry if larger)."""
    import sqlalchemy as sa

    from tunecache.exchange import export
    from tunecache.problem.model import InductorEntry

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    digest, desc = inductor_entries.inductor_target()
    small = [InductorEntry("autotune", f"k{i}", digest, b"%d" % i * 100, desc) for i in range(130)]
    big = [InductorEntry("fx_graph", f"g{i}", digest, os.urandom(3 << 20), desc) for i in range(6)]
    for e in small + big:
        store.put_inductor(e)
    reads: list[tuple[str, int]] = []

    def seen(conn, cursor, statement, params, context, executemany) -> None:
        if "inductor_entries.signature" in statement:  # a query of whole rows (not of their keys and sizes)
            reads.append((statement, cursor.rowcount))

    sa.event.listen(store.engine, "after_cursor_execute", seen)
    try:
        out = export(store, tmp_path / "x.jsonl", with_inductor=True)
    finally:
        sa.event.remove(store.engine, "after_cursor_execute", seen)
    assert out["inductor_entries"] == 136
    # Pages, not one query for all: 130 small ones by 50, 6 of 3 MiB by at most 2 (8 MiB).
    assert len(reads) >= 5, [n for _, n in reads]
    if store.dialect == "postgresql":  # the rows each query brought into the client at once
        held = [n for _, n in reads]
        assert sum(held) == 136 and max(held) <= 50, held


# ---- item 6: invalidate selects entries by driver release -------------------------------------


def put_on(entries: InductorStore, monkeypatch, release: str, key: str) -> None:
    """Store an entry as a host with CUDA driver 13000 and driver release ``release`` would."""
    monkeypatch.setenv("TUNECACHE_TARGET_OVERRIDE", json.dumps({"driver_version": "13000", "driver_release": release}))
    inductor_entries.inductor_target.cache_clear()
    entries.put("fx_graph", key, b"graph of " + key.encode())
    monkeypatch.delenv("TUNECACHE_TARGET_OVERRIDE")
    inductor_entries.inductor_target.cache_clear()


def test_invalidate_selects_entries_by_driver_release_and_always_says_their_count(store_url, store, monkeypatch):
    """A driver update that keeps the CUDA driver version (580.95.05 -> 580.159.04, both 13000):
    the tuner's problems of the old release go with the entries."""
    from dataclasses import replace

    from builders import H200, problem, results

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    entries = InductorStore(store)
    put_on(entries, monkeypatch, "580.95.05", "old")
    put_on(entries, monkeypatch, "580.159.04", "new")
    store.put(problem(1, replace(H200, driver_release="580.95.05")), results())
    store.put(problem(2, H200), results())  # 580.159.04
    assert sorted(r["driver_release"] for r in store.list_inductor()) == ["580.159.04", "580.95.05"]

    def invalidate(*args: str, release: str | None = None) -> subprocess.CompletedProcess:
        env = {"TUNECACHE_TARGET_OVERRIDE": json.dumps({"driver_version": "13000", "driver_release": release})}
        r = tc("--url", store_url, "invalidate", *args, env=env if release else None)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    def selected(*args: str, release: str | None = None) -> tuple[list[str], list[str]]:
        gone = json.loads(invalidate("--json", *args, release=release).stdout)
        keys = [p["batch_bucket"] for p in gone["problems"]]
        return sorted(e["key"] for e in gone["inductor"]["entries"]), sorted(keys)

    assert selected("--driver", "580.95.05", "--dry-run") == (["old"], [1])
    assert selected("--driver", "13000", "--dry-run") == (["new", "old"], [1, 2])
    assert selected("--driver-not-current", "--dry-run", release="580.159.04") == (["old"], [1])
    assert selected("--driver-not-current", "--dry-run", release="580.95.05") == (["new"], [2])
    # The count is said whatever it is (0 included), and a --kernel filter says it selects none.
    assert "0 torch.compile cache entries would be deleted" in invalidate("--arch", "sm80", "--dry-run").stdout
    assert "0 torch.compile cache entries" in invalidate("--kernel", "m.k", "--dry-run").stdout
    r = invalidate("--driver", "580.95.05")
    assert "1 torch.compile cache entries deleted" in r.stdout, r.stdout
    assert [r["key"] for r in store.list_inductor()] == ["new"]


def test_a_driver_filter_keeps_what_is_bound_to_no_driver_and_says_so(store_url, store, monkeypatch):
    """Issue 43, item 5: host modules (Triton's C extensions, bound to the machine and Triton, not to a
    driver: driver_version "") were selected by ``--driver-not-current`` (every "" differs from the
    current driver) and deleted, and every fresh host rebuilt them. No driver filter selects an entry
    or a problem bound to no driver; the run says how many it kept."""
    from dataclasses import replace

    from builders import H200, problem, results

    from tunecache.inductor.entries import host_target
    from tunecache.inductor.tritoncache import KIND

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    entries = InductorStore(store)
    put_on(entries, monkeypatch, "580.95.05", "old")
    entries.put(KIND, "c0ffee" * 10 + "abcd", b"cuda_utils of this machine", host_target())  # a host module
    assert sorted(r["driver_version"] for r in store.list_inductor()) == ["", "13000"]
    store.put(problem(1, replace(H200, driver_release="580.95.05")), results())
    store.put(problem(2, replace(H200, driver_version="", driver_release="")), results())  # bound to no driver

    def invalidate(*args: str, release: str = "580.159.04") -> subprocess.CompletedProcess:
        env = {"TUNECACHE_TARGET_OVERRIDE": json.dumps({"driver_version": "13000", "driver_release": release})}
        r = tc("--url", store_url, *args, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    got = json.loads(invalidate("--json", "invalidate", "--driver-not-current", "--dry-run").stdout)
    assert [e["key"] for e in got["inductor"]["entries"]] == ["old"], got  # not the host module
    assert [p["batch_bucket"] for p in got["problems"]] == [1], got
    assert got["kept_driver_independent"] == {"problems": 1, "inductor": 1}, got
    got = json.loads(invalidate("--json", "invalidate", "--driver-not-current", "--arch", "sm90", "--dry-run").stdout)
    assert got["kept_driver_independent"] == {"problems": 1, "inductor": 0}, got  # what the other filters select
    for driver in ("13000", "580.95.05"):
        got = json.loads(invalidate("--json", "invalidate", "--driver", driver, "--dry-run").stdout)
        assert "c0ffee" not in json.dumps(got["inductor"]) and 2 not in [p["batch_bucket"] for p in got["problems"]]
        assert got["kept_driver_independent"] == {"problems": 1, "inductor": 1}, got
    said = invalidate("invalidate", "--driver-not-current", "--dry-run").stdout
    assert "kept 1 problem(s) and 1 torch.compile cache entries bound to no driver" in said, said
    assert "kept_driver_independent" not in invalidate("--json", "invalidate", "--arch", "sm80", "--dry-run").stdout
    said = invalidate("invalidate", "--driver-not-current").stdout
    assert "1 torch.compile cache entries deleted" in said and "kept 1 problem(s) and 1" in said, said
    assert [r["driver_version"] for r in store.list_inductor()] == [""]  # the host module survived
    assert [p.batch_bucket for p in store.find_problems()] == [2]


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mysql_url"])
def test_the_stores_driver_filters_never_select_rows_bound_to_no_driver(db, request, monkeypatch):
    """The filter layer itself, on every backend: ``not_driver`` and ``driver`` leave rows whose
    driver version is "" alone (problems and torch.compile entries), ``no_driver`` selects them."""
    from dataclasses import replace

    from builders import H200, problem, results

    from tunecache.inductor.entries import host_target

    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    with contextlib.closing(open_store(request.getfixturevalue(db))) as s:
        entries = InductorStore(s)
        put_on(entries, monkeypatch, "580.95.05", "old")
        entries.put("triton_kernel", "ab" * 32, b"a host module", host_target())
        s.put(problem(1, replace(H200, driver_version="12080", driver_release="550.1")), results())
        s.put(problem(2, replace(H200, driver_version="", driver_release="")), results())
        current = ("13000", "580.159.04")
        for driver in ("12080", "550.1", ""):  # "": no driver filter at all, as the CLI passes it
            assert sorted(p.batch_bucket for p in s.find_problems(driver=driver)) == ([1] if driver else [1, 2])
        assert [r["key"] for r in s.list_inductor(driver="13000")] == ["old"]
        assert [p.batch_bucket for p in s.delete(not_driver=current, dry_run=True)] == [1]
        assert [g["key"] for g in s.delete_inductor(not_driver="12080", dry_run=True)] == ["old"]
        assert [p.batch_bucket for p in s.find_problems(no_driver=True)] == [2]
        assert [r["key"] for r in s.list_inductor(no_driver=True)] == ["ab" * 32]
        assert [p.batch_bucket for p in s.delete(not_driver=current)] == [1]
        assert [g["key"] for g in s.delete_inductor(not_driver="12080")] == ["old"]
        assert [p.batch_bucket for p in s.find_problems()] == [2]
        assert [r["key"] for r in s.list_inductor()] == ["ab" * 32]


def test_an_entry_line_written_before_the_driver_release_was_recorded_still_imports():
    import base64
    import hashlib

    from tunecache.exchange.validate import Invalid, check_inductor

    target = {"backend": "cuda", "arch": "sm90", "device_name": "NVIDIA H200", "driver_version": "13000"}
    target |= {"torch_version": "2.11.0", "triton_version": "3.6"}
    line = {"cache": "fx_graph", "key": "k", "target_digest": "ab" * 32, "target": target}
    line |= {"sha256": hashlib.sha256(b"g").hexdigest(), "value": base64.b64encode(b"g").decode(), "signature": None}
    assert check_inductor(line, None).target.get("driver_release", "") == ""
    assert check_inductor({**line, "target": {**target, "driver_release": "580.159.04"}}, None)
    with pytest.raises(Invalid, match="target"):
        check_inductor({**line, "target": {**target, "driver_relase": "580.159.04"}}, None)
