"""Scenario 5: a corrupt or unusable SQLite store.

Every time, a fresh process launches the kernel on that store: it must run (tuning in the process),
say once and clearly which file is the problem and why, and leave the file as it was.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultlib import check_ok, collect, fault_report_fixture, log_lines, spawn  # noqa: F401

from tunecache.problem.identity import problem_digest
from tunecache.problem.model import ConfigResult, Problem
from tunecache.problem.target import Target
from tunecache.store.opening import open_store

SIZES = [64, 100, 200]
N_CONFIGS = 6  # worker.configs()
ROOT = Path(__file__).resolve().parents[2]


def _seed(path: Path, n: int = 3) -> None:
    """A valid store holding n problems (of another kernel), checkpointed and closed."""
    t = Target("cuda", "sm90", "NVIDIA H200", 132, 232448, 32, "13000", "580.159.04", "13.0", "3.9")
    s = open_store(f"sqlite:///{path}")
    for i in range(n):
        key = f'[["B",{i}]]'
        p = Problem(problem_digest("seed", t, key), "seed.kernel", "seed", t, key, batch_bucket=i)
        s.put(p, [ConfigResult(f"c{j}", {"kwargs": {"X": j}}, median_ms=1.0 + j) for j in range(3)])
    s.close()


def _fingerprint(path: Path) -> tuple:
    st = os.stat(path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_ino, st.st_size


def _problems(path: Path) -> int:
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return c.execute("SELECT count(*) FROM problems").fetchone()[0]


# ---- running the worker as `nobody` -------------------------------------------------------------


def _hidden(need: Path) -> tuple[Path, Path] | None:
    """The first ancestor of ``need`` that others cannot traverse, and its child on the way to ``need``."""
    p = Path("/")
    for part in need.parts[1:]:
        nxt = p / part
        if p != Path("/") and not p.stat().st_mode & 0o001:
            return p, nxt
        p = nxt
    return None


def _nobody(base: Path) -> tuple[list[str], dict]:
    """A prefix that runs the worker as ``nobody`` (via runuser), and the environment it needs.

    The interpreter may live where ``nobody`` cannot go (pyenv under /root, mode 0700). In a private
    mount namespace (nothing leaks to the host) a world-readable tmpfs covers that directory, with
    the interpreter's tree bind-mounted back into it. Nothing on the host changes.
    """
    needs = {Path(sys.executable).resolve(), Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), ROOT}
    hidden: dict[Path, set[Path]] = {}
    for need in needs:
        h = _hidden(need)
        if h:
            hidden.setdefault(h[0], set()).add(h[1])
    script = ["set -e"]
    for i, (top, children) in enumerate(sorted(hidden.items())):
        stages = []
        for j, child in enumerate(sorted(children)):
            stage = base / f"stage{i}-{j}"
            stage.mkdir()
            stages.append((child, stage))
            script.append(f"mount --bind '{child}' '{stage}'")
        script.append(f"mount -t tmpfs -o mode=755,size=1m tmpfs '{top}'")
        for child, stage in stages:
            script += [f"mkdir -p '{child}'", f"mount --bind '{stage}' '{child}'"]
    home = base / "home"
    home.mkdir()
    shutil.chown(home, "nobody")
    script.append(f"exec runuser -u nobody -- env HOME='{home}' \"$@\"")
    env = {"TUNECACHE_LOCK_DIR": str(home / "locks"), "TRITON_CACHE_DIR": str(home / "triton")}
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(script), "sh"], env


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory under /tmp that ``nobody`` can enter (pytest's tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="tunecache-faults-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["chmod", "-R", "u+rwx", str(d)], check=False, timeout=60)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator:
    """``mount(size) -> dir``: a small tmpfs, unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str = "1m") -> Path:
        d = tmp_path / f"tmpfs{len(mounted)}"
        d.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, timeout=60
        )
        if r.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs (root needed): {r.stderr.decode().strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False, timeout=60)


