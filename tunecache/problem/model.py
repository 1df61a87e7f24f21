"""Model: the shapes of the rows tunecache keeps, shared by the store, export/import and the CLI.

A :class:`Problem` is one tuning problem (kernel source x target x tuning key) with its
:class:`ConfigResult` rows, failed configs included; a :class:`LaunchSpec` is one compiled
specialisation of a winner, enough for Triton to load it again without compiling.
:func:`pick_winner` is the one rule every host applies to choose among config rows.

Each has ONE JSON shape, the export file's (:mod:`tunecache.exchange.format` documents it field by
field), which ``ls --json`` and ``show --json`` print too: :data:`PROBLEM_FIELDS`,
:data:`CONFIG_ROW_FIELDS` and :data:`LAUNCH_SPEC_FIELDS` list it, :func:`problem_to_json` and
friends convert. The store's columns are the same fields (:func:`column_names`): a target is its
digest and its fields, and JSON values (a key, a config, a spec) are text in ``<field>_json``.
Bulk paths (export, import, a warm start's fetch) index rows by the offsets these lists give.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tunecache.problem.identity import canonical_json
from tunecache.problem.target import TARGET_FIELDS, Target

STATUSES = ("ok", "out_of_resources", "compile_error", "runtime_error", "pruned")
FAILED_STATUSES = ("out_of_resources", "compile_error", "runtime_error")


def utcnow() -> dt.datetime:
    """Naive UTC: every backend stores and compares it the same way."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


@dataclass
class ConfigResult:
    """One config's outcome for one problem."""

    config_hash: str
    config: dict[str, Any]
    status: str = "ok"
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    samples: int = 0
    failure: dict[str, Any] | None = None
    host: str = ""
    measured_at: dt.datetime | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_ms is not None

    def timings(self) -> list[float]:
        """[median, p20, p80] as Triton's ``configs_timings`` holds them (inf when failed)."""
        if not self.ok:
            return [float("inf")] * 3
        return [self.median_ms, self.p20_ms or self.median_ms, self.p80_ms or self.median_ms]


@dataclass
class Problem:
    """One tuning problem (kernel source x target x tuning key) and its config rows."""

    digest: str
    kernel: str
    source_hash: str
    target: Target
    key_json: str
    batch_bucket: int | None = None
    winner_config_hash: str | None = None
    winner_ms: float | None = None
    search_space_hash: str = ""
    tuning_seconds: float = 0.0
    host: str = ""
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    hit_count: int = 0
    last_hit_at: dt.datetime | None = None
    configs: list[ConfigResult] = field(default_factory=list)

    def config_map(self) -> dict[str, ConfigResult]:
        return {c.config_hash: c for c in self.configs}

    @property
    def winner(self) -> ConfigResult | None:
        return self.config_map().get(self.winner_config_hash) if self.winner_config_hash else None


def pick_winner(
    rows: Iterable[ConfigResult], prefer: Sequence[str] = (), tolerance: float = 0.0
) -> ConfigResult | None:
    """Fastest ok config; ties broken by config hash so every host picks the same one.

    With ``prefer`` (config hashes, most preferred first) and ``tolerance`` > 0, the first preferred
    config whose median is within ``tolerance`` (a fraction) of the fastest wins instead: configs that
    close are within benchmark noise of each other, and reusing one that already wins elsewhere means
    fewer kernels to compile and load, and fewer winners that flip between tuning runs.

    >>> rows = [ConfigResult("a", {}, median_ms=1.0), ConfigResult("b", {}, median_ms=1.02)]
    >>> pick_winner(rows).config_hash
    'a'
    >>> pick_winner(rows, prefer=["b"], tolerance=0.05).config_hash  # 2% slower: within noise
    'b'
    >>> pick_winner([ConfigResult("c", {}, status="compile_error")]) is None
    True
    """
    ok = [r for r in rows if r.ok]
    if not ok:
        return None
    best = min(ok, key=lambda r: (r.median_ms, r.config_hash))
    if tolerance > 0 and prefer:
        near = {r.config_hash: r for r in ok if r.median_ms <= best.median_ms * (1.0 + tolerance)}
        for h in prefer:
            if h in near:
                return near[h]
    return best


