"""What a bench sets up around tunecache: a store of its own, a signing key pair, a PostgreSQL
database it drops, a ``tunecache`` command run as a user runs it, another revision's package."""

from __future__ import annotations

import subprocess
import tarfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from pathlib import Path

from benchkit import ROOT, procs


def sqlite_url(path: Path, *, fresh: bool = False) -> str:
    """The URL of a SQLite store at ``path``; ``fresh``: the file (and its WAL) removed first."""
    if fresh:
        path.parent.mkdir(parents=True, exist_ok=True)
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
    return f"sqlite:///{path}"


def key_env(path: Path) -> dict[str, str]:
    """A new key pair at ``path`` (replacing one there): the environment of a host that signs with
    it and trusts it (``TUNECACHE_SIGNING_KEY``, ``TUNECACHE_TRUSTED_KEYS``)."""
    from tunecache.trust import signing

    made = signing.keygen(path, overwrite=True)
    return {"TUNECACHE_SIGNING_KEY": made["private_key"], "TUNECACHE_TRUSTED_KEYS": made["public_key"]}


def pg_database(server_url: str) -> tuple[str, Callable[[], None]]:
    """A fresh database on the PostgreSQL server of ``server_url``, and a function that drops it."""
    import sqlalchemy as sa

    from tunecache.store.engine import resolve_url

    name = f"tc_bench_{uuid.uuid4().hex[:10]}"
    base = resolve_url(server_url)
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")

    def drop() -> None:
        with admin.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop


def cli(
    args: Sequence[str | Path], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None
) -> procs.Done:
    """``tunecache ARGS`` in a process of its own (``python -m tunecache.cli``), timed. Give ``cwd``
    outside the checkout where the installed package must run: from the checkout, ``-m`` imports its
    source tree, which lacks what an install maps (``tunecache.migrations``)."""
    return procs.run(procs.python("-m", "tunecache.cli", *args), env=env, cwd=cwd)


def package_of(rev: str, dest: Path) -> Path:
    """The ``tunecache`` package of git revision ``rev`` of this checkout, unpacked into ``dest``
    (a tree to put first on a child's path)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "tunecache"], check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(data.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest
