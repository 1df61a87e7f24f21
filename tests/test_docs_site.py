"""The documentation site (issue 46): its reference pages are what the code generates, it builds with
``mkdocs build --strict``, every page is in its nav, and the README stays a short front door."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunecache import settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _gendocs():
    spec = importlib.util.spec_from_file_location("gendocs", ROOT / "scripts" / "gendocs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gendocs = _gendocs()


def test_the_generated_pages_are_what_the_code_generates():
    for rel, generate in gendocs.PAGES.items():
        gendocs.check(ROOT / rel, generate())  # raises OutOfDate, with the diff


def test_a_changed_default_or_meaning_makes_the_configuration_page_out_of_date():
    page = DOCS / "configuration.md"
    lease = settings.SETTINGS["TUNECACHE_LEASE_SECONDS"]
    assert f"| `TUNECACHE_LEASE_SECONDS` | `{lease.default}` |" in page.read_text()
    for changed in (dataclasses.replace(lease, default="45"), dataclasses.replace(lease, meaning="something else")):
        registry = {**settings.SETTINGS, lease.name: changed}
        with pytest.raises(gendocs.OutOfDate, match="TUNECACHE_LEASE_SECONDS"):
            gendocs.check(page, gendocs.settings_table(registry))
    added = {**settings.SETTINGS, "TUNECACHE_NEW": settings.Setting("TUNECACHE_NEW", "1", str, "new")}
    with pytest.raises(gendocs.OutOfDate, match="TUNECACHE_NEW"):
        gendocs.check(page, gendocs.settings_table(added))


def test_a_changed_command_makes_the_cli_page_out_of_date():
    from tunecache.cli import main

    page = DOCS / "cli.md"
    group = copy.copy(main)
    group.commands = dict(main.commands)
    gc = copy.copy(main.commands["gc"])
    gc.help = "Remove every problem, whatever its age."
    group.commands["gc"] = gc
    with pytest.raises(gendocs.OutOfDate, match="whatever its age"):
        gendocs.check(page, gendocs.cli_reference(group))
    del group.commands["gc"]
    with pytest.raises(gendocs.OutOfDate, match="tunecache gc"):
        gendocs.check(page, gendocs.cli_reference(group))


def test_the_page_holds_every_command_with_its_options():
    from tunecache.cli import main
    from tunecache.cli.maintain import db

    text = (DOCS / "cli.md").read_text()
    names = [f"tunecache {n}" for n in main.commands if n != "db"] + [f"tunecache db {n}" for n in db.commands]
    for name in names:
        assert f"### `{name}`" in text and f"Usage: {name} [OPTIONS]" in text, name
    assert "--older-than" in text and "--trust-unsigned" in text


def test_check_fails_on_a_page_edited_by_hand_and_the_script_rewrites_it(tmp_path, monkeypatch, capsys):
    for rel in gendocs.PAGES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    page = tmp_path / "docs" / "configuration.md"
    text = page.read_text()
    row = "| `TUNECACHE_WAIT_SECONDS` | `300` |"
    assert row in text
    page.write_text(text.replace(row, "| `TUNECACHE_WAIT_SECONDS` | `600` |"))
    monkeypatch.setattr(gendocs, "ROOT", tmp_path)
    assert gendocs.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/configuration.md is out of date" in err and "`600`" in err and "`300`" in err, err
    assert gendocs.main([]) == 0
    assert page.read_text() == text  # the hand edit is gone, the prose around the table kept
    assert gendocs.main(["--check"]) == 0


def test_a_page_without_its_markers_is_refused():
    with pytest.raises(gendocs.OutOfDate, match="BEGIN GENERATED"):
        gendocs.render("# Configuration\n\nno markers\n", "| a |\n")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_site_builds_strict_with_every_page(tmp_path):
    r = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]
    pages = [p.relative_to(DOCS) for p in DOCS.rglob("*.md") if "gpu-runs" not in p.parts]
    for p in pages:
        built = tmp_path / "site" / (p.with_suffix("") / "index.html" if p.stem != "index" else p.with_suffix(".html"))
        assert built.is_file(), (p, built)
    configuration = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert all(name in configuration for name in settings.SETTINGS)


def test_the_nav_lists_every_page():
    listed = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "gpu-runs" not in p.parts}
    assert listed == pages


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("gpu-runs"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "orphan.md" in r.stderr, r.stderr[-3000:]
    (tmp_path / "docs" / "orphan.md").unlink()
    with (tmp_path / "docs" / "fleet.md").open("a") as f:
        f.write("\n[the trust model](trust.md#no-such-section)\n")
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "no-such-section" in r.stderr, r.stderr[-3000:]


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, len(lines)
    # It opens with the two commands that work on a fresh machine.
    assert lines[0] == "# tunecache" and lines[2] == "```bash", lines[:3]
    assert lines[3].startswith("scripts/demo   # ") and lines[4].startswith("scripts/test   # "), lines[3:5]
    assert "TUNECACHE_INSTALL=1" in text and "db grant --reader" in text and "TUNECACHE_SIGNING_KEY=" in text
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target
