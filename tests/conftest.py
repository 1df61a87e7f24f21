"""Shared fixtures. Store tests run against SQLite AND the real PostgreSQL (never a mock).

PostgreSQL comes from ``TUNECACHE_TEST_PG_URL`` (default: the local server's ``test`` database;
see tests/servers.py); each test gets a fresh database on that server. If the server cannot be reached, the PostgreSQL
tests FAIL: ``scripts/test`` starts the local server first.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

# Ctrl-C as in a terminal, for this process and the children it starts: an xdist worker, and any
# command that a non-interactive shell runs in the background (scripts/test's older-Triton
# segments), begin with SIGINT ignored, which every child inherits, so a test of what a process
# does on Ctrl-C saw it run on (test_new_user's interrupted import exited 0, not 130).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Kernels run under the Triton interpreter on a CPU machine; this must precede any triton import.
if os.environ.get("TUNECACHE_TEST_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"
# This process's own directory (one per xdist worker; see docs/testing.md): kernels defined at
# import (collection) time open their store in the background there, away from the user's real
# default store (each test then gets its own, see _isolated), and Triton's cache lives there, so no
# worker, no other run and no user shares the compiles and launchers one of them is checking.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_COLLECT_DIR = __import__("tempfile").mkdtemp(prefix=f"tc-{_WORKER}-")
__import__("atexit").register(__import__("shutil").rmtree, _COLLECT_DIR, ignore_errors=True)
os.environ["TUNECACHE_URL"] = f"sqlite:///{_COLLECT_DIR}/s.sqlite3"
os.environ["TRITON_CACHE_DIR"] = f"{_COLLECT_DIR}/triton"
# Inductor's C++ builds, shared by the torch.compile tests' host processes (tests/cppbuilds.py):
# scripts/test names one pool per run; otherwise this process's.
os.environ.setdefault("TEST_INDUCTOR_CPP_BUILDS", f"{_COLLECT_DIR}/cpp-builds")

import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # tests/tinykernels.py, tests/procs.py, tests/servers.py

import scheduling  # noqa: E402
from servers import PG_URL, make_database  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help=f"the quick tier: no slow-marked test, none over {scheduling.QUICK_SECONDS:g} s (tests/scheduling.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    profile = os.environ.get("TUNECACHE_TEST_PROFILE")
    if profile:
        from profiling import Profiler

        config.pluginmanager.register(Profiler(profile), "tunecache-profile")
    config.pluginmanager.register(_Counter(), "tunecache-count")


# The parameter values of a store test's server-database variants (store_url's, or a test's own).
SERVER_VARIANTS = ("postgresql", "mysql")


def pytest_itemcollected(item: pytest.Item) -> None:
    """A variant on a database server of a test marked ``sql_variants`` is marked ``server_sql``:
    what it adds to the SQLite variant is SQL, the same on every Triton, so the older Tritons'
    segments of scripts/test leave it to the newest's (``-m "not server_sql"``)."""
    mark = item.get_closest_marker("sql_variants")
    if mark is None:
        return
    assert mark.args and mark.args[0], f"{item.nodeid}: sql_variants needs its reason"
    params = getattr(getattr(item, "callspec", None), "params", {})
    kinds = {v for v in params.values() if isinstance(v, str) and v in ("sqlite", *SERVER_VARIANTS)}
    assert kinds, f"{item.nodeid}: sql_variants on a test with no store variants"
    if kinds & set(SERVER_VARIANTS):
        item.add_marker(pytest.mark.server_sql)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scheduling.arrange(config, items, parallel=_WORKER != "main")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    return scheduling.scheduler(config, log)


