"""The hit path: a launch of an already resolved tuning key, without Triton's per-call dicts.

Once a key is resolved, Triton's ``Autotuner.run`` (the same steps in 3.4 to 3.9) still does on
every launch: a dict of the positional arguments, a merged dict with the keyword arguments, a
filtered third one, the key (``hasattr(arg, "dtype")`` and ``str(arg.dtype)`` of every argument),
two lookups, and the winner's ``Config.all_kwargs()`` (two more dicts) merged into the launch: about
4 us of Python per launch here, 14 us on the H200 host, more than a small kernel takes on the GPU.

:class:`FastLaunch` (a mixin of :class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, so also of
every Autotuner ``install()`` adopts, under a library's own ``run``) does only what a hit needs, in
one function generated once per call shape (how many positional arguments, which keyword names, in
order: Triton's key puts the dtypes of keyword arguments in the caller's order), a *launcher*:

* the key, read straight from ``args`` and ``kwargs``: argument positions and key values resolved
  when it is built; the values seen without a dtype guarded by their exact types, the dtypes of
  tensors looked up by name (a value there without a torch dtype: the general ``getattr`` key);
* one lookup in Triton's own ``self.cache`` (so whatever resolves, re-resolves or forgets a key,
  Triton, tunecache or a library, is seen at the next launch), and one of the winner's launch
  keywords (``all_kwargs()``, bound once per config, not merged per call);
* ``best_config`` set and ``nargs`` left ``None`` as Triton leaves them after a launch, then
  ``JITFunction.run`` (or the wrapper's ``run``) with exactly the arguments Triton passes, each
  under its name (keywords that are the kernel's next parameters by position, where nothing can
  tell: see the end).

That this is Triton's path is proven by difference: ``tests/test_hitpath_differential.py`` drives the
same kernels through Triton's run and through this path over a generated space of call forms, and
what reaches ``JITFunction.run``, what hooks see, results and exceptions must be identical.

Two entries reach the launchers: ``kernel[grid](...)`` (``__getitem__`` returns a call shape's
*entry*, the launcher itself bound to the kernel and the grid, so nothing stands between the call
and the launch: the first shape's, until another shape has been handed on ``FOLLOW_AFTER`` times;
a call of another shape is handed to its launcher; Triton's launcher where the class has a
library's own ``run``, which must run first, or where the instance has a ``run`` of its own), and
``run`` (what a library's ``super().run``, a ``Heuristics`` above the tuner or a direct call reach).
``run`` takes ``grid`` and ``warmup`` apart from the other keywords, so both entries share one
launcher per shape and a ``run`` call's shape is cheap to tell.

Bucket functions (``bucket=``) are not on this path: Triton's key holds the argument's own value,
so the first launch of each value resolves through Triton's run (a memory lookup of the bucket's
stored problem) and later ones of that value take this path.

Anything else goes through Triton's own ``run`` (through tunecache's hooks), so semantics never
change: a miss; a config with a ``pre_hook``; a kernel with ``pre_hook``/``post_hook``,
``reset_to_zero``/``restore_value`` or prune functions (``early_config_prune``, ``perf_model``);
one config (Triton uses it without a key); a call shape the generated function cannot serve
(more positional arguments than the kernel has, an argument given both ways, a key value that
cannot be hashed, ``grid`` or ``warmup`` given to ``kernel[grid]`` as well: Triton's launcher fails
it); a winner that sets a keyword the call passes by position (Triton's run fails the launch);
``TUNECACHE_FAST_LAUNCH=0``. A launch that raises is handed to the stored-winner recovery as
Triton's path hands it (``nargs`` set as Triton leaves it after a failed launch); a launch of
Triton's run that raises is never made a second time. No I/O, hashing of sources or logging happens
here; the only per-call state read is the instance's ``cache``, ``configs`` and ``fn`` (and the
kernel's list of pre-run hooks). A launcher is generated Python: its only identifiers are generated
names; argument names appear in it as string literals, so no user text is executed as code.

A CUDA graph capture needs no check here. On a hit, Triton's run under a capture does exactly what
this path does (one launch of the winner, recorded into the graph); what must never happen inside a
capture, a benchmark, happens only on a miss or after a failed launch, and both go through
tunecache's run, which checks for a capture there (``measure.capturing``: a miss falls back to a
stored or default config, the recovery judges a failure outside the capture). Asking torch on every
launch cost 0.32-0.49 us on the H200 host (2026-12-06), a quarter of what this path adds to a launch.

Where this differs from Triton's run, by design: during the launch ``nargs`` is what the previous
call left (Triton's run sets it to this call's dict, then back to ``None``); a config's
``all_kwargs()`` is read once, after Triton's run first launched it (a config that path has not
launched yet goes through it once), so a ``Config`` edited in place after that is not seen (a new
``Config`` object is); ``run`` hands Triton's run ``grid`` and ``warmup`` ahead of the other
keywords, where Triton's own launcher puts them (a call without them goes to Triton's run as made;
only the functions of a ``Heuristics`` under the tuner see that order: their dict holds both).

Not a difference: a launch whose keyword arguments are the kernel's next parameters (``k(x=x, y=y,
N=n)``, as fla launches) hands them to ``JITFunction.run`` positionally, in the kernel's order (a
merged dict less per launch, and Triton's binder binds positions faster than names), where nothing
can tell: ``fn`` is Triton's own ``JITFunction`` or the interpreter's (:func:`binds_alike`), which
binds both alike; the kernel has no pre-run hooks at that launch (``add_pre_run_hook``: they get
the call's own positional and keyword arguments, so a launch with hooks passes them as made; the
launchers read the list Triton keeps, a list put in its place later is not seen); the winner sets
none of them (a per-shape ``<t>BOUND``: Triton's run fails such a launch, as Triton does); none is a
keyword ``JITFunction.run`` sets itself (:data:`RUN_SETS`). Under a ``Heuristics`` (its functions
see the dict of the arguments, and the value it sets may be one the caller passed) or a ``fn`` whose
class has a ``run`` of its own, they are passed as made.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from tunecache import settings
from tunecache.errors import ConfigurationError
from tunecache.tuner import basepatch

#: Triton's own ``Autotuner.run`` (see :mod:`tunecache.tuner.basepatch`): the launch after a
#: stored winner's own failure, as :meth:`~tunecache.tuner.recovery.WinnerRecovery.run` makes it.
_BASE_RUN = basepatch.original("run")

#: Bounds of one kernel's plan: call shapes with a generated launcher, configs bound. Past them,
#: new shapes and configs launch through Triton's run.
MAX_SHAPES = 64
MAX_BOUND = 4096
#: Calls of one other shape handed on by ``kernel[grid]``'s entry after which that shape's launcher
#: becomes the entry (a kernel whose first call was not of the shape it is launched with from then on).
FOLLOW_AFTER = 16

_MISSING = object()
#: A plan's ``attrs`` where ``kernel[grid]`` is never served by the hit path: "a ``run`` is set".
_NEVER: Mapping[str, Any] = types.MappingProxyType({"run": None})
#: ``launch(tuner, grid, warmup, args, kwargs)``: one call shape's generated launcher.
Launcher = Callable[[Any, Any, Any, Sequence[Any], Mapping[str, Any]], Any]
KeyFn = Callable[[Sequence[Any], Mapping[str, Any]], tuple]

#: Types whose instances never have a ``dtype`` (no such class attribute, no instance dict).
NO_DTYPE: tuple[type, ...] = (int, float, bool, str, type(None))


class _Torch:
    """What the launchers need of torch, looked up once (torch is imported by then: a launch passed
    tensors). Without torch: no tensors."""

    def __init__(self) -> None:
        self.tensor: type | None = None
        self.dtype_names: dict[Any, str] = {}
        try:
            import torch
        except ImportError:
            return
        self.torch = torch
        self.tensor = torch.Tensor
        self.dtype_names = {d: str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}

    def has_dtype(self, t: type) -> bool | None:
        """Whether a value of type ``t`` has a dtype: True for tensors (their launchers read it and
        fall back where it is no torch dtype), False where it never has one, None: not known."""
        if self.tensor is not None and issubclass(t, self.tensor):
            return True
        return False if t in NO_DTYPE else None


_torch: _Torch | None = None


def torch_facts() -> _Torch:
    global _torch
    if _torch is None:
        _torch = _Torch()
    return _torch


def _call_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | tuple:
    """What selects a launcher: the number of positional arguments, the keyword names in order, or
    both (written out where it is used on the hit path, a call less). An all-keyword launch, as fla
    writes them, makes one tuple of the names and no list."""
    if not kwargs:
        return len(args)
    return (len(args), *kwargs) if args else tuple(kwargs)


class LaunchPlan:
    """One kernel's hit path: a generated launcher per call shape (None: that shape goes through
    Triton's run) and the winners' launch keywords by config. ``ns``: the launchers' globals, where
    the bound keywords are read at each launch."""

    __slots__ = (
        "arg_names", "keys", "name", "positional", "shapes", "bound", "by_position", "held", "ns", "made", "attrs",
        "entry", "entries", "handed",
    )  # fmt: skip

    def __init__(self, arg_names: Sequence[str], keys: Sequence[str], name: str, hooks: list | None = None) -> None:
        facts = torch_facts()
        self.arg_names = tuple(arg_names)
        self.keys = tuple(keys)
        self.name = name
        #: The kernel's run binds positional and keyword arguments alike, and ``hooks`` is its list of
        #: pre-run hooks (:func:`binds_alike`): launchers read it at each launch.
        self.positional = hooks is not None
        self.shapes: dict[int | tuple, Launcher | None] = {}
        self.bound: dict[int, dict[str, Any]] = {}
        #: Per call shape launched by position (``<t>BOUND``): its keyword names, and the bound configs
        #: that set none of them (one that does goes to Triton's run, which fails it as Triton does).
        self.by_position: list[tuple[frozenset[str], dict[int, dict[str, Any]]]] = []
        self.held: list[Any] = []  # the bound configs: alive while their ids key ``bound``
        self.ns: dict[str, Any] = {
            "M": _MISSING,
            "DN": facts.dtype_names,
            "BOUND": self.bound,
            "MISS": _through_triton,
            "HOOKS": () if hooks is None else hooks,
            "NO_CACHE": types.MappingProxyType({}),
            "BASE_RUN": _BASE_RUN,
            "DISPATCH": _dispatch,
        }
        self.made = itertools.count()  # numbers the launchers' type names (``T3_0``), unique across threads
        #: Where ``kernel[grid]`` looks for a ``run`` set on the instance: the tuner's ``__dict__``, or
        #: :data:`_NEVER` under a library's own ``run`` (set by :meth:`FastLaunch._tc_learn`).
        self.attrs: Mapping[str, Any] = _NEVER
        #: What ``kernel[grid]`` returns, bound to ``(tuner, grid)``: a call shape's entry
        #: (:func:`launcher_source` with ``entry``; the first shape's, then the one :meth:`handed_on`
        #: follows), or :func:`_launch` until one is generated.
        self.entry: Callable[..., Any] = _launch
        self.entries: dict[int | tuple, Callable[..., Any]] = {}
        self.handed: dict[int | tuple, int] = {}  # calls handed on by the entry, by shape

    def handed_on(self, shape: int | tuple) -> None:
        """``kernel[grid]``'s entry handed a call of ``shape`` on (:func:`_dispatch`, never a hit): after
        :data:`FOLLOW_AFTER` such calls of one shape, that shape's entry is ``kernel[grid]``'s. Two
        shapes launched in turn keep costing a hand-on each, whichever is the entry."""
        n = self.handed.get(shape, 0) + 1
        if n < FOLLOW_AFTER:
            self.handed[shape] = n
        else:
            self.handed.clear()
            self.entry = self.entries.get(shape, self.entry)

    def learn(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Generate the launcher of this call's shape the first time it is seen (the argument types
        are the ones its quick key expects)."""
        shape = _call_shape(args, kwargs)
        if shape in self.shapes or len(self.shapes) >= MAX_SHAPES:
            return
        facts = torch_facts()
        values = [*args, *kwargs.values()]
        t = f"T{next(self.made)}_"
        how = (self.arg_names, self.keys, len(args), list(kwargs), [facts.has_dtype(type(v)) for v in values], t)
        src = launcher_source(*how, positional=self.positional)
        if src is None:
            self.shapes[shape] = None
            return
        src += "\n\n" + launcher_source(*how, positional=self.positional, entry=True)  # type: ignore[operator]
        self.ns.update({f"{t}{i}": type(v) for i, v in enumerate(values)}, **{f"{t}names": tuple(kwargs)})
        if self.positional and kwargs and _in_kernel_order(self.arg_names, len(args), list(kwargs)):
            names = frozenset(kwargs)
            self.ns[f"{t}BOUND"] = fits = {i: kw for i, kw in self.bound.items() if names.isdisjoint(kw)}
            self.by_position.append((names, fits))
        made: dict[str, Any] = {}
        exec(compile(src, f"<tunecache launcher of {self.name}>", "exec"), self.ns, made)  # noqa: S102 - generated, no user text as code
        self.shapes[shape] = made["launch"]
        self.entries[shape] = made["enter"]
        if self.entry is _launch:  # the first shape that fits: kernel[grid] enters its launcher directly
            self.entry = made["enter"]

    def bind(self, config: Any) -> None:
        """Bind ``config``'s launch keywords once (not a config with a ``pre_hook``: Triton calls it).
        Keyed by ``id(config)``: ``held`` keeps the config, so no other object can have that id while
        the entry exists, and a hit needs no identity check."""
        if config is None or config.pre_hook is not None or len(self.bound) >= MAX_BOUND:
            return
        if id(config) not in self.bound:
            self.bound[id(config)] = kw = config.all_kwargs()
            self.held.append(config)
            for names, fits in self.by_position:
                if names.isdisjoint(kw):
                    fits[id(config)] = kw


