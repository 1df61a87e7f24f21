"""Export and import (issue 5): round trips across backends, conflict policies, and malformed files.

Every malformed file must give exit 1 with ``line N: reason`` and leave the store's row counts as
they were; store-side behaviour runs on SQLite and the real PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from realcli import cli_process, one_line_error

from tunecache import exchange
from tunecache.cli import main
from tunecache.errors import ImportFormatError, StoreError, StoreReadOnlyError
from tunecache.exchange import FORMAT_VERSION, export, import_, importer, validate
from tunecache.problem.configidentity import config_hash_of
from tunecache.problem.identity import canonical_key, problem_digest
from tunecache.problem.model import (
    CONFIG_ROW_FIELDS,
    PROBLEM_FIELDS,
    ConfigResult,
    LaunchSpec,
    Problem,
    launch_spec_from_json,
    launch_spec_to_json,
    problem_from_json,
    problem_to_json,
)
from tunecache.problem.target import Target
from tunecache.store import bulk
from tunecache.store.opening import open_store
from tunecache.store.store import Store

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.5")
A100 = Target("cuda", "sm80", "NVIDIA A100-SXM4-80GB", 108, 166912, 32, "12040", "550.54.15", "12.4", "3.4")
SOURCE = "5e" * 32
T0 = dt.datetime(2026, 11, 1, 8, 30, 15, 123456)


def cfg(block: int, warps: int = 4) -> dict[str, Any]:
    return {
        "kwargs": {"BLOCK": block},
        "num_warps": warps,
        "num_stages": 2,
        "num_ctas": 1,
        "maxnreg": None,
        "pre_hook": None,
    }


def make_problem(n: int, target: Target = H200, kernel: str = "tests.kernels.add_kernel") -> Problem:
    key = canonical_key(["N", "x.dtype"], [n, "torch.float16"])
    return Problem(
        digest=problem_digest(SOURCE, target, key),
        kernel=kernel,
        source_hash=SOURCE,
        target=target,
        key_json=key,
        batch_bucket=n,
        tuning_seconds=2.5,
        host="tuner-1",
    )


def make_results(scale: float = 1.0) -> list[ConfigResult]:
    """Two ok configs (the first wins), one out of shared memory, one that did not compile."""
    rows = [
        ConfigResult(config_hash_of(c), c, "ok", m * scale, m * scale * 0.9, m * scale * 1.1, 25, None, "tuner-1", T0)
        for c, m in ((cfg(64), 0.25), (cfg(128, 8), 0.5))
    ]
    big = cfg(1024, 8)
    rows.append(
        ConfigResult(
            config_hash_of(big),
            big,
            "out_of_resources",
            failure={"resource": "shared", "required": 300000, "limit": 232448},
            host="tuner-1",
            measured_at=dt.datetime(2026, 11, 1, 9, 0, 0),  # no microseconds: exported without a fraction
        )
    )
    bad = cfg(4096, 16)
    rows.append(
        ConfigResult(
            config_hash_of(bad),
            bad,
            "compile_error",
            failure={"error": "CompilationError", "message": "at 12:4: layout"},
            host="tuner-2",
            measured_at=T0 + dt.timedelta(seconds=1),
        )
    )
    return rows


def fill(url: str, n: int = 3) -> Store:
    """A store with n problems on two targets and kernels, failed configs, and hits recorded."""
    store = open_store(url)
    for i in range(n):
        target, kernel = (H200, "tests.kernels.add_kernel") if i % 2 == 0 else (A100, "tests.kernels.mul_kernel")
        store.put(make_problem(1024 * (i + 1), target, kernel), make_results(1.0 + i))
    first = store.find_problems()[0]
    store.record_hits({first.digest: 7})
    return store


def content(url: str) -> list[dict[str, Any]]:
    """Everything stored about every problem, configs sorted: two stores hold the same iff equal."""
    store = open_store(url)
    try:
        out = []
        for p in sorted(store.find_problems(with_configs=True), key=lambda p: p.digest):
            d = dataclasses.asdict(p)
            d["configs"] = sorted(d["configs"], key=lambda c: c["config_hash"])
            out.append(d)
        return out
    finally:
        store.close()


def cli(url: str, *args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["--url", url, *args], input=input)


def ok(res: Result) -> Result:
    assert res.exit_code == 0, (res.output, res.exception)
    return res


def body_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.splitlines(keepends=True)


def assemble(lines: list[bytes], fix_header: bool = True) -> bytes:
    """Lines back into a file; with ``fix_header`` the header's counts and hash match the body."""
    if fix_header:
        header = orjson.loads(lines[0])
        body = lines[1:]
        specs = [x for x in body if b'"spec_hash"' in x]
        header["problems"] = len(body) - len(specs)
        if header.get("version") == 2:
            header["launch_specs"] = len(specs)
        header["configs"] = sum(len(orjson.loads(x)["configs"]) for x in body if x not in specs)
        header["body_sha256"] = hashlib.sha256(b"".join(body)).hexdigest()
        lines = [orjson.dumps(header) + b"\n", *body]
    return b"".join(lines)


def edit(lines: list[bytes], index: int, change: Callable[[dict[str, Any]], None]) -> list[bytes]:
    lines = list(lines)
    obj = orjson.loads(lines[index])
    change(obj)
    lines[index] = orjson.dumps(obj) + b"\n"
    return lines


