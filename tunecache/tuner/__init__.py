"""The tuner layer: the Autotuner subclass, ``install()`` and what a tuning process does around them.

Above the binaries and the store, below exchange, report and the CLI. This file imports nothing
(importing Triton costs about a second): import the modules by name.
"""