def _key_parts(
    arg_names: Sequence[str], keys: Sequence[str], n: int, kwnames: Sequence[str], dtyped: Sequence[bool | None], t: str
) -> tuple[list[str], str | None, list[str]] | None:
    """The statements of Triton's key for a call shape, shared by :func:`key_source` and
    :func:`launcher_source`: (reading the arguments, the quick key's expression or None, the general
    key's statements). None where the shape does not fit."""
    argpos = {name: i for i, name in enumerate(arg_names)}
    if n > len(arg_names):
        return None
    passed: dict[str, tuple[str, int]] = {arg_names[i]: (f"a{i}", i) for i in range(n)}  # name -> (var, value index)
    read = [f"{', '.join(f'a{i}' for i in range(n))}{',' if n == 1 else ''} = args"] if n else []
    for j, name in enumerate(kwnames):
        p = argpos.get(name)
        if p is None:
            continue  # not an argument: not in Triton's key
        if p < n:
            return None
        passed[name] = (f"w{j}", n + j)
        read.append(f"w{j} = kwargs[{name!r}]")
    values = [passed[k][0] for k in keys if k in passed]
    known = [dtyped[i] if i < len(dtyped) else None for _, i in passed.values()]
    quick = None
    if None not in known:
        names = [f"DN[{v}.dtype]" for (v, _), has in zip(passed.values(), known) if has]
        quick = f"({', '.join(values + names)}{',' if len(values + names) == 1 else ''})"
        guard = " and ".join(f"type({v}) is {t}{i}" for (v, i), has in zip(passed.values(), known) if not has)
        if guard:
            quick = f"{quick} if {guard} else None"
    general = [f"k = [{', '.join(values)}]"]
    for var, _ in passed.values():  # positional first, then keywords in the caller's order
        general.append(f"d = getattr({var}, 'dtype', M)")
        general.append("if d is not M: k.append(str(d))")
    general.append("key = tuple(k)")
    return read, quick, general


