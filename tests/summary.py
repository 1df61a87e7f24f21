"""Lines a test asks pytest to print in its terminal summary (tests/conftest.py prints them), e.g.
the adversarial writer's attack counts: seen in ``scripts/test`` and CI without ``-s``."""

from __future__ import annotations

LINES: list[str] = []


def say(line: str) -> None:
    LINES.append(line)
