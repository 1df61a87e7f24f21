"""Settings: every ``TUNECACHE_*`` environment variable, in one table.

Each variable is read here and nowhere else (``tests/test_settings.py`` enforces it), so its name,
default, accepted values and meaning are written once: docs/configuration.md is generated from
:data:`SETTINGS` (``scripts/gendocs.py``; ``tests/test_docs_site.py`` fails when the two disagree).
Values are read when they are used, not cached at import: a process (or a test) may change its
environment after importing tunecache, and none of these reads sits on the launch path.

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
    the code that reads it decides, as ``when_unset`` and ``meaning`` say)."""

    name: str
    default: str | None
    parse: Callable[[str], Any]
    #: What it does, in Markdown: docs/configuration.md is generated from it (scripts/gendocs.py).
    meaning: str
    #: The reference's default column for a variable with no default: what leaving it unset means.
    when_unset: str = "unset"


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "TUNECACHE_URL",
            None,
            _text,
            "any SQLAlchemy URL: `sqlite:////path/file.sqlite3`, `postgresql://user@host/db`,"
            " `mysql://user@host/db` (`postgresql://` uses psycopg 3, `mysql://` PyMySQL)",
            when_unset="SQLite file in the user cache dir (`~/.cache/tunecache/tunecache.sqlite3` on Linux)",
        ),
        Setting(
            "TUNECACHE_MODE",
            "readwrite",
            _mode,
            "`readwrite`: reads the store and writes what it benchmarks. `readonly`: never writes, misses are"
            " benchmarked in memory. `offline`: never benchmarks, a miss falls back like a capture miss."
            " `strict`: as readwrite, but a miss during capture raises `tunecache.CaptureMissError`. `off`:"
            " plain `triton.autotune`",
        ),
        Setting(
            "TUNECACHE_ON_DRIVER_CHANGE",
            "retune",
            _driver_policy,
            "`retune`: a miss caused only by a new driver benchmarks every config again. `topk:N`: a miss"
            " caused only by a new driver benchmarks just the N best configs stored for the previous driver;"
            " the rest are stored as `pruned`",
        ),
        Setting(
            "TUNECACHE_LEASE_SECONDS",
            "30",
            _number,
            "how long a lease (a benchmark's, a torch.compile entry's) lives without renewal (the holder"
            " renews every third of it): how long a host that died blocks others; also how long an idle"
            " torch.compile process keeps its leases",
        ),
        Setting(
            "TUNECACHE_WAIT_SECONDS",
            "300",
            _number,
            "the longest a process waits for another's benchmark of the same key (or torch.compile entry)"
            " before computing it itself",
        ),
        Setting(
            "TUNECACHE_LOCK_DIR", None, _text, "per-digest lock files (one host)", when_unset="user cache dir `/locks`"
        ),
        Setting(
            "TUNECACHE_MISS_SPOOL",
            None,
            _text,
            "where a process records the misses that a read-only store cannot take (one JSON line per miss,"
            " tagged with the store); `tunecache misses` lists them with the store's own (see [Images and"
            " driver upgrades](images.md))",
            when_unset="user cache dir `/misses.jsonl`",
        ),
        Setting(
            "TUNECACHE_AUTO_MIGRATE",
            "1",
            _switch,
            "apply migrations on first use; `0` leaves it to `tunecache db upgrade`",
        ),
        Setting("TUNECACHE_SQLITE_BUSY_MS", "30000", _count(0), "SQLite busy timeout, in milliseconds"),
        Setting("TUNECACHE_CONNECT_TIMEOUT", "5", _count(1), "seconds to wait for a database server"),
        Setting(
            "TUNECACHE_POOL_SIZE",
            "0",
            _count(0),
            "database server connections a process keeps open between operations; 0: none (connect per operation)",
        ),
        Setting(
            "TUNECACHE_PRELOAD",
            "1",
            _switch,
            "once CUDA is initialised (torch's lazy-init queue; nothing touches CUDA before, so a server can"
            " still fork), load the stored winners' binaries of each tunecache kernel in the background"
            " thread, while the server loads its weights. Automatic where one GPU is visible; a process that"
            " sees several calls `tunecache.load_winners()` after `torch.cuda.set_device` (it returns how"
            ' many binaries it loaded and never raises). `stats()["preloaded"]` counts them; a spec not'
            ' loaded is counted in `stats()["preload_skipped"]` and by reason in `tunecache.preload_skips()`'
            " (`other_triton`, `unparseable`, `key_mismatch`, `options`, `rebuilt_differs`, `unsupported`,"
            " `error`), named at debug level, and summarised in one line per process (a warning only for"
            " `unparseable`, `key_mismatch` or `error`). Off on Python 3.11 (a background parse could race"
            " the launching thread: [Reliability](reliability.md), bug 9) and under the interpreter. Only"
            " kernels whose module has finished importing are loaded early: a kernel defined in a script run"
            " as `__main__` is hashed, and its binaries loaded, at its first launch"
            " ([Reliability](reliability.md), Trust 1)",
        ),
        Setting(
            "TUNECACHE_PREFETCH",
            "1",
            _switch,
            "when a kernel is defined, open the store and fetch its problems in a background thread, and"
            " compute Triton's compiler fingerprint (`triton_key`, 0.33 s per process on the H200 host) in"
            " another, so neither is on the first launch; no CUDA call, and a fork waits for the fingerprint"
            " thread. The prefetch reads the kernel's problems by name; its source is hashed in the"
            " background only once its module has finished importing (a `@jit` helper defined below the"
            " kernel is then in the hash), else at the first launch, and never in the background on Python"
            " 3.11 (its `ast` is not thread-safe: [Reliability](reliability.md), bug 9)",
        ),
        Setting(
            "TUNECACHE_FAST_LAUNCH",
            "1",
            _switch,
            "a launch of a tuning key already resolved in this process takes tunecache's hit path: Triton's"
            " key built straight from the arguments, one lookup in Triton's `cache`, the winner's"
            " `all_kwargs()` bound once, the same arguments to `JITFunction.run` (about a third of stock"
            " Triton's Python per launch: [the hit path's benchmarks](benchmarks/hit-path.md)). Kernels with"
            " hooks, `reset_to_zero`/`restore_value` or prune functions, a config with a `pre_hook`, a single"
            " config, a miss (inside a CUDA graph capture too) and call shapes it cannot serve go through"
            " Triton's `Autotuner.run` as before. `0`: Triton's run for every launch. Read at each kernel's"
            " first launch",
        ),
        Setting(
            "TUNECACHE_SPARSE_DECODE_GLUON",
            "1",
            _switch,
            "the bundled sparse decode kernel only: `0` runs its portable Triton split stage for fp8 caches"
            " on Hopper too, instead of the Gluon/wgmma one (`kernels/sparse_decode_sm90.py`); read at import",
        ),
        Setting(
            "TUNECACHE_WINNER_TOLERANCE",
            "0.02",
            _fraction,
            "a config within this fraction of the fastest that already wins other keys of the same kernel and"
            " target is chosen instead (configs that close are within benchmark noise): fewer kernels to"
            " compile and load, fewer winners that flip between tuning runs; `0` picks the plain fastest",
        ),
        Setting(
            "TUNECACHE_HOST_ID", None, _text, "the host recorded in rows (never part of a key)", when_unset="hostname"
        ),
        Setting(
            "TUNECACHE_INSTALL",
            "0",
            _switch,
            "`1`: every Python process of this environment runs `tunecache.install()` as soon as it imports"
            " Triton, with no code change (a `.pth` start-up hook that installing tunecache (`pip install .`"
            " in the checkout) puts in site-packages; spawned workers inherit it). Unset (and"
            " `TUNECACHE_INDUCTOR` too), the hook costs two environment lookups and imports nothing",
        ),
        Setting(
            "TUNECACHE_INDUCTOR",
            "0",
            _switch,
            "`1`: torch.compile's remote caches (autotune, bundled autotune, FX graph, AOTAutograd) use the"
            " store (see [torch.compile](torch-compile.md)); through the start-up hook when a process first"
            " imports `torch._inductor.remote_cache` (on its own: `TUNECACHE_INSTALL` adds Triton's"
            " Autotuners), or where code calls `tunecache.inductor.enable.enable()`",
        ),
        Setting(
            "TUNECACHE_INDUCTOR_KERNELS",
            "1",
            _switch,
            "with `TUNECACHE_INDUCTOR`: the Triton kernels a process compiles are filed in the store (signed)"
            " and a kernel its local Triton cache lacks is taken from there before Triton compiles it (see"
            " [torch.compile](torch-compile.md)); off where `TRITON_CACHE_MANAGER` names a cache manager of"
            " your own",
        ),
        Setting(
            "TUNECACHE_SUMMARY",
            "0",
            _switch,
            "`1`: each process that used tunecache writes one line on stderr as it ends, e.g. `tunecache: 36"
            " kernels covered, 1,296 hits, 0 benchmarks, 48 preloaded (0 skipped), saved 52.1 s, spent 0.0 s"
            " benchmarking` (a restart that did what it should: 0 benchmarks). Written straight to stderr,"
            ' not logged: with only `TUNECACHE_INSTALL=1` the "tunecache" logger has no handler and would'
            " show warnings only. A process whose torch.compile used the store adds a line of its own:"
            " `tunecache: torch.compile: 41 served, 0 computed, 0 put, 1 lease wait (3.2 s), 0 untrusted`. A"
            " process that did nothing with tunecache says nothing; a forked or multiprocessing child says"
            " what it did itself, with its pid, also when a pool ends it with SIGTERM",
        ),
        Setting(
            "TUNECACHE_METRICS",
            "1",
            _switch,
            "where `prometheus_client` is installed (the `metrics` extra), a process that opens a store shows"
            " tunecache's counters on the Prometheus `/metrics` it already serves (prometheus_client's"
            " default registry, once the program imports it: tunecache never imports it first), or, under"
            " `PROMETHEUS_MULTIPROC_DIR`, in that directory for the server's multiprocess collector to sum;"
            " `0`: not (see [Metrics](metrics.md))",
        ),
        Setting(
            "TUNECACHE_METRICS_PORT",
            None,
            _listen,
            "`PORT` or `HOST:PORT`: the first process that opens a store also serves `/metrics` there (every"
            " interface when only a port is given), for a program that serves no metrics of its own",
            when_unset="unset",
        ),
        Setting(
            "TUNECACHE_CPU_BENCH_REPS", "3", _count(1), "repetitions of the CPU timer used under `TRITON_INTERPRET=1`"
        ),
        Setting(
            "TUNECACHE_TARGET_OVERRIDE",
            None,
            _json_object,
            "JSON object replacing detected target fields: for simulations and tests only",
            when_unset="unset",
        ),
        Setting(
            "TUNECACHE_BINARIES",
            "1",
            _switch,
            "after storing its results, a tuning process uploads what Triton compiled for each winner (binary"
            " and metadata, sha256-addressed, bound to Triton's cache key), and a starting process places the"
            " stored ones its Triton cache lacks, verified, so a fresh host compiles nothing; `0` does"
            " neither (see [Binaries](binaries.md))",
        ),
        Setting(
            "TUNECACHE_COMPANIONS",
            "1",
            _switch,
            "watch Triton's `jit_post_compile_hook` (called once per compiled specialisation, never on the"
            " launch path; a hook set before is chained): every plain `@triton.jit` kernel a process compiles"
            " is filed, in the background, as a companion of the tuned kernel it resolved last, with its"
            " binaries; a restart's preload loads those companions with the winners, so their first launch"
            " loads nothing. `0`: neither (see [Binaries](binaries.md)); a readwrite process still watches"
            ' its tuned kernels\' compiles ([Binaries](binaries.md), "After a comment edit")',
        ),
        Setting(
            "TUNECACHE_BINARY_MAX_BYTES",
            "2M",
            _bytes_up_to(MAX_BINARY_BYTES),
            f"a binary (with its metadata) larger than this is not uploaded; at most {MAX_BINARY_BYTES / (1 << 20):g}"
            " MiB, so that it fits"
            " an export line",
        ),
        Setting(
            "TUNECACHE_KERNEL_BINARIES_MAX_BYTES",
            "64M",
            _bytes_up_to(1 << 40),
            "binaries of one kernel source (all its targets) stop being uploaded past this many bytes",
        ),
        Setting(
            "TUNECACHE_TRUSTED_KEYS",
            None,
            _text,
            "public keys (a `.pub` file made by `tunecache keygen`, or its `tunecache-ed25519 ...` text;"
            " comma-separated) whose signed exports `import` accepts (set: every import must be signed by one"
            " of them, unless `--trust-unsigned`), and whose signed binaries, host modules and launch specs a"
            " process places and preloads (see [Trust model](trust.md))",
            when_unset="unset",
        ),
        Setting(
            "TUNECACHE_SIGNING_KEY",
            None,
            _text,
            "a private key made by `tunecache keygen`: a tuning process signs every binary, host module and"
            " launch spec it stores with it; unset: they are stored unsigned (placed only from a store"
            " trusted as a whole)",
            when_unset="unset",
        ),
        Setting(
            "TUNECACHE_TRUST_STORE",
            "auto",
            _trust_store,
            "`yes`: place and preload every binary, host module and launch spec of the store, signed or not;"
            " `no`: only those a key of `TUNECACHE_TRUSTED_KEYS` signed; `auto`: `yes` for a SQLite file only"
            " this user can write (the default store), else `no`",
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