def _indent(lines: Sequence[str], level: int) -> list[str]:
    return ["    " * level + line for line in lines]


def _quick_lines(quick: str | None) -> list[str]:
    if quick is None:
        return ["key = None"]
    return [
        "try:",
        f"    key = {quick}",
        "except Exception:  # a value there without a torch dtype: the general key",
        "    key = None",
    ]


def key_source(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    dtyped: Sequence[bool | None] = (),
    t: str = "T",
) -> str | None:
    """Python source of ``key(args, kwargs)``: Triton's tuning key for a call with ``n`` positional
    arguments and the keyword names ``kwnames`` (in the caller's order), built as ``Autotuner.run``
    builds it: the values of the ``keys`` passed (a name not passed is skipped), then ``str(dtype)``
    of every argument with a ``dtype``, positional ones first, then keyword ones in their order;
    keywords that are no argument (``grid``) are left out. None where the shape does not fit: more
    positional arguments than names, or an argument given both ways. The launchers compute their
    key with these very statements.

    ``dtyped``, per positional then keyword value: whether a value of the type seen there has a dtype
    (True: a tensor; None: not known for every value of that type). Where all are known, a quick key
    is built in one tuple: the values seen without a dtype guarded by their exact types (``T0``...),
    the dtype names of the others looked up (``DN``). A value there without a torch dtype raises and
    the general key is built. Only generated names (``a0``, ``w1``) are identifiers; argument names
    appear as string literals.

    >>> print(key_source(["x", "out", "N", "BLOCK"], ["N"], 2, ["N"], [True, True, False]))
    def key(args, kwargs):
        a0, a1 = args
        w0 = kwargs['N']
        try:
            key = (w0, DN[a0.dtype], DN[a1.dtype]) if type(w0) is T2 else None
        except Exception:  # a value there without a torch dtype: the general key
            key = None
        if key is None:
            k = [w0]
            d = getattr(a0, 'dtype', M)
            if d is not M: k.append(str(d))
            d = getattr(a1, 'dtype', M)
            if d is not M: k.append(str(d))
            d = getattr(w0, 'dtype', M)
            if d is not M: k.append(str(d))
            key = tuple(k)
        return key
    >>> key_source(["x", "N"], ["N"], 1, ["x"]) is None  # x given both ways: Triton's run decides
    True
    """
    parts = _key_parts(arg_names, keys, n, kwnames, dtyped, t)
    if parts is None:
        return None
    read, quick, general = parts
    lines = ["def key(args, kwargs):", *_indent(read + _quick_lines(quick), 1), "    if key is None:"]
    return "\n".join([*lines, *_indent(general, 2), "    return key"])


