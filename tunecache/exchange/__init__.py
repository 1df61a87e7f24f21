"""Export and import: move tuning results between stores as one versioned file.

The format, field by field, is :mod:`tunecache.exchange.format`'s docstring. This package's public
API is re-exported here: :func:`export`, :func:`import_` and what they take and return.
"""

from tunecache.exchange.export import export
from tunecache.exchange.format import (
    BINARIES_VERSION,
    CONFLICT_POLICIES,
    FORMAT_NAME,
    FORMAT_VERSION,
    GZIP_LEVEL,
    MAX_FAILURE_DEPTH,
    MAX_LINE_BYTES,
    READABLE_VERSIONS,
    SIGNED_ROWS_VERSION,
    Progress,
    Source,
)
from tunecache.exchange.importer import ImportSummary, import_

__all__ = [
    "BINARIES_VERSION",
    "CONFLICT_POLICIES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GZIP_LEVEL",
    "MAX_FAILURE_DEPTH",
    "MAX_LINE_BYTES",
    "READABLE_VERSIONS",
    "SIGNED_ROWS_VERSION",
    "ImportSummary",
    "Progress",
    "Source",
    "export",
    "import_",
]
