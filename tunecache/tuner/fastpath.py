"""The hit path: a launch of an already resolved tuning key, without Triton's per-call dicts.

Once a key is resolved, Triton's ``Autotuner.run`` (the same steps in 3.4 to 3.9) still does on
every launch: a dict of the positional arguments, a merged dict with the keyword arguments, a
filtered third one, the key (``hasattr(arg, "dtype")`` and ``str(arg.dtype)`` of every argument),
two lookups, and the winner's ``Config.all_kwargs()`` (two more dicts) merged into the launch: about
4 us of Python per launch here, 14 us on the H200 host, more than a small kernel takes on the GPU.

:class:`FastLaunch` (a mixin of :class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, so also of
every Autotuner ``install()`` adopts, under a library's own ``run``) does only what a hit needs:

* the key from the call's positional and keyword arguments, by a function generated once per call
  shape (how many positional arguments, which keyword names, in order: Triton's key puts the dtypes
  of keyword arguments in the caller's order) that reads the arguments straight from ``args`` and
  ``kwargs``: argument positions, key values and dtype candidates are resolved when it is built;
* one lookup in Triton's own ``self.cache`` (so whatever resolves, re-resolves or forgets a key,
  Triton, tunecache or a library, is seen at the next launch), and one of the winner's launch
  keywords (``all_kwargs()``, bound once per config, not merged per call);
* ``best_config`` set and ``nargs`` left ``None`` as Triton leaves them after a launch, then
  ``JITFunction.run`` (or the wrapper's ``run``) with exactly the arguments Triton passes.

Two entries serve a hit: ``kernel[grid](...)`` (``__getitem__`` returns a launcher that serves it
itself, a frame less than Triton's launcher and ``run``; Triton's launcher where the class has a
library's own ``run``, which must run first, or where the instance has a ``run`` of its own), and
``run`` (what a library's ``super().run``, a ``Heuristics`` above the tuner or a direct call reach).

Bucket functions (``bucket=``) are not on this path: Triton's key holds the argument's own value,
so the first launch of each value resolves through Triton's run (a memory lookup of the bucket's
stored problem) and later ones of that value take this path.

Anything else goes through Triton's own ``run`` (through tunecache's hooks), so semantics never
change: a miss; a config with a ``pre_hook``; a kernel with ``pre_hook``/``post_hook``,
``reset_to_zero``/``restore_value`` or prune functions (``early_config_prune``, ``perf_model``);
one config (Triton uses it without a key); a call shape the generated function cannot serve
(more positional arguments than the kernel has, an argument given both ways, a key value that
cannot be hashed); a CUDA graph capture in progress; ``TUNECACHE_FAST_LAUNCH=0``. A launch that
raises is handed to the stored-winner recovery as Triton's path hands it (``nargs`` set as Triton
leaves it after a failed launch). No I/O, hashing of sources or logging happens here; the only
per-call state read is the instance's ``cache`` and ``configs`` and the capture flag.

Where this differs from Triton's run, by design: during the launch ``nargs`` is what the previous
call left (Triton's run sets it to this call's dict, then back to ``None``); the winner's
``all_kwargs()`` is read the first time this path launches it, so a ``Config`` edited in place
after that is not seen (a new ``Config`` object is).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache import settings
from tunecache.errors import ConfigurationError
from tunecache.tuner import basepatch

#: Triton's own ``Autotuner.run`` (see :mod:`tunecache.tuner.basepatch`): the launch after a
#: stored winner's own failure, as :meth:`~tunecache.tuner.recovery.WinnerRecovery.run` makes it.
_BASE_RUN = basepatch.original("run")

#: Bounds of one kernel's plan: call shapes with a generated key function, configs bound. Past
#: them, new shapes and configs launch through Triton's run.
MAX_SHAPES = 64
MAX_BOUND = 4096

_MISSING = object()
KeyFn = Callable[[Sequence[Any], Mapping[str, Any]], tuple]

#: Types whose instances never have a ``dtype`` (no such class attribute, no instance dict).
NO_DTYPE: tuple[type, ...] = (int, float, bool, str, type(None))


def _never() -> bool:
    return False


class _Torch:
    """What the key functions and the capture check need of torch, looked up once (torch is imported
    by then: a launch passed tensors). Without torch: no types with a dtype, never a capture."""

    def __init__(self) -> None:
        self.with_dtype: tuple[type, ...] = ()
        self.dtype_names: dict[Any, str] = {}
        self.cuda_built = False
        try:
            import torch
        except ImportError:
            return
        self.torch = torch
        self.with_dtype = (torch.Tensor, torch.nn.Parameter)  # exactly these types: ``dtype`` always there
        self.dtype_names = {d: str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        self.cuda_built = bool(torch.backends.cuda.is_built())

    def capture_check(self) -> Callable[[], bool] | None:
        """What tells a CUDA graph capture in progress: None where there cannot be one (no torch, or
        one built without CUDA); torch's own check once CUDA is up (a kernel's first launch on a GPU
        brought it up); before that, one that asks only once CUDA is up (torch's check would raise
        on a machine without a GPU)."""
        if not self.cuda_built:
            return None
        cuda = self.torch.cuda
        if cuda.is_initialized():
            return cuda.is_current_stream_capturing
        up, capturing = cuda.is_initialized, cuda.is_current_stream_capturing
        return lambda: up() and capturing()


_torch: _Torch | None = None


def torch_facts() -> _Torch:
    global _torch
    if _torch is None:
        _torch = _Torch()
    return _torch


class LaunchPlan:
    """One kernel's hit path: its argument positions and key names, a key function per call shape
    (None: that shape goes through Triton's run), the winners' launch keywords by config."""

    __slots__ = ("arg_names", "keys", "name", "shapes", "direct", "bound", "capturing")

    def __init__(self, arg_names: Sequence[str], keys: Sequence[str], name: str) -> None:
        self.arg_names = tuple(arg_names)
        self.keys = tuple(keys)
        self.name = name
        self.shapes: dict[tuple, KeyFn | None] = {}  # for run: (len(args), *kwargs), grid and warmup in kwargs
        self.direct: dict[tuple | int, KeyFn | None] = {}  # for kernel[grid]: len(args), or (len(args), *kwargs)
        self.bound: dict[int, tuple[Any, dict[str, Any]]] = {}
        self.capturing = torch_facts().capture_check()

    def learn_shape(
        self, shapes: dict, shape: tuple | int, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> KeyFn | None:
        """The key function of this call's ``shape`` in ``shapes``, generated the first time (its
        argument types are the ones a guarded quick branch expects)."""
        if shape in shapes:
            return shapes[shape]
        if len(shapes) >= MAX_SHAPES:
            return None
        types = [type(a) for a in args] + [type(v) for v in kwargs.values()]
        fn = shapes[shape] = key_function(self.arg_names, self.keys, len(args), list(kwargs), types, self.name)
        return fn

    def bind(self, config: Any) -> None:
        """Bind ``config``'s launch keywords once (not a config with a ``pre_hook``: Triton calls it).
        Keyed by ``id(config)``: the entry holds the config, so no other object can have that id while
        the entry exists, and a hit needs no identity check."""
        if config.pre_hook is not None or len(self.bound) >= MAX_BOUND:
            return
        if id(config) not in self.bound:
            self.bound[id(config)] = (config, config.all_kwargs())


def key_source(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    dtyped: Sequence[bool | None] = (),
) -> str | None:
    """Python source of ``key(args, kwargs)``: Triton's tuning key for a call with ``n`` positional
    arguments and the keyword names ``kwnames`` (in the caller's order), built as ``Autotuner.run``
    builds it: the values of the ``keys`` passed (a name not passed is skipped), then ``str(dtype)``
    of every argument with a ``dtype``, positional ones first, then keyword ones in their order;
    keywords that are no argument (``grid``, ``warmup``) are left out. None where the shape does
    not fit: more positional arguments than names, or an argument given both ways.

    ``dtyped``, per positional then keyword value, whether a value of the type seen there has a
    dtype (None: not known for every value of that type). Where all are known, a quick branch
    guarded by those exact types (``T0``...) builds the key in one tuple, with dtype names looked
    up (``DN``: a dtype missing there raises KeyError, and the launch takes Triton's run).
    Only generated names (``a0``, ``w1``) are identifiers; argument names appear as string literals.

    >>> print(key_source(["x", "out", "N", "BLOCK"], ["N"], 3, ["grid", "warmup"], [True, True, False, None, None]))
    def key(args, kwargs):
        a0, a1, a2 = args
        if type(a0) is T0 and type(a1) is T1 and type(a2) is T2:
            return (a2, DN[a0.dtype], DN[a1.dtype])
        k = [a2]
        d = getattr(a0, 'dtype', M)
        if d is not M: k.append(str(d))
        d = getattr(a1, 'dtype', M)
        if d is not M: k.append(str(d))
        d = getattr(a2, 'dtype', M)
        if d is not M: k.append(str(d))
        return tuple(k)
    >>> key_source(["x", "N"], ["N"], 1, ["x"]) is None  # x given both ways: Triton's run decides
    True
    """
    argpos = {name: i for i, name in enumerate(arg_names)}
    if n > len(arg_names):
        return None
    passed: dict[str, tuple[str, int]] = {arg_names[i]: (f"a{i}", i) for i in range(n)}  # name -> (var, value index)
    lines = ["def key(args, kwargs):"]
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}{',' if n == 1 else ''} = args")
    for j, name in enumerate(kwnames):
        p = argpos.get(name)
        if p is None:
            continue  # not an argument: not in Triton's key
        if p < n:
            return None
        passed[name] = (f"w{j}", n + j)
        lines.append(f"    w{j} = kwargs[{name!r}]")
    values = [passed[k][0] for k in keys if k in passed]
    known = [dtyped[i] if i < len(dtyped) else None for _, i in passed.values()]
    if passed and None not in known:
        guard = " and ".join(f"type({v}) is T{i}" for v, i in passed.values())
        names = [f"DN[{v}.dtype]" for (v, _), has in zip(passed.values(), known) if has]
        lines.append(f"    if {guard}:")
        lines.append(f"        return ({', '.join(values + names)}{',' if len(values + names) == 1 else ''})")
    lines.append(f"    k = [{', '.join(values)}]")
    for var, _ in passed.values():  # positional first, then keywords in the caller's order
        lines.append(f"    d = getattr({var}, 'dtype', M)")
        lines.append("    if d is not M: k.append(str(d))")
    lines.append("    return tuple(k)")
    return "\n".join(lines)


def key_function(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    types: Sequence[type],
    name: str,
) -> KeyFn | None:
    """:func:`key_source`, compiled (None where the shape does not fit). ``types``: of the values of
    the call it is learnt from, positional then keyword ones, which the quick branch expects."""
    facts = torch_facts()
    dtyped = [True if t in facts.with_dtype else False if t in NO_DTYPE else None for t in types]
    src = key_source(arg_names, keys, n, kwnames, dtyped)
    if src is None:
        return None
    ns: dict[str, Any] = {"M": _MISSING, "DN": facts.dtype_names, **{f"T{i}": t for i, t in enumerate(types)}}
    exec(compile(src, f"<tunecache key of {name}>", "exec"), ns)  # noqa: S102 - generated above, no user text as code
    return ns["key"]


def plan_for(tuner: Any) -> LaunchPlan | None:
    """A hit path for ``tuner``, or None where every launch goes through Triton's run: switched off,
    or a kernel with hooks or prune functions (read at its first launch, after a library's own
    ``__init__`` replaced its hooks)."""
    try:
        if not settings.get("TUNECACHE_FAST_LAUNCH"):
            return None
    except ConfigurationError:  # set bad after the kernel was defined: Triton's run, warned once
        settings.usable()
        return None
    if getattr(tuner, "user_defined_pre_hook", True) or getattr(tuner, "user_defined_post_hook", True):
        return None
    if tuner.reset_to_zero or tuner.restore_value or tuner.early_config_prune or tuner.perf_model:
        return None
    return LaunchPlan(tuner.arg_names, tuner.keys, getattr(tuner, "_tc_name", "kernel"))


def _launch(bound_to: tuple[Any, Any], *args: Any, **kwargs: Any) -> Any:
    """``kernel[grid](*args, **kwargs)`` of a :class:`FastLaunch` (``bound_to``: the kernel and the grid):
    a hit launched here, anything else through ``kernel.run(*args, grid=grid, warmup=False, **kwargs)``
    as Triton's launcher calls it."""
    self, grid = bound_to
    plan = self._tc_plan
    if plan and len(self.configs) > 1:
        key = plan.direct.get((len(args), *kwargs) if kwargs else len(args))
        if key is not None:
            try:
                config = self.cache.get(key(args, kwargs))
                if config is not None and plan.capturing is not None and plan.capturing():
                    config = None  # a capture in progress: Triton's run
            except Exception:  # noqa: BLE001 - an unhashable key value, a broken CUDA context: Triton's run raises it
                config = None
            if config is not None:
                bound = plan.bound.get(id(config))
                if bound is not None:
                    self.best_config = config
                    try:
                        ret = self.fn.run(*args, grid=grid, warmup=False, **kwargs, **bound[1])
                    except BaseException as e:
                        if self._tc_launch_failed(config, args, {"grid": grid, "warmup": False, **kwargs}, e):
                            return _BASE_RUN(self, *args, grid=grid, warmup=False, **kwargs)
                        raise
                    self.nargs = None
                    return ret
    ret = self.run(*args, grid=grid, warmup=False, **kwargs)
    self._tc_learn(True, (len(args), *kwargs) if kwargs else len(args), args, kwargs)
    return ret


class FastLaunch(Autotuner):
    """``run`` and ``kernel[grid]`` with the hit path in front of Triton's run (see the module's
    docstring). A subclass of Triton's Autotuner, as :class:`~tunecache.tuner.recovery.WinnerRecovery`
    is (see there); its ``super().run`` is tunecache's recovering run, then Triton's."""

    #: None: not built yet (the first launch builds it); False: this kernel always takes Triton's run.
    _tc_plan: LaunchPlan | None | bool = None
    _tc_own_run: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tc_own_run = cls.run is FastLaunch.run  # False under a library's own run (a covering class)

    def __getitem__(self, grid: Any) -> Any:
        """``kernel[grid]``: Triton's launcher calls ``self.run(grid=grid, warmup=False, ...)``; this one
        serves a hit itself, a frame less. Triton's where ``run`` is not this class's (a library's own
        ``run`` runs first; one set on the instance, as the first call's observer), or where the kernel
        has no plan (yet)."""
        if self._tc_plan and self._tc_own_run and "run" not in self.__dict__:
            # (self, grid) bound as a method's "self": cheaper to make and to call than a partial
            return types.MethodType(_launch, (self, grid))
        return super().__getitem__(grid)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Triton's ``Autotuner.run`` (``kwargs`` with ``grid`` and ``warmup``), a hit served here."""
        plan = self._tc_plan
        if plan and len(self.configs) > 1:
            key = plan.shapes.get((len(args), *kwargs))
            if key is not None:
                try:
                    config = self.cache.get(key(args, kwargs))
                    if config is not None and plan.capturing is not None and plan.capturing():
                        config = None  # a capture in progress: Triton's run
                except Exception:  # noqa: BLE001 - as above
                    config = None
                if config is not None:
                    bound = plan.bound.get(id(config))
                    if bound is not None:
                        self.best_config = config
                        try:
                            ret = self.fn.run(*args, **kwargs, **bound[1])
                        except BaseException as e:
                            if self._tc_launch_failed(config, args, kwargs, e):
                                return _BASE_RUN(self, *args, **kwargs)
                            raise
                        self.nargs = None
                        return ret
        elif plan is False:
            return super().run(*args, **kwargs)
        ret = super().run(*args, **kwargs)
        self._tc_learn(False, (len(args), *kwargs), args, kwargs)
        return ret

    def _tc_launch_failed(self, config: Any, args: Sequence[Any], kwargs: Mapping[str, Any], e: BaseException) -> bool:
        """The hit path's launch of ``config`` raised ``e``: ``nargs`` as Triton's run leaves it after a
        failed launch, then the stored-winner recovery as for Triton's path. True: launch again through
        Triton's run (the winner was marked failed); False: re-raise ``e``."""
        self.nargs = dict(zip(self.arg_names, args))
        return isinstance(e, Exception) and self._tc_blamed(config, args, kwargs, e)

    def _tc_learn(self, direct: bool, shape: tuple | int, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """After a launch through Triton's run: what the next launch of this shape and key needs
        (``direct``: a launch by ``kernel[grid]``, whose ``kwargs`` hold no grid and warmup)."""
        plan = self._tc_plan
        if plan is None:
            plan = self._tc_plan = plan_for(self) or False
        if not plan or len(self.configs) < 2:
            return
        key = plan.learn_shape(plan.direct if direct else plan.shapes, shape, args, kwargs)
        if key is None:
            return
        try:
            config = self.cache.get(key(args, kwargs))
        except Exception:  # noqa: BLE001 - as above
            return
        if config is not None:
            plan.bind(config)


__all__ = [
    "MAX_BOUND",
    "MAX_SHAPES",
    "NO_DTYPE",
    "FastLaunch",
    "LaunchPlan",
    "key_function",
    "key_source",
    "plan_for",
    "torch_facts",
]