def launcher_source(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    dtyped: Sequence[bool | None] = (),
    t: str = "T",
    *,
    positional: bool = False,
    entry: bool = False,
) -> str | None:
    """Python source of one call shape's ``launch(self, grid, warmup, args, kwargs)`` (see
    :func:`key_source` for the shape and the key): the key, one lookup in Triton's ``self.cache``,
    the winner's bound keywords (``BOUND``), ``best_config``, the launch with
    exactly the arguments Triton's run passes, ``nargs``; anything else is handed to ``MISS``
    (Triton's run), a failed launch to the stored-winner recovery. One function and one frame, no
    dict built but the launch's own keywords. None where the shape does not fit.

    ``positional``: the kernel's run binds arguments by position as by name (``JITFunction.run``): a
    call whose keywords are the parameters right after its positional arguments launches with all of
    them positional, in the kernel's order.

    >>> print(launcher_source(["x", "N", "BLOCK"], ["N"], 0, ["N", "x"], [False, True], positional=True))
    ... # doctest: +ELLIPSIS
    def launch(self, grid, warmup, args, kwargs):
    ...
        w0 = kwargs['N']
        w1 = kwargs['x']
    ...
            if HOOKS:  # pre-run hooks see the call's own positional and keyword arguments
                ret = self.fn.run(*args, grid=grid, warmup=warmup, **kwargs, **bound)
            else:
                ret = self.fn.run(w1, w0, grid=grid, warmup=warmup, **bound)
    ...

    ``entry``: the shape's ``enter(bound_to, *args, **kwargs)`` instead, what ``kernel[grid]`` returns
    (bound to ``(tuner, grid)``) where this is the kernel's entry shape (:attr:`LaunchPlan.entry`):
    the same launcher with no frame between it and the caller (``warmup`` is ``False`` there). A call
    of another shape goes to ``DISPATCH`` with the call's own ``args`` and ``kwargs`` (the shape's
    launcher, or Triton's run). The shape's keyword names are the global ``<t>names``, never written
    into the source.

    >>> print(launcher_source(["x", "N", "BLOCK"], ["N"], 2, [], [True, False], entry=True))
    ... # doctest: +ELLIPSIS
    def enter(bound_to, *args, **kwargs):
        if kwargs or len(args) != 2:
            return DISPATCH(bound_to, args, kwargs)
        self, grid = bound_to
        try:
            self.configs[1]
            cache = self.cache
        except Exception:  # one config (or none): Triton's run, which launches it without a key
            cache = NO_CACHE
        a0, a1 = args
    ...
    """
    body = _launch_body(arg_names, keys, n, kwnames, dtyped, t, positional, "False" if entry else "warmup")
    if body is None:
        return None
    if not entry:
        return "\n".join(["def launch(self, grid, warmup, args, kwargs):", *body])
    count = f"len(args) != {n}" if n else "args"
    shape = f"{count} or tuple(kwargs) != {t}names" if kwnames else f"kwargs or {count}"
    dispatch = "        return DISPATCH(bound_to, args, kwargs)"
    head = ["def enter(bound_to, *args, **kwargs):", f"    if {shape}:", dispatch, "    self, grid = bound_to"]
    return "\n".join([*head, *body])


