"""The import's queries: what the store already holds of an incoming file, and the deletes before it.

Kept in the store layer (the only one that writes SQL) so that :mod:`tunecache.exchange.importer`
keeps only the file format and the conflict policy; its bulk inserts are :mod:`tunecache.store.bulk`.
Every function takes the import's open Connection: all of it is one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tunecache.store.schema import configs, misses, problems

#: Digests per ``IN (...)``: large enough to be few round trips, small enough for every backend.
LOOKUP_CHUNK = 2000


def stored_winners(conn: Connection, digests: Sequence[str]) -> dict[str, tuple[str | None, float | None]]:
    """``{digest: (winner config hash, winner ms)}`` of the ``digests`` the store holds (one query
    only when it holds no problem at all: a first import into an empty store)."""
    stored: dict[str, tuple[str | None, float | None]] = {}
    if conn.execute(sa.select(problems.c.digest).limit(1)).first() is None:
        return stored
    for i in range(0, len(digests), LOOKUP_CHUNK):
        q = sa.select(problems.c.digest, problems.c.winner_config_hash, problems.c.winner_ms).where(
            problems.c.digest.in_(digests[i : i + LOOKUP_CHUNK])
        )
        stored.update((d, (w, ms)) for d, w, ms in conn.execute(q))
    return stored


def delete_problems(conn: Connection, digests: Sequence[str]) -> None:
    """Delete these problems and their configs (an import replacing them)."""
    for i in range(0, len(digests), LOOKUP_CHUNK):
        chunk = digests[i : i + LOOKUP_CHUNK]
        conn.execute(sa.delete(configs).where(configs.c.digest.in_(chunk)))
        conn.execute(sa.delete(problems).where(problems.c.digest.in_(chunk)))


def drop_misses(conn: Connection, digests: Iterable[str]) -> None:
    """Delete the recorded capture misses of these digests (an import resolves them)."""
    missed = set(conn.execute(sa.select(misses.c.digest)).scalars()) & set(digests)
    if missed:
        conn.execute(sa.delete(misses).where(misses.c.digest.in_(sorted(missed))))
