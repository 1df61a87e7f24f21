"""The recipes of the README and of the documentation site (docs/), run as written (issue 26): what
a newcomer copies must work. Real processes: the ``tunecache`` console script, from a shell."""

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
DOCS = ROOT / "docs"
#: The README and every page of the site but the benchmark records, where install lines are shown.
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

HOSTS = 3
# What each "host" tunes: three keys of a tiny kernel.
WARM = """
    import tinykernels
    def warmup(progress=None):
        k = tinykernels.make_add()
        for n in (32, 64, 128):
            tinykernels.launch(k, n)
"""


def block_after(marker: str, page: str) -> str:
    """The first fenced code block after ``marker`` in ``docs/<page>``."""
    text = (DOCS / page).read_text()
    at = text.index(marker)
    m = re.search(r"```\w*\n(.*?)```", text[at:], re.S)
    assert m, f"no code block after {marker!r} in docs/{page}"
    return m.group(1)


def _recipe_env() -> dict[str, str]:
    """The shell a user runs a recipe in: the ``tunecache`` script on PATH, tests/ importable."""
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p),
    }


def test_multi_host_timings_on_one_machine_as_the_docs_say(tmp_path):
    script = block_after("Several hosts' timings on one machine", "report.md")
    assert "TUNECACHE_HOST_ID" in script and "tunecache hosts" in script, script
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(WARM))
    r = subprocess.run(
        ["bash", "-ec", script], cwd=tmp_path, env=_recipe_env(), capture_output=True, text=True, timeout=600
    )
    assert r.returncode in (0, 1), r.stderr[-3000:]  # hosts exits 1 for an outlier: noise on a busy CPU
    assert "3 keys timed by more than one host" in r.stdout, r.stdout + r.stderr[-3000:]
    out = json.loads(tc("--url", f"sqlite:///{tmp_path / 'gpu-a.sqlite3'}", "hosts", "--json").stdout)
    assert sorted((h["host"], h["keys"]) for h in out["hosts"]) == [(f"gpu-{c}", 3) for c in "abc"[:HOSTS]], out


# The image's model: three keys, and a daemon thread that still references the kernel (and so its
# store) as the process exits, as a serving framework's background loop does: nothing is then
# garbage-collected at exit, and before issue 44 the store's rows stayed in its log.
IMAGE_MODEL = """
    import threading, time
    import tinykernels

    def warmup(progress=None):
        k = tinykernels.make_add()
        threading.Thread(target=lambda k=k: time.sleep(3600), daemon=True).start()
        for n in (32, 64, 128):
            tinykernels.launch(k, n)
"""


def test_the_image_flow_serves_every_key_from_the_one_file_as_the_docs_say(tmp_path):
    script = block_after("The simplest image", "images.md")
    assert "chmod 444" in script and "cp tuned.sqlite3" in script and "TUNECACHE_MODE=offline" in script, script
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(IMAGE_MODEL))
    r = subprocess.run(
        ["bash", "-ec", script], cwd=tmp_path, env=_recipe_env(), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout.strip().splitlines()[-1]
    promised = re.search(r"# -> (.*)", script).group(1)  # what the page says the check prints
    assert re.sub(r"in [\d.]+s", "", said) == re.sub(r"in [\d.]+s", "", promised), (said, promised)
    assert said.endswith("3 hits, 0 misses, 0 configs benchmarked"), said
    assert os.listdir(tmp_path / "rootfs" / "opt" / "tunecache") == ["store.sqlite3"]  # nothing written beside it


def test_installing_from_a_checkout_names_every_extra():
    text = block_after("## Installing from a checkout", "getting-started.md")
    table = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = re.findall(r"^(\w+)\s*=", table, re.M)  # (no tomllib on Python 3.10)
    assert "postgres" in extras, extras
    assert "pip install -e ." in text, text
    page = (DOCS / "getting-started.md").read_text()
    section = page[page.index("## Installing from a checkout") :].split("\n## ", 1)[0]
    for name in extras:
        assert f"[{name}]" in section or f"`{name}`" in section, f"extra {name!r} not in docs/getting-started.md"


def _documented_install_lines() -> list[str]:
    """Every ``pip install`` line of the code blocks of the README and the site's pages, as written (its
    comment dropped), but the CPU build of torch from PyTorch's index: tests/test_packaging.py runs that
    one, with the lines after it, in a fresh venv
    (test_the_documented_install_lines_for_a_cpu_machine_work_in_a_fresh_venv)."""
    lines = []
    blocks = [b for page in PAGES for b in re.findall(r"```\w*\n(.*?)```", page.read_text(), re.S)]
    for block in blocks:
        for line in block.splitlines():
            cmd = line.split(" #")[0].strip()
            if cmd.startswith("pip install") and "download.pytorch.org" not in cmd:
                lines.append(cmd)
    return list(dict.fromkeys(lines))  # each line once, in order of appearance


def test_every_install_line_of_the_docs_works_from_the_checkout(tmp_path):
    """tunecache is on no package index: each install line, run as written in the checkout (in a
    fresh venv that sees this one's dependencies, so nothing is downloaded), installs this tunecache
    with the extras it names; none may reach for a package index."""
    import shutil
    import sysconfig

    lines = _documented_install_lines()
    assert lines, "neither the README nor docs/ shows an install line"
    readme = (ROOT / "README.md").read_text()
    assert any(line in readme for line in lines), "the README shows no install line"
    checkout = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (checkout / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, checkout / f)
    venv = tmp_path / "venv"
    # Without its own (older) pip and setuptools: this venv's, lent below, build the checkout offline.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = venv / "bin" / "pip"
    pip.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
    )
    pip.chmod(0o755)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "lend-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, psycopg...
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    # Offline, as a checkout on a build host: no index, setuptools from the lent dependencies.
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_NO_BUILD_ISOLATION="0", PIP_QUIET="1")
    for line in lines:
        r = subprocess.run(["bash", "-ec", line], cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{line}: {r.stderr[-2000:]}"
        assert re.search(r"pip install (-e )?'?\.", line), f"not an install from the checkout: {line}"
        probe = "import tunecache, json; print(json.dumps(tunecache.__file__))"
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0 and str(tmp_path) in out.stdout, (line, out.stdout, out.stderr[-2000:])
        r = subprocess.run([str(venv / "bin" / "tunecache"), "--version"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, (line, r.stderr)