def _launch_body(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    dtyped: Sequence[bool | None],
    t: str,
    positional: bool,
    warmup: str = "warmup",
) -> list[str] | None:
    """The statements a launcher and an entry share, from reading the arguments to the launch
    (``warmup``: its value's expression, ``False`` in an entry)."""
    parts = _key_parts(arg_names, keys, n, kwnames, dtyped, t)
    if parts is None:
        return None
    read, quick, general = parts
    kw = ", **kwargs" if kwnames else ""
    as_made = f"*args, grid=grid, warmup={warmup}{kw}, **bound"
    order = _in_kernel_order(arg_names, n, kwnames) if positional and kwnames else None
    if order is None:
        launch = [f"        ret = self.fn.run({as_made})"]
    else:
        launch = [
            "        if HOOKS:  # pre-run hooks see the call's own positional and keyword arguments",
            f"            ret = self.fn.run({as_made})",
            "        else:",
            f"            ret = self.fn.run({', '.join(order)}, grid=grid, warmup={warmup}, **bound)",
        ]
    miss = f"return MISS(self, grid, {warmup}, args, kwargs)"
    return [
        "    try:",
        "        self.configs[1]",
        "        cache = self.cache",
        "    except Exception:  # one config (or none): Triton's run, which launches it without a key",
        "        cache = NO_CACHE",
        *_indent(read + _quick_lines(quick), 1),
        "    try:",
        "        if key is None:",
        *_indent(general, 3),
        "        config = cache.get(key)",
        "    except Exception:  # an unhashable key value, a broken CUDA context: Triton's run raises it",
        "        config = None",
        f"    bound = {t + 'BOUND' if order else 'BOUND'}.get(id(config))  # never None's",
        "    if bound is None:  # a miss, or a config not launched here yet (or setting a keyword passed)",
        f"        {miss}  # (not in the try: Triton's run raising is not run again)",
        "    self.best_config = config",
        "    try:",
        *launch,
        "    except BaseException as e:",
        f"        if self._tc_launch_failed(config, args, {{'grid': grid, 'warmup': {warmup}{kw}}}, e):",
        f"            return BASE_RUN(self, *args, grid=grid, warmup={warmup}{kw})",
        "        raise",
        "    self.nargs = None",
        "    return ret",
    ]