def _fill(directory: Path) -> int:
    """Fill the filesystem of ``directory``; returns the bytes written."""
    written = 0
    with open(directory / "filler", "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 64, 1):
            chunk = b"\0" * size
            for _ in range(100_000):
                try:
                    f.write(chunk)
                    written += size
                except OSError:
                    break
    return written


def _run(url: str, prefix: list[str] | None = None, env: dict | None = None, **kw) -> dict:
    r = collect(spawn("kernel", {"url": url, "sizes": SIZES, **kw}, env, prefix=prefix or ()), 240)
    check_ok(r)  # the kernel ran and produced the right output for every size; nothing was raised
    assert sorted(map(int, r["winners"])) == SIZES
    return r


# ---- the cases -----------------------------------------------------------------------------------


def _garbage(d: Path, _: Path) -> tuple[Path, str, list, dict]:
    path = d / "store.sqlite3"
    path.write_bytes(os.urandom(64 * 1024))
    return path, r"file is not a database", [], {}


def _malformed_pages(d: Path, _: Path) -> tuple[Path, str, list, dict]:
    path = d / "store.sqlite3"
    _seed(path)
    data = bytearray(path.read_bytes())
    page = struct.unpack(">H", data[16:18])[0]
    data[2 * page :] = os.urandom(len(data) - 2 * page)  # header and schema page intact, table pages not
    path.write_bytes(bytes(data))
    return path, r"malformed", [], {}


def _truncated_file(d: Path, _: Path) -> tuple[Path, str, list, dict]:
    path = d / "store.sqlite3"
    _seed(path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)  # an interrupted copy
    return path, r"malformed", [], {}


def _disk_full(d: Path, mount) -> tuple[Path, str, list, dict]:
    fs = mount("1m")
    path = fs / "store.sqlite3"
    _seed(path)
    _fill(fs)
    return path, r"no space left", [], {}


def _no_permission(d: Path, world: Path) -> tuple[Path, str, list, dict]:
    path = world / "store.sqlite3"
    _seed(path)
    os.chmod(path, 0o000)
    prefix, env = _nobody(world)
    return path, r"permission denied", prefix, env


def _unreadable_directory(d: Path, world: Path) -> tuple[Path, str, list, dict]:
    sub = world / "private"
    sub.mkdir()
    path = sub / "store.sqlite3"
    _seed(path)
    os.chmod(sub, 0o700)
    prefix, env = _nobody(world)
    return path, r"permission denied", prefix, env


CASES = {
    "garbage": _garbage,
    "malformed-pages": _malformed_pages,
    "truncated-file": _truncated_file,
    "disk-full": _disk_full,
    "no-permission": _no_permission,
    "unreadable-directory": _unreadable_directory,
}


@pytest.mark.parametrize("case", list(CASES))
def test_unusable_sqlite_store_falls_back_with_one_warning(case, tmp_path, tmpfs, world_dir, fault_report):
    if case in ("no-permission", "unreadable-directory", "disk-full") and os.geteuid() != 0:
        pytest.skip("needs root (tmpfs, runuser)")
    arg = {"disk-full": tmpfs, "no-permission": world_dir, "unreadable-directory": world_dir}.get(case, tmp_path)
    path, cause, prefix, env = CASES[case](tmp_path, arg)
    before = _fingerprint(path)
    siblings = sorted(os.listdir(path.parent))
    r = _run(f"sqlite:///{path}", prefix, env)
    # Tuned in this process: every config of every key benchmarked, nothing stored.
    assert r["stats"]["benchmarks"] == len(SIZES) * N_CONFIGS and r["stats"]["store_errors"] >= 1
    warnings = log_lines(r)
    assert len(warnings) == 1, warnings  # one warning, however many reads and writes failed
    assert str(path) in warnings[0], warnings[0]  # names the file...
    assert re.search(cause, warnings[0], re.I), warnings[0]  # ... and why
    assert _fingerprint(path) == before, "the store file was changed"  # bytes, mtime and inode
    assert set(siblings) <= set(os.listdir(path.parent))  # nothing deleted
    if case in ("no-permission", "unreadable-directory"):
        assert r["host"] and r["pid"]  # ran as nobody: the worker could not have read the file as root
    fault_report.update(
        case=case,
        warning=warnings[0][-160:],
        benchmarks=r["stats"]["benchmarks"],
        store_errors=r["stats"]["store_errors"],
        file_unchanged=True,
    )


def test_disk_fills_while_running_keeps_what_was_written(tmp_path, tmpfs, fault_report):
    if os.geteuid() != 0:
        pytest.skip("needs root (tmpfs)")
    fs = tmpfs("2m")
    path = fs / "store.sqlite3"
    _seed(path)
    ino = os.stat(path).st_ino
    r = _run(f"sqlite:///{path}", fill=str(fs / "filler"))  # fills the disk after the first key
    assert r["stats"]["benchmarks"] == len(SIZES) * N_CONFIGS
    warnings = log_lines(r)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and re.search(r"disk is full|no space left", warnings[0], re.I), warnings[0]
    assert os.stat(path).st_ino == ino
    for f in fs.glob("filler*"):
        f.unlink()
    # The first key (stored before the disk filled) and the seeded rows are intact.
    assert _problems(path) == 3 + 1
    fault_report.update(
        case="disk-fills-while-running",
        warning=warnings[0][-160:],
        pending_when_exiting=r["pending_puts"],
        rows_after=4,
    )


def _wal_commits(wal: bytes) -> list[int]:
    """Byte offsets just past each commit frame of a WAL file."""
    page = struct.unpack(">I", wal[8:12])[0]
    out, off = [], 32
    while off + 24 + page <= len(wal):
        if struct.unpack(">I", wal[off + 4 : off + 8])[0]:  # "database size after commit": a commit frame
            out.append(off + 24 + page)
        off += 24 + page
    return out


def test_truncated_wal_loses_only_the_torn_commits(tmp_path, fault_report):
    """A crash left a WAL; its tail is torn. SQLite rolls back to the last whole commit (the
    documented synchronous=NORMAL contract): what survived is used, what was lost is tuned again."""
    path = tmp_path / "store.sqlite3"
    url = f"sqlite:///{path}"
    first = collect(spawn("kernel", {"url": url, "sizes": SIZES, "die": True}), 240)
    assert first["rc"] == -9 and "Traceback" not in first["stderr"]
    wal = path.with_name(path.name + "-wal").read_bytes()
    commits = _wal_commits(wal)
    # Tear the WAL in the middle of a frame, after the last commit that still leaves at least one key.
    survived, cut = None, None
    for end in reversed(commits[:-1]):
        probe = tmp_path / f"probe{end}"
        probe.mkdir()
        shutil.copy(path, probe / path.name)
        (probe / (path.name + "-wal")).write_bytes(wal[: end + 24 + 100])
        n = _problems(probe / path.name)
        if 1 <= n < len(SIZES):
            survived, cut = n, end + 24 + 100
            break
    assert cut is not None, "no commit boundary leaves some keys but not all"
    with open(path.with_name(path.name + "-wal"), "r+b") as f:
        f.truncate(cut)
    ino = os.stat(path).st_ino
    r = _run(url)
    assert r["stats"]["hits"] == survived
    assert r["stats"]["benchmarks"] == (len(SIZES) - survived) * N_CONFIGS
    assert not [m for m in log_lines(r) if "store unavailable" in m]  # nothing wrong with the store now
    assert all("took over" in m for m in log_lines(r))  # at most: a lease of the crashed process
    assert os.stat(path).st_ino == ino
    assert _problems(path) == len(SIZES)
    fault_report.update(
        case="truncated-wal",
        wal_bytes=len(wal),
        wal_commits=len(commits),
        cut_at=cut,
        keys_survived=survived,
        keys_retuned=len(SIZES) - survived,
    )
