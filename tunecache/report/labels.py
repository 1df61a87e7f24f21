"""How the report names and orders tuning keys and configs: keys in the order of their values
(numbers numerically, not as strings), labelled by the fields that vary within a group, and config
labels unique within a group (every field that differs, down to ``maxnreg`` or ``num_ctas``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


def key_items(key_json: str) -> list[tuple[str, Any]]:
    """A tuning key's (field, value) pairs, in the key's order."""
    try:
        return [(str(k), v) for k, v in orjson.loads(key_json)]
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return [("key", key_json)]


def _value_order(v: Any) -> tuple[int, float, str]:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        return (0, float(v), "")
    return (1, 0.0, str(v))


def key_order(key_json: str) -> tuple[tuple[int, float, str], ...]:
    """Sort order of keys: by each field's value in the key's order, numbers as numbers (1024 after
    256), not as text."""
    return tuple(_value_order(v) for _, v in key_items(key_json))


def key_text(key_json: str) -> str:
    """A key as a person reads it: ``B=1 N=128 q.dtype=torch.bfloat16`` (not its JSON)."""
    return " ".join(f"{k}={v}" for k, v in key_items(key_json))


@dataclass
class KeyAxis:
    """A group's keys as columns: labelled by the fields that vary between them, the constant ones
    said once (``constant``), the axis title naming the varying fields."""

    labels: list[str]
    varying: list[str]
    constant: list[str]

    @property
    def title(self) -> str:
        if not self.varying:
            return "tuning key"
        return f"tuning key: {', '.join(self.varying)}" + (" (values)" if len(self.varying) == 1 else "")


def key_axis(key_jsons: list[str]) -> KeyAxis:
    items = [key_items(k) for k in key_jsons]
    names = list(dict.fromkeys(n for it in items for n, _ in it))
    values = {n: {orjson.dumps(dict(it).get(n)) for it in items} for n in names}
    varying = [n for n in names if len(values[n]) > 1] if len(items) > 1 else []
    constant = [f"{n}={dict(items[0]).get(n)}" for n in names if n not in varying] if items else []
    if not varying:
        labels = [key_text(k)[:60] for k in key_jsons]
    elif len(varying) == 1:
        labels = [str(dict(it).get(varying[0])) for it in items]
    else:
        labels = [" ".join(f"{n}={dict(it).get(n)}" for n in varying) for it in items]
    return KeyAxis(_unique(labels), varying, constant)


def _unique(labels: list[str]) -> list[str]:
    """Labels made unique by a ``#n`` suffix where two are equal (so no column or row is mistaken
    for another)."""
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        n = seen.get(lab, 0)
        seen[lab] = n + 1
        out.append(lab if n == 0 else f"{lab} #{n + 1}")
    return out


#: A config's fields shown by :func:`config_label` in every label (the rest only where they differ).
_BASE_FIELDS = ("kwargs", "num_warps", "num_stages")


def config_label(cfg: dict[str, Any]) -> str:
    kw = " ".join(f"{k}={v}" for k, v in sorted(cfg.get("kwargs", {}).items()))
    return f"{kw} w{cfg.get('num_warps')} s{cfg.get('num_stages')}".strip()


def config_labels(cfgs: list[dict[str, Any]], hashes: list[str]) -> tuple[list[str], list[str]]:
    """Unique labels for a group's configs: :func:`config_label`, plus every other field whose value
    differs between them (``num_ctas``, ``maxnreg``, ...), plus the config hash where two still read
    the same; and the other fields that are the same in all (said once, in the group's header)."""
    names = sorted({k for c in cfgs for k in c if k not in _BASE_FIELDS})
    differ = [n for n in names if len({orjson.dumps(c.get(n)) for c in cfgs}) > 1]
    same = [f"{n}={cfgs[0].get(n)}" for n in names if n not in differ] if cfgs else []
    labels = [" ".join([config_label(c), *(f"{n}={c.get(n)}" for n in differ)]) for c in cfgs]
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    labels = [f"{lab} [{h[:8]}]" if counts[lab] > 1 else lab for lab, h in zip(labels, hashes)]
    return _unique(labels), same
