"""The README's recipes, run as written (issue 26): what a newcomer copies must work. Real processes:
the ``tunecache`` console script, from a shell."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from realcli import tc

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

HOSTS = 3
# What each "host" tunes: three keys of a tiny kernel.
WARM = """
    import tinykernels
    def warmup(progress=None):
        k = tinykernels.make_add()
        for n in (32, 64, 128):
            tinykernels.launch(k, n)
"""


def block_after(marker: str) -> str:
    """The first fenced code block after ``marker`` in the README."""
    at = README.index(marker)
    m = re.search(r"```\w*\n(.*?)```", README[at:], re.S)
    assert m, f"no code block after {marker!r}"
    return m.group(1)


def test_multi_host_timings_on_one_machine_as_the_readme_says(tmp_path):
    script = block_after("Several hosts' timings on one machine")
    assert "TUNECACHE_HOST_ID" in script and "tunecache hosts" in script, script
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(WARM))
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p),
    }
    r = subprocess.run(["bash", "-ec", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # hosts exits 1 for an outlier: noise on a busy CPU
    assert "3 keys timed by more than one host" in r.stdout, r.stdout + r.stderr[-3000:]
    out = json.loads(tc("--url", f"sqlite:///{tmp_path / 'gpu-a.sqlite3'}", "hosts", "--json").stdout)
    assert sorted((h["host"], h["keys"]) for h in out["hosts"]) == [(f"gpu-{c}", 3) for c in "abc"[:HOSTS]], out


def test_installing_from_a_checkout_names_every_extra():
    text = block_after("Installing from a checkout")
    table = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = re.findall(r"^(\w+)\s*=", table, re.M)  # (no tomllib on Python 3.10)
    assert "postgres" in extras, extras
    assert "pip install -e ." in text, text
    section = README[README.index("Installing from a checkout") :].split("\n## ", 1)[0]
    for name in extras:
        assert f"[{name}]" in section or f"`{name}`" in section, f"extra {name!r} not in the README"
