"""The binaries layer: Triton's compiled kernels, stored, verified and placed back into its cache.

Above the store, below the tuner. This file imports nothing: import the modules by name.
"""