# ---- round trips ----------------------------------------------------------------------------


def test_round_trip_into_another_url_keeps_ls_json(store_url, tmp_path):
    src = fill(store_url)
    src.close()
    out = tmp_path / "tuned.jsonl.gz"
    res = ok(cli(store_url, "export", str(out), "--json"))
    summary = json.loads(res.output)
    assert summary["problems"] == 3 and summary["configs"] == 12 and summary["compressed"] is True
    assert out.read_bytes()[:2] == b"\x1f\x8b"

    dst = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    res = ok(cli(dst, "import", str(out)))
    assert "3 problems (12 config rows): 3 new, 0 updated, 0 skipped, 0 conflicts" in res.output
    assert ok(cli(dst, "ls", "--json")).output == ok(cli(store_url, "ls", "--json")).output
    assert content(dst) == content(store_url)
    failed = [c for p in content(dst) for c in p["configs"] if c["status"] == "out_of_resources"]
    assert len(failed) == 3 and failed[0]["failure"] == {"resource": "shared", "required": 300000, "limit": 232448}
    hit = [p for p in content(dst) if p["hit_count"] == 7]
    assert len(hit) == 1 and hit[0]["last_hit_at"] is not None


def test_sqlite_to_postgresql_to_sqlite_loses_nothing(sqlite_url, pg_url, tmp_path):
    fill(sqlite_url, n=5).close()
    first = export(open_store(sqlite_url), tmp_path / "a.jsonl")
    assert import_(open_store(pg_url), tmp_path / "a.jsonl").new == 5
    second = export(open_store(pg_url), tmp_path / "b.jsonl")
    back = f"sqlite:///{tmp_path / 'back.sqlite3'}"
    assert import_(open_store(back), tmp_path / "b.jsonl").new == 5
    assert content(sqlite_url) == content(pg_url) == content(back)
    # The same content exports to the same body, byte for byte, whatever the backend.
    assert first["body_sha256"] == second["body_sha256"]
    assert body_lines(tmp_path / "a.jsonl")[1:] == body_lines(tmp_path / "b.jsonl")[1:]


def test_file_format_is_the_documented_one(sqlite_url, tmp_path):
    fill(sqlite_url).close()
    export(open_store(sqlite_url), tmp_path / "f.jsonl", kernel="add_kernel", since=dt.datetime(2020, 1, 1))
    lines = body_lines(tmp_path / "f.jsonl")
    header = orjson.loads(lines[0])
    assert set(header) == {
        "format",
        "version",
        "tunecache",
        "problems",
        "configs",
        "body_sha256",
        "created_at",
        "filters",
        "launch_specs",
    }
    assert header["format"] == "tunecache-export" and header["version"] == FORMAT_VERSION == 2
    assert header["launch_specs"] == 0  # this store recorded none
    assert header["filters"] == {
        "kernel": "add_kernel",
        "arch": None,
        "device": None,
        "driver": None,
        "since": "2020-01-01T00:00:00",
    }
    assert header["problems"] == 2 == len(lines) - 1  # the two add_kernel problems only
    assert header["body_sha256"] == hashlib.sha256(b"".join(lines[1:])).hexdigest()
    p = orjson.loads(lines[1])
    assert list(p) == list(PROBLEM_FIELDS)
    assert p["key"] in ([["N", n], ["x.dtype", "torch.float16"]] for n in (1024, 3072))
    assert p["target"] == H200.as_dict()
    assert [list(c) for c in p["configs"]] == [list(CONFIG_ROW_FIELDS)] * 4
    assert [c["config_hash"] for c in p["configs"]] == sorted(c["config_hash"] for c in p["configs"])


def test_stdout_and_stdin(store_url, tmp_path):
    fill(store_url).close()
    res = ok(cli(store_url, "export", "-"))
    data = res.stdout_bytes
    assert orjson.loads(data.splitlines()[0])["problems"] == 3
    assert "exported 3 problems" in res.stderr  # the summary stays off the data stream
    dst = f"sqlite:///{tmp_path / 'in.sqlite3'}"
    ok(cli(dst, "import", "-", input=data))
    assert content(dst) == content(store_url)
    # gzip on stdin is recognised by its magic bytes
    dst2 = f"sqlite:///{tmp_path / 'in2.sqlite3'}"
    res = ok(cli(dst2, "import", "-", "--json", input=gzip.compress(data)))
    assert json.loads(res.output)["new"] == 3


def test_dry_run_writes_nothing(store_url, tmp_path):
    fill(f"sqlite:///{tmp_path / 'src.sqlite3'}").close()
    export(open_store(f"sqlite:///{tmp_path / 'src.sqlite3'}"), tmp_path / "x.jsonl")
    store = open_store(store_url)
    store.put(make_problem(1024), make_results(3.0))  # one of the three, with another winner time
    before = store.counts()
    res = ok(cli(store_url, "import", str(tmp_path / "x.jsonl"), "--dry-run", "--on-conflict", "replace", "--json"))
    dry = json.loads(res.output)
    assert (dry["new"], dry["updated"], dry["skipped"], dry["dry_run"]) == (2, 1, 0, True)
    assert store.counts() == before
    real = import_(store, tmp_path / "x.jsonl", on_conflict="replace")
    assert (real.new, real.updated, real.skipped) == (2, 1, 0)
    assert store.counts()["problems"] == 3


