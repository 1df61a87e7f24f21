"""operations: capture/offline misses, per-kernel counters, an index for gc

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kernel_stats",
        sa.Column("kernel", sa.String(length=255), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.Column("misses", sa.BigInteger(), nullable=False),
        sa.Column("benchmarks", sa.BigInteger(), nullable=False),
        sa.Column("bench_seconds", sa.Double(), nullable=False),
        sa.Column("saved_seconds", sa.Double(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("kernel", name=op.f("pk_kernel_stats")),
    )
    op.create_table(
        "misses",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("kernel", sa.String(length=255), nullable=False),
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        sa.Column("target_digest", sa.String(length=64), nullable=False),
        sa.Column("key_json", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("first_seen", TIMESTAMP, nullable=False),
        sa.Column("last_seen", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("digest", "reason", name=op.f("pk_misses")),
    )
    with op.batch_alter_table("problems", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_problems_last_hit_at"), ["last_hit_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("problems", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_problems_last_hit_at"))
    op.drop_table("misses")
    op.drop_table("kernel_stats")