@dataclass(frozen=True)
class LaunchSpec:
    """One compiled specialisation of a kernel: enough for Triton to load it again."""

    spec_hash: str  # sha256 of spec_json
    config_hash: str  # the config it was compiled with
    kernel_hash: str  # Triton's compile-cache hash of the binary: a preload must reproduce it
    spec_json: str  # Triton's serialize_specialization_data output
    triton_version: str
    signature: str | None = None  # its maker's row signature (tunecache.trust.trust), or None: unsigned


#: The field of a launch spec's JSON that names its binary: a spec of one text's binary added beside
#: another text's spec of the same specialisation (``tunecache.binaries.preload.for_binary``).
SPEC_BINARY_FIELD = "tunecache_kernel_hash"

#: The config hash of a companion's launch spec: a plain ``@triton.jit`` kernel (e.g. a merge stage)
#: whose binaries the user asked to keep with an autotuned kernel's (``tunecache.binaries.binaries.record_companions``).
COMPANION_CONFIG = "0" * 32

#: The binary file each Triton backend writes next to a kernel's metadata (``backend.binary_ext``).
BINARY_EXTS = {"cuda": "cubin", "hip": "hsaco"}


@dataclass(frozen=True)
class Binary:
    """What Triton's compile cache holds for one compiled specialisation, enough to load it without
    compiling (what ``TRITON_STORE_BINARY_ONLY`` keeps): its metadata JSON and its binary, filed by
    Triton under ``name.json`` and ``name.<ext>`` in the cache directory of ``triton_key``."""

    triton_key: str  # Triton's cache-key hash of the specialisation: CompiledKernel.hash, LaunchSpec.kernel_hash
    sha256: str  # content address: binary_sha256() of everything below and triton_key
    name: str  # Triton's file name stem for it (the kernel's name, at most 150 characters)
    ext: str  # the binary's extension: BINARY_EXTS of its backend
    triton_version: str
    metadata: bytes  # the .json file, as Triton wrote it
    binary: bytes  # the .cubin / .hsaco
    signature: str | None = None  # its maker's row signature (tunecache.trust.trust), or None: unsigned

    @property
    def size(self) -> int:
        return len(self.metadata) + len(self.binary)


#: The caches of torch.compile (Inductor) whose entries tunecache keeps (:mod:`tunecache.inductor`):
#: Inductor's four remote caches, and the Triton kernels it compiles (:mod:`tunecache.inductor.tritoncache`).
INDUCTOR_KINDS = ("autotune", "bundled_autotune", "fx_graph", "aot_autograd", "triton_kernel")
#: The fields of the target an Inductor entry is bound to (the store's columns, an export's ``target``).
INDUCTOR_TARGET_FIELDS = (
    "backend",
    "arch",
    "device_name",
    "driver_version",
    "driver_release",
    "torch_version",
    "triton_version",
)


