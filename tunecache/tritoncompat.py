"""Where tunecache finds the Triton internals it relies on, from Triton 3.4 to 3.9.

Some of them moved between releases (``triton_key`` is in ``triton.compiler.compiler`` on 3.4 and
in ``triton.runtime.cache`` from 3.5). Every lookup is here, in one place, returning None where a
name is absent so that the caller skips an optimisation instead of failing. Because a None is
silent, tests/test_triton_names.py runs on every Triton of the test matrix and asserts that each
name resolves where this module says it lives: a move in a new release fails a test, it does not
quietly turn a feature off.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: Triton's compiler fingerprint (hash of its sources and libtriton): newest location first.
TRITON_KEY_MODULES = ("triton.runtime.cache", "triton.compiler.compiler")  # 3.5+, 3.4

#: Triton's serialiser of a specialisation, the input ``JITFunction.preload`` takes (3.4-3.9).
SERIALIZE_MODULE = "triton.runtime.jit"


def _find(modules: tuple[str, ...], name: str) -> tuple[str, Any] | None:
    for mod in modules:
        try:
            obj = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
        return mod, obj
    return None


def triton_key_location() -> str | None:
    """The module ``triton_key`` was found in, or None."""
    found = _find(TRITON_KEY_MODULES, "triton_key")
    return found[0] if found else None


def triton_key() -> Callable[[], str] | None:
    """Triton's ``triton_key`` (memoised by Triton), or None where this Triton has none."""
    found = _find(TRITON_KEY_MODULES, "triton_key")
    return found[1] if found else None


def serialize_specialization_data() -> Callable[..., str] | None:
    """Triton's ``serialize_specialization_data``, or None: then nothing is recorded for preloads."""
    found = _find((SERIALIZE_MODULE,), "serialize_specialization_data")
    return found[1] if found else None


__all__ = [
    "TRITON_KEY_MODULES",
    "SERIALIZE_MODULE",
    "triton_key",
    "triton_key_location",
    "serialize_specialization_data",
]
