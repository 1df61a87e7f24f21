"""Image pre-population: import at build time (no GPU), serve hits from a read-only root filesystem;
a store written any way is whole in its one file, so it may be made read-only or copied alone
(issue 44)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from builders import fill
from click.testing import CliRunner
from processes import run, run_json
from realcli import tc

from tunecache.cli import main

HERE = Path(__file__).parent

SERVE = """
    import json, tinykernels, tunecache
    from tunecache.store import store as st
    writes = []
    orig = st.Store._write
    def spy(self, what):
        writes.append(what)
        return orig(self, what)
    st.Store._write = spy
    k = tinykernels.make_add()
    winners = [str(tinykernels.launch(k, n)) for n in (64, 200)]
    tunecache.flush()
    print(json.dumps({"stats": tunecache.stats(), "writes": writes, "winners": winners}))
"""


def child(code: str, env: dict) -> dict:
    """A serving process: a restart (no tunecache state), from the warm pool."""
    return run_json(["-c", textwrap.dedent(code)], env)


@pytest.mark.parametrize("mode", ["offline", "readonly"])
def test_build_time_import_then_read_only_image_serves_hits(tmp_path, make_readonly, mode):
    # 1. A tuning machine tunes and exports.
    tuned = f"sqlite:///{tmp_path / 'tuner.sqlite3'}"
    first = child(SERVE, {"TUNECACHE_URL": tuned})
    assert first["stats"]["benchmarks"] > 0
    bundle = tmp_path / "tuned.jsonl.gz"
    r = CliRunner().invoke(main, ["--url", tuned, "export", str(bundle)])
    assert r.exit_code == 0, r.output
    # 2. The image build (no GPU) imports into the image's store.
    image_db = tmp_path / "image" / "store.sqlite3"
    image_db.parent.mkdir()  # as docs/images.md's recipe: import creates the store, not its directory
    r = CliRunner().invoke(main, ["--url", f"sqlite:///{image_db}", "import", str(bundle)])
    assert r.exit_code == 0, r.output
    # 3. Run time: read-only root filesystem.
    ro = make_readonly([image_db])
    served = child(SERVE, {"TUNECACHE_URL": f"sqlite:///{ro / 'store.sqlite3'}", "TUNECACHE_MODE": mode})
    s = served["stats"]
    assert s["benchmarks"] == 0 and s["hits"] == 2 and s["store_errors"] == 0
    assert served["writes"] == []  # not even attempted
    assert served["winners"] == first["winners"]
    assert sorted(os.listdir(ro)) == ["store.sqlite3"]


def test_warm_command_calls_a_modules_warmup(tmp_path, sqlite_url):
    mod = tmp_path / "mywarm.py"
    mod.write_text(
        textwrap.dedent("""
        import tinykernels
        def warmup(progress=None):
            k = tinykernels.make_add()
            out = {}
            for n in (32, 64):
                out[n] = str(tinykernels.launch(k, n))
                if progress:
                    progress(n, 0.0)
            return out
    """)
    )
    sys.path.insert(0, str(tmp_path))
    try:
        r = CliRunner().invoke(main, ["--url", sqlite_url, "warm", "mywarm", "--json"])
    finally:
        sys.path.remove(str(tmp_path))
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["buckets"] == 2 and out["stats"]["benchmarks"] > 0
    r = CliRunner().invoke(main, ["--url", sqlite_url, "warm", "no_such_module_xyz"])
    assert r.exit_code == 1 and "cannot import" in r.output


# ---- issue 44.1: whole in its one file, however it was written --------------------------------

KEYS = (64, 200)
# A kernel that a daemon thread still references as the process exits (a serving framework's
# background loop, a C extension's registry): its store is never garbage-collected, so its SQLite
# connection was never closed and the rows stayed in the log.
TUNE = f"""
    import threading, time, tinykernels
    k = tinykernels.make_add()
    threading.Thread(target=lambda k=k: time.sleep(3600), daemon=True).start()
    for n in {KEYS!r}:
        tinykernels.launch(k, n)
"""
# Pool workers (fork) leave by os._exit: no atexit, no garbage collection.
POOL = f"""
    import multiprocessing as mp, tinykernels
    def tune(n):
        return str(tinykernels.launch(tinykernels.make_add(), n))
    with mp.get_context("fork").Pool(2) as pool:
        print(pool.map(tune, {KEYS!r}))
"""
WARM = f"""
    import threading, time, tinykernels
    def warmup(progress=None):
        k = tinykernels.make_add()
        threading.Thread(target=lambda k=k: time.sleep(3600), daemon=True).start()
        for n in {KEYS!r}:
            tinykernels.launch(k, n)
