"""The test database servers: where they are, and a fresh empty database on one.

PostgreSQL comes from ``TUNECACHE_TEST_PG_URL`` (default: the local server's ``test`` database),
MySQL/MariaDB from ``TUNECACHE_TEST_MYSQL_URL``. Both are read here, for the tests only, not through
tunecache.settings: they configure the test suite, not tunecache.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("TUNECACHE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("TUNECACHE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")


def _server_db(base: str, name: str) -> str:
    from tunecache.store.engine import resolve_url

    return resolve_url(base).set(database=name).render_as_string(hide_password=False)


def make_database(kind: str) -> tuple[str, Callable[[], None]]:
    """Create a fresh, empty database on the test server; return its URL and a dropper."""
    from tunecache.store.engine import resolve_url

    name = f"tc_{uuid.uuid4().hex[:12]}"
    base = PG_URL if kind == "postgresql" else MYSQL_URL
    admin = sa.create_engine(resolve_url(base), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"CREATE DATABASE {name}")
    except Exception as e:  # noqa: BLE001
        admin.dispose()
        pytest.fail(f"cannot create a {kind} test database at {resolve_url(base).render_as_string()}: {e}")

    def drop() -> None:
        with admin.connect() as c:
            force = " WITH (FORCE)" if kind == "postgresql" else ""
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
        admin.dispose()

    return _server_db(base, name), drop
