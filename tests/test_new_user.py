"""What a new user hit (issue 38): each check through the real CLI or real processes, on SQLite and
the real PostgreSQL where a store is involved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import fill
from realcli import tc

from tunecache.store.opening import open_store

HERE = Path(__file__).parent


def _count(url: str) -> int:
    s = open_store(url, readonly=True)
    try:
        return len(s.find_problems())
    finally:
        s.engine.dispose()


# ---- 38.1: Ctrl-C after an import committed says so ------------------------------------------


def test_ctrl_c_after_the_import_committed_says_it_committed(store_url, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, 3)
    export = tmp_path / "e.jsonl"
    assert tc("--url", src, "export", str(export)).returncode == 0
    assert tc("--url", store_url, "db", "upgrade").returncode == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, str(HERE / "interrupt_after_commit.py"), "--url", store_url, "import", str(export)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert _count(store_url) == 3  # the import committed before the Ctrl-C
    assert "Traceback" not in r.stderr and r.returncode == 130, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing imported" not in lines[0], r.stderr
    assert lines[0].startswith("tunecache: interrupted") and "committed" in lines[0], r.stderr
    assert "3 problems" in lines[0], r.stderr


# ---- 38.3: a serving worker on a read-only store says so once, and spools its misses ---------

TUNED, SERVED = [64, 128], [64, 128, 256, 512]


def _tuned(url: str) -> None:
    from processes import run_procs

    (r,) = run_procs("warm", 1, url=url, sizes=TUNED)
    assert r["stats"]["misses"] == len(TUNED), r["stats"]


def _read_only(kind: str, url: str, tmp_path: Path, roles: dict | None) -> str:
    """The store at ``url`` as a serving worker sees it: a reader role, or a file mode 444."""
    if kind == "pg":
        from tunecache.store.engine import resolve_url

        assert tc("--url", url, "db", "grant", "--reader", roles["reader"]).returncode == 0
        return resolve_url(url).set(username=roles["reader"], password=None).render_as_string(hide_password=False)
    path = Path(url.removeprefix("sqlite:///"))
    path.chmod(0o444)
    return url


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_default_mode_on_a_read_only_store_says_so_once_and_spools_the_misses(kind, request, tmp_path):
    from processes import run_procs

    url = request.getfixturevalue("sqlite_url" if kind == "sqlite" else "pg_url")
    roles = request.getfixturevalue("roles") if kind == "pg" else None
    _tuned(url)
    ro = _read_only(kind, url, tmp_path, roles)
    (r,) = run_procs("warm", 1, url=ro, sizes=SERVED)  # the default mode: readwrite
    s = r["stats"]
    assert s["hits"] == len(TUNED) and s["misses"] == len(SERVED) - len(TUNED), s
    said = [ln for ln in r["stderr"].splitlines() if "read-only" in ln]
    assert len(said) == 1, r["stderr"][-3000:]
    assert "TUNECACHE_MODE=offline" in said[0] and "tunecache warm" in said[0], said
    # the misses are where `tunecache misses` finds them
    m = tc("--url", ro, "misses", "--json")
    assert m.returncode == 0, m.stderr
    got = json.loads(m.stdout)
    assert len(got) == len(SERVED) - len(TUNED), got
    assert {x["recorded"] for x in got} == {"spool"} and {x["reason"] for x in got} == {"readonly"}, got
    assert len(open_store(url).find_problems()) == len(TUNED)  # nothing written


# ---- 38.4: a store the image marks read-only is read-only for root too ----------------------


@pytest.mark.parametrize("marked", ["file 444", "directory 555"])
def test_a_store_marked_read_only_is_read_only_for_root_too(marked, tmp_path):
    d = tmp_path / "image"
    d.mkdir()
    path = d / "store.sqlite3"
    url = f"sqlite:///{path}"
    fill(url, 3)
    if marked == "file 444":
        path.chmod(0o444)
    else:
        d.chmod(0o555)
    try:
        before = sorted(p.name for p in d.iterdir())
        stat = path.stat()
        r = tc("--url", url, "gc", "--older-than", "0s")
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 1 and "read-only" in r.stderr, (os.geteuid(), r.returncode, r.stdout, r.stderr)
        assert tc("--url", url, "ls").returncode == 0
        assert tc("--url", url, "info").returncode == 0
        assert sorted(p.name for p in d.iterdir()) == before  # no WAL or shm file written
        assert path.stat().st_mtime_ns == stat.st_mtime_ns
    finally:
        d.chmod(0o755)
        path.chmod(0o644)
    assert _count(url) == 3


# ---- 38.5: import creates no directory, and a failed import leaves nothing --------------------


def _interrupted_import(url: str, export: Path, at: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TC_INTERRUPT_AT": at}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(HERE / "interrupt_after_commit.py"), "--url", url, "import", str(export)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _export(tmp_path: Path, n: int = 3) -> Path:
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, n)
    export = tmp_path / "e.jsonl"
    assert tc("--url", src, "export", str(export)).returncode == 0
    return export


def test_import_into_a_directory_that_does_not_exist_creates_nothing(tmp_path):
    export = _export(tmp_path)
    target = tmp_path / "no" / "such" / "dir"
    r = tc("--url", f"sqlite:///{target / 'store.sqlite3'}", "import", str(export))
    assert "Traceback" not in r.stderr and r.returncode == 1, (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert line.startswith("tunecache: error: ") and "does not exist" in line and "mkdir" in line, line
    assert not (tmp_path / "no").exists()


def test_an_import_into_a_new_store_interrupted_or_failed_leaves_nothing(tmp_path):
    export = _export(tmp_path)
    d = tmp_path / "new"
    d.mkdir()
    url = f"sqlite:///{d / 'store.sqlite3'}"
    r = _interrupted_import(url, export, "insert")
    assert r.returncode == 130 and "nothing imported" in r.stderr, (r.returncode, r.stderr)
    assert list(d.iterdir()) == []  # no empty store, no .migrate.lock, no WAL
    # a file that fails to import (its signature is not trusted): nothing either
    bad = tmp_path / "bad.jsonl"
    bad.write_text(export.read_text().replace('"configs"', '"config"', 1))
    r = tc("--url", url, "import", str(bad))
    assert r.returncode == 1, r.stderr
    assert list(d.iterdir()) == []
    # interrupted after the commit: the new store is kept, with what was imported
    r = _interrupted_import(url, export, "commit")
    assert r.returncode == 130 and "committed" in r.stderr, (r.returncode, r.stderr)
    assert _count(url) == 3


# ---- 38.6 / 35.9: the trust state is visible, and a bad key file is one line at start ---------


def _keys(tmp_path: Path) -> dict:
    (tmp_path / "k").mkdir()
    r = tc("keygen", str(tmp_path / "k" / "build"), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_info_shows_the_trusted_keys_the_signing_key_and_whether_the_store_is_trusted_and_why(tmp_path, pg_url):
    k = _keys(tmp_path)
    env = {"TUNECACHE_TRUSTED_KEYS": k["public_key"], "TUNECACHE_SIGNING_KEY": k["private_key"]}
    private = tmp_path / "mine"
    private.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    for u in (f"sqlite:///{private / 's.sqlite3'}", f"sqlite:///{shared / 's.sqlite3'}", pg_url):
        assert tc("--url", u, "db", "upgrade").returncode == 0
    r = tc("--url", f"sqlite:///{private / 's.sqlite3'}", "info", "--json", env=env)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["trust"]
    assert t["trusted_keys"] == [{"key_id": k["key_id"], "from": k["public_key"]}], t
    assert t["signing_key"] == {"path": k["private_key"], "key_id": k["key_id"], "error": None}, t
    assert t["store_trusted"] is True and "only" in t["why"], t
    r = tc("--url", f"sqlite:///{shared / 's.sqlite3'}", "info", "--json", env=env)
    t = json.loads(r.stdout)["trust"]
    assert t["store_trusted"] is False and str(shared) in t["why"] and "writable" in t["why"], t
    r = tc("--url", pg_url, "info", "--json", env={"TUNECACHE_TRUSTED_KEYS": None, "TUNECACHE_SIGNING_KEY": None})
    t = json.loads(r.stdout)["trust"]
    assert t["trusted_keys"] == [] and t["signing_key"] is None and t["store_trusted"] is False, t
    assert "not a SQLite file" in t["why"], t
    # the text form: the same, in lines a user reads
    r = tc("--url", f"sqlite:///{shared / 's.sqlite3'}", "info", env=env)
    assert r.returncode == 0, r.stderr
    assert f"trusted keys: {k['key_id']}" in r.stdout and f"signing key:  {k['key_id']}" in r.stdout, r.stdout
    assert "store trusted as a whole: no" in r.stdout, r.stdout
    # a key file that does not exist: info says so, in its place
    r = tc("--url", pg_url, "info", "--json", env={"TUNECACHE_TRUSTED_KEYS": str(tmp_path / "gone.pub")})
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["trust"]
    assert "gone.pub" in t["trusted_keys_error"], t


def _start(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


@pytest.mark.parametrize("how", ["start-up hook", "install()"])
@pytest.mark.parametrize("var", ["TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY"])
def test_a_key_file_that_cannot_be_read_is_one_line_at_start(how, var, tmp_path):
    gone = tmp_path / "gone.key"
    if how == "start-up hook":
        r = _start("import triton", {"TUNECACHE_INSTALL": "1", var: str(gone)})
    else:
        r = _start("import tunecache; tunecache.install()", {var: str(gone)})
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if var in ln]
    assert len(said) == 1 and str(gone) in said[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_refused_store_says_why_and_a_host_storing_unsigned_rows_is_told(tmp_path, monkeypatch, caplog):
    import logging

    remote_cache = pytest.importorskip("torch._inductor.remote_cache")
    from tunecache import trust
    from tunecache.inductor.backend import backend_cls
    from tunecache.inductor.entries import InductorStore

    graph = {"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}  # what FxGraphCache puts (JSON)

    def fx(entries: InductorStore):  # Inductor's own FX graph cache, with tunecache as its backend
        monkeypatch.setattr(remote_cache.RemoteFxGraphCache, "backend_override_cls", backend_cls("fx_graph", entries))
        return remote_cache.RemoteFxGraphCache("tc-test-v1")

    for var in ("TUNECACHE_TRUST_STORE", "TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY"):
        monkeypatch.delenv(var, raising=False)
    trust.reset_warnings()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    store = open_store(f"sqlite:///{shared / 's.sqlite3'}")
    try:
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            fx(InductorStore(store)).put("g", graph)
            unsigned = [r.getMessage() for r in caplog.records if "unsigned" in r.getMessage()]
            assert len(unsigned) == 1 and "TUNECACHE_SIGNING_KEY" in unsigned[0], unsigned
            caplog.clear()
            assert fx(InductorStore(store)).get("g") is None
        (refused,) = [r.getMessage() for r in caplog.records if "no trusted key signed" in r.getMessage()]
        assert str(shared) in refused and "writable" in refused and "TUNECACHE_TRUST_STORE" in refused, refused
    finally:
        store.close()


# ---- 38.7: a log-scale axis of the report reads as numbers, not TeX ---------------------------


def test_report_log_scale_labels_are_numbers_not_raw_math_text(sqlite_url, tmp_path):
    pytest.importorskip("matplotlib")
    from builders import H200, SOURCE

    from tunecache.configidentity import config_hash_of
    from tunecache.identity import canonical_key, problem_digest
    from tunecache.model import ConfigResult, Problem

    store = open_store(sqlite_url)
    cfg = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 2, "num_ctas": 1, "maxnreg": None, "pre_hook": None}
    for i, ms in enumerate((0.01, 0.05, 0.3, 2.0, 15.0)):  # winner times spanning 1500x: a log scale
        key = canonical_key(["N"], [1 << (10 + i)])
        p = Problem(problem_digest(SOURCE, H200, key), "tests.add", SOURCE, H200, key, 1 << (10 + i))
        store.put(p, [ConfigResult(config_hash_of(cfg), cfg, "ok", ms, ms * 0.9, ms * 1.1, 25)])
    store.close()
    out = tmp_path / "r.html"
    r = tc("--url", sqlite_url, "report", "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "mathdefault" not in page and "10^{" not in page, page[page.find("mathdefault") - 300 :][:600]


# ---- 38.8: what the README says of torch.compile's local caches is what Inductor does ---------


def _compile(tmp_path: Path, name: str, url: str) -> dict:
    from processes import run_json

    env = {
        "TUNECACHE_URL": url,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
        "TUNECACHE_INDUCTOR": "1",
        "TUNECACHE_INSTALL": "1",
    }
    return run_json(["inductor_prog.py"], env=env, timeout=600)


def test_a_store_hit_of_torch_compile_is_fetched_again_at_the_next_start_as_the_readme_says(sqlite_url, tmp_path):
    pytest.importorskip("torch._inductor.remote_cache")
    readme = (HERE.parent / "README.md").read_text()
    first = _compile(tmp_path, "a", sqlite_url)
    assert first["tunecache"].get("inductor_puts", 0) >= 1, first
    fresh = _compile(tmp_path, "b", sqlite_url)  # another host's empty local caches: served by the store
    assert fresh["fxgraph_cache_hit"] == 1 and fresh["tunecache"].get("inductor_hits", 0) >= 1, fresh
    again = _compile(tmp_path, "b", sqlite_url)  # the same host again: Inductor kept nothing of the hit locally
    assert again["fxgraph_cache_hit"] == 1 and again["tunecache"].get("inductor_hits", 0) >= 1, again
    assert "a hit from the store is written to" not in readme
    assert "not written to its local caches" in readme and "every start of a host fetches" in readme
    assert "CPU figures" in readme