def test_import_resolves_recorded_misses(sqlite_url, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src).close()
    export(open_store(src), tmp_path / "x.jsonl")
    store = open_store(sqlite_url)
    store.record_miss(make_problem(1024), "capture")
    store.record_miss(make_problem(99), "offline")
    import_(store, tmp_path / "x.jsonl")
    assert [m["key_json"] for m in store.list_misses()] == [make_problem(99).key_json]


def test_export_filters_and_empty_export(sqlite_url, tmp_path):
    fill(sqlite_url).close()
    res = ok(cli(sqlite_url, "export", str(tmp_path / "a.jsonl"), "--arch", "sm80", "--json"))
    assert json.loads(res.output)["problems"] == 1
    res = ok(cli(sqlite_url, "export", str(tmp_path / "none.jsonl"), "--since", "2099-01-01", "--json"))
    assert json.loads(res.output)["problems"] == 0
    dst = f"sqlite:///{tmp_path / 'd.sqlite3'}"
    assert "0 problems (0 config rows): 0 new" in ok(cli(dst, "import", str(tmp_path / "none.jsonl"))).output
    res = cli(sqlite_url, "export", str(tmp_path / "missing-dir" / "x.jsonl"))
    assert res.exit_code == 1 and "does not exist" in res.stderr


def test_offset_timestamps_are_stored_as_utc(store_url, tmp_path):
    fill(f"sqlite:///{tmp_path / 'src.sqlite3'}", n=1).close()
    export(open_store(f"sqlite:///{tmp_path / 'src.sqlite3'}"), tmp_path / "x.jsonl")
    lines = body_lines(tmp_path / "x.jsonl")

    def shift(p: dict[str, Any]) -> None:
        p["created_at"] = "2026-01-01T01:00:00+01:00"
        p["configs"][0]["measured_at"] = "2026-01-01T00:00:00Z"

    (tmp_path / "y.jsonl").write_bytes(assemble(edit(lines, 1, shift)))
    import_(open_store(store_url), tmp_path / "y.jsonl")
    (p,) = content(store_url)
    assert p["created_at"] == dt.datetime(2026, 1, 1, 0, 0)
    assert dt.datetime(2026, 1, 1) in [c["measured_at"] for c in p["configs"]]
    # and filters compare them correctly (SQLite stores text: the format must be SQLAlchemy's)
    assert open_store(store_url).counts(since=dt.datetime(2026, 1, 1))["problems"] == 1


# ---- conflicts -------------------------------------------------------------------------------


@pytest.fixture
def incoming(tmp_path) -> Path:
    """An export holding problem N=1024 measured twice as fast as ``make_results()``, and N=2048."""
    url = f"sqlite:///{tmp_path / 'incoming.sqlite3'}"
    s = open_store(url)
    fast = make_results(0.5)
    fast[0], fast[1] = dataclasses.replace(fast[0], median_ms=0.4), dataclasses.replace(fast[1], median_ms=0.1)
    s.put(make_problem(1024), fast)
    s.put(make_problem(2048), make_results())
    s.close()
    export(open_store(url), tmp_path / "incoming.jsonl")
    return tmp_path / "incoming.jsonl"


@pytest.mark.parametrize(
    ("policy", "stored_scale", "expect", "winner_ms"),
    [
        ("keep", 1.0, (1, 0, 1, 1), 0.25),
        ("replace", 1.0, (1, 1, 0, 1), 0.1),
        ("faster", 1.0, (1, 1, 0, 1), 0.1),  # incoming 0.1 ms beats stored 0.25 ms
        ("faster", 0.1, (1, 0, 1, 1), 0.025),  # stored 0.025 ms is faster: kept
    ],
)
def test_on_conflict(store_url, incoming, policy, stored_scale, expect, winner_ms):
    store = open_store(store_url)
    p = make_problem(1024)
    stale = ConfigResult(config_hash_of(cfg(8, 1)), cfg(8, 1), "ok", 9.0, 9.0, 9.0, 3, None, "old", T0)
    store.put(p, [*make_results(stored_scale), stale])
    res = ok(cli(store_url, "import", str(incoming), "--on-conflict", policy, "--json"))
    s = json.loads(res.output)
    assert (s["new"], s["updated"], s["skipped"], s["conflicts"]) == expect
    got = store.get(p.digest)
    assert got.winner_ms == pytest.approx(winner_ms)
    replaced = expect[1] == 1
    # replace means replace: the stored config the file does not have is gone with the old entry
    assert (stale.config_hash in got.config_map()) is not replaced
    assert len(got.configs) == (4 if replaced else 5)
    assert store.counts()["problems"] == 2


def test_same_winner_is_not_a_conflict(sqlite_url, tmp_path):
    fill(sqlite_url).close()
    export(open_store(sqlite_url), tmp_path / "x.jsonl")
    s = import_(open_store(sqlite_url), tmp_path / "x.jsonl")
    assert (s.new, s.updated, s.skipped, s.conflicts) == (0, 0, 3, 0)


# ---- all or nothing --------------------------------------------------------------------------


