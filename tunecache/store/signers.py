"""Signer slots: in every table of code each signer keeps its own row of one identity, and a read
returns only the rows of the signers its reader trusts, none larger than a row of code can be.

A binary, a host module, a launch spec or a torch.compile entry is code, signed where it is made
(:mod:`tunecache.trust.trust`). Each table of code keys its rows by their identity *and* their signer's
slot, the column ``signer``: the base64 public key the row's signature names, "" for an unsigned
row or a malformed signature (:func:`tunecache.trust.signing.row_slot`), written by the store from the
row's signature, never taken from a caller. So:

- a put writes only its own signer's slot: a torch.compile entry replaces what the slot held (last
  writer wins within one signer, as with Inductor's Redis); a binary or launch spec keeps the row
  there where the slot's key verifies it as it stands (the first build of a key stays, as in
  Triton's own cache) and replaces anything else. Either way a row planted in a signer's slot (a
  junk signature naming the fleet's key, an altered row) is put right by that signer's next put;
- a row in another slot never keeps a put out, nor is evicted by it: a dev box that signs with no
  key and the fleet never evict each other, and a row planted first, under any other key or none,
  blocks no one;
- a read returns the rows of the slots its reader trusts (its trusted keys' slots; every slot of a
  store trusted as a whole), so a row of an untrusted slot is never read, however many there are;
  the slot only selects: every row read is still verified against the identity asked for.

And a read never returns a row of code larger than :data:`MAX_ROW_BYTES` of its table, measured by
the database (the row's ``size`` column is not what it trusts): a planted oversized payload costs a
reader one skipped row.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from tunecache.settings import MAX_BINARY_BYTES

#: The largest row of code a read returns, by table: a binary or host module as large as one may be
#: uploaded or imported; a launch spec (a few KiB) as large as an export line; a torch.compile entry
#: 256 MiB (max-autotune's largest FX graph measured so far: 44 MB, docs/torch-compile.md).
MAX_ROW_BYTES: dict[str, int] = {"binaries": MAX_BINARY_BYTES, "launch_specs": 4 << 20, "inductor_entries": 256 << 20}


def trusted_slots(column: Any, slots: Collection[str] | None) -> list[Any]:
    """The condition that a row's ``signer`` ``column`` is one of ``slots`` (None: any slot)."""
    return [] if slots is None else [column.in_(sorted(slots))]


def not_larger(table: sa.Table, *payload: Any) -> Any:
    """The condition that the ``payload`` columns of a row of ``table`` are within its :data:`MAX_ROW_BYTES`."""
    total = sa.func.length(payload[0])
    for c in payload[1:]:
        total = total + sa.func.length(c)
    return total <= MAX_ROW_BYTES[table.name]


__all__ = ["MAX_ROW_BYTES", "not_larger", "trusted_slots"]