#: Keywords ``JITFunction.run`` sets itself (3.4 to 3.9): a parameter of that name passed by keyword
#: is one Triton's run replaces, so such a call is never handed over by position.
RUN_SETS = frozenset({"debug", "instrumentation_mode", "fpsan_homomorphic_casts"})


def _in_kernel_order(arg_names: Sequence[str], n: int, kwnames: Sequence[str]) -> list[str] | None:
    """The launcher's variables of a call's arguments in the kernel's parameter order (``a0``... for
    the positional ones, ``w<j>`` for the keyword ones), where its keywords are exactly the parameters
    after the positional ones; None otherwise (a gap, a default left out, a keyword no parameter, one
    that ``JITFunction.run`` sets: :data:`RUN_SETS`)."""
    following = arg_names[n : n + len(kwnames)]
    if len(following) != len(kwnames) or set(following) != set(kwnames) or not RUN_SETS.isdisjoint(kwnames):
        return None
    index = {name: j for j, name in enumerate(kwnames)}
    return [f"a{i}" for i in range(n)] + [f"w{index[name]}" for name in following]


def key_function(
    arg_names: Sequence[str],
    keys: Sequence[str],
    n: int,
    kwnames: Sequence[str],
    value_types: Sequence[type],
    name: str,
) -> KeyFn | None:
    """:func:`key_source`, compiled (None where the shape does not fit): the key a launcher learnt
    from a call with values of ``value_types`` (positional then keyword ones) computes."""
    facts = torch_facts()
    src = key_source(arg_names, keys, n, kwnames, [facts.has_dtype(t) for t in value_types])
    if src is None:
        return None
    ns: dict[str, Any] = {"M": _MISSING, "DN": facts.dtype_names, **{f"T{i}": t for i, t in enumerate(value_types)}}
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
    hooks = tuner.fn.pre_run_hooks if binds_alike(tuner.fn) else None
    return LaunchPlan(tuner.arg_names, tuner.keys, getattr(tuner, "_tc_name", "kernel"), hooks)


