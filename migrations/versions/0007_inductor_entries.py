"""inductor entries: torch.compile's remote caches (autotune, FX graph, AOTAutograd) in the store

Inductor's remote caches hand their backend bytes under Inductor's own key; tunecache.inductor files
them here, bound to the target (device, driver, torch and Triton versions) and addressed by their
sha256. FX graph and AOTAutograd entries are code: signed where made (tunecache.trust.trust).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")
# A compiled graph may be megabytes: MySQL's BLOB stops at 64 KiB.
BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inductor_entries",
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("target_digest", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("value", BLOB, nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=32), nullable=False),
        sa.Column("device_name", sa.String(length=128), nullable=False),
        sa.Column("driver_version", sa.String(length=32), nullable=False),
        sa.Column("torch_version", sa.String(length=64), nullable=False),
        sa.Column("triton_version", sa.String(length=32), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("used_at", TIMESTAMP, nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("kind", "key_hash", "target_digest", name=op.f("pk_inductor_entries")),
    )
    op.create_index(op.f("ix_inductor_entries_driver_version"), "inductor_entries", ["driver_version"], unique=False)
    op.create_index(op.f("ix_inductor_entries_used_at"), "inductor_entries", ["used_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_inductor_entries_used_at"), table_name="inductor_entries")
    op.drop_index(op.f("ix_inductor_entries_driver_version"), table_name="inductor_entries")
    op.drop_table("inductor_entries")
