"""Blame: is a failed launch of a stored winner the winner's failure, or the call's?

A stored winner W of tuning key K is shared by the fleet, so marking it failed changes what every
process runs for K. It is marked only when the failure is W's own: it reproduces when W is
benchmarked alone under K's arguments. A failure caused by the call fails that call as stock
Triton's cached config would (the exception reaches the caller), and neither the store nor the
process's in-memory winner changes.

**K's arguments.** Triton's tuning key holds the ``key`` arguments and the dtypes, so a call of K
agrees with every other call of K on those. What can still differ, and change what Triton compiles
for W, is the call's *non-key constexprs*: ``tl.constexpr`` parameters the call passes that are
neither in ``key`` nor set by the config. (Other non-key arguments, pointers and ints, change only
Triton's specialisation hints; stock Triton launches its cached config for any of them, and so does
this rule. A failure that is not Triton's own exception, e.g. an illegal address, is never blamed.)

**The rule**, applied in this order by :func:`verdict`:

1. W already ran for K in this process (the call that resolved K from the store, or tuned it here,
   launched it; or a reproduction ran it): the failure is the call's. Learnt without work on the
   launch path: the resolving call's ``nargs`` (Triton makes one per call, drops it after a launch
   that succeeded, leaves it when the launch raises) is weakly marked at resolution, so a later
   failure finds the mark dead, and the resolving call's own failure finds it alive and its own.
2. The call passes no non-key constexpr: the call's arguments are K's arguments. Reproduce.
3. It passes some, and a recorded launch spec of W on this target (what Triton compiled W with when
   a key was tuned, :mod:`tunecache.binaries.preload`) has the same values: reproduce.
4. W has recorded launch specs, none with those values: W compiled under the stored arguments and
   the call changed them: the call's failure.
5. No launch spec (interpreter, a store imported without specs): what K was stored with is unknown,
   so nothing can be reproduced under it: the call's failure, with a warning once.

To reproduce is to benchmark W alone with the call's arguments (Triton's own ``_bench``, with its
reset and restore hooks). If that fails too, W is marked with that failure and the call re-resolved
to the next stored config; if it runs, the original exception reaches the caller.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from tunecache.problem.identity import base_function
from tunecache.problem.model import LaunchSpec

#: Verdicts of :func:`verdict`.
REPRODUCE = "reproduce"  # the call is under K's arguments: benchmark W alone
CALL = "call"  # W ran (or compiled) under K's arguments: the call's failure
UNKNOWN = "unknown"  # K's non-key constexprs are not known here: not W's failure either


def constexpr_names(fn: Any) -> frozenset[str]:
    """The kernel's ``tl.constexpr`` parameters, from its Python signature (as Triton's
    ``KernelParam.is_constexpr`` decides: the annotation names ``constexpr``)."""
    out = set()
    for p in inspect.signature(base_function(fn)).parameters.values():
        a = p.annotation
        text = a if isinstance(a, str) else getattr(a, "__name__", "")
        if "constexpr" in text:
            out.add(p.name)
    return frozenset(out)


def call_constexprs(
    constexprs: Iterable[str],
    arg_names: Sequence[str],
    keys: Iterable[str],
    config: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """The non-key constexprs the call passes, with its values: neither key arguments nor the config's."""
    passed = {**dict(zip(arg_names, args)), **kwargs}
    skip = set(keys) | set(config.kwargs)
    return {n: _plain(passed[n]) for n in constexprs if n in passed and n not in skip}


def spec_constants(spec_json: str, arg_names: Sequence[str]) -> dict[str, Any]:
    """The constants a launch spec was compiled with, by parameter name (Triton's
    ``serialize_specialization_data`` files them by argument index path)."""
    obj = orjson.loads(spec_json)
    out = {}
    for path, v in zip(obj.get("constant_keys", ()), obj.get("constant_vals", ())):
        if isinstance(path, list) and len(path) == 1 and isinstance(path[0], int) and path[0] < len(arg_names):
            out[arg_names[path[0]]] = v["constexpr"] if isinstance(v, dict) and "constexpr" in v else v
    return out


def verdict(
    *,
    ran_here: bool,
    passed: Mapping[str, Any],
    specs: Iterable[LaunchSpec],
    config_hash: str,
    arg_names: Sequence[str],
) -> str:
    """What a failed launch of the stored winner ``config_hash`` says about it (see the module's rule).

    ``ran_here``: it already ran for this key in this process; ``passed``: the call's non-key
    constexprs (:func:`call_constexprs`); ``specs``: the kernel's launch specs on this target.
    """
    if ran_here:
        return CALL
    if not passed:
        return REPRODUCE
    seen = False
    for s in specs:
        if s.config_hash != config_hash:
            continue
        try:
            consts = spec_constants(s.spec_json, arg_names)
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            continue
        seen = True
        if all(n in consts and consts[n] == v for n, v in passed.items()):
            return REPRODUCE
    return CALL if seen else UNKNOWN


def _plain(v: Any) -> Any:
    """A constexpr's value as a launch spec files it (``tl.constexpr(3)`` is 3)."""
    return getattr(v, "value", v) if type(v).__name__ == "constexpr" else v


__all__ = ["CALL", "REPRODUCE", "UNKNOWN", "call_constexprs", "constexpr_names", "spec_constants", "verdict"]
