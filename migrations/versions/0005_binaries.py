"""binaries: the winners' compiled binaries, so that a fresh host compiles nothing

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")
# A binary is at most 2.5 MiB: MySQL's BLOB stops at 64 KiB.
BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "binaries",
        sa.Column("triton_key", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        sa.Column("kernel", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=150), nullable=False),
        sa.Column("ext", sa.String(length=16), nullable=False),
        sa.Column("triton_version", sa.String(length=32), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("metadata", BLOB, nullable=False),
        sa.Column("binary", BLOB, nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("triton_key", name=op.f("pk_binaries")),
    )
    op.create_index(op.f("ix_binaries_source_hash"), "binaries", ["source_hash"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_binaries_source_hash"), table_name="binaries")
    op.drop_table("binaries")
