"""Settings: every ``TUNECACHE_*`` environment variable, in one table.

Each variable is read here and nowhere else (``tests/test_settings.py`` enforces it, and checks the
README's table against :data:`SETTINGS`), so its name, default, accepted values and meaning are
written once. Values are read when they are used, not cached at import: a process (or a test) may
change its environment after importing tunecache, and none of these reads sits on the launch path.

A bad value raises :class:`~tunecache.errors.ConfigurationError` naming the variable, what it
holds and what is accepted; the CLI prints it as one line.

>>> get("TUNECACHE_MODE", {"TUNECACHE_MODE": "READONLY"})
'readonly'
>>> get("TUNECACHE_LEASE_SECONDS", {})
30.0
>>> get("TUNECACHE_ON_DRIVER_CHANGE", {"TUNECACHE_ON_DRIVER_CHANGE": "topk:3"})
3
>>> get("TUNECACHE_PRELOAD", {"TUNECACHE_PRELOAD": "off"})
False
>>> get("TUNECACHE_WAIT_SECONDS", {"TUNECACHE_WAIT_SECONDS": "-1"})
Traceback (most recent call last):
...
tunecache.errors.ConfigurationError: TUNECACHE_WAIT_SECONDS='-1' must be a number >= 0
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from tunecache.errors import ConfigurationError

MODES = ("readwrite", "readonly", "offline", "strict", "off")
#: The largest binary tunecache stores: base64 in an export line (4 MiB at most) with its metadata.
MAX_BINARY_BYTES = 5 << 19  # 2.5 MiB
_FALSE = ("0", "false", "off", "no")
_TRUE = ("1", "true", "on", "yes")


class _Bad(ValueError):
    """What a parser says is wrong with a value; :func:`get` adds the variable's name."""


def _text(raw: str) -> str:
    return raw


