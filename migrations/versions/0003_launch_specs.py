"""launch_specs: what Triton compiled each winner with, for preloading binaries at restart

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "launch_specs",
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        sa.Column("target_digest", sa.String(length=64), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("kernel", sa.String(length=255), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("kernel_hash", sa.String(length=64), nullable=False),
        sa.Column("triton_version", sa.String(length=32), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("source_hash", "target_digest", "spec_hash", name=op.f("pk_launch_specs")),
    )


def downgrade() -> None:
    op.drop_table("launch_specs")
