"""Config identity: a Triton ``Config`` as canonical JSON and its hash, the row's ``config_hash``.

A config's identity holds its kwargs, launch options (``num_warps``, ``num_stages``, ``num_ctas``,
``maxnreg``), its ``pre_hook`` (:func:`tunecache.problem.identity.hook_identity`) and ``ir_override`` (the
IR file's contents): each config is its own row, so adding a config to a search space benchmarks
only that one. :class:`ConfigIds` memoises identities by the config's value, for the launch path
of a key's first call; :func:`search_space_hash` names a set of configs.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tunecache.problem.identity import canonical_json, hook_identity, sha256_hex

CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_VKEY_FIELDS = ("kwargs", "pre_hook", *CONFIG_FIELDS, "ir_override")  # what ConfigIds' memo key reads
_VKEY_GET = operator.attrgetter(*_VKEY_FIELDS)


def _vkey_fields(config: Any) -> tuple[Any, ...]:
    """The config's ``_VKEY_FIELDS`` with getattr's semantics: one C-level ``attrgetter`` (this runs
    for every config at each key's first launch); None for one a config type lacks."""
    try:
        return _VKEY_GET(config)
    except AttributeError:
        return tuple(getattr(config, f, None) for f in _VKEY_FIELDS)


def config_dict(config: Any) -> dict[str, Any]:
    """A Triton Config as plain data: kwargs plus launch options and the pre_hook identity."""
    kwargs = {}
    for k, v in config.kwargs.items():
        if not isinstance(v, (bool, int, float, str)) and v is not None:
            raise TypeError(f"config kwarg {k!r} has type {type(v).__name__}; configs must hold scalars")
        kwargs[k] = v
    out: dict[str, Any] = {"kwargs": kwargs}
    for f in CONFIG_FIELDS:
        out[f] = getattr(config, f, None)
    out["pre_hook"] = hook_identity(getattr(config, "pre_hook", None))
    ir = getattr(config, "ir_override", None)
    if ir:  # a file of IR that replaces the compiled code: its contents are the config
        out["ir_override"] = f"{os.path.basename(str(ir))}:{_file_hash(str(ir))}"
    return out


def _file_hash(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return sha256_hex(f.read())[:32]
    except OSError:
        return "unreadable"  # Triton cannot compile it either


def config_hash_of(data: Mapping[str, Any]) -> str:
    """A config's identity: 32 hex digits of its canonical JSON, so key order does not matter.

    >>> config_hash_of({"num_warps": 4, "kwargs": {"BLOCK": 64}})
    '1cb9b30067a7873db7f36443635937e4'
    >>> config_hash_of({"kwargs": {"BLOCK": 64}, "num_warps": 4})
    '1cb9b30067a7873db7f36443635937e4'
    """
    return sha256_hex(canonical_json(dict(data)))[:32]


def config_identity(config: Any) -> tuple[str, str]:
    """(canonical JSON, hash) of a Triton Config."""
    d = config_dict(config)
    return canonical_json(d), config_hash_of(d)


class ConfigIds:
    """:func:`config_identity` of a kernel's configs, memoised by the config's VALUE:
    ``early_config_prune`` may build fresh Config objects at the addresses of freed ones. The
    pre_hook enters by ``id``; the memo holds the hook itself, so that id is not reused while the
    entry lives. At most ``max_size`` entries (a prune may build configs without end)."""

    def __init__(self, max_size: int = 4096) -> None:
        self.max_size = max_size
        self._memo: dict[tuple, tuple[Any, tuple[str, str]]] = {}  # config value -> (pre_hook, identity)

    def __len__(self) -> int:
        return len(self._memo)

    def __call__(self, config: Any) -> tuple[str, str]:
        """(canonical JSON, hash) of ``config``."""
        v = _vkey_fields(config)
        hook = v[1]
        try:
            vkey = (tuple(sorted(v[0].items())), v[2:], id(hook) if hook is not None else None)
            memo = self._memo.get(vkey)
        except TypeError:  # an unhashable kwarg: config_identity names it
            return config_identity(config)
        if memo is not None:
            return memo[1]
        ident = config_identity(config)
        if len(self._memo) >= self.max_size:
            self._memo.clear()
        self._memo[vkey] = (hook, ident)
        return ident


def make_config(data: Mapping[str, Any]) -> Any:
    """Rebuild a ``triton.Config`` from stored data (without its pre_hook, which is code)."""
    from triton import Config

    opts = {f: data.get(f) for f in CONFIG_FIELDS if data.get(f) is not None}
    return Config(dict(data.get("kwargs", {})), **opts)


def search_space_hash(config_hashes: Sequence[str]) -> str:
    return sha256_hex(",".join(sorted(config_hashes)))


__all__ = [
    "CONFIG_FIELDS",
    "ConfigIds",
    "config_dict",
    "config_hash_of",
    "config_identity",
    "make_config",
    "search_space_hash",
]
