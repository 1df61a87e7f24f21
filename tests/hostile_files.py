"""Hostile export files, for the import-memory test and scripts/bench_import_memory.py.

:func:`write_spec_bomb` writes a valid version-2 export whose launch-spec lines are each nearly
:data:`tunecache.exchange.MAX_LINE_BYTES` long and compress ~1000:1: a file of a few hundred
kilobytes that is gigabytes of lines. Every line passes validation, so an importer that keeps
them (or any part proportional to their size) grows with the uncompressed file.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import tempfile
from pathlib import Path

import orjson

from tunecache.exchange import FORMAT_NAME, MAX_LINE_BYTES, export
from tunecache.problem.configidentity import config_hash_of
from tunecache.problem.identity import canonical_key, problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.store.opening import open_store

H200 = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.5")
SOURCE = "5e" * 32


def _problem_line() -> bytes:
    """One valid problem line, as a real export writes it."""
    with tempfile.TemporaryDirectory(prefix="tc-hostile-") as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 's.sqlite3'}")
        key = canonical_key(["N"], [1024])
        cfg = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 2, "num_ctas": 1, "maxnreg": None}
        cfg["pre_hook"] = None
        t0 = dt.datetime(2026, 1, 1)
        p = Problem(problem_digest(SOURCE, H200, key), "tests.kernels.add_kernel", SOURCE, H200, key, 1024)
        store.put(p, [ConfigResult(config_hash_of(cfg), cfg, "ok", 0.25, 0.2, 0.3, 25, None, "tuner-1", t0)])
        export(store, Path(tmp) / "one.jsonl", with_launch_specs=False)
        store.close()
        return (Path(tmp) / "one.jsonl").read_bytes().splitlines(keepends=True)[1]


def write_spec_bomb(path: Path, n_specs: int, line_bytes: int = MAX_LINE_BYTES - 1024) -> int:
    """Write the hostile ``.jsonl.gz`` to ``path``; return its uncompressed size in bytes.

    One gzip member per piece (readers concatenate members), so the ``line_bytes`` run of padding
    is compressed once and reused: writing a 1 GB file takes a moment, not a minute.
    """
    problem = _problem_line()
    head = b'{"pad":"'
    pad = b"x" * (line_bytes - 600)
    spec_state = hashlib.sha256(head + pad)
    body_sha = hashlib.sha256(problem)
    pad_member = gzip.compress(pad.replace(b'"', b'\\"'), compresslevel=9, mtime=0)
    pieces: list[tuple[bytes, bytes]] = []  # (before the padding, after it), escaped as in the line
    size = len(problem)
    for i in range(n_specs):
        tail = b'","i":%d}' % i
        h = spec_state.copy()
        h.update(tail)
        fields = {
            "kernel": "tests.kernels.add_kernel",
            "source_hash": SOURCE,
            "target_digest": H200.digest,
            "spec_hash": h.hexdigest(),
            "config_hash": "0" * 32,
            "kernel_hash": f"{i:064x}",
            "triton_version": "3.5.0",
        }
        before = orjson.dumps(fields)[:-1] + b',"spec":"' + head.replace(b'"', b'\\"')
        after = tail.replace(b'"', b'\\"') + b'"}\n'
        body_sha.update(before)
        body_sha.update(pad)
        body_sha.update(after)
        pieces.append((before, after))
        size += len(before) + len(pad) + len(after)
    header = {
        "format": FORMAT_NAME,
        "version": 2,
        "tunecache": "0",
        "problems": 1,
        "configs": 1,
        "body_sha256": body_sha.hexdigest(),
        "created_at": "2026-01-01T00:00:00",
        "filters": {"kernel": None, "arch": None, "device": None, "driver": None, "since": None},
        "launch_specs": n_specs,
    }
    with open(path, "wb") as f:
        f.write(gzip.compress(orjson.dumps(header) + b"\n" + problem, mtime=0))
        for before, after in pieces:
            f.write(gzip.compress(before, mtime=0))
            f.write(pad_member)
            f.write(gzip.compress(after, mtime=0))
    return size
