"""Alembic environment: runs on the connection tunecache hands over (see tunecache.store.migrate)."""

from __future__ import annotations

from alembic import context

from tunecache.store.engine import resolve_url
from tunecache.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")

if context.is_offline_mode():
    context.configure(url=str(resolve_url()), target_metadata=metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is None:
    # Plain `alembic upgrade head` from a checkout: open the store's URL ourselves.
    from tunecache.store.engine import make_engine

    engine = make_engine(resolve_url(), readonly=False)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