def test_failure_while_writing_rolls_everything_back(store_url, tmp_path, monkeypatch):
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, n=6).close()
    export(open_store(src), tmp_path / "x.jsonl")
    store = open_store(store_url)
    store.put(make_problem(1024), make_results(9.0))
    before = content(store_url)
    monkeypatch.setattr(importer, "WRITE_BATCH", 4)  # several batches: the first ones are written
    monkeypatch.setattr(bulk, "PG_FK_REBUILD_MIN", 0)  # PostgreSQL: the dropped foreign key comes back
    calls = []
    real = bulk.BulkWriter.write if store.dialect != "postgresql" else bulk.PgBulkWriter.write

    def failing(self, p_rows, c_rows):
        calls.append(len(c_rows))
        if len(calls) == 3:
            raise StoreError("disk full (simulated)")
        real(self, p_rows, c_rows)

    monkeypatch.setattr(bulk.PgBulkWriter if store.dialect == "postgresql" else bulk.BulkWriter, "write", failing)
    res = cli(store_url, "import", str(tmp_path / "x.jsonl"), "--on-conflict", "replace")
    assert res.exit_code == 1 and "disk full (simulated)" in res.stderr
    assert len(calls) == 3
    assert content(store_url) == before
    if store.dialect == "postgresql":
        with store.engine.connect() as c:
            fks = (
                c.exec_driver_sql(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'configs'::regclass "
                    "AND contype = 'f'"
                )
                .scalars()
                .all()
            )
        assert fks == ["FOREIGN KEY (digest) REFERENCES problems(digest) ON DELETE CASCADE"]


def test_postgresql_bulk_path_restores_the_foreign_key(pg_url, tmp_path, monkeypatch):
    src = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    fill(src, n=4).close()
    export(open_store(src), tmp_path / "x.jsonl")
    monkeypatch.setattr(bulk, "PG_FK_REBUILD_MIN", 0)
    store = open_store(pg_url)
    assert import_(store, tmp_path / "x.jsonl").new == 4
    assert content(pg_url) == content(src)
    with store.engine.begin() as c:
        fk = c.exec_driver_sql(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'configs'::regclass AND contype = 'f'"
        ).scalar_one()
        assert fk == "FOREIGN KEY (digest) REFERENCES problems(digest) ON DELETE CASCADE"
        with pytest.raises(sa.exc.IntegrityError), c.begin_nested():  # enforced again
            c.exec_driver_sql(
                "INSERT INTO configs (digest, config_hash, config_json, status, samples, host, measured_at) "
                "VALUES ('0', '0', '{}', 'ok', 0, 'h', now())"
            )
    store.delete(kernel="add_kernel")
    assert store.counts() == {"problems": 2, "configs": 8, "failed_configs": 4, "open_misses": 0}  # cascade


# ---- malformed files ------------------------------------------------------------------------


@pytest.fixture
def good_lines(tmp_path) -> list[bytes]:
    """A valid export of three problems: header on line 1, problems on lines 2-4."""
    url = f"sqlite:///{tmp_path / 'good.sqlite3'}"
    fill(url).close()
    export(open_store(url), tmp_path / "good.jsonl")
    return body_lines(tmp_path / "good.jsonl")


def _gzip_corrupt(lines: list[bytes]) -> bytes:
    data = bytearray(gzip.compress(assemble(lines)))
    data[10:18] = b"\xff" * 8  # the start of the deflate stream: the first read fails
    return bytes(data)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            obj = obj[int(p)] if p.isdigit() else obj[p]
        obj[int(last) if last.isdigit() else last] = value

    return change


def _nest(depth: int) -> dict[str, Any]:
    d: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        d = {"x": d}
    return d


