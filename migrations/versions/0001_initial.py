"""initial schema: problems, their config rows, and benchmark leases

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Naive UTC timestamps; MySQL needs fsp=6 to keep microseconds.
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mariadb").with_variant(mysql.DATETIME(fsp=6), "mysql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_leases")),
    )
    op.create_table(
        "problems",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("kernel", sa.String(length=255), nullable=False),
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        sa.Column("target_digest", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=32), nullable=False),
        sa.Column("device_name", sa.String(length=128), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("max_shared_mem", sa.Integer(), nullable=False),
        sa.Column("warp_size", sa.Integer(), nullable=False),
        sa.Column("driver_version", sa.String(length=32), nullable=False),
        sa.Column("driver_release", sa.String(length=64), nullable=False),
        sa.Column("cuda_runtime", sa.String(length=32), nullable=False),
        sa.Column("triton_version", sa.String(length=16), nullable=False),
        sa.Column("key_json", sa.Text(), nullable=False),
        sa.Column("batch_bucket", sa.Integer(), nullable=True),
        sa.Column("winner_config_hash", sa.String(length=32), nullable=True),
        sa.Column("winner_ms", sa.Double(), nullable=True),
        sa.Column("search_space_hash", sa.String(length=64), nullable=False),
        sa.Column("tuning_seconds", sa.Double(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False),
        sa.Column("last_hit_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_problems")),
    )
    with op.batch_alter_table("problems", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_problems_arch_device_name"), ["arch", "device_name"], unique=False)
        batch_op.create_index(batch_op.f("ix_problems_driver_version"), ["driver_version"], unique=False)
        batch_op.create_index(batch_op.f("ix_problems_kernel"), ["kernel"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_problems_source_hash_target_digest"),
            ["source_hash", "target_digest"],
            unique=False,
        )
        batch_op.create_index(batch_op.f("ix_problems_updated_at"), ["updated_at"], unique=False)

    op.create_table(
        "configs",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("median_ms", sa.Double(), nullable=True),
        sa.Column("p20_ms", sa.Double(), nullable=True),
        sa.Column("p80_ms", sa.Double(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("measured_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "status IN ('ok', 'out_of_resources', 'compile_error', 'runtime_error', 'pruned')",
            name=op.f("ck_configs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["digest"], ["problems.digest"], name=op.f("fk_configs_digest_problems"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("digest", "config_hash", name=op.f("pk_configs")),
    )


def downgrade() -> None:
    op.drop_table("configs")
    op.drop_table("problems")
    op.drop_table("leases")
