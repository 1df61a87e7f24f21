"""The tables of a store, in one SQL schema for SQLite, PostgreSQL and MySQL.

Kept apart from :mod:`tunecache.store.store` so that the migrations, the export, the import and the
report read the same table objects without the store's connection logic. The column order of
``problems`` and ``configs`` is :mod:`tunecache.problem.model`'s row shape (checked at import).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as mysql_dialect

from tunecache.problem.model import CONFIG_ROW_COLUMNS, PROBLEM_COLUMNS

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Timestamp = sa.DateTime().with_variant(mysql_dialect.DATETIME(fsp=6), "mysql", "mariadb")
Digest = sa.String(64)
#: The signer slot of a row of code (tunecache.store.signers): a base64 Ed25519 public key, or "".
Signer = sa.String(64)

problems = sa.Table(
    "problems",
    metadata,
    sa.Column("digest", Digest, primary_key=True),
    sa.Column("kernel", sa.String(255), nullable=False),
    sa.Column("source_hash", Digest, nullable=False),
    sa.Column("target_digest", Digest, nullable=False),
    sa.Column("backend", sa.String(16), nullable=False),
    sa.Column("arch", sa.String(32), nullable=False),
    sa.Column("device_name", sa.String(128), nullable=False),
    sa.Column("sm_count", sa.Integer, nullable=False),
    sa.Column("max_shared_mem", sa.Integer, nullable=False),
    sa.Column("warp_size", sa.Integer, nullable=False),
    sa.Column("driver_version", sa.String(32), nullable=False),
    sa.Column("driver_release", sa.String(64), nullable=False),
    sa.Column("cuda_runtime", sa.String(32), nullable=False),
    sa.Column("triton_version", sa.String(16), nullable=False),
    sa.Column("key_json", sa.Text, nullable=False),
    sa.Column("batch_bucket", sa.Integer, nullable=True),
    sa.Column("winner_config_hash", sa.String(32), nullable=True),
    sa.Column("winner_ms", sa.Double, nullable=True),
    sa.Column("search_space_hash", Digest, nullable=False),
    sa.Column("tuning_seconds", sa.Double, nullable=False, default=0.0),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("hit_count", sa.Integer, nullable=False, default=0),
    sa.Column("last_hit_at", Timestamp, nullable=True),
    sa.Index(None, "source_hash", "target_digest"),  # warm-start bulk fetch
    sa.Index(None, "kernel"),
    sa.Index(None, "arch", "device_name"),
    sa.Index(None, "driver_version"),
    sa.Index(None, "updated_at"),
    sa.Index(None, "last_hit_at"),  # gc
)

configs = sa.Table(
    "configs",
    metadata,
    sa.Column("digest", Digest, sa.ForeignKey("problems.digest", ondelete="CASCADE"), primary_key=True),
    sa.Column("config_hash", sa.String(32), primary_key=True),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("median_ms", sa.Double, nullable=True),
    sa.Column("p20_ms", sa.Double, nullable=True),
    sa.Column("p80_ms", sa.Double, nullable=True),
    sa.Column("samples", sa.Integer, nullable=False, default=0),
    sa.Column("failure", sa.Text, nullable=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("measured_at", Timestamp, nullable=False),
    sa.CheckConstraint(
        "status IN ('ok', 'out_of_resources', 'compile_error', 'runtime_error', 'pruned')", name="status"
    ),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("digest", Digest, primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),  # Unix seconds by the database's clock (dbclock)
)

misses = sa.Table(
    "misses",
    metadata,
    sa.Column("digest", Digest, primary_key=True),
    sa.Column("reason", sa.String(16), primary_key=True),  # capture | offline
    sa.Column("kernel", sa.String(255), nullable=False),
    sa.Column("source_hash", Digest, nullable=False),
    sa.Column("target_digest", Digest, nullable=False),
    sa.Column("key_json", sa.Text, nullable=False),
    sa.Column("count", sa.Integer, nullable=False, default=1),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("first_seen", Timestamp, nullable=False),
    sa.Column("last_seen", Timestamp, nullable=False),
)

kernel_stats = sa.Table(
    "kernel_stats",
    metadata,
    sa.Column("kernel", sa.String(255), primary_key=True),
    sa.Column("hits", sa.BigInteger, nullable=False, default=0),
    sa.Column("misses", sa.BigInteger, nullable=False, default=0),
    sa.Column("benchmarks", sa.BigInteger, nullable=False, default=0),
    sa.Column("bench_seconds", sa.Double, nullable=False, default=0.0),
    sa.Column("saved_seconds", sa.Double, nullable=False, default=0.0),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# Every host's own timings of identical problems (same digest: same kernel source, target and key),
# which ``configs`` cannot hold: it keeps one row per config, the first measured. One row per
# (digest, host, config), replaced when that host measures again, ok rows only: at most the ok
# config rows times the hosts that benchmarked each problem. ``tunecache hosts`` compares hosts on
# it (tunecache.report.fleet). No foreign key: an import that replaces a problem keeps the fleet's history;
# delete() (invalidate, gc) removes a problem's rows with it.
measurements = sa.Table(
    "measurements",
    metadata,
    sa.Column("digest", Digest, primary_key=True),
    sa.Column("host", sa.String(255), primary_key=True),
    sa.Column("config_hash", sa.String(32), primary_key=True),
    sa.Column("median_ms", sa.Double, nullable=False),
    sa.Column("p20_ms", sa.Double, nullable=True),
    sa.Column("p80_ms", sa.Double, nullable=True),
    sa.Column("samples", sa.Integer, nullable=False, default=0),
    sa.Column("measured_at", Timestamp, nullable=False),
)

# What Triton compiled each winner with (see tunecache.binaries.preload): a restart hands these to
# JITFunction.preload while the server loads its weights. Per kernel source and target, not per
# problem: one binary serves many batch buckets.
launch_specs = sa.Table(
    "launch_specs",
    metadata,
    sa.Column("source_hash", Digest, primary_key=True),
    sa.Column("target_digest", Digest, primary_key=True),
    sa.Column("spec_hash", Digest, primary_key=True),
    sa.Column("signer", Signer, primary_key=True, server_default=""),  # tunecache.store.signers
    sa.Column("kernel", sa.String(255), nullable=False),
    sa.Column("config_hash", sa.String(32), nullable=False),
    sa.Column("kernel_hash", Digest, nullable=False),
    sa.Column("triton_version", sa.String(32), nullable=False),
    sa.Column("spec_json", sa.Text, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("signature", sa.Text, nullable=True),  # tunecache.trust.signing.sign_row's, or None (unsigned)
)

# What Triton's compile cache holds for each winner's specialisation (tunecache.binaries.binaries), filed by
# Triton's own cache key (a launch spec's kernel_hash) and addressed by the sha256 of its content:
# a fresh host places them into its Triton cache, verified, before the preload. MySQL's BLOB is 64 KiB.
Blob = sa.LargeBinary().with_variant(mysql_dialect.LONGBLOB(), "mysql", "mariadb")
binaries = sa.Table(
    "binaries",
    metadata,
    sa.Column("triton_key", Digest, primary_key=True),
    sa.Column("signer", Signer, primary_key=True, server_default=""),  # tunecache.store.signers
    sa.Column("sha256", Digest, nullable=False),
    sa.Column("source_hash", Digest, nullable=False, index=True),
    sa.Column("kernel", sa.String(255), nullable=False),
    sa.Column("name", sa.String(150), nullable=False),
    sa.Column("ext", sa.String(16), nullable=False),
    sa.Column("triton_version", sa.String(32), nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("metadata", Blob, nullable=False),
    sa.Column("binary", Blob, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("signature", sa.Text, nullable=True),  # tunecache.trust.signing.sign_row's, or None (unsigned)
)

# Entries of torch.compile's (Inductor's) remote caches (tunecache.inductor): the bytes Inductor hands its
# RemoteCacheBackend, filed by the cache they belong to, Inductor's own key and the target digest of
# what that key leaves out (device, driver, torch and Triton versions), addressed by their sha256.
# FX graph and AOTAutograd entries are code (they bundle Triton binaries): signed where made.
inductor_entries = sa.Table(
    "inductor_entries",
    metadata,
    sa.Column("kind", sa.String(32), primary_key=True),  # model.INDUCTOR_KINDS
    sa.Column("key_hash", Digest, primary_key=True),  # sha256 of Inductor's key (which may be long)
    sa.Column("target_digest", Digest, primary_key=True),
    sa.Column("signer", Signer, primary_key=True, server_default=""),  # tunecache.store.signers
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("sha256", Digest, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("value", Blob, nullable=False),
    sa.Column("backend", sa.String(16), nullable=False),
    sa.Column("arch", sa.String(32), nullable=False),
    sa.Column("device_name", sa.String(128), nullable=False),
    sa.Column("driver_version", sa.String(32), nullable=False),
    sa.Column("torch_version", sa.String(64), nullable=False),
    sa.Column("triton_version", sa.String(32), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("used_at", Timestamp, nullable=False),
    sa.Column("hit_count", sa.Integer, nullable=False, default=0),
    sa.Column("signature", sa.Text, nullable=True),  # tunecache.trust.signing.sign_row's, or None (unsigned)
    # e.g. 580.159.04 (migration 0008): a driver update may keep driver_version; "" when unknown
    sa.Column("driver_release", sa.String(64), nullable=False, server_default=""),
    sa.Index(None, "driver_version"),
    sa.Index(None, "used_at"),  # gc
)

if tuple(c.name for c in problems.c) != PROBLEM_COLUMNS or tuple(c.name for c in configs.c)[1:] != CONFIG_ROW_COLUMNS:
    raise AssertionError(
        "the tables' columns must be tunecache.problem.model's row shape, in its order"
    )  # pragma: no cover

#: The migrations this code knows, oldest first (tests check it against Alembic's script directory).
#: Kept as constants so that opening an up-to-date store, on every server start, needs no Alembic
#: import (about 0.3 s): Alembic is loaded only when there is something to migrate.
SCHEMA_REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009")
SCHEMA_HEAD = SCHEMA_REVISIONS[-1]
