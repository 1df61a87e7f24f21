"""The store layer: the only package that writes SQL (engine, schema, migrations, queries, writes).

Above the core, :mod:`tunecache.problem`, :mod:`tunecache.process` and :mod:`tunecache.trust`, below
everything else. Its modules are imported by name (``tunecache.store.store``,
``tunecache.store.opening``); this file imports nothing, so that ``import tunecache.store.engine``
loads no more than it needs.
"""
