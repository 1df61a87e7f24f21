"""Kernels bundled with tunecache: real workloads to tune, warm and benchmark the store against.

Installed as ``tunecache.kernels`` (``kernels/`` is mapped there in pyproject.toml, since a
top-level ``kernels`` package would clash with another PyPI project).
"""