"""
# One process serves each read-only form of the store (argv: their URLs), offline.
SERVE_EACH = f"""
    import json, sys, tinykernels, tunecache
    from tunecache.store.opening import open_store
    out = {{}}
    for url in sys.argv[1:]:
        before = tunecache.stats()
        k = tinykernels.make_add(store=url)
        for n in {KEYS!r}:
            tinykernels.launch(k, n)
        now = tunecache.stats()
        s = open_store(url, create=False)
        out[url] = {{k: now[k] - before[k] for k in ("hits", "benchmarks", "store_errors", "offline_fallbacks")}}
        out[url]["problems"] = len(s.find_problems())
        s.engine.dispose()
    print(json.dumps(out))
"""


def _run(code: str, url: str) -> None:
    """A tuning process, from the warm pool: it ends as Python does (its atexit handlers, its daemon
    threads left running), which is what the store must be whole after."""
    r = run(["-c", textwrap.dedent(code)], {"TUNECACHE_URL": url}, cwd=str(HERE))
    assert r.returncode == 0, r.stderr[-3000:]


def _written(way: str, path: Path, tmp_path: Path) -> int:
    """Write the store at ``path`` the way named, the way's command last; returns the problems it holds."""
    url = f"sqlite:///{path}"
    if way == "tuning process":
        _run(TUNE, url)
    elif way == "pool worker":
        _run(POOL, url)
    elif way == "warm":
        (tmp_path / "heldwarm.py").write_text(textwrap.dedent(WARM))
        r = tc("--url", url, "warm", "heldwarm", cwd=tmp_path, pool=True)
        assert r.returncode == 0, r.stderr[-3000:]
    elif way == "import":
        src = tmp_path / "tuner.sqlite3"
        _run(TUNE, f"sqlite:///{src}")
        assert tc("--url", f"sqlite:///{src}", "export", str(tmp_path / "t.jsonl")).returncode == 0
        r = tc("--url", url, "import", str(tmp_path / "t.jsonl"))
        assert r.returncode == 0, r.stderr[-3000:]
    else:  # a command that writes an existing store, after a tuning process left it
        fill(url, 3)  # problems of another target, to delete
        cutoff = dt.datetime.now(dt.timezone.utc).isoformat()
        _run(TUNE, url)
        args = {
            "gc": ["gc", "--older-than", cutoff],
            "invalidate": ["invalidate", "--device", "NVIDIA H200"],
            "db upgrade": ["db", "upgrade"],
        }[way]
        r = tc("--url", url, *args)
        assert r.returncode == 0, r.stderr[-3000:]
        return 2 + (3 if way == "db upgrade" else 0)
    return 2


def _read_only_forms(path: Path, tmp_path: Path, make_readonly) -> dict[str, Path]:
    """The store as an image ships it: its directory copied with the file 444 (a writable
    directory), or with the directory 555; the main file copied alone, read-only."""
    forms = {}
    for form in ("file 444", "directory 555"):
        d = tmp_path / form.replace(" ", "-")
        shutil.copytree(path.parent, d, ignore=shutil.ignore_patterns("*.migrate.lock"))
        (d / path.name).chmod(0o444)
        if form == "directory 555":
            d.chmod(0o555)
        forms[form] = d / path.name
    forms["main file alone"] = make_readonly([path]) / path.name
    return forms


@pytest.mark.parametrize("way", ["tuning process", "pool worker", "warm", "import", "gc", "invalidate", "db upgrade"])
def test_a_store_written_any_way_serves_read_only_from_its_one_file(way, tmp_path, make_readonly):
    store = tmp_path / "built" / "store.sqlite3"
    store.parent.mkdir()
    n = _written(way, store, tmp_path)
    forms = _read_only_forms(store, tmp_path, make_readonly)
    listed = {f: sorted(os.listdir(p.parent)) for f, p in forms.items()}
    try:
        out = child(
            SERVE_EACH.replace("sys.argv[1:]", repr([f"sqlite:///{p}" for p in forms.values()])),
            {"TUNECACHE_MODE": "offline"},
        )
    finally:
        (tmp_path / "directory-555").chmod(0o755)
    for form, p in forms.items():
        got = out[f"sqlite:///{p}"]
        assert got == {"hits": 2, "benchmarks": 0, "store_errors": 0, "offline_fallbacks": 0, "problems": n}, (
            form,
            got,
        )
        assert sorted(os.listdir(p.parent)) == listed[form], form  # nothing written beside it
    assert sorted(os.listdir(store.parent)) in (["store.sqlite3"], ["store.sqlite3", "store.sqlite3.migrate.lock"])
