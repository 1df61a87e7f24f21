"""The package installs as a plain wheel: migrations ship inside and run from it."""

from __future__ import annotations

import json
import os
import re
import shlex
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


def _venv_lending_deps(where: Path) -> Path:
    """A venv that sees this one's dependencies (torch, triton...) but not its tunecache."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "lend-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_the_install_ships_the_startup_hook(tmp_path, editable):
    """``pip install tunecache`` (and ``pip install -e``, as scripts/_env.sh does) puts
    tunecache-install.pth in site-packages: with TUNECACHE_INSTALL=1 a process that never names
    tunecache has Triton's Autotuner hooked as soon as it imports Triton; unset, nothing is imported."""
    py = _venv_lending_deps(tmp_path / "venv")
    args = ["-e", str(ROOT)] if editable else [str(ROOT)]
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert (Path(site) / "tunecache-install.pth").read_text() == (ROOT / "tunecache-install.pth").read_text()
    probe = (
        "import sys, json; before = 'tunecache' in sys.modules; import triton.runtime.autotuner as a; "
        "import tunecache; "
        "print(json.dumps([before, hasattr(a.Autotuner.__init__, '__wrapped__'), tunecache.__file__]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for value, hooked in (("1", True), ("", False)):
        out = subprocess.run(
            [str(py), "-c", probe],
            env={**env, "TUNECACHE_INSTALL": value, "TRITON_INTERPRET": "1"},
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        before, patched, where = json.loads(out.stdout.strip().splitlines()[-1])
        assert before is False and patched is hooked, (value, out.stderr[-2000:])
        assert (str(ROOT) in where) if editable else (str(tmp_path / "venv") in where), where


PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def documented_cpu_install() -> list[list[str]]:
    """docs/getting-started.md's install lines for a machine without a GPU: the ``pip install`` lines
    of its code block that names PyTorch's CPU index, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "getting-started.md").read_text(), re.S)
    cpu = [b for b in blocks if PYTORCH_CPU_INDEX in b]
    assert cpu, "docs/getting-started.md has no install lines for a machine without a GPU (PyTorch's CPU index)"
    lines = [ln.split("#")[0].strip() for ln in cpu[0].splitlines()]
    return [shlex.split(ln) for ln in lines if ln.startswith("pip install")]


@pytest.mark.slow
def test_the_documented_install_lines_for_a_cpu_machine_work_in_a_fresh_venv(tmp_path):
    """Issue 44.2: a new user on a CPU machine runs the documented lines in a fresh venv, then the demo.
    PyPI and PyTorch's CPU index are stood in for by the packages on this disk (tests/localindex.py):
    nothing is fetched from the network, and the CUDA build of torch is on offer as on PyPI."""
    from localindex import local_indexes

    commands = documented_cpu_install()
    indexes = local_indexes(tmp_path / "indexes")
    if indexes is None:
        pytest.skip("no CPU build of torch on this disk (pip's find-links and file:// indexes)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("TRITON_INTERPRET", None)  # the demo finds there is no GPU itself, as for a user
    # pip as a fresh machine has it: PyPI (here its stand-in), no configuration file; no .pyc compiled (time)
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=indexes.pypi, PIP_NO_COMPILE="1", PIP_NO_INPUT="1")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    for cmd in commands:
        args = [indexes.pytorch_cpu if a == PYTORCH_CPU_INDEX else a for a in cmd[2:]]
        r = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, (cmd, r.stderr[-3000:])
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], env=env, capture_output=True, text=True
    )
    versions = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)}
    assert versions["torch"].endswith("+cpu"), versions  # not the CUDA build PyPI offers
    assert not [n for n in versions if n.startswith("nvidia-")], versions
    assert "numpy" in versions and "tunecache" in versions, versions
    r = subprocess.run(
        [str(venv / "bin" / "tunecache"), "demo", "--buckets", "1", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["device"].startswith("cpu") and out["runs"][1]["benchmarks"] == 0, out
