"""What a new user hit (issues 38 and 44): each check through the real CLI or real processes, on
SQLite and the real PostgreSQL where a store is involved."""

from __future__ import annotations

import json
import os
import re
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
    # 44.5: a line a user reads at every start, not a paragraph (it was ~560 characters)
    assert len(re.sub(r"\S+://\S+", "URL", said[0])) <= 250, (len(said[0]), said[0])
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
    from tunecache.inductor.backend import backend_cls
    from tunecache.inductor.entries import InductorStore
    from tunecache.trust import trust

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

    from tunecache.problem.configidentity import config_hash_of
    from tunecache.problem.identity import canonical_key, problem_digest
    from tunecache.problem.model import ConfigResult, Problem

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


# ---- 38.8: what docs/torch-compile.md says of its local caches is what Inductor does ---------


def _compile(tmp_path: Path, name: str, url: str) -> dict:
    from processes import run_json

    env = {
        "TUNECACHE_URL": url,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
        "TUNECACHE_INDUCTOR": "1",
        "TUNECACHE_INSTALL": "1",
    }
    return run_json(["inductor_prog.py"], env=env, timeout=600)


def test_a_store_hit_of_torch_compile_is_fetched_again_at_the_next_start_as_the_docs_say(sqlite_url, tmp_path):
    pytest.importorskip("torch._inductor.remote_cache")
    page = (HERE.parent / "docs" / "torch-compile.md").read_text()
    first = _compile(tmp_path, "a", sqlite_url)
    assert first["tunecache"].get("inductor_puts", 0) >= 1, first
    fresh = _compile(tmp_path, "b", sqlite_url)  # another host's empty local caches: served by the store
    assert fresh["fxgraph_cache_hit"] == 1 and fresh["tunecache"].get("inductor_hits", 0) >= 1, fresh
    again = _compile(tmp_path, "b", sqlite_url)  # the same host again: Inductor kept nothing of the hit locally
    assert again["fxgraph_cache_hit"] == 1 and again["tunecache"].get("inductor_hits", 0) >= 1, again
    assert "a hit from the store is written to" not in page
    assert "not written to its local caches" in page and "every start of a host fetches" in page
    assert "CPU figures" in page


# ==== issue 44 ================================================================================

