"""Image pre-population: import at build time (no GPU), serve hits from a read-only root filesystem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

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
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        cwd=str(HERE),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


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
    image_db.parent.mkdir()  # as the README's recipe: import creates the store, not its directory
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
