"""``TUNECACHE_MODE``, read and checked in one place: the library and every CLI command refuse a bad
value the same way, at once, instead of at the first launch that misses."""

from __future__ import annotations

import os

from tunecache.errors import ConfigurationError

MODES = ("readwrite", "readonly", "offline", "strict", "off")


def current_mode() -> str:
    """The mode from ``TUNECACHE_MODE`` (default ``readwrite``); raises :class:`ConfigurationError`."""
    raw = os.environ.get("TUNECACHE_MODE", "readwrite")
    mode = raw.strip().lower() or "readwrite"
    if mode not in MODES:
        raise ConfigurationError(f"TUNECACHE_MODE={raw!r} is not one of {', '.join(MODES)}; unset it for readwrite")
    return mode