# ---- 44.2: a missing optional dependency is one line naming what to install -------------------


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing each of ``modules`` fails as it does where it is not installed."""
    d = tmp_path / "without"
    for m in modules:
        (d / m).mkdir(parents=True)
        (d / m / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{m}'\", name='{m}')\n")
    return {"PYTHONPATH": str(d)}


MISSING = {
    "psycopg": (["--url", "postgresql://tunecache@127.0.0.1:1/none", "ls"], "pip install '.[postgres]'"),
    "pymysql": (["--url", "mysql://tunecache@127.0.0.1:1/none", "ls"], "pip install '.[mysql]'"),
    "matplotlib": (["report", "-o", "{tmp}/r.html"], "pip install '.[report]'"),
    "cryptography": (["keygen", "{tmp}/key"], "pip install '.[sign]'"),
    "numpy-demo": (["demo", "--buckets", "1"], "pip install numpy"),
    "numpy-warm": (["warm", "tunecache.kernels.sparse_decode"], "pip install numpy"),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_dependency_is_one_line_naming_what_to_install(case, sqlite_url, tmp_path):
    from realcli import one_line_error

    module = case.split("-")[0]
    args, hint = MISSING[case]
    fill(sqlite_url, 2)
    env = {**_without(tmp_path, module), "TUNECACHE_URL": sqlite_url}
    r = tc(*[a.format(tmp=tmp_path) for a in args], env=env)
    line = one_line_error(r)
    assert module in line and hint in line, line
    assert not (tmp_path / "key").exists()


# ---- 44.4: TUNECACHE_INDUCTOR=1 alone backs torch.compile's caches ----------------------------


def test_tunecache_inductor_alone_backs_torch_compile_and_leaves_triton_alone(tmp_path):
    pytest.importorskip("torch._inductor.remote_cache")
    prog = (
        "import json\n"
        "from torch._inductor import remote_cache\n"
        "import triton.runtime.autotuner as a\n"
        "b = remote_cache.RemoteFxGraphCache.backend_override_cls\n"
        "print(json.dumps([getattr(b, 'kind', None), hasattr(a.Autotuner.__init__, '__wrapped__')]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_INSTALL"}
    env.update(TUNECACHE_INDUCTOR="1", TUNECACHE_URL=f"sqlite:///{tmp_path / 's.sqlite3'}")
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["fx_graph", False], r.stderr[-2000:]


# ---- 44.5: info, misses, ls/stats, the migration lock -------------------------------------------


def test_info_of_a_read_only_file_says_read_only_not_that_this_user_can_write_it(tmp_path):
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    path = d / "s.sqlite3"
    fill(f"sqlite:///{path}", 1)
    path.chmod(0o444)
    try:
        r = tc("--url", f"sqlite:///{path}", "info", "--json", env={"TUNECACHE_TRUST_STORE": None})
        assert r.returncode == 0, r.stderr
        t = json.loads(r.stdout)["trust"]
    finally:
        path.chmod(0o644)
    assert t["store_trusted"] is True, t  # nobody else can change it: trusted as before
    assert "read-only" in t["why"] and "can write the SQLite file" not in t["why"], t["why"]


def test_info_counts_the_misses_that_misses_lists_spooled_ones_included(sqlite_url):
    from builders import problem

    from tunecache.tuner import missspool

    fill(sqlite_url, 2)
    store = open_store(sqlite_url)
    try:
        for i in (1, 2):
            assert missspool.append(problem(i), "readonly", store.masked_url)
    finally:
        store.close()
    listed = json.loads(tc("--url", sqlite_url, "misses", "--json").stdout)
    assert len(listed) == 2
    r = tc("--url", sqlite_url, "info", "--json")
    counts = json.loads(r.stdout)["counts"]
    assert counts["open_misses"] == len(listed) and counts["spooled_misses"] == 2, counts
    text = tc("--url", sqlite_url, "info").stdout
    assert re.search(r"open_misses=2\b.*2 .*spool", text), text


def test_info_on_a_machine_with_no_store_yet_shows_the_machine_and_creates_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'none' / 's.sqlite3'}"
    r = tc("--url", url, "info")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert re.search(r"^target:\s+[0-9a-f]{16}$", r.stdout, re.M) and "backend" in r.stdout, r.stdout
    assert "no store" in r.stdout and "tunecache db upgrade" in r.stdout, r.stdout
    out = json.loads(tc("--url", url, "info", "--json").stdout)
    assert out["store_exists"] is False and out["counts"] is None and out["target"]["backend"], out
    assert out["target_digest"] == json.loads(tc("--url", url, "info", "--json").stdout)["target_digest"]
    assert not (tmp_path / "none").exists()


def test_misses_with_nothing_to_list_says_so(sqlite_url):
    fill(sqlite_url, 1)
    r = tc("--url", sqlite_url, "misses")
    assert r.returncode == 0, r.stderr
    assert "DIGEST" not in r.stdout and r.stdout.startswith("no misses"), r.stdout
    assert json.loads(tc("--url", sqlite_url, "misses", "--json").stdout) == []


def test_ls_and_stats_name_a_kernel_alike(sqlite_url):
    from builders import problem, results

    store = open_store(sqlite_url)
    try:
        store.put(problem(1, kernel="__main__.add_kernel"), results())
        store.bump_stats({"__main__.add_kernel": {"hits": 3, "misses": 1, "benchmarks": 4}})
    finally:
        store.close()

    def kernel_column(text: str) -> list[str]:
        head, *rows = text.strip().splitlines()
        start = head.index("KERNEL")
        return [row[start:].split()[0] for row in rows if row.strip() and not row.startswith("kernels seen")]

    ls = kernel_column(tc("--url", sqlite_url, "ls").stdout)
    stats = kernel_column(tc("--url", sqlite_url, "stats").stdout)
    assert ls == stats == ["__main__.add_kernel"], (ls, stats)


def _lock_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".lock"))


def test_a_store_leaves_no_migration_lock_beside_it(tmp_path):
    from processes import run_procs

    one = tmp_path / "one"
    one.mkdir()
    assert tc("--url", f"sqlite:///{one / 's.sqlite3'}", "db", "upgrade").returncode == 0
    assert _lock_files(one) == []
    lib = tmp_path / "lib"
    lib.mkdir()
    open_store(f"sqlite:///{lib / 's.sqlite3'}").close()  # the library's first use migrates too
    assert _lock_files(lib) == []
    # four processes creating one store at once: each serves, and nothing is left beside it
    many = tmp_path / "many"
    many.mkdir()
    url = f"sqlite:///{many / 's.sqlite3'}"
    run_procs("warm", 4, url=url, sizes=[64])
    assert _lock_files(many) == [] and _count(url) == 1


# ---- 44.5: info and --help load neither torch nor Triton ---------------------------------------

PROBE = (
    "import json, sys\n"
    "from tunecache.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:], prog_name='tunecache')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "sys.stderr.write(json.dumps([code, sorted(m for m in ('torch', 'triton') if m in sys.modules)]) + '\\n')\n"
)


@pytest.mark.parametrize("interpret", ["", "1"], ids=["detect", "TRITON_INTERPRET"])
@pytest.mark.parametrize("args", [["--help"], ["info"], ["info", "--json"], ["info", "--no-store"]], ids=str)
def test_info_and_help_import_neither_torch_nor_triton(args, interpret, sqlite_url, tmp_path):
    fill(sqlite_url, 1)
    if args[-1] == "--no-store":  # a fresh machine
        args, url = ["info"], f"sqlite:///{tmp_path / 'none.sqlite3'}"
    else:
        url = sqlite_url
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TUNECACHE_URL=url, **({"TRITON_INTERPRET": interpret} if interpret else {}))
    r = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120)
    code, loaded = json.loads(r.stderr.strip().splitlines()[-1])
    assert code in (0, None) and loaded == [], (code, loaded, r.stderr[-2000:])


def test_the_machine_info_shows_is_the_target_the_tuner_detects(tmp_path):
    """``info`` reads the machine without torch: the same target (digest) a tuning process computes."""
    prog = (
        "import json\n"
        "from tunecache.problem import target\n"
        "cheap = target.machine_target()\n"
        "print(json.dumps([cheap.as_dict(), target.detect_target().as_dict()]))\n"
    )
    for interpret in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        if interpret:
            env["TRITON_INTERPRET"] = interpret
        r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        cheap, tuner = json.loads(r.stdout.strip().splitlines()[-1])
        assert cheap == tuner, (interpret, cheap, tuner)
