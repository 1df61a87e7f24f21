"""The examples in the library's docstrings run, and show what they claim (issue 16).

Every module of tunecache/ and kernels/ that holds a ``>>>`` example is found and run with
:func:`doctest.testmod`, so an example added to any docstring is tested without registering it
here. They run on a CPU without network: a store they need is a temporary SQLite file.
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: directory -> the package name it installs as (pyproject's package-dir)
PACKAGES = {"tunecache": "tunecache", "kernels": "tunecache.kernels"}
#: the public API a user touches first: each must keep an example
MUST_HAVE_EXAMPLES = {
    "tunecache.buckets",
    "tunecache.problem.identity",
    "tunecache.problem.model",
    "tunecache.settings",
    "tunecache.store.opening",
}


def modules_with_examples() -> list[str]:
    out = []
    for directory, package in PACKAGES.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            if re.search(r"^\s*>>> ", path.read_text(), re.M):
                parts = list(path.relative_to(ROOT / directory).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                out.append(".".join([package, *parts]))
    return out


def test_the_public_api_has_examples():
    missing = MUST_HAVE_EXAMPLES - set(modules_with_examples())
    assert not missing, f"these modules lost their docstring examples: {sorted(missing)}"


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_docstring_examples_run(name):
    failures, tried = doctest.testmod(importlib.import_module(name))
    assert tried > 0 and failures == 0, f"{failures} of {tried} examples in {name} failed (the output above says which)"
