"""Model: the shapes of the rows tunecache keeps, shared by the store, export/import and the CLI.

A :class:`Problem` is one tuning problem (kernel source x target x tuning key) with its
:class:`ConfigResult` rows, failed configs included; a :class:`LaunchSpec` is one compiled
specialisation of a winner, enough for Triton to load it again without compiling.
:func:`pick_winner` is the one rule every host applies to choose among config rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunecache.target import Target

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