def binds_alike(fn: Any) -> bool:
    """Whether ``fn.run`` is Triton's own ``JITFunction.run`` (or the interpreter's), which binds
    positional and keyword arguments alike and shows which were which only to its pre-run hooks
    (``pre_run_hooks``, read by the launchers at each launch). Not a ``Heuristics`` (its functions see
    the arguments' dict in the caller's order, and a value it sets may be one the caller passed), nor
    a ``run`` of the instance's or of a subclass's own, which may read its keywords."""
    if "run" in getattr(fn, "__dict__", {}) or not isinstance(getattr(fn, "pre_run_hooks", None), list):
        return False
    run = getattr(type(fn), "run", None)
    interpreter = sys.modules.get("triton.runtime.interpreter")  # never imported here: no fn is one without it
    owners = (JITFunction, getattr(interpreter, "InterpretedFunction", None))
    return run is not None and any(run is getattr(c, "run", None) for c in owners if c is not None)


def _through_triton(self: FastLaunch, grid: Any, warmup: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """A launch the hit path does not serve: Triton's run (through tunecache's recovering run), then
    what the next launch of this call's shape and key needs."""
    ret = super(FastLaunch, self).run(*args, grid=grid, warmup=warmup, **kwargs)
    self._tc_learn(args, kwargs)
    return ret


def _launch(bound_to: tuple[Any, Any], *args: Any, **kwargs: Any) -> Any:
    """``kernel[grid](*args, **kwargs)`` of a :class:`FastLaunch` (``bound_to``: the kernel and the
    grid) with no entry generated yet: :func:`_dispatch`."""
    return _dispatch(bound_to, args, kwargs)


def _dispatch(bound_to: tuple[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """A ``kernel[grid]`` call an entry does not serve (another shape): the call shape's launcher
    (counted: :meth:`LaunchPlan.handed_on`), or Triton's run as Triton's launcher calls it
    (``warmup=False``; Triton's launcher itself where the call gives ``grid`` or ``warmup`` too)."""
    self, grid = bound_to
    plan = self._tc_plan
    if plan:
        if not kwargs:  # the call's shape, as _call_shape (written out: a call less on a launch)
            shape: int | tuple = len(args)
        else:
            shape = (len(args), *kwargs) if args else tuple(kwargs)
        launch = plan.shapes.get(shape)
        if launch is not None:
            plan.handed_on(shape)
            return launch(self, grid, False, args, kwargs)
    if "grid" in kwargs or "warmup" in kwargs:  # given twice: Triton's launcher fails it, as Triton does
        return super(FastLaunch, self).__getitem__(grid)(*args, **kwargs)
    return _through_triton(self, grid, False, args, kwargs)


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
        is the plan's entry (:attr:`LaunchPlan.entry`), which serves a hit itself. Triton's where ``run``
        is not this class's (a library's own ``run`` runs first; one set on the instance, as the first
        call's observer), or where the kernel has no plan (yet)."""
        plan = self._tc_plan
        if plan and "run" not in plan.attrs:  # one lookup: the class's run and the instance's (see LaunchPlan)
            # (self, grid) bound as a method's "self": cheaper to make and to call than a partial
            return types.MethodType(plan.entry, (self, grid))
        return super().__getitem__(grid)

    def run(self, *args: Any, grid: Any = _MISSING, warmup: Any = _MISSING, **kwargs: Any) -> Any:
        """Triton's ``Autotuner.run``, a hit served here. ``grid`` and ``warmup`` are taken apart from
        the other keywords (every launch passes both, as ``JITFunction.run`` requires), so that a call
        shape is what the caller passed to the kernel and the launchers serve both entries; Triton's
        run gets them back first, where Triton's launcher puts them."""
        if grid is _MISSING or warmup is _MISSING:  # no launch: Triton's run fails it as it does
            given = {n: v for n, v in (("grid", grid), ("warmup", warmup)) if v is not _MISSING}
            return super().run(*args, **given, **kwargs)
        plan = self._tc_plan
        if plan:  # (a kernel left with one config: its launcher hands it to Triton's run)
            if not kwargs:  # the call's shape, as _call_shape
                launch = plan.shapes.get(len(args))
            else:
                launch = plan.shapes.get((len(args), *kwargs) if args else tuple(kwargs))
            if launch is not None:
                return launch(self, grid, warmup, args, kwargs)
        elif plan is False:
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)
        return _through_triton(self, grid, warmup, args, kwargs)

    def _tc_launch_failed(self, config: Any, args: Sequence[Any], kwargs: Mapping[str, Any], e: BaseException) -> bool:
        """The hit path's launch of ``config`` raised ``e``: ``nargs`` as Triton's run leaves it after a
        failed launch, then the stored-winner recovery as for Triton's path. True: launch again through
        Triton's run (the winner was marked failed); False: re-raise ``e``."""
        self.nargs = dict(zip(self.arg_names, args))
        return isinstance(e, Exception) and self._tc_blamed(config, args, kwargs, e)

    def _tc_learn(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """After a launch through Triton's run (``kwargs``: the call's, without grid and warmup): the
        launcher of its shape, and the launch keywords of the config Triton's run launched."""
        plan = self._tc_plan
        if plan is None:
            plan = plan_for(self)
            if plan is not None and self._tc_own_run:
                plan.attrs = self.__dict__  # kernel[grid] is served here unless a run is set on the instance
            plan = self._tc_plan = plan or False
        if not plan or len(self.configs) < 2:
            return
        plan.learn(args, kwargs)
        plan.bind(getattr(self, "best_config", None))


__all__ = [
    "MAX_BOUND",
    "MAX_SHAPES",
    "NO_DTYPE",
    "FastLaunch",
    "LaunchPlan",
    "binds_alike",
    "key_function",
    "key_source",
    "launcher_source",
    "plan_for",
    "torch_facts",
]
