"""What a tuning problem is: its identity (:mod:`~tunecache.problem.identity`), its config's identity
(:mod:`~tunecache.problem.configidentity`), the data model of what a store holds
(:mod:`~tunecache.problem.model`) and the machine it is tuned for (:mod:`~tunecache.problem.target`).

Above the core, beside :mod:`tunecache.process`, below everything else. This file imports nothing:
import the modules by name.
"""
