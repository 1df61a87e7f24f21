"""signer slots: every table of code keeps one row per identity and signer

A binary, host module, launch spec or torch.compile entry is code, signed where it is made. Until
this revision one row held an identity, and a row planted first (signed by a throwaway key, or
carrying a junk signature) kept the fleet's own signed put out for good. Now each table's primary
key adds the column ``signer`` (the base64 public key the row's signature names; "" for an
unsigned row or a malformed signature: tunecache.store.signers): each signer writes its own row of
an identity, and a host reads only the rows of the keys it trusts. Rows stored before keep their
signatures, which still verify (the signed messages did not change): each is moved into the slot
its signature names.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: Each table of code and its primary key before this revision.
KEYS = {
    "binaries": ["triton_key"],
    "launch_specs": ["source_hash", "target_digest", "spec_hash"],
    "inductor_entries": ["kind", "key_hash", "target_digest"],
}
#: A row signature: "ed25519:" (8), the 44 characters of the base64 public key, ":", the signature.
_SIGNED = "signature LIKE 'ed25519:%' AND length(signature) > 53 AND substr(signature, 53, 1) = ':'"


def upgrade() -> None:
    for table, key in KEYS.items():
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("signer", sa.String(length=64), nullable=False, server_default=""))
        op.execute(f"UPDATE {table} SET signer = substr(signature, 9, 44) WHERE {_SIGNED}")  # noqa: S608 - constants
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", [*key, "signer"])


def downgrade() -> None:
    conn = op.get_bind()
    for table, key in KEYS.items():
        # One row per identity again: the signed row of the greatest slot is kept, the others dropped.
        t = sa.table(table, *(sa.column(c) for c in [*key, "signer"]))
        kept: set[tuple[str, ...]] = set()
        for row in conn.execute(sa.select(t).order_by(*(t.c[c] for c in key), t.c.signer.desc())).all():
            if tuple(row[:-1]) in kept:
                conn.execute(sa.delete(t).where(*(t.c[c] == v for c, v in zip([*key, "signer"], row))))
            kept.add(tuple(row[:-1]))
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.drop_column("signer")
            batch.create_primary_key(f"pk_{table}", key)
