"""tunecache's counters as Prometheus metrics (prometheus_client, the ``metrics`` extra): the table
(:mod:`~tunecache.metrics.families`), the single-process collector and the port
(:mod:`~tunecache.metrics.exporter`), the multiprocess mode's mirror (:mod:`~tunecache.metrics.mirror`)."""
