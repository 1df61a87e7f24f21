"""The report layer: the HTML report and the fleet analysis, over rows the store reads for it.

Beside exchange, below the CLI. This file imports nothing: import the modules by name.
"""
