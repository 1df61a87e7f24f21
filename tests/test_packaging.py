"""The package installs as a plain wheel: migrations ship inside and run from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_install_then_db_upgrade(tmp_path, pg_url):
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # Lend this venv's dependencies (torch, triton, sqlalchemy...) through a .pth line; .pth files
    # inside that directory are not run, so this venv's editable tunecache stays invisible.
    new_site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(new_site, "lend-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(ROOT)], check=True, capture_output=True)
    where = subprocess.run(
        [
            str(py),
            "-c",
            "import tunecache, tunecache.migrations, tunecache.kernels; "
            "print(tunecache.__file__); print(tunecache.migrations.__file__)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.split()
    assert all(str(venv) in w for w in where), where  # not the checkout
    tc = venv / "bin" / "tunecache"
    for url in (f"sqlite:///{tmp_path / 'new' / 'store.sqlite3'}", pg_url):
        r = subprocess.run([str(tc), "--url", url, "db", "upgrade"], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([str(tc), "--url", url, "db", "current"], capture_output=True, text=True, cwd=tmp_path)
        assert r.stdout.strip().endswith("(head)"), r.stdout + r.stderr
        r = subprocess.run([str(tc), "--url", url, "info", "--json"], capture_output=True, text=True, cwd=tmp_path)
        assert json.loads(r.stdout)["counts"]["problems"] == 0
    # no generic top-level packages installed
    assert not (Path(new_site) / "kernels").exists() and not (Path(new_site) / "migrations").exists()
