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


def test_a_build_another_host_pooled_meanwhile_is_taken_not_built(tmp_path):
    """A cold fleet's hosts start together (the pool empty): one that waited for another's torch.compile
    entry must find that host's builds at its own build step, and its own builds go in at once."""
    import types

    pool, cache = tmp_path / "pool", tmp_path / "host"
    cppbuilds.keep(_host(tmp_path / "other"), pool)  # another host built these after this one started
    built: list[str] = []

    class CppBuilder:
        def __init__(self, target: Path) -> None:
            self.target = target

        def get_target_file_path(self) -> str:
            return str(self.target)

        def build(self) -> None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.target.write_text("built here")
            built.append(self.target.name)

    cppbuilds._wrap(types.SimpleNamespace(CppBuilder=CppBuilder), pool, cache)
    CppBuilder(cache / "ab" / "cabxyz.so").build()  # in the pool: copied, not built
    assert built == [] and (cache / "ab" / "cabxyz.so").read_text() == "ELF"
    CppBuilder(cache / "ef" / "cefnew.so").build()  # not in the pool: built, then pooled
    assert built == ["cefnew.so"] and (pool / "ef" / "cefnew.so").read_text() == "built here"
    CppBuilder(cache / "ab" / "cabxyz.o").build()  # an intermediate object: built, never pooled
    CppBuilder(tmp_path / "elsewhere" / "ab" / "cabxyz.so").build()  # outside this cache: built
    assert built == ["cefnew.so", "cabxyz.o", "cabxyz.so"] and not (pool / "ab" / "cabxyz.o").exists()