def _switch(raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _Bad(f"must be one of {', '.join(_TRUE + _FALSE)}")


def _number(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise _Bad("must be a number >= 0") from None
    if not v >= 0 or v == float("inf"):
        raise _Bad("must be a number >= 0")
    return v


def _fraction(raw: str) -> float:
    v = _number(raw)
    if v >= 1:
        raise _Bad("must be a fraction below 1 (0.02 means 2%)")
    return v


def _count(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            v = int(raw.strip())
        except ValueError:
            raise _Bad(f"must be an integer >= {minimum}") from None
        if v < minimum:
            raise _Bad(f"must be an integer >= {minimum}")
        return v

    return parse


def _bytes_up_to(cap: int) -> Callable[[str], int]:
    """A size in bytes (``K``/``M`` suffixes of 1024), at least 1 and at most ``cap``."""

    def parse(raw: str) -> int:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)i?[bB]?\s*", raw)
        if not m:
            raise _Bad("must be a size in bytes like 2097152, 512K or 2M")
        v = int(m.group(1)) << {"": 0, "k": 10, "m": 20}[m.group(2).lower()]
        if not 1 <= v <= cap:
            raise _Bad(f"must be between 1 byte and {cap} bytes")
        return v

    return parse


def _mode(raw: str) -> str:
    v = raw.strip().lower() or "readwrite"
    if v not in MODES:
        raise _Bad(f"is not one of {', '.join(MODES)}; unset it for readwrite")
    return v


def _driver_policy(raw: str) -> int | None:
    """``retune`` -> None; ``topk:N`` -> N."""
    v = raw.strip().lower()
    if v in ("", "retune"):
        return None
    if v.startswith("topk:") and v[5:].isdigit() and int(v[5:]) > 0:
        return int(v[5:])
    raise _Bad("is not 'retune' or 'topk:N' with N >= 1")


TRUST_STORE = ("auto", "yes", "no")


def _trust_store(raw: str) -> str:
    """``auto`` (default), ``yes`` or ``no`` (the switch spellings are accepted)."""
    v = raw.strip().lower()
    if v in _TRUE:
        return "yes"
    if v in _FALSE:
        return "no"
    if v == "auto":
        return "auto"
    raise _Bad("is not auto, yes (1) or no (0)")


def _listen(raw: str) -> tuple[str, int]:
    """``PORT`` (every interface, as prometheus_client's own server) or ``HOST:PORT``.

    >>> _listen("9400"), _listen("127.0.0.1:9400")
    (('0.0.0.0', 9400), ('127.0.0.1', 9400))
    """
    host, _, port = raw.strip().rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535 or not re.fullmatch(r"[\w.\-\[\]:]*", host):
        raise _Bad("must be a port (1-65535) or HOST:PORT, like 9400 or 127.0.0.1:9400")
    return host.strip("[]") or "0.0.0.0", int(port)


def _json_object(raw: str) -> dict[str, Any]:
    try:
        v = json.loads(raw)
    except ValueError as e:
        raise _Bad(f"is not valid JSON: {e}") from None
    if not isinstance(v, dict):
        raise _Bad("must be a JSON object")
    return v


@dataclass(frozen=True)
class Setting:
    """One variable: ``default`` is the raw text used when it is unset or empty (None: no value, and
    the code that reads it decides, as documented in ``meaning``)."""

    name: str
    default: str | None
    parse: Callable[[str], Any]
    meaning: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "TUNECACHE_URL", None, _text, "the store: any SQLAlchemy URL; unset: a SQLite file in the user cache dir"
        ),
        Setting("TUNECACHE_MODE", "readwrite", _mode, f"how the autotuner uses the store: {', '.join(MODES)}"),
        Setting(
            "TUNECACHE_ON_DRIVER_CHANGE",
            "retune",
            _driver_policy,
            "a miss caused only by a new driver: retune all configs, or topk:N of the previous driver's best",
        ),
        Setting(
            "TUNECACHE_LEASE_SECONDS",
            "30",
            _number,
            "how long a lease (a benchmark's, a torch.compile entry's) lives without renewal; also how long an"
            " idle torch.compile process keeps its leases",
        ),
        Setting(
            "TUNECACHE_WAIT_SECONDS",
            "300",
            _number,
            "the longest a process waits for another's benchmark or torch.compile entry",
        ),
        Setting("TUNECACHE_LOCK_DIR", None, _text, "per-digest lock files of one host; unset: the user cache dir"),
        Setting(
            "TUNECACHE_MISS_SPOOL",
            None,
            _text,
            "JSON-lines file for misses a read-only store cannot record (`tunecache misses` reads it);"
            " unset: misses.jsonl in the user cache dir",
        ),
        Setting("TUNECACHE_AUTO_MIGRATE", "1", _switch, "apply schema migrations on first use"),
        Setting("TUNECACHE_SQLITE_BUSY_MS", "30000", _count(0), "SQLite busy timeout, milliseconds"),
        Setting("TUNECACHE_CONNECT_TIMEOUT", "5", _count(1), "seconds to wait for a database server"),
        Setting(
            "TUNECACHE_POOL_SIZE",
            "0",
            _count(0),
            "database server connections a process keeps open between operations; 0: none (connect per operation)",
        ),
        Setting("TUNECACHE_PRELOAD", "1", _switch, "load the stored winners' binaries once CUDA is up"),
        Setting("TUNECACHE_PREFETCH", "1", _switch, "open the store and fetch a kernel's problems when it is defined"),
        Setting(
            "TUNECACHE_FAST_LAUNCH",
            "1",
            _switch,
            "launch a resolved tuning key through tunecache's hit path (the key from the arguments, one lookup, the"
            " winner's keywords bound once); 0: Triton's own Autotuner.run for every launch. Read at a kernel's first"
            " launch",
        ),
        Setting(
            "TUNECACHE_SPARSE_DECODE_GLUON", "1", _switch, "the bundled kernel's Hopper (Gluon) split stage; at import"
        ),
        Setting(
            "TUNECACHE_WINNER_TOLERANCE",
            "0.02",
            _fraction,
            "a config within this fraction of the fastest that already wins another key of the same kernel and"
            " target is chosen instead (0 disables): configs that close are within benchmark noise, and reusing a"
            " winner means fewer kernels to compile and load and fewer winners that flip between tuning runs",
        ),
        Setting("TUNECACHE_HOST_ID", None, _text, "the host recorded in rows; unset: the hostname"),
        Setting(
            "TUNECACHE_INSTALL",
            "0",
            _switch,
            "every Python process runs tunecache.install() when it imports Triton (the .pth start-up hook)",
        ),
        Setting(
            "TUNECACHE_INDUCTOR",
            "0",
            _switch,
            "torch.compile's remote caches (autotune, bundled autotune, FX graph, AOTAutograd) use the store; with"
            " TUNECACHE_INSTALL, set up when torch._inductor is first imported, else by tunecache.inductor.enable()",
        ),
        Setting(
            "TUNECACHE_INDUCTOR_KERNELS",
            "1",
            _switch,
            "with TUNECACHE_INDUCTOR, the Triton kernels a process compiles are filed in the store (signed) and a"
            " kernel the local Triton cache lacks is taken from there before Triton compiles it (not where"
            " TRITON_CACHE_MANAGER names a cache manager of your own)",
        ),
        Setting(
            "TUNECACHE_SUMMARY",
            "0",
            _switch,
            "each process that used tunecache writes one line on stderr as it ends: kernels covered, hits,"
            " benchmarks, preloaded and skipped, seconds saved and spent benchmarking; and one for torch.compile's"
            " store: served, computed, put, lease waits and their seconds, untrusted",
        ),
        Setting(
            "TUNECACHE_METRICS",
            "1",
            _switch,
            "where prometheus_client is installed, a process that opens a store shows tunecache's counters in"
            " prometheus_client's default registry (the /metrics its server already serves, once the program"
            " imports it), or, under PROMETHEUS_MULTIPROC_DIR, in that directory for the server's multiprocess"
            " collector to sum",
        ),
        Setting(
            "TUNECACHE_METRICS_PORT",
            None,
            _listen,
            "[HOST:]PORT: the first process that opens a store also serves /metrics there (every interface when"
            " only a port is given), for a program that serves no metrics of its own; unset: none",
        ),
        Setting("TUNECACHE_CPU_BENCH_REPS", "3", _count(1), "repetitions of the CPU timer under TRITON_INTERPRET=1"),
        Setting(
            "TUNECACHE_TARGET_OVERRIDE", None, _json_object, "JSON object replacing detected target fields (tests)"
        ),
        Setting(
            "TUNECACHE_BINARIES",
            "1",
            _switch,
            "upload the winners' compiled binaries after tuning; place stored ones into Triton's cache at start",
        ),
        Setting(
            "TUNECACHE_COMPANIONS",
            "1",
            _switch,
            "file the plain @triton.jit kernels a process launches with its last-resolved tuned kernel; preload them",
        ),
        Setting(
            "TUNECACHE_BINARY_MAX_BYTES",
            "2M",
            _bytes_up_to(MAX_BINARY_BYTES),
            f"largest binary uploaded (metadata included); at most {MAX_BINARY_BYTES} (an export line's room)",
        ),
        Setting(
            "TUNECACHE_KERNEL_BINARIES_MAX_BYTES",
            "64M",
            _bytes_up_to(1 << 40),
            "most binary bytes stored per kernel source (all its targets); further binaries are not uploaded",
        ),
        Setting(
            "TUNECACHE_TRUSTED_KEYS",
            None,
            _text,
            "public keys (files or `tunecache-ed25519 ...` text, comma-separated) whose signed exports may be "
            "imported and whose signed binaries, host modules and launch specs are placed and preloaded",
        ),
        Setting(
            "TUNECACHE_SIGNING_KEY",
            None,
            _text,
            "private key (made by `tunecache keygen`) this process signs the binaries, host modules and launch "
            "specs it stores with; unset: they are stored unsigned",
        ),
        Setting(
            "TUNECACHE_TRUST_STORE",
            "auto",
            _trust_store,
            "yes: place and preload every binary, host module and launch spec of the store, signed or not; no: "
            "only those signed by a trusted key; auto: yes for a SQLite file only this user can write, else no",
        ),
    )
}


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's text as set (None when unset or empty), without parsing."""
    env = os.environ if environ is None else environ
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a tunecache setting; known: {', '.join(SETTINGS)}")
    v = env.get(name)
    return v if v is not None and v.strip() != "" else None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``name`` (its default when unset or empty; None when it has none)."""
    text = raw(name, environ)  # raises KeyError for an unknown name
    s = SETTINGS[name]
    if text is None:
        if s.default is None:
            return None
        text = s.default
    try:
        return s.parse(text)
    except _Bad as e:
        raise ConfigurationError(f"{name}={text!r} {e}") from None


def put(name: str, value: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``name`` to ``value`` in ``environ`` (default: this process's environment), for a child
    process or for code imported after it (``warm``, the demo), checked as a read would be: a name
    that is no setting raises KeyError, a value it does not parse raises ConfigurationError.

    >>> env = {}
    >>> put("TUNECACHE_MODE", "offline", env); env
    {'TUNECACHE_MODE': 'offline'}
    """
    env = os.environ if environ is None else environ
    get(name, {name: value})  # raises for an unknown name or a bad value, before anything is written
    env[name] = value


