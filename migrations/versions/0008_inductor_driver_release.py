"""inductor entries carry the driver release: invalidate selects them by it

An entry's target digest covers the driver release (580.95.05, 580.159.04), but the row recorded
only the CUDA driver version (13000), which a driver update may keep: `invalidate --driver
580.95.05` selected no entry, and `--driver-not-current` kept the old release's. Entries stored
before this revision have an empty release (unknown): they are selected by the version only.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inductor_entries") as batch:
        batch.add_column(sa.Column("driver_release", sa.String(length=64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("inductor_entries") as batch:
        batch.drop_column("driver_release")
