"""A method's calls counted where they run: wrapped at the class level, so every instance and every
subclass that inherits it is counted (a benchmark that a subclass runs through ``super()`` too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def count_calls(cls: type, name: str, tally: Callable[[Any], None]) -> Callable[..., Any]:
    """Replace ``cls.name`` by a wrapper that calls ``tally(self)`` before each call; returns the
    method it wraps. Every argument and the result pass through unchanged; the wrapper is a plain
    function (no ``__wrapped__``), as the code it counts saw before."""
    original = getattr(cls, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally(self)
        return original(self, *args, **kwargs)

    setattr(cls, name, counted)
    return original
