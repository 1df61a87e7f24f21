"""A bench's record of one run: its JSON file (the figures, with the date, versions and device they
were measured on) and the markdown tables of its summary."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def meta(*, cpu: bool = False, versions: bool = True) -> dict[str, Any]:
    """When and on what a run measures: the UTC date, Python, the CPU count, and with ``versions``
    the torch and Triton versions (where they import) and the device (the GPU's name; ``cpu`` where
    there is none or ``cpu`` is asked for)."""
    out: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if not versions:
        return out
    try:
        import torch
        import triton

        out.update(torch=torch.__version__, triton=triton.__version__)
        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() and not cpu else "cpu"
    except Exception:  # noqa: BLE001 - a record without them (no torch here)
        out["device"] = "cpu"
    return out


def write(path: Path, record: Any, *, indent: int | None = 2) -> Path:
    """Write ``record`` as JSON (anything JSON lacks, as its ``str``); its folder is made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent, default=str) + "\n")
    return path


def read(path: Path) -> Any:
    return json.loads(path.read_text())


class Record(dict):
    """A run's figures as they come in, saved to ``path`` after each step (:meth:`save`), so a run
    cut short still leaves what it measured."""

    def __init__(self, path: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.path = path

    def save(self) -> Path:
        return write(self.path, dict(self))


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A markdown table: ``header``, then one line per row (each cell as ``str``); ``align`` has one
    letter per column, ``l`` or ``r`` (default left)."""
    seps = ["---:" if align[i : i + 1] == "r" else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(seps) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
