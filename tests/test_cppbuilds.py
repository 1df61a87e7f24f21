"""The suite's pool of Inductor C++ builds shares only C++ builds, whole, under Inductor's own names."""

from __future__ import annotations

from pathlib import Path

import cppbuilds


def _host(root: Path) -> Path:
    for rel, text in {
        "ab/cabxyz.cpp": "int f();",
        "ab/cabxyz.so": "ELF",
        "cd/ccdq.main.so": "ELF2",
        "fxgraph/b3/entry": "a graph tunecache serves",
        "aotautograd/x/entry": "an AOT entry",
        "zz/cqq.so": "not under its own name's letters",
        "locks/ab.lock": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_only_cpp_builds_go_into_the_pool_and_come_out_of_it(tmp_path):
    pool, first, second = tmp_path / "pool", _host(tmp_path / "first"), tmp_path / "second"
    assert cppbuilds.keep(first, pool) == 3
    assert sorted(str(p.relative_to(pool)) for p in pool.rglob("*") if p.is_file()) == [
        "ab/cabxyz.cpp",
        "ab/cabxyz.so",
        "cd/ccdq.main.so",
    ]
    assert cppbuilds.keep(first, pool) == 0  # already there
    assert cppbuilds.seed(pool, second) == 3
    assert (second / "ab" / "cabxyz.so").read_text() == "ELF"
    assert not (second / "fxgraph").exists() and not (second / "aotautograd").exists()
    assert not list(second.rglob("*.tmp"))


def test_share_seeds_from_the_pool_only_where_both_are_named(tmp_path, monkeypatch):
    pool = tmp_path / "pool"
    cppbuilds.keep(_host(tmp_path / "first"), pool)
    cache = tmp_path / "host"
    monkeypatch.delenv(cppbuilds.ENV, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    cppbuilds.share()
    assert not cache.exists()
    monkeypatch.setenv(cppbuilds.ENV, str(pool))
    monkeypatch.setattr(cppbuilds.atexit, "register", lambda *a: None)
    cppbuilds.share()
    assert (cache / "cd" / "ccdq.main.so").read_text() == "ELF2"
