"""Stand-ins for PyPI and for PyTorch's CPU index, made of the packages on this machine's disk, so
that a test can run the documented install lines in a fresh venv with no network.

Where the packages are is pip's own configuration (``pip config list``): its find-links directories
and its ``file://`` indexes; a remote index named there is left out. ``pypi`` lists every project found
there, the CUDA build of torch included, as PyPI does; ``pytorch_cpu`` is the same with only the CPU
builds of torch (a ``+cpu`` local version), as ``https://download.pytorch.org/whl/cpu`` has them.
Each is a PEP 503 index of ``file://`` links (each page's links made absolute), written to a
temporary directory: pip reads the files where they lie and copies none of them.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_ANCHOR = re.compile(r"<a\s[^>]*?href=\"([^\"]+)\"[^>]*>.*?</a>", re.S | re.I)
_DIST = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._]*?)-\d")  # a wheel's or sdist's project name


@dataclass(frozen=True)
class LocalIndexes:
    pypi: str  # file:// URL of the PyPI stand-in
    pytorch_cpu: str  # file:// URL of the PyTorch CPU index stand-in
    cpu_torch: list[str]  # the CPU torch files it offers


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_sources() -> tuple[list[Path], list[Path]]:
    """(find-links directories, simple-index directories) on this disk, as pip is configured."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    links, indexes = [], []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        for item in shlex.split(value.strip().strip("'\"")) if value else []:
            path = Path(urllib.request.url2pathname(urllib.parse.urlparse(item).path)) if "://" in item else Path(item)
            if item.startswith(("http://", "https://")) or not path.is_dir():
                continue
            if option == "find-links":
                links.append(path)
            elif option in ("index-url", "extra-index-url"):
                indexes.append(path)
    return list(dict.fromkeys(links)), list(dict.fromkeys(indexes))


def _projects(links: list[Path], indexes: list[Path]) -> dict[str, list[str]]:
    """Project -> its anchors, each with an absolute ``file://`` href."""
    found: dict[str, list[str]] = {}
    for root in indexes:
        for page in sorted(root.glob("*/index.html")):
            base = page.as_uri()
            anchors = [
                m.group(0).replace(m.group(1), urllib.parse.urljoin(base, m.group(1)), 1)
                for m in _ANCHOR.finditer(page.read_text(errors="replace"))
            ]
            found.setdefault(normalise(page.parent.name), []).extend(anchors)
    for d in links:
        for f in sorted(d.iterdir()):
            m = _DIST.match(f.name)
            if m and f.name.endswith((".whl", ".tar.gz", ".zip")):
                found.setdefault(normalise(m.group(1)), []).append(f'<a href="{f.as_uri()}">{f.name}</a>')
    return found


def _write(root: Path, projects: dict[str, list[str]]) -> str:
    for name, anchors in projects.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        body = "\n".join(anchors)
        (root / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{body}\n</body></html>\n")
    return root.as_uri() + "/"


def local_indexes(where: Path) -> LocalIndexes | None:
    """The two stand-ins under ``where``; None if this machine has no CPU build of torch on disk."""
    projects = _projects(*_pip_sources())
    cpu = [a for a in projects.get("torch", []) if re.search(r"torch-[^-\"]+\+cpu-", a)]
    if not cpu:
        return None
    pypi = _write(where / "pypi", projects)
    pytorch_cpu = _write(where / "pytorch-cpu", {**projects, "torch": cpu})
    return LocalIndexes(pypi, pytorch_cpu, [re.sub(r"<[^>]+>", "", a) for a in cpu])
