"""measurements: every host's own timings of identical problems, for finding slow GPUs

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "measurements",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("median_ms", sa.Double(), nullable=False),
        sa.Column("p20_ms", sa.Double(), nullable=True),
        sa.Column("p80_ms", sa.Double(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("measured_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("digest", "host", "config_hash", name=op.f("pk_measurements")),
    )


def downgrade() -> None:
    op.drop_table("measurements")
