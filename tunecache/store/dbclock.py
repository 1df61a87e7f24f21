"""The database's clock: the one time every host of a fleet reads alike.

A lease's expiry was once the holder's ``time.time() + ttl``, compared with the waiter's ``time.time()``:
hosts whose clocks disagree by minutes (NTP broken, a VM resumed) then either waited
``TUNECACHE_WAIT_SECONDS`` on a holder long dead or took a live holder's lease over at once. A lease's
times are therefore the database's own, read in the statement that writes or compares them.

``now(dialect)`` is that time as a Unix time in seconds (a float, what ``leases.expires_at`` holds):

==========  =====================================================================================
SQLite      ``julianday('now')`` (milliseconds; the same within one statement). The file is local, so
            this is the clock of the host that runs the statement, as it can only be; ``unixepoch
            ('subsec')`` would do the same from SQLite 3.42, newer than some Pythons bundle
PostgreSQL  ``clock_timestamp()``: the time as the statement runs, not ``now()``, which is the
            transaction's start (a statement that waited on a row lock would see its lease early)
MySQL /     ``UTC_TIMESTAMP(6)`` minus the epoch, as a plain difference of datetimes: unlike
MariaDB     ``UNIX_TIMESTAMP(NOW(6))`` it never passes through the session's time zone (whose
            daylight-saving hour it reads twice)
==========  =====================================================================================
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

_NOW = {
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    "mysql": "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1e6)",
}
_NOW["mariadb"] = _NOW["mysql"]


def now(dialect: str) -> Any:
    """The database's time now, as Unix seconds, for use inside a statement (a SQL expression)."""
    try:
        return sa.literal_column(_NOW[dialect], sa.Double)
    except KeyError:
        raise ValueError(f"no clock known for the {dialect!r} database") from None


__all__ = ["now"]