# name -> (file bytes from the good lines, file suffix, expected line, expected reason)
MALFORMED: dict[str, tuple[Callable[[list[bytes]], bytes], str, int, str]] = {
    "empty file": (lambda ls: b"", ".jsonl", 1, "empty file"),
    "header missing": (lambda ls: assemble(ls[1:], fix_header=False), ".jsonl", 1, "missing header"),
    "not an export": (lambda ls: b'{"hello": "world"}\n', ".jsonl", 1, "not a tunecache export"),
    "wrong format version": (
        lambda ls: assemble(edit(ls, 0, _set("version", 6))),
        ".jsonl",
        1,
        "unsupported format version 6",
    ),
    "truncated at a line end": (
        lambda ls: assemble(ls[:-1], fix_header=False),
        ".jsonl",
        4,
        "unexpected end of file after 2 of the 3 problems",
    ),
    "truncated mid-line": (lambda ls: assemble(ls)[:-100], ".jsonl", 4, "truncated file: the last line has no newline"),
    "gzip corrupt": (_gzip_corrupt, ".jsonl.gz", 1, "gzip error"),
    "gzip truncated": (lambda ls: gzip.compress(assemble(ls))[:-40], ".jsonl.gz", 4, "gzip error"),
    "gzip name, not gzip": (lambda ls: assemble(ls), ".jsonl.gz", 1, "gzip error"),
    "wrong type: string for integer": (
        lambda ls: assemble(edit(ls, 2, _set("hit_count", "12"))),
        ".jsonl",
        3,
        "hit_count must be an integer",
    ),
    "wrong type: boolean for integer": (
        lambda ls: assemble(edit(ls, 2, _set("configs.0.samples", True))),
        ".jsonl",
        3,
        "configs[0].samples must be an integer, got boolean",
    ),
    "wrong type: target field": (
        lambda ls: assemble(edit(ls, 1, _set("target.sm_count", "132"))),
        ".jsonl",
        2,
        "target.sm_count must be an integer, got string",
    ),
    "line is not an object": (
        lambda ls: assemble([ls[0], b"[1, 2]\n", *ls[2:]], fix_header=False),
        ".jsonl",
        2,
        "a problem must be a JSON object, got list",
    ),
    "tampered digest": (
        lambda ls: assemble(edit(ls, 3, _set("key.0.1", 999))),
        ".jsonl",
        4,
        "does not match its content",
    ),
    "tampered config hash": (
        lambda ls: assemble(edit(ls, 1, _set("configs.1.config.num_warps", 2))),
        ".jsonl",
        2,
        "config_hash",
    ),
    "winner not among the configs": (
        lambda ls: assemble(edit(ls, 1, _set("winner_config_hash", "ab" * 16))),
        ".jsonl",
        2,
        "is not the hash of any of this problem's configs",
    ),
    "NaN literal": (
        lambda ls: assemble(
            [*ls[:2], ls[2].replace(b'"median_ms":', b'"median_ms":NaN,"x":', 1), *ls[3:]], fix_header=False
        ),
        ".jsonl",
        3,
        "not valid JSON",
    ),
    "Infinity literal": (
        lambda ls: assemble(
            [*ls[:3], ls[3].replace(b'"winner_ms":', b'"winner_ms":Infinity,"x":', 1)], fix_header=False
        ),
        ".jsonl",
        4,
        "not valid JSON",
    ),
    "negative timing": (
        lambda ls: assemble(edit(ls, 2, _set("configs.0.p20_ms", -0.5))),
        ".jsonl",
        3,
        "configs[0].p20_ms must be finite and non-negative, got -0.5",
    ),
    "unknown status": (
        lambda ls: assemble(edit(ls, 1, _set("configs.2.status", "exploded"))),
        ".jsonl",
        2,
        "status 'exploded' is not one of",
    ),
    "unknown field": (
        lambda ls: assemble(edit(ls, 3, _set("__reduce__", "os.system"))),
        ".jsonl",
        4,
        "unknown field in a problem: '__reduce__'",
    ),
    "unknown config field": (
        lambda ls: assemble(edit(ls, 2, _set("configs.0.config.pre_hook_source", "import os"))),
        ".jsonl",
        3,
        "unknown field in configs[0].config: 'pre_hook_source'",
    ),
    "deep nesting in failure": (
        lambda ls: assemble(edit(ls, 1, _set("configs.0.failure", _nest(40)))),
        ".jsonl",
        2,
        "failure nests deeper than 8 levels",
    ),
    "nesting beyond the JSON parser's limit": (
        lambda ls: assemble([*ls[:2], b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n", *ls[3:]], fix_header=False),
        ".jsonl",
        3,
        "not valid JSON",
    ),
    "body hash mismatch": (  # the edited line cannot be named, but it is one of the body's, not the header
        lambda ls: assemble([*ls[:2], ls[2].replace(b'"tuner-1"', b'"tuner-X"', 1), *ls[3:]], fix_header=False),
        ".jsonl",
        2,
        "does not match the header's",
    ),
    "config count mismatch": (
        lambda ls: assemble(edit(ls, 0, _set("configs", 11)), fix_header=False),
        ".jsonl",
        1,
        "the header announces 11 config rows but the file has 12",
    ),
    "duplicate problem": (lambda ls: assemble([*ls[:3], ls[2]]), ".jsonl", 4, "duplicate problem"),
    "invalid UTF-8": (
        lambda ls: assemble([*ls[:2], ls[2].replace(b"tuner-1", b"tuner-\xff", 1), *ls[3:]], fix_header=False),
        ".jsonl",
        3,
        "not valid JSON",
    ),
    "string longer than its column": (
        lambda ls: assemble(edit(ls, 1, _set("target.device_name", "X" * 300))),
        ".jsonl",
        2,
        "target.device_name is 300 characters long; the store's limit is 128",
    ),
    "huge line": (
        lambda ls: assemble([*ls[:2], b'{"kernel": "' + b"A" * (5 << 20) + b'"}\n'], fix_header=False),
        ".jsonl",
        3,
        "line longer than",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_exits_1_and_changes_nothing(case, good_lines, tmp_path):
    make, suffix, line, reason = MALFORMED[case]
    url = f"sqlite:///{tmp_path / 'target.sqlite3'}"
    store = open_store(url)
    store.put(make_problem(1), make_results())
    before = store.counts()
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(make(good_lines))
    msg = one_line_error(cli_process("--url", url, "import", str(path)))  # a real process: real stderr
    assert re.match(rf"tunecache: error: (line {line}|lines {line}-\d+): ", msg), msg
    assert reason in msg, msg
    assert store.counts() == before
    with pytest.raises(ImportFormatError) as e:  # the library says the same, dry run or not
        import_(store, path, dry_run=True)
    assert e.value.line == line


def test_the_good_file_imports(good_lines, tmp_path):
    """The malformed cases are edits of this file, which itself is fine (also after re-assembly)."""
    path = tmp_path / "good2.jsonl"
    path.write_bytes(assemble(good_lines))
    s = import_(open_store(f"sqlite:///{tmp_path / 't.sqlite3'}"), path)
    assert (s.new, s.problems, s.configs) == (3, 3, 12)


def test_postgresql_store_unchanged_by_a_bad_file(pg_url, good_lines, tmp_path):
    store = fill(pg_url, n=2)
    before = content(pg_url)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(assemble(edit(good_lines, 3, _set("configs.3.median_ms", -1.0))))
    res = cli(pg_url, "import", str(path), "--on-conflict", "replace")
    assert res.exit_code == 1 and "line 4: configs[3].median_ms must be finite and non-negative" in res.stderr
    assert content(pg_url) == before and store.counts()["problems"] == 2


def test_huge_line_memory_stays_bounded(good_lines, tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(good_lines[0])
        f.write(b'{"kernel": "')
        for _ in range(50):
            f.write(b"A" * (1 << 20))  # 50 MiB and no newline
    store = open_store(f"sqlite:///{tmp_path / 't.sqlite3'}")
    tracemalloc.start()
    try:
        with pytest.raises(ImportFormatError, match="line longer than") as e:
            import_(store, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.line == 2
    assert peak < 3 * exchange.MAX_LINE_BYTES, f"peak {peak / 1e6:.1f} MB for a 50 MB line"


def test_unsupported_policy_and_version_messages(sqlite_url, good_lines, tmp_path):
    res = cli(sqlite_url, "import", "x.jsonl", "--on-conflict", "newest")
    assert res.exit_code == 2  # click rejects the choice
    path = tmp_path / "v9.jsonl"
    path.write_bytes(assemble(edit(good_lines, 0, _set("version", 9))))
    res = cli(sqlite_url, "import", str(path))
    assert res.exit_code == 1
    assert "line 1: unsupported format version 9: this tunecache" in res.stderr and "upgrade tunecache" in res.stderr


def test_file_rewritten_between_the_passes_is_rolled_back(store_url, good_lines, tmp_path, monkeypatch):
    path = tmp_path / "x.jsonl"
    path.write_bytes(assemble(good_lines))
    real_scan = validate.scan

    def scan_then_rewrite(*args: Any, **kw: Any) -> Any:
        scan = real_scan(*args, **kw)
        path.write_bytes(assemble([*good_lines[:2], good_lines[2].replace(b"tuner-1", b"tuner-9"), *good_lines[3:]]))
        return scan

    monkeypatch.setattr(validate, "scan", scan_then_rewrite)
    store = open_store(store_url)
    with pytest.raises(ImportFormatError, match="changed while it was being imported"):
        import_(store, path)
    assert store.counts()["problems"] == 0


def test_mysql_round_trip(sqlite_url, mysql_url, tmp_path):
    fill(sqlite_url).close()
    first = export(open_store(sqlite_url), tmp_path / "a.jsonl")
    assert import_(open_store(mysql_url), tmp_path / "a.jsonl").new == 3
    assert content(mysql_url) == content(sqlite_url)
    assert export(open_store(mysql_url), tmp_path / "b.jsonl")["body_sha256"] == first["body_sha256"]
    again = import_(open_store(mysql_url), tmp_path / "a.jsonl", on_conflict="replace")
    assert (again.updated, again.conflicts) == (3, 0) and content(mysql_url) == content(sqlite_url)


def test_read_only_store_refuses_before_validating(sqlite_url, good_lines, tmp_path):
    open_store(sqlite_url).close()
    path = tmp_path / "x.jsonl"
    path.write_bytes(assemble(good_lines))
    ro = open_store(sqlite_url, readonly=True)
    with pytest.raises(StoreReadOnlyError, match="read-only"):
        import_(ro, path)
    assert import_(ro, path, dry_run=True).new == 3  # a dry run only reads


# ---- the winners' launch specs (format version 2) -------------------------------------------


def spec(n: int) -> LaunchSpec:
    text = json.dumps({"key": f"spec-{n}", "constants": {"BLOCK": 64 * n}})
    return LaunchSpec(hashlib.sha256(text.encode()).hexdigest(), config_hash_of(cfg(64)), f"{n:064x}", text, "3.6.0")


def fill_specs(url: str) -> Store:
    """fill() plus launch specs: two for the H200 kernel, one for the A100 one, one for nothing stored."""
    store = fill(url)
    store.put_specs("tests.kernels.add_kernel", SOURCE, H200.digest, [spec(1), spec(2)])
    store.put_specs("tests.kernels.mul_kernel", SOURCE, A100.digest, [spec(3)])
    other = Target(**{**H200.as_dict(), "device_name": "NVIDIA H100"})
    store.put_specs("tests.kernels.add_kernel", SOURCE, other.digest, [spec(4)])  # no problem: not exported
    return store


def test_launch_specs_travel_with_their_problems_and_import_idempotently(store_url, tmp_path):
    fill_specs(store_url).close()
    out = tmp_path / "tuned.jsonl.gz"
    s = export(open_store(store_url), out)
    assert (s["version"], s["problems"], s["launch_specs"]) == (2, 3, 3)
    assert orjson.loads(body_lines(out)[0])["launch_specs"] == 3
    dst = f"sqlite:///{tmp_path / 'dst.sqlite3'}"
    plain = import_(open_store(dst), out)  # specs validated, not added unless asked
    assert (plain.new, plain.launch_specs, plain.launch_specs_new) == (3, 3, 0)
    assert open_store(dst).get_specs(SOURCE) == {}
    first = import_(open_store(dst), out, with_launch_specs=True, trust_unsigned=True)
    assert (first.skipped, first.launch_specs, first.launch_specs_new) == (3, 3, 3)
    got = open_store(dst).get_specs(SOURCE)
    by_hash = sorted([spec(1), spec(2)], key=lambda x: x.spec_hash)  # get_specs orders by spec hash
    assert got == {H200.digest: by_hash, A100.digest: [spec(3)]}
    again = import_(open_store(dst), out, with_launch_specs=True, trust_unsigned=True)
    assert (again.skipped, again.launch_specs, again.launch_specs_new) == (3, 3, 0)
    assert open_store(dst).get_specs(SOURCE) == got
    # A filtered export carries only the specs of the kernels and targets it exports.
    assert export(open_store(store_url), tmp_path / "add.jsonl", kernel="add_kernel")["launch_specs"] == 2
    res = ok(cli(dst, "import", str(out), "--launch-specs", "--trust-unsigned"))
    assert "3 launch specs, 0 added" in res.output


def test_no_launch_specs_writes_version_1_which_still_imports(sqlite_url, tmp_path):
    fill_specs(sqlite_url).close()
    path = tmp_path / "v1.jsonl"
    ok(cli(sqlite_url, "export", str(path), "--no-launch-specs"))
    header = orjson.loads(body_lines(path)[0])
    assert header["version"] == 1 and "launch_specs" not in header and header["problems"] == 3
    assert len(body_lines(path)) == 4  # header + 3 problems, no spec lines
    dst = open_store(f"sqlite:///{tmp_path / 'dst.sqlite3'}")
    s = import_(dst, path)
    assert (s.new, s.launch_specs) == (3, 0) and dst.get_specs(SOURCE) == {}


@pytest.fixture
def spec_lines(tmp_path) -> list[bytes]:
    """A valid version 2 export: header, 3 problems (lines 2-4), 3 launch specs (lines 5-7)."""
    url = f"sqlite:///{tmp_path / 'specs.sqlite3'}"
    fill_specs(url).close()
    export(open_store(url), tmp_path / "specs.jsonl")
    lines = body_lines(tmp_path / "specs.jsonl")
    assert len(lines) == 7
    return lines


def _respec(text: str) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["spec"], obj["spec_hash"] = text, hashlib.sha256(text.encode()).hexdigest()

    return change


SPEC_MALFORMED: dict[str, tuple[Callable[[list[bytes]], bytes], int, str]] = {
    "spec edited, hash kept": (
        lambda ls: assemble(edit(ls, 4, _set("spec", '{"key": "other"}'))),
        5,
        "does not match its spec",
    ),
    "spec not an object": (lambda ls: assemble(edit(ls, 5, _respec("[1, 2]"))), 6, "must be a JSON object"),
    "spec for no problem of the file": (
        lambda ls: assemble(edit(ls, 6, _set("target_digest", "ab" * 32))),
        7,
        "no problem in this file has",
    ),
    "unknown field": (lambda ls: assemble(edit(ls, 4, _set("code", "import os"))), 5, "unknown field in a launch spec"),
    "bad kernel hash": (lambda ls: assemble(edit(ls, 4, _set("kernel_hash", "xyz"))), 5, "kernel_hash must be 64"),
    "duplicate": (lambda ls: assemble([*ls, ls[4]]), 8, "duplicate launch spec"),
    "fewer specs than announced": (
        lambda ls: assemble(ls[:-1], fix_header=False),
        7,
        "after 2 of the 3 launch specs",
    ),
    "more lines than announced": (
        lambda ls: assemble([*ls, ls[5]], fix_header=False),
        8,
        "more lines than the 3 problems and 3 launch specs",
    ),
}


@pytest.mark.parametrize("case", list(SPEC_MALFORMED))
def test_malformed_launch_spec_exits_1_and_changes_nothing(case, spec_lines, tmp_path):
    make, line, reason = SPEC_MALFORMED[case]
    url = f"sqlite:///{tmp_path / 'target.sqlite3'}"
    store = open_store(url)
    store.put(make_problem(1), make_results())
    before = store.counts()
    path = tmp_path / "bad.jsonl"
    path.write_bytes(make(spec_lines))
    res = cli(url, "import", str(path), "--launch-specs", "--trust-unsigned")
    assert res.exit_code == 1, res.output
    msg = res.stderr.strip()
    assert msg.startswith(f"tunecache: error: line {line}: "), msg
    assert reason in msg, msg
    assert store.counts() == before and store.get_specs(SOURCE) == {}


def test_the_good_spec_file_imports_after_reassembly(spec_lines, tmp_path):
    path = tmp_path / "good.jsonl"
    path.write_bytes(assemble(spec_lines))
    s = import_(open_store(f"sqlite:///{tmp_path / 't.sqlite3'}"), path, with_launch_specs=True, trust_unsigned=True)
    assert (s.new, s.launch_specs_new) == (3, 3)


# ---- an export is one snapshot (issue 13, item 10) -------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite_url", "pg_url", "mysql_url"])
def test_export_is_a_snapshot_when_a_delete_commits_between_its_queries(backend, request, tmp_path):
    """Another process deletes a problem (gc, invalidate) after the export read the problems but
    before it read their configs: the file must still be the store as it was, and import."""
    store_url = request.getfixturevalue(backend)
    fill(store_url, n=4).close()
    before = content(store_url)
    store, other = open_store(store_url), open_store(store_url)  # two engines: two connections
    victim = before[1]["digest"]
    deleted: list[str] = []

    def delete_between(conn, cursor, statement, *_):
        if not deleted and "FROM configs" in statement and "problems" not in statement.split("FROM configs")[1]:
            deleted.extend(p.digest for p in other.delete(digests=[victim]))

    sa.event.listen(store.engine, "before_cursor_execute", delete_between)
    try:
        summary = export(store, tmp_path / "snap.jsonl")
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", delete_between)
    assert deleted == [victim] and other.get(victim) is None  # the delete did commit, mid-export
    assert summary["problems"] == 4 and summary["configs"] == 16
    dst = f"sqlite:///{tmp_path / 'dst.sqlite3'}"
    assert import_(open_store(dst), tmp_path / "snap.jsonl").new == 4
    assert content(dst) == before
    store.close()
    other.close()


# ---- import memory is bounded by the work, not by the file (issue 13, item 9) ----------------

# Runs the real command and reports its own peak RSS (VmHWM) as it exits: ru_maxrss of a child
# would carry over the forking parent's size (Linux keeps it across exec).
_PEAK_RSS = (
    "import atexit, sys\n"
    "def peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            sys.stderr.write('PEAK_KB %s\\n' % line.split()[1])\n"
    "atexit.register(peak)\n"
    "from tunecache.cli import main\n"
    "main(prog_name='tunecache')\n"
)


def _import_peak_mb(url: str, path: Path, *args: str) -> tuple[str, float]:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, "--url", url, "import", str(path), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    kb = [int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("PEAK_KB ")]
    return r.stdout, kb[-1] / 1024


def test_import_memory_does_not_grow_with_a_compressed_bomb(tmp_path):
    """64 valid launch-spec lines of ~4 MiB each, ~280 KB gzip'd (256 MiB of lines): importing
    them (dry run, or without --launch-specs) must peak within 64 MiB of importing one."""
    from hostile_files import write_spec_bomb

    small, bomb = tmp_path / "one.jsonl.gz", tmp_path / "bomb.jsonl.gz"
    write_spec_bomb(small, 1)
    size = write_spec_bomb(bomb, 64)
    assert size > 250 << 20 and bomb.stat().st_size < 1 << 20
    url = f"sqlite:///{tmp_path / 'dst.sqlite3'}"
    out, base = _import_peak_mb(url, small, "--dry-run")
    assert "1 launch specs" in out
    for args in (["--dry-run"], []):
        out, peak = _import_peak_mb(url, bomb, *args)
        assert "64 launch specs, 0 added" in out, out
        assert peak < base + 64, f"import {args} peaked at {peak:.0f} MB, one spec line at {base:.0f} MB"


# ---- one shape: the format stays byte for byte, export and the model agree ---------------------

DATA = Path(__file__).parent / "data"


def _header_and_body(data: bytes) -> tuple[dict[str, Any], int, bytes]:
    head, body = data.split(b"\n", 1)
    header = orjson.loads(head)
    del header["created_at"]  # the time of the export
    return header, len(head), body


@pytest.mark.parametrize("name", ["export_v2.jsonl", "export_v1.jsonl"])
def test_export_is_byte_for_byte_the_format_written_before_the_exchange_package(store_url, tmp_path, name):
    """tests/data/export_v*.jsonl were written by the single-module exchange (before issue 16's split)
    from fill_specs() plus a problem without configs and a config with maxnreg, pre_hook and
    ir_override. Imported and exported again, every byte but the header's created_at is the same."""
    golden = (DATA / name).read_bytes()
    specs = name == "export_v2.jsonl"
    store = open_store(store_url)
    import_(store, DATA / name, with_launch_specs=specs, trust_unsigned=True)
    export(store, tmp_path / "again.jsonl", with_launch_specs=specs)
    assert _header_and_body((tmp_path / "again.jsonl").read_bytes()) == _header_and_body(golden)


def test_export_lines_are_the_model_json_shape(store_url, tmp_path):
    """Export builds lines from rows by offsets; the model converts objects: both give one shape."""
    store = fill_specs(store_url)
    export(store, tmp_path / "x.jsonl")
    lines = (tmp_path / "x.jsonl").read_bytes().splitlines()
    n = orjson.loads(lines[0])["problems"]
    for line in lines[1 : 1 + n]:
        obj = orjson.loads(line)
        stored = store.get(obj["digest"])
        stored.configs.sort(key=lambda r: r.config_hash)  # export's order
        assert orjson.loads(orjson.dumps(problem_to_json(stored))) == obj
        assert problem_from_json(obj) == stored
    for line in lines[1 + n :]:
        obj = orjson.loads(line)
        kernel, source_hash, target_digest, sp = launch_spec_from_json(obj)
        assert sp in store.get_specs(source_hash)[target_digest]
        assert launch_spec_to_json(kernel, source_hash, target_digest, sp) == obj
