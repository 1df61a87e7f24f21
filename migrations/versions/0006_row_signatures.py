"""row signatures: binaries, host modules and launch specs carry their maker's Ed25519 signature

A stored binary, host module or launch spec is code for every GPU of a fleet: a process places or
preloads one only when a trusted key vouches for it (tunecache.trust.trust). Rows stored before this
revision have no signature: they are placed only from a store trusted as a whole.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("launch_specs") as batch:
        batch.add_column(sa.Column("signature", sa.Text(), nullable=True))
    with op.batch_alter_table("binaries") as batch:
        batch.add_column(sa.Column("signature", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("binaries") as batch:
        batch.drop_column("signature")
    with op.batch_alter_table("launch_specs") as batch:
        batch.drop_column("signature")
