"""Misses of a read-only image (issue 26): a serving process that falls back on a read-only store
cannot record the miss there, so it goes to the local spool, and ``tunecache misses`` (a real
process, pointed at the same read-only store) lists it; where even the spool cannot be written,
every missed key is in the log."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from processes import run_json_stderr
from realcli import cli_process

SIZES = (64, 200, 300)

SERVE = f"""
    import json, tinykernels, tunecache
    k = tinykernels.make_add()
    for n in {SIZES!r}:
        tinykernels.launch(k, n)
    tunecache.flush()
    print(json.dumps(tunecache.stats()))
"""


def serve(env: dict[str, str]) -> tuple[dict, str]:
    """A serving process (a restart, from the warm pool): its stats and its stderr."""
    return run_json_stderr(["-c", textwrap.dedent(SERVE)], env)


def read_only_store(tmp_path: Path, make_readonly) -> str:
    built = tmp_path / "image" / "store.sqlite3"
    r = cli_process("--url", f"sqlite:///{built}", "db", "upgrade")
    assert r.returncode == 0, r.stderr
    return f"sqlite:///{make_readonly([built]) / 'store.sqlite3'}"


def test_offline_misses_on_a_read_only_store_go_to_the_spool_that_tunecache_misses_lists(tmp_path, make_readonly):
    url = read_only_store(tmp_path, make_readonly)
    spool = tmp_path / "cache" / "misses.jsonl"
    env = {"TUNECACHE_URL": url, "TUNECACHE_MODE": "offline", "TUNECACHE_MISS_SPOOL": str(spool)}
    stats, stderr = serve(env)
    assert stats["offline_fallbacks"] == len(SIZES) and stats["benchmarks"] == 0, stats
    warning = [ln for ln in stderr.splitlines() if "no stored config" in ln]
    assert len(warning) == 1, stderr  # once per kernel: the spool has every key
    assert "read-only" in warning[0] and str(spool) in warning[0] and "tunecache misses" in warning[0], warning
    lookup = {"TUNECACHE_URL": url, "TUNECACHE_MISS_SPOOL": str(spool)}  # `tunecache misses` in the image
    r = cli_process("misses", "--json", env=lookup)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert sorted(dict(m["key"])["N"] for m in rows) == list(SIZES), rows
    assert all(m["reason"] == "offline" and m["count"] == 1 and m["recorded"] == "spool" for m in rows), rows
    # A second serving process misses the same keys: counted, not listed twice.
    serve(env)
    rows = json.loads(cli_process("misses", "--json", env=lookup).stdout)
    assert sorted((dict(m["key"])["N"], m["count"]) for m in rows) == [(n, 2) for n in SIZES], rows
    # The spool belongs to that store: another store's `misses` does not list its rows.
    other = tmp_path / "other.sqlite3"
    assert cli_process("--url", f"sqlite:///{other}", "db", "upgrade").returncode == 0
    r = cli_process("--url", f"sqlite:///{other}", "misses", "--json", env={"TUNECACHE_MISS_SPOOL": str(spool)})
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout


def test_where_the_spool_is_not_writable_every_missed_key_is_in_the_log(tmp_path, make_readonly):
    url = read_only_store(tmp_path, make_readonly)
    spool = Path(url.removeprefix("sqlite:///")).parent / "misses.jsonl"  # on the read-only filesystem
    stats, stderr = serve({"TUNECACHE_URL": url, "TUNECACHE_MODE": "offline", "TUNECACHE_MISS_SPOOL": str(spool)})
    assert stats["offline_fallbacks"] == len(SIZES), stats
    lines = [ln for ln in stderr.splitlines() if "no stored config" in ln]
    assert len(lines) == len(SIZES), stderr
    for n, line in zip(SIZES, lines):
        assert f'["N",{n}]' in line.replace(" ", "") and "not recorded" in line and str(spool) in line, line
    assert not spool.exists()
