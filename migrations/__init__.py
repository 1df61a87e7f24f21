"""Alembic migrations of the tunecache schema (installed as ``tunecache.migrations``).

Run them with ``tunecache db upgrade``; the library also applies them on first use.
"""
