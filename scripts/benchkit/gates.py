"""A bench's targets as one gate: every target missed is one line, and ``--check`` (or a proof the
bench cannot do without) turns a miss into exit status 1 once the run is written."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable


class Gate:
    """The misses of one run, named by ``label`` (the bench) in what :meth:`enforce` prints."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.misses: list[str] = []

    def expect(self, ok: bool, miss: str) -> bool:
        """Record ``miss`` unless ``ok``; returns ``ok``."""
        if not ok:
            self.misses.append(miss)
        return ok

    def add(self, misses: Iterable[str]) -> None:
        self.misses.extend(misses)

    @property
    def met(self) -> bool:
        return not self.misses

    def verdict(self) -> str:
        return "all met" if self.met else "; ".join(self.misses)

    def enforce(self, enabled: bool = True) -> None:
        """With ``enabled`` and a miss: each miss on stderr, then exit status 1 (``SystemExit``, so
        the bench's ``finally`` blocks still clean up)."""
        if enabled and self.misses:
            for miss in self.misses:
                print(f"{self.label}: {miss}", file=sys.stderr)
            raise SystemExit(1)


def add_check_flag(parser: argparse.ArgumentParser, what: str = "a target") -> None:
    """The bench's ``--check``: exit 1 when ``what`` is missed."""
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {what} is missed")
