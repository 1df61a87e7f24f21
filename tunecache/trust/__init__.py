"""What is trusted: which signed rows of a store this process places or preloads, and its own rows'
signatures (:mod:`~tunecache.trust.trust`), the keys that sign them (:mod:`~tunecache.trust.signing`)
and what a process may share with a store (:mod:`~tunecache.trust.sharing`).

Above :mod:`tunecache.problem` and :mod:`tunecache.process`, below the store. This file imports
nothing: import the modules by name.
"""
