"""Typed exceptions. Every message says what went wrong and what the user can do about it."""

from __future__ import annotations


class TunecacheError(Exception):
    """Base class of every error tunecache raises on purpose."""


class StoreError(TunecacheError):
    """The store cannot be opened, read or written (unreachable server, bad URL, corrupt file)."""


class StoreNotFoundError(StoreError):
    """There is no store at the URL (no SQLite file, no such database, or no tunecache schema in it);
    raised where a store must not be created, e.g. by read-only CLI commands."""


class StoreOfflineError(StoreError):
    """The store's server did not answer a connection attempt a moment ago: it is not tried again
    until its back-off ends (tunecache.store.breaker), so this was raised at once, without waiting."""


class StoreReadOnlyError(StoreError):
    """A write was attempted on a store opened read-only."""


class SchemaError(StoreError):
    """The database schema is missing, older than needed in read-only mode, or newer than this code."""


class RoleError(TunecacheError):
    """``tunecache db grant`` was asked to give a role a kind that would take away its own rights
    (the tables' owner, or the role running the grant, made a reader or a tuner); nothing was changed."""


class ConfigurationError(TunecacheError, ValueError):
    """A ``TUNECACHE_*`` setting has a value tunecache does not accept."""


class CaptureMissError(TunecacheError):
    """A tuning key missed the store while a CUDA graph was being captured (strict mode)."""

    def __init__(self, kernel: str, key: object, reason: str = "CUDA graph capture") -> None:
        self.kernel = kernel
        self.key = key
        super().__init__(
            f"{kernel}: no stored config for tuning key {key!r} during {reason}; benchmarking now would "
            "break the capture. Tune this key before capturing (run `tunecache warm` at image build, or "
            "a warm-up forward pass before capture), or unset TUNECACHE_MODE=strict to fall back."
        )


class Busy(TunecacheError):
    """Inside ``tunecache.defer_busy()``: a launch whose tuning key missed the store while another live
    process holds its benchmark (its lease, or on this host its lock). Nothing was launched, benchmarked
    or stored, and nothing waited; launch it again later, when that process's result is served (outside
    the context the launch waits for it, as always)."""

    def __init__(self, kernel: str, key: str) -> None:
        self.kernel = kernel
        self.key = key  # the tuning key, as the store names it (canonical JSON)
        super().__init__(
            f"{kernel}: another process is benchmarking tuning key {key}; nothing was launched. Launch it "
            "again later (outside tunecache.defer_busy() a launch waits for that process's result)."
        )


class UntrustedFileError(TunecacheError):
    """An export file would install binaries or launch specs (code that runs on every GPU of a
    fleet) but carries no signature by a key in ``TUNECACHE_TRUSTED_KEYS``; nothing was written."""


class SigningError(TunecacheError):
    """A signing key cannot be made, read or used (or the ``sign`` extra is not installed)."""


class MissingDependencyError(TunecacheError):
    """A package that this use of tunecache needs is not installed; the message names what to install
    (the extra, see :mod:`tunecache.extras`)."""


class OutputExistsError(TunecacheError):
    """A command would overwrite an existing file (a signed export, say) without ``--force``; nothing
    was written."""


class ImportFormatError(TunecacheError):
    """An export file is malformed; nothing from it was written."""

    def __init__(self, line: int, reason: str, last: int | None = None) -> None:
        self.line = line
        self.last = last  # a fault that only a range of lines can be blamed for: lines line..last
        self.reason = reason
        super().__init__(
            f"lines {line}-{last}: {reason}" if last is not None and last > line else f"line {line}: {reason}"
        )


def driver_message(exc: BaseException) -> str:
    """The first line of a database driver's message (SQLAlchemy wraps it in ``orig``): the part that says why."""
    orig = getattr(exc, "orig", None) or exc
    lines = [ln.strip() for ln in str(orig).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(orig).__name__


class InterruptedAfterCommit(KeyboardInterrupt):
    """Ctrl-C came once a write had committed (an import's one transaction): what the message says
    is in the store stays there, and nothing may be undone as if it were not."""
