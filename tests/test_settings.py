"""Settings: every ``TUNECACHE_*`` variable is declared once, read only through tunecache.settings,
documented in docs/configuration.md's table, and a bad value is refused in one line."""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunecache import settings
from tunecache.errors import ConfigurationError

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    sorted((ROOT / "tunecache").rglob("*.py"))
    + sorted((ROOT / "kernels").rglob("*.py"))
    + [ROOT / "_tunecache_startup.py", ROOT / "tunecache-install.pth"]  # the .pth line is Python too
)
#: The only direct reads allowed: the .pth start-up hook runs in every Python process and must not import
#: anything (not even its own module: a first path-based import costs ~2 ms) to learn that
#: TUNECACHE_INSTALL and TUNECACHE_INDUCTOR are unset; both only test presence, and the values are
#: parsed by tunecache.settings when the hook runs.
ALLOWED_DIRECT_READS = {
    ("_tunecache_startup.py", "TUNECACHE_INSTALL"),
    ("tunecache-install.pth", "TUNECACHE_INSTALL"),
    ("_tunecache_startup.py", "TUNECACHE_INDUCTOR"),
    ("tunecache-install.pth", "TUNECACHE_INDUCTOR"),
}
NAME = re.compile(r"\bTUNECACHE_[A-Z0-9_]+\b")


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every TUNECACHE_* variable read from the environment directly: os.environ.get,
    os.getenv, os.environ[...], "..." in os.environ, and click's envvar=."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def literal(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("TUNECACHE_"):
            return node.value
        return None

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            reads = isinstance(f, ast.Attribute) and (
                (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)) or f.attr == "getenv"
            )
            if reads and node.args and literal(node.args[0]):
                out.append((node.lineno, literal(node.args[0])))
            for kw in node.keywords:
                if kw.arg == "envvar" and literal(kw.value):
                    out.append((node.lineno, literal(kw.value)))
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            if literal(node.slice):
                out.append((node.lineno, literal(node.slice)))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators) and literal(node.left):
            out.append((node.lineno, literal(node.left)))
    return out


def test_no_module_but_settings_reads_a_tunecache_variable():
    found = []
    for path in SOURCES:
        if path.name == "settings.py" and path.parent.name == "tunecache":
            continue
        found += [
            f"{path.relative_to(ROOT)}:{line}: {name}"
            for line, name in _env_reads(ast.parse(path.read_text()))
            if (str(path.relative_to(ROOT)), name) not in ALLOWED_DIRECT_READS
        ]
    assert found == [], "read these through tunecache.settings.get():\n" + "\n".join(found)


def test_the_enforcing_scan_finds_direct_reads():
    code = (
        'import os, click\nos.environ.get("TUNECACHE_X")\nos.getenv("TUNECACHE_Y", "1")\n'
        'os.environ["TUNECACHE_Z"]\n"TUNECACHE_W" in os.environ\nclick.Option(["--u"], envvar="TUNECACHE_V")\n'
        'os.environ["TUNECACHE_OK"] = "1"\nos.environ.get("HOME")\n'
    )
    assert [n for _, n in _env_reads(ast.parse(code))] == [
        "TUNECACHE_X",
        "TUNECACHE_Y",
        "TUNECACHE_Z",
        "TUNECACHE_W",
        "TUNECACHE_V",
    ]


def test_every_variable_named_in_the_code_is_a_declared_setting():
    unknown = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in SOURCES
        for name in NAME.findall(path.read_text())
        if name not in settings.SETTINGS
    }
    assert unknown == set(), "declare these in tunecache/settings.py (or fix the typo)"


def _configuration_table() -> dict[str, str]:
    """Each variable's default column in docs/configuration.md (generated: tests/test_docs_site.py)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(TUNECACHE_[A-Z0-9_]+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_the_configuration_page_is_the_settings_table():
    rows = _configuration_table()
    assert sorted(rows) == sorted(settings.SETTINGS), "docs/configuration.md and settings.py list other variables"
    for name, s in settings.SETTINGS.items():
        if s.default is not None:
            assert rows[name] == f"`{s.default}`", f"docs/configuration.md: {name} defaults to {rows[name]}"
        else:
            assert rows[name], f"docs/configuration.md says nothing of {name} unset"


@pytest.mark.parametrize("name", sorted(settings.SETTINGS))
def test_every_default_parses_and_garbage_is_refused_naming_the_variable(name):
    s = settings.SETTINGS[name]
    assert settings.get(name, {}) == (None if s.default is None else s.parse(s.default))
    if s.parse is settings._text:
        return  # free text: any value is one
    with pytest.raises(ConfigurationError, match=rf"^{name}='\[\]garbage'"):
        settings.get(name, {name: "[]garbage"})


def test_an_unknown_setting_is_a_key_error():
    with pytest.raises(KeyError, match="TUNECACHE_NOPE is not a tunecache setting"):
        settings.get("TUNECACHE_NOPE", {})


@pytest.mark.parametrize("name", ["TUNECACHE_LEASE_SECONDS", "TUNECACHE_ON_DRIVER_CHANGE", "TUNECACHE_PRELOAD"])
def test_every_command_refuses_a_bad_value_in_one_line(name, sqlite_url):
    r = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "--url", sqlite_url, "ls"],
        env={**__import__("os").environ, name: "bogus"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tunecache: error: {name}='bogus' "), r.stderr


def test_put_checks_the_name_and_the_value_before_writing():
    env: dict[str, str] = {}
    settings.put("TUNECACHE_URL", "sqlite:////tmp/x.sqlite3", env)
    assert settings.get("TUNECACHE_URL", env) == "sqlite:////tmp/x.sqlite3"
    with pytest.raises(KeyError):
        settings.put("TUNECACHE_ULR", "x", env)  # a typo is no setting
    with pytest.raises(ConfigurationError):
        settings.put("TUNECACHE_MODE", "bogus", env)
    assert set(env) == {"TUNECACHE_URL"}  # nothing written for either


def test_an_explicit_call_still_refuses_a_bad_setting(monkeypatch, sqlite_url):
    """Only what the user did not call degrades to stock Triton; ``install()`` or ``open_store()``
    called with a typo in the environment fails loudly, naming the variable."""
    import tunecache
    from tunecache.tuner import decorator

    monkeypatch.setenv("TUNECACHE_MODE", "bogus")
    with pytest.raises(ConfigurationError, match=r"^TUNECACHE_MODE='bogus' is not one of readwrite, "):
        tunecache.install()
    assert not decorator.installed()
    monkeypatch.setenv("TUNECACHE_SQLITE_BUSY_MS", "soon")
    with pytest.raises(ConfigurationError, match=r"^TUNECACHE_SQLITE_BUSY_MS='soon' must be an integer"):
        tunecache.open_store(sqlite_url)


def test_a_mode_made_bad_after_definition_launches_stock_with_one_warning(monkeypatch, caplog, sqlite_url):
    """A process that changes ``TUNECACHE_MODE`` to a typo after defining its kernels: their launches
    run as stock Triton's (tuned, correct results), with one warning, never a traceback."""
    import tinykernels

    kernel = tinykernels.make_add(configs=tinykernels.CONFIGS[:2], store=sqlite_url)
    monkeypatch.setenv("TUNECACHE_MODE", "bogus-at-launch")
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for n in (8, 16):
            assert tinykernels.launch(kernel, n) in tinykernels.CONFIGS[:2]
    said = [r.getMessage() for r in caplog.records if "TUNECACHE_MODE" in r.getMessage()]
    assert len(said) == 1 and "'bogus-at-launch' is not one of readwrite, readonly" in said[0], said