_warned: dict[str, object] = {}  # the bad values usable() warned about


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Parse every variable that is set: the CLI calls it first, so a bad value is refused by every
    command in one line, not only by the code path that happens to read it."""
    for name in SETTINGS:
        get(name, environ)


def usable() -> bool:
    """Whether every variable that is set parses: asked where tunecache acts without being called
    (the start-up hook, the Autotuners it adopts, kernel definitions, launches). False, with one
    warning per bad value, means tunecache is off there and Triton runs as it does without it: a
    typo must not break a library's import or its kernels. An explicit call (``open_store()``,
    ``install()``, the CLI) raises the :class:`ConfigurationError` instead."""
    try:
        check_all()
    except ConfigurationError as e:
        mark = object()
        if _warned.setdefault(str(e), mark) is mark:  # atomic: no lock that a fork could inherit held
            logging.getLogger("tunecache").warning("tunecache: off in this process (Triton runs without it): %s", e)
        return False
    return True


def current_mode() -> str:
    """``TUNECACHE_MODE``, checked: raises :class:`ConfigurationError` for a value not in :data:`MODES`."""
    return get("TUNECACHE_MODE")


__all__ = ["MODES", "SETTINGS", "TRUST_STORE", "Setting", "check_all", "current_mode", "get", "put", "raw", "usable"]
