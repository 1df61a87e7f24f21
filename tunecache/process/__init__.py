"""A process's life: what a fork resets (:mod:`~tunecache.process.forks`), what it counts
(:mod:`~tunecache.process.counters`), what runs at its end (:mod:`~tunecache.process.processend`),
the writes it defers (:mod:`~tunecache.process.writeback`), the line it says at its end
(:mod:`~tunecache.process.summary`) and what Ctrl-C interrupts (:mod:`~tunecache.process.interrupts`).

Above the core, beside :mod:`tunecache.problem`, below everything else. This file imports nothing:
import the modules by name.
"""