@dataclass(frozen=True)
class InductorEntry:
    """One entry of an Inductor remote cache: the bytes Inductor put under its key, for one target.

    ``target`` describes what Inductor's key leaves out (backend, arch, device, driver, torch and
    Triton versions); ``target_digest`` hashes it."""

    kind: str  # one of INDUCTOR_KINDS
    key: str  # Inductor's key, as its RemoteCache hands it to the backend
    target_digest: str
    value: bytes
    target: dict[str, str]  # backend, arch, device_name, driver_version, driver_release, torch and triton_version
    signature: str | None = None  # its maker's row signature (tunecache.trust.trust), or None: unsigned
    sha256: str = ""  # content address of value; computed when empty

    def __post_init__(self) -> None:
        if not self.sha256:
            object.__setattr__(self, "sha256", hashlib.sha256(self.value).hexdigest())

    @property
    def key_hash(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    @property
    def size(self) -> int:
        return len(self.value)


def binary_sha256(triton_key: str, name: str, ext: str, triton_version: str, metadata: bytes, binary: bytes) -> str:
    """The content address of a :class:`Binary`: every byte of it, and the key it is filed under,
    length-prefixed so that no two different binaries frame to the same bytes."""
    h = hashlib.sha256(b"tunecache-binary-1\0")
    for part in (triton_key.encode(), name.encode(), ext.encode(), triton_version.encode(), metadata, binary):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# The one JSON shape (the export format's) and the one row shape (the store's columns)
# --------------------------------------------------------------------------------------------

#: A problem's fields, in the order export writes them.
PROBLEM_FIELDS = (
    "digest",
    "kernel",
    "source_hash",
    "target",
    "key",
    "batch_bucket",
    "winner_config_hash",
    "winner_ms",
    "search_space_hash",
    "tuning_seconds",
    "host",
    "created_at",
    "updated_at",
    "hit_count",
    "last_hit_at",
    "configs",
)
#: A config row's fields, in the order export writes them: :class:`ConfigResult`'s fields, in its order.
CONFIG_ROW_FIELDS = (
    "config_hash",
    "config",
    "status",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "samples",
    "failure",
    "host",
    "measured_at",
)
#: A launch spec line's fields: where it belongs (kernel, source, target), then the :class:`LaunchSpec`.
LAUNCH_SPEC_FIELDS = (
    "kernel",
    "source_hash",
    "target_digest",
    "spec_hash",
    "config_hash",
    "kernel_hash",
    "triton_version",
    "spec",
)
#: A binary line's fields (version 3): the kernel whose launch spec references it, then the :class:`Binary`
#: (metadata as text, binary as base64).
BINARY_FIELDS = ("kernel", "source_hash", "triton_key", "sha256", "name", "ext", "triton_version", "metadata", "binary")
#: A launch spec or binary line's fields in a version 4 file: the row signature is carried with it.
LAUNCH_SPEC_FIELDS_SIGNED = (*LAUNCH_SPEC_FIELDS, "signature")
BINARY_FIELDS_SIGNED = (*BINARY_FIELDS, "signature")
#: Fields holding a naive UTC datetime (ISO 8601 text in JSON).
TIMESTAMP_FIELDS = frozenset({"created_at", "updated_at", "last_hit_at", "measured_at"})
#: Fields holding a JSON value that the store keeps as text in a column ``<field>_json``.
JSON_TEXT_FIELDS = frozenset({"key", "config", "spec"})


def column_names(fields: Sequence[str]) -> tuple[str, ...]:
    """The store's columns that hold these JSON fields, in order.

    ``target`` is ``target_digest`` then every :class:`Target` field; ``key``, ``config`` and
    ``spec`` are JSON text in ``key_json``, ``config_json``, ``spec_json``; ``configs`` is a table
    of its own. Every other field is a column of its name.
    """
    out: list[str] = []
    for f in fields:
        if f == "target":
            out += ["target_digest", *TARGET_FIELDS]
        elif f in JSON_TEXT_FIELDS:
            out.append(f + "_json")
        elif f != "configs":
            out.append(f)
    return tuple(out)


#: The ``problems`` table's columns, in its order.
PROBLEM_COLUMNS = column_names(PROBLEM_FIELDS)
#: A config row's columns in the ``configs`` table, without the ``digest`` that leads it there.
CONFIG_ROW_COLUMNS = column_names(CONFIG_ROW_FIELDS)
#: The ``configs`` table's columns, in its order.
CONFIG_COLUMNS = ("digest", *CONFIG_ROW_COLUMNS)
#: The columns of a launch spec line's fields (``launch_specs`` adds who recorded it, and when).
LAUNCH_SPEC_COLUMNS = column_names(LAUNCH_SPEC_FIELDS)
# Named offsets into a config row (CONFIG_ROW_COLUMNS order), for config_from_row's positional path.
_C = {c: i for i, c in enumerate(CONFIG_ROW_COLUMNS)}
_C_HASH, _C_CONFIG, _C_STATUS, _C_MEDIAN = _C["config_hash"], _C["config_json"], _C["status"], _C["median_ms"]
_C_P20, _C_P80, _C_SAMPLES, _C_FAILURE = _C["p20_ms"], _C["p80_ms"], _C["samples"], _C["failure"]
_C_HOST, _C_MEASURED = _C["host"], _C["measured_at"]
_NOT_PROBLEM_ATTRS = frozenset({"target_digest", *TARGET_FIELDS})


def _iso(v: Any) -> Any:
    return v.isoformat() if isinstance(v, dt.datetime) else v


def parse_timestamp(v: str | None) -> dt.datetime | None:
    """ISO 8601 text as the naive UTC datetime the store keeps (an offset, if any, is applied)."""
    if v is None:
        return None
    t = dt.datetime.fromisoformat(v)
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo is not None else t


def json_text(v: Any) -> str:
    """A JSON value as the canonical text the store keeps (sorted keys): one config, one text."""
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def config_to_json(r: ConfigResult) -> dict[str, Any]:
    """A config row in the export shape (JSON types only)."""
    return {f: _iso(getattr(r, f)) for f in CONFIG_ROW_FIELDS}


def config_from_json(obj: Mapping[str, Any]) -> ConfigResult:
    """The inverse of :func:`config_to_json` (of a row that import validated)."""
    r = ConfigResult(*(obj[f] for f in CONFIG_ROW_FIELDS))
    r.measured_at = parse_timestamp(obj["measured_at"])
    return r


def problem_to_json(p: Problem, *, configs: bool = True) -> dict[str, Any]:
    """A problem in the export shape (JSON types only); ``configs=False`` leaves its config rows out.

    >>> from tunecache.problem.target import Target
    >>> cpu = Target("cpu", "interpreter", "CPU", 1, 0, 1, "0", "", "", "3.6")
    >>> p = Problem("d1", "mod.kern", "src1", cpu, '[["N",1024]]', configs=[ConfigResult("c1", {}, median_ms=0.5)])
    >>> obj = problem_to_json(p)
    >>> obj["key"], obj["target"]["arch"], obj["configs"][0]["median_ms"]
    ([['N', 1024]], 'interpreter', 0.5)
    >>> problem_from_json(obj) == p
    True
    """
    out: dict[str, Any] = {}
    for f in PROBLEM_FIELDS:
        if f == "target":
            out[f] = p.target.as_dict()
        elif f == "key":
            out[f] = orjson.loads(p.key_json)
        elif f == "configs":
            if configs:
                out[f] = [config_to_json(r) for r in p.configs]
        else:
            out[f] = _iso(getattr(p, f))
    return out


def problem_from_json(obj: Mapping[str, Any]) -> Problem:
    """The inverse of :func:`problem_to_json` (of a line that import validated)."""
    plain = {f: obj[f] for f in PROBLEM_FIELDS if f not in ("target", "key", "configs")}
    plain.update({f: parse_timestamp(plain[f]) for f in TIMESTAMP_FIELDS if f in plain})
    return Problem(
        target=Target(**obj["target"]),
        key_json=canonical_json(obj["key"]),
        configs=[config_from_json(r) for r in obj.get("configs", ())],
        **plain,
    )


def launch_spec_to_json(kernel: str, source_hash: str, target_digest: str, spec: LaunchSpec) -> dict[str, Any]:
    """A launch spec line: where the spec belongs, then the spec."""
    where = {"kernel": kernel, "source_hash": source_hash, "target_digest": target_digest}
    return {f: where[f] if f in where else getattr(spec, c) for f, c in zip(LAUNCH_SPEC_FIELDS, LAUNCH_SPEC_COLUMNS)}


def launch_spec_from_json(obj: Mapping[str, Any]) -> tuple[str, str, str, LaunchSpec]:
    """The inverse of :func:`launch_spec_to_json`: (kernel, source_hash, target_digest, spec)."""
    fields = ("spec_hash", "config_hash", "kernel_hash", "spec", "triton_version")
    spec = LaunchSpec(*(obj[f] for f in fields), obj.get("signature"))
    return obj["kernel"], obj["source_hash"], obj["target_digest"], spec


def launch_spec_row(kernel: str, source_hash: str, target_digest: str, spec: LaunchSpec) -> dict[str, Any]:
    """A launch spec as a ``launch_specs`` row, without the host and time the store stamps on it."""
    row = dict(zip(LAUNCH_SPEC_COLUMNS, launch_spec_to_json(kernel, source_hash, target_digest, spec).values()))
    row["signature"] = spec.signature
    return row


def binary_row(kernel: str, source_hash: str, b: Binary) -> dict[str, Any]:
    """A binary as a ``binaries`` row, without the host and time the store stamps on it."""
    return {
        "triton_key": b.triton_key,
        "sha256": b.sha256,
        "source_hash": source_hash,
        "kernel": kernel[:255],
        "name": b.name,
        "ext": b.ext,
        "triton_version": b.triton_version,
        "size": b.size,
        "metadata": b.metadata,
        "binary": b.binary,
        "signature": b.signature,
    }


def binary_to_json(kernel: str, source_hash: str, b: Binary) -> dict[str, Any]:
    """A binary line (version 3): the metadata as its JSON text, the binary in base64."""
    return {
        "kernel": kernel,
        "source_hash": source_hash,
        "triton_key": b.triton_key,
        "sha256": b.sha256,
        "name": b.name,
        "ext": b.ext,
        "triton_version": b.triton_version,
        "metadata": b.metadata.decode(),
        "binary": base64.b64encode(b.binary).decode(),
    }


def binary_from_json(obj: Mapping[str, Any]) -> tuple[str, str, Binary]:
    """The inverse of :func:`binary_to_json`: (kernel, source_hash, binary). Raises ValueError for
    base64 that is not strictly that."""
    data = base64.b64decode(obj["binary"], validate=True)
    b = Binary(
        obj["triton_key"],
        obj["sha256"],
        obj["name"],
        obj["ext"],
        obj["triton_version"],
        obj["metadata"].encode(),
        data,
        obj.get("signature"),
    )
    return obj["kernel"], obj["source_hash"], b


def miss_fields(p: Problem, reason: str) -> dict[str, Any]:
    """What a recorded miss says of its problem (a ``misses`` row's, and a spooled miss's, fields)."""
    return {
        "digest": p.digest,
        "reason": reason,
        "kernel": p.kernel,
        "source_hash": p.source_hash,
        "target_digest": p.target.digest,
        "key_json": p.key_json,
    }


def problem_row(p: Problem) -> dict[str, Any]:
    """A problem as a ``problems`` row: column -> value (datetimes as datetimes, the key as its JSON text)."""
    t = p.target
    return {
        c: t.digest if c == "target_digest" else getattr(t, c) if c in TARGET_FIELDS else getattr(p, c)
        for c in PROBLEM_COLUMNS
    }


def problem_from_row(row: Sequence[Any]) -> Problem:
    """A ``problems`` row, its values in :data:`PROBLEM_COLUMNS` order, as a Problem (without configs)."""
    values = dict(zip(PROBLEM_COLUMNS, row))
    target = Target(**{f: values[f] for f in TARGET_FIELDS})
    return Problem(target=target, **{c: v for c, v in values.items() if c not in _NOT_PROBLEM_ATTRS})


def config_row(digest: str, r: ConfigResult) -> dict[str, Any]:
    """A config row as a ``configs`` row: column -> value, the config and failure as canonical JSON text."""
    row = {c: getattr(r, c) for c in CONFIG_ROW_FIELDS}
    row["config_json"] = json_text(row.pop("config"))
    row["failure"] = json_text(r.failure) if r.failure else None
    row["digest"] = digest
    return row


def config_from_row(row: Sequence[Any]) -> ConfigResult:
    """A ``configs`` row, its values in :data:`CONFIG_ROW_COLUMNS` order, as a ConfigResult.

    Positional, by named offsets into :data:`CONFIG_ROW_COLUMNS`: a warm start converts thousands.
    """
    loads, failure = orjson.loads, row[_C_FAILURE]
    return ConfigResult(
        row[_C_HASH],
        loads(row[_C_CONFIG]),
        row[_C_STATUS],
        row[_C_MEDIAN],
        row[_C_P20],
        row[_C_P80],
        row[_C_SAMPLES],
        loads(failure) if failure else None,
        row[_C_HOST],
        row[_C_MEASURED],
    )


def problems_from_rows(result: Any) -> list[Problem]:
    """Rows of problem columns, then config columns (a ``problems`` outer join ``configs``), to Problems.

    Positional access over one fetchall: a warm start converts hundreds of rows, and the
    per-row mapping lookups cost more than the query itself.
    """
    out: dict[str, Problem] = {}
    n = len(PROBLEM_COLUMNS)
    rows = result.all() if hasattr(result, "all") else list(result)
    for r in rows:
        d = r[0]
        p = out.get(d)
        if p is None:
            p = out[d] = problem_from_row(r[:n])
        if len(r) > n and r[n] is not None:
            p.configs.append(config_from_row(r[n:]))
    return list(out.values())


def new_problem_row(p: Problem, host: str, now: dt.datetime) -> dict[str, Any]:
    """A new problem's row for an insert; its winner is chosen by :meth:`tunecache.store.store.Store.put`
    once its configs are in."""
    return {
        **problem_row(p),
        "kernel": p.kernel[:255],
        "winner_config_hash": None,
        "winner_ms": None,
        "search_space_hash": p.search_space_hash or "",
        "host": host,
        "created_at": p.created_at or now,
        "updated_at": p.updated_at or now,
    }


def new_config_row(digest: str, r: ConfigResult, host: str, now: dt.datetime) -> dict[str, Any]:
    """A config row for an insert, stamped with ``host`` and ``now`` where the result has none."""
    if r.status not in STATUSES:
        raise ValueError(f"unknown config status {r.status!r}; expected one of {STATUSES}")
    return {**config_row(digest, r), "host": r.host or host, "measured_at": r.measured_at or now}