class _Counter:
    """Prints how many tests ran (one line, read by scripts/test to check no segment shrank)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seen.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
        if _WORKER == "main":
            terminalreporter.write_line(f"tunecache: {len(self.seen)} tests ran")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def _fresh_database(kind: str):
    url, drop = make_database(kind)
    yield url
    from tunecache.store.opening import reset_shared_stores

    reset_shared_stores()
    drop()


@pytest.fixture
def pg_url():
    yield from _fresh_database("postgresql")


@pytest.fixture
def mysql_url():
    yield from _fresh_database("mysql")


@pytest.fixture(scope="session")
def pgbouncer():
    """A private PgBouncer (transaction pooling, 10 server connections per database) in front of the
    test PostgreSQL, for the whole session; installed first if missing (tests/pgbouncer.py)."""
    from pgbouncer import PgBouncer

    from tunecache.store.engine import resolve_url

    u = resolve_url(PG_URL)
    try:
        bouncer = PgBouncer(u.host or "127.0.0.1", u.port or 5432, pool_size=10).start()
    except RuntimeError as e:
        pytest.fail(f"cannot start PgBouncer: {e}")
    yield bouncer
    bouncer.stop()


@pytest.fixture
def bouncer_url(pgbouncer, pg_url) -> str:
    """A fresh PostgreSQL database, reached through PgBouncer in transaction mode."""
    return pgbouncer.through(pg_url)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Parametrises a test over the embedded SQLite and the real PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every test: its own default store, lock dir and counters; no leaked env."""
    monkeypatch.setenv("TUNECACHE_URL", f"sqlite:///{tmp_path / 'default.sqlite3'}")
    monkeypatch.setenv("TUNECACHE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("TUNECACHE_MISS_SPOOL", str(tmp_path / "misses.jsonl"))
    for var in (
        "TUNECACHE_MODE",
        "TUNECACHE_TARGET_OVERRIDE",
        "TUNECACHE_ON_DRIVER_CHANGE",
        "TUNECACHE_LEASE_SECONDS",
        "TUNECACHE_WAIT_SECONDS",
        "TUNECACHE_HOST_ID",
        "TUNECACHE_WINNER_TOLERANCE",
        "TUNECACHE_PREFETCH",
        "TUNECACHE_POOL_SIZE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TUNECACHE_CPU_BENCH_REPS", "1")
    import tunecache
    from tunecache.process import counters, writeback
    from tunecache.store import breaker
    from tunecache.store.opening import reset_shared_stores

    tunecache.reset_stats()
    counters.reset_warnings()
    yield
    writeback.flush()
    reset_shared_stores()
    breaker.reset()  # a hung server's breaker stays open otherwise (tunecache_store_breaker_open)
    tunecache.uninstall()


#: The lock the run's fleet tests share: scripts/test names one per run (TUNECACHE_TEST_FLEET_LOCK);
#: a plain pytest run shares this machine's.
FLEET_LOCK = os.environ.get("TUNECACHE_TEST_FLEET_LOCK") or os.path.join(
    __import__("tempfile").gettempdir(), f"tunecache-test-fleet-{os.getuid()}.lock"
)


@pytest.fixture(autouse=True)
def _one_fleet_at_a_time(request: pytest.FixtureRequest):
    """A test marked ``fleet`` (16 processes started together, with bounds on how soon they finish)
    runs while no other does, in any xdist worker: on a 2-core machine two such fleets at once starved
    each other past their bounds (CI: a kill-9 survivor still running 60 s after the last kill).
    The CPU is the bottleneck either way, so a worker waiting here costs the run little."""
    if request.node.get_closest_marker("fleet") is None:
        yield
        return
    from filelock import FileLock

    with FileLock(FLEET_LOCK):
        yield


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def fleet_url(request: pytest.FixtureRequest) -> str:
    """The multi-process cases: the embedded SQLite, the real PostgreSQL, and that PostgreSQL through
    PgBouncer in transaction mode with a pool of 10 (issue 18)."""
    return request.getfixturevalue({"sqlite": "sqlite_url", "postgresql": "pg_url"}.get(request.param, "bouncer_url"))


@pytest.fixture
def make_readonly(tmp_path: Path):
    """Returns ``freeze(files) -> dir``: a directory holding copies of ``files`` that nobody can write.

    As root (CI), chmod does not stop writes, so the copies go on a tmpfs remounted read-only, like
    an image's read-only root filesystem. Otherwise the directory and files are chmod'ed read-only.
    """
    import shutil
    import subprocess

    mounts: list[Path] = []
    chmodded: list[Path] = []

    def freeze(files: list[Path]) -> Path:
        d = tmp_path / f"ro{len(mounts) + len(chmodded)}"
        d.mkdir()
        if os.geteuid() == 0:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d)], capture_output=True)
            if r.returncode == 0:
                mounts.append(d)
                for f in files:
                    shutil.copy(f, d / Path(f).name)
                subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
                return d
        for f in files:
            shutil.copy(f, d / Path(f).name)
            os.chmod(d / Path(f).name, 0o444)
        os.chmod(d, 0o555)
        chmodded.append(d)
        if os.access(d, os.W_OK):
            pytest.fail("cannot make a read-only directory here (root without mount permission)")
        return d

    yield freeze
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)
    for d in chmodded:
        os.chmod(d, 0o755)


@pytest.fixture
def roles(pg_url):
    """Fresh role names (a reader, a tuner, and more for test_roles.py's setups); those created are
    dropped (with their privileges) after the test."""
    kinds = ("reader", "tuner", "owner", "writers", "team", "nested", "member", "boss")
    names = {k: f"tc_{k}_{uuid.uuid4().hex[:8]}" for k in kinds}
    yield names
    from tunecache.store.engine import resolve_url

    admin = sa.create_engine(resolve_url(pg_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        for r in names.values():
            if c.exec_driver_sql("SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": r}).first():
                c.exec_driver_sql(f'DROP OWNED BY "{r}"')
                c.exec_driver_sql(f'DROP ROLE "{r}"')
    admin.dispose()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print each test's ``("summary", line)`` user property (what a generated test covered, e.g. the
    hit path's differential test): one line each, also from xdist workers (properties travel with
    their reports)."""
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "summary"
    ]
    for line in lines:
        terminalreporter.write_line(line)
