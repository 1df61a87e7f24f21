"""Which stored row a put may replace, by the rows' signatures: one rule for every table of code.

A binary, a launch spec or a torch.compile entry is code, signed where it is made
(:mod:`tunecache.trust`). A put replaces a stored row only when that row is unsigned, or names the
putting row's own signer (:func:`tunecache.signing.row_signer`; a tampered row that names the key
too is then put right by its signer). A row signed by none, or by another key, never replaces a
signed one: a host that trusts no key (a dev box on the fleet's store) or signs with another key
would otherwise evict the fleet's rows, which the fleet puts back, and the two evict each other.
The rule is a SQL condition, evaluated in the put's own transaction.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tunecache import signing


def replaceable_by(column: Any, signature: str | None) -> sa.ColumnElement[bool]:
    """The stored rows (their ``signature`` column) that a row signed ``signature`` may replace."""
    signer = signing.row_signer(signature)
    if signer is None:
        return column.is_(None)
    return sa.or_(column.is_(None), sa.func.substr(column, 1, len(signer)) == signer)


def kept_out_by(stored: str | None, signature: str | None) -> bool:
    """Whether a stored row signed ``stored`` keeps out a row signed ``signature`` (the same rule)."""
    signer = signing.row_signer(signature)
    return stored is not None and not (signer is not None and stored.startswith(signer))


__all__ = ["kept_out_by", "replaceable_by"]
