"""The hit path is Triton's path, proven by difference (tunecache/tuner/fastpath.py, issue 43).

The same kernels are driven through Triton's own ``Autotuner.run`` (``TUNECACHE_FAST_LAUNCH=0``) and
through the hit path, over a generated space of call forms (hypothesis, derandomized, a fixed example
budget): positional and keyword mixes, keywords in any order, defaults left out, constexprs passed or
defaulted, ``None``, ints, bools, floats and numpy scalars, tensors of several dtypes,
``triton.heuristics`` (inside the autotuner and around it, with values the caller also passes),
pre-run hooks that read arguments by name (added before the first launch or after the first hit),
config ``pre_hook``s, a config that sets a constexpr a caller may pass, ``do_not_specialize``,
``.run(...)`` and ``[grid](...)``, the grid as a tuple and as a function, ``warmup=True``, names that
are no argument, a missing argument, and several call shapes in turn on one kernel.

Each call runs on both kernels, the same objects passed. For each call these must be identical: what
reaches ``JITFunction.run`` (each argument under its name, recorded at that seam), what the hooks see
(pre-run hooks: exactly their positional and keyword arguments; heuristics, config ``pre_hook``s and
the grid function: their dicts), the kernel's output, the return value or the exception (type and
message), and what the kernel is left with (``best_config``, ``nargs``, Triton's ``cache``).
Winners are deterministic (a benchmark's time is a function of the launched config and the call),
and the store is read-only (nothing one kernel writes reaches the other). Runs under
``TRITON_INTERPRET=1`` (conftest).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tunecache
from tunecache.tuner import fastpath


def _kern(
    x,
    y,
    out,
    N,
    alpha=1.0,
    bias=None,
    SCALE: tl.constexpr = 1,
    MODE: tl.constexpr = 0,
    BLOCK: tl.constexpr = 16,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    a = tl.load(x + offs, mask=m).to(tl.float32)
    b = tl.load(y + offs, mask=m).to(tl.float32)
    r = (a * alpha + b) * SCALE
    if bias is not None:
        r += tl.load(bias + offs, mask=m).to(tl.float32)
    if MODE == 1:
        r = -r
    tl.store(out + offs, r, mask=m)


SIG = inspect.signature(_kern)
PARAMS = tuple(SIG.parameters)
PASSABLE = PARAMS[:-1]  # BLOCK: every config sets it
REQUIRED = {n for n, p in SIG.parameters.items() if p.default is inspect.Parameter.empty}
SIZE = 40

TENSORS = {
    "x32": torch.arange(SIZE, dtype=torch.float32),
    "x16": torch.arange(SIZE, dtype=torch.float16),
    "xbf16": torch.arange(SIZE, dtype=torch.bfloat16),
    "y32": torch.full((SIZE,), 2.0),
    "y16": torch.full((SIZE,), 2.0, dtype=torch.float16),
    "yi32": torch.full((SIZE,), 2, dtype=torch.int32),
    "out": torch.empty(SIZE),
    "bias": torch.ones(SIZE),
}
NAMES = {id(t): name for name, t in TENSORS.items()}
OUT = TENSORS["out"]
#: The values each argument is drawn from, repeated for weight (numpy integers in ``N`` and float32 in
#: ``alpha`` fail in the interpreter: a failure both paths must raise alike; in ``MODE`` they run).
VALUES: dict[str, list[Any]] = {
    "x": [TENSORS["x32"], TENSORS["x32"], TENSORS["x16"], TENSORS["xbf16"]],
    "y": [TENSORS["y32"], TENSORS["y32"], TENSORS["y16"], TENSORS["yi32"]],
    "out": [OUT],
    "N": [SIZE, SIZE, SIZE, SIZE, 33, 33, True, np.int64(SIZE)],
    "alpha": [1.0, 1.0, 1.0, 2, 0.5, True, np.float64(0.5), np.float32(0.5)],
    "bias": [None, None, TENSORS["bias"]],
    "SCALE": [1, 2, True],
    "MODE": [0, 1, np.int32(1), np.bool_(False)],
}

#: The current side's observations (seam calls, hooks); None between calls.
REC: list | None = None


def observe(*what: Any) -> None:
    if REC is not None:
        REC.append(what)


def canon(v: Any) -> Any:
    """A value as compared: the caller's tensors by name (the very objects), other tensors (the
    interpreter's host copies) by dtype, shape and contents, scalars with their exact type."""
    if isinstance(v, torch.Tensor):
        name = NAMES.get(id(v))
        return ("tensor", name) if name else ("tensor", str(v.dtype), tuple(v.shape), tuple(v.tolist()))
    if isinstance(v, np.generic):
        return (type(v).__name__, v.item())
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(canon(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted(((k, canon(x)) for k, x in v.items()), key=repr)))
    if isinstance(v, triton.Config):
        return ("config", canon(v.all_kwargs()), v.pre_hook is not None)
    if isinstance(v, tl.tensor):  # the interpreter's converted arguments: their type only (host pointers)
        return ("tl.tensor", str(v.dtype))
    if callable(v):
        return ("callable", getattr(v, "__name__", type(v).__name__))
    return (type(v).__name__,)


def canon_call(args: tuple, kwargs: dict) -> Any:
    """A hook's call exactly: its positional arguments in order, its keyword arguments by name."""
    return tuple(canon(a) for a in args), canon(kwargs)


# ---- the hooks, heuristics, configs and grids the kernels are built with ----------------------------


def hook_records(*args: Any, **kwargs: Any) -> None:
    observe("pre-run hook", canon_call(args, kwargs))


def hook_by_name(*args: Any, **kwargs: Any) -> None:
    """A pre-run hook that reads arguments by name (KeyError where the call passed them by position)."""
    observe("pre-run hook by name", canon(kwargs["N"]), canon(kwargs.get("SCALE")), len(args))


def scale_heuristic(nargs: dict) -> int:
    observe("heuristic SCALE", canon(nargs))
    return 2


def mode_heuristic(nargs: dict) -> int:
    observe("heuristic MODE", canon(nargs))
    return 1


def config_pre_hook(nargs: dict) -> None:
    observe("config pre_hook", canon(nargs))


def grid_fn(meta: dict) -> tuple:
    observe("grid", canon(meta))
    return (triton.cdiv(SIZE, meta["BLOCK"]),)


GRIDS: dict[str, Any] = {"tuple": (3,), "function": grid_fn}

CONFIG_SETS = {
    "plain": [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((16, 1), (32, 2), (16, 2))],
    "one with a pre_hook": [
        triton.Config({"BLOCK": 16}, num_warps=1),
        triton.Config({"BLOCK": 32}, num_warps=2, pre_hook=config_pre_hook),
        triton.Config({"BLOCK": 16}, num_warps=2),
    ],
    "one sets SCALE": [
        triton.Config({"BLOCK": 16}, num_warps=1),
        triton.Config({"BLOCK": 32, "SCALE": 2}, num_warps=2),
        triton.Config({"BLOCK": 16}, num_warps=2),
    ],
    "one config": [triton.Config({"BLOCK": 32}, num_warps=2)],
}
KEYS = [("N",), ("N", "alpha"), ("N", "SCALE"), ("alpha", "MODE"), ("MODE", "bias")]
HAS_PRE_RUN_HOOKS = hasattr(triton.jit(_kern), "add_pre_run_hook")  # not in Triton 3.4's interpreter


def bench(kernel_call: Callable[[], Any], *args: Any, **kwargs: Any) -> list[float]:
    """A deterministic benchmark: one launch, timed by a function of what it passed (so both kernels
    pick the same winners, whatever the machine does)."""
    kernel_call()
    seam = next((o for o in reversed(REC or []) if o[0] == "seam"), None)
    t = 1.0 + zlib.crc32(repr(seam).encode()) % 97
    return [t, t, t]


# ---- the kernels and the calls ------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    key: tuple[str, ...]
    configs: str
    heuristics: str  # none | inside (autotune over heuristics) | around (heuristics over autotune)
    hook: str  # none | records | by name | added late
    do_not_specialize: tuple[str, ...]


@dataclass(frozen=True)
class Form:
    entry: str  # grid | run
    positional: tuple[str, ...]
    keywords: tuple[str, ...]  # in the call's order
    values: tuple[tuple[str, Any], ...]
    extra: tuple[tuple[str, Any], ...]  # keywords that are no argument
    grid: str
    warmup: bool | None  # None: a run call without warmup
    launch_keywords_first: bool  # run: grid and warmup before the other keywords

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            return NAMES.get(id(v)) or (f"np.{type(v).__name__}({v})" if isinstance(v, np.generic) else repr(v))

        values = dict(self.values)
        parts = [show(values[n]) for n in self.positional]
        parts += [f"{n}={show(values[n])}" for n in self.keywords] + [f"{n}={v!r}" for n, v in self.extra]
        launch = [f"grid={self.grid}"] + ([] if self.warmup is None else [f"warmup={self.warmup}"])
        if self.entry == "grid":
            return f"kernel[{self.grid}]({', '.join(parts)})"
        return f"kernel.run({', '.join(launch + parts if self.launch_keywords_first else parts + launch)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis's report: the call as written
        p.text(repr(self))

    def call(self, kernel: Any) -> Any:
        values = dict(self.values)
        args = [values[n] for n in self.positional]
        kwargs = {n: values[n] for n in self.keywords}
        kwargs.update(self.extra)
        grid = GRIDS[self.grid]
        if self.entry == "grid":
            return kernel[grid](*args, **kwargs)
        launch = {"grid": grid} if self.warmup is None else {"grid": grid, "warmup": self.warmup}
        if self.launch_keywords_first:
            return kernel.run(*args, **launch, **kwargs)
        return kernel.run(*args, **kwargs, **launch)


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    hooks = ["none", "records", "by name", "added late"] if HAS_PRE_RUN_HOOKS else ["none"]
    return Variant(
        key=draw(st.sampled_from(KEYS)),
        configs=draw(st.sampled_from(["plain", "one with a pre_hook", "one config", "one sets SCALE", "plain"])),
        heuristics=draw(st.sampled_from(["none", "none", "inside", "around"])),
        hook=draw(st.sampled_from(hooks)),
        do_not_specialize=draw(st.sampled_from([(), (), ("N",), ("alpha", "N")])),
    )


@st.composite
def forms(draw: st.DrawFn) -> Form:
    n = draw(st.integers(0, len(PASSABLE)))
    positional = PASSABLE[:n]
    rest = []
    if draw(st.booleans()):  # the next parameters, as fla launches (the hit path passes them by position)
        last_required = max((i + 1 for i, name in enumerate(PASSABLE[n:]) if name in REQUIRED), default=0)
        rest = list(PASSABLE[n : n + draw(st.integers(last_required, len(PASSABLE) - n))])
    else:
        for name in PASSABLE[n:]:
            # a required argument is left out now and then (both paths must fail it alike)
            if draw(st.sampled_from([True] * 19 + [False])) if name in REQUIRED else draw(st.booleans()):
                rest.append(name)
    keywords = tuple(draw(st.permutations(rest)))
    values = tuple((name, draw(st.sampled_from(VALUES[name]))) for name in (*positional, *keywords))
    entry = draw(st.sampled_from(["grid", "run"]))
    odd: list[tuple] = [(("foo", 1),), (("num_warps", 4),), (("BLOCK", 16),)]
    if entry == "grid":  # a launch keyword given to kernel[grid] as well
        odd.append((("warmup", True),))
    extra = draw(st.sampled_from([()] * 24 + odd))
    warmup = draw(st.sampled_from([False] * 5 + [True, True, None])) if entry == "run" else False
    return Form(
        entry=entry,
        positional=positional,
        keywords=keywords,
        values=values,
        extra=extra,
        grid=draw(st.sampled_from(sorted(GRIDS))),
        warmup=warmup,
        launch_keywords_first=draw(st.booleans()),
    )


class Seam:
    """Records every call that reaches the kernels' ``JITFunction.run`` (the interpreter's function
    here): each argument under its name, the other keywords (grid, warmup, launch options)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tuners: dict[int, Any] = {}  # id(jit function) -> its tuner, while watched
        self.hit = False  # the hit path launched during the current call
        self.passed = 0  # how many positional arguments the last launch got
        fn = triton.jit(_kern)
        if "run" not in fn.__dict__:  # a class's own run (3.6+): recorded there, so it stays Triton's own
            cls = type(fn)
            inner = cls.run
            seam = self

            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                seam.record(self, args, kwargs)
                return inner(self, *args, **kwargs)

            monkeypatch.setattr(cls, "run", run)

    def watch(self, jf: Any, tuner: Any) -> None:
        self.tuners[id(jf)] = tuner
        if "run" in jf.__dict__:  # Triton 3.4's interpreter sets run on the instance
            inner = jf.run

            def run(*args: Any, **kwargs: Any) -> Any:
                self.record(jf, args, kwargs)
                return inner(*args, **kwargs)

            jf.run = run

    def record(self, jf: Any, args: tuple, kwargs: dict) -> None:
        tuner = self.tuners.get(id(jf))
        if tuner is None or REC is None:
            return
        self.hit = self.hit or getattr(tuner, "nargs", None) is None  # Triton's run sets nargs before it launches
        self.passed = len(args)
        try:
            bound = SIG.bind(*args, **{k: v for k, v in kwargs.items() if k in SIG.parameters}).arguments
            named = canon(dict(bound))
        except TypeError as e:
            named = ("does not bind", str(e))
        observe("seam", named, canon({k: v for k, v in kwargs.items() if k not in SIG.parameters}))


@contextlib.contextmanager
def fast_launch(on: bool) -> Iterator[None]:
    before = os.environ.get("TUNECACHE_FAST_LAUNCH")
    os.environ["TUNECACHE_FAST_LAUNCH"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TUNECACHE_FAST_LAUNCH"]
        else:
            os.environ["TUNECACHE_FAST_LAUNCH"] = before


class Side:
    """One of the two kernels: built from a variant, driven through the hit path or Triton's run."""

    def __init__(self, variant: Variant, fast: bool, seam: Seam) -> None:
        self.fast, self.seam = fast, seam
        jf = triton.jit(_kern, do_not_specialize=list(variant.do_not_specialize))
        self.jf = jf
        if variant.hook in ("records", "by name"):
            jf.add_pre_run_hook(hook_records if variant.hook == "records" else hook_by_name)
        fn: Any = jf
        if variant.heuristics == "inside":
            fn = triton.heuristics({"SCALE": scale_heuristic})(jf)
        self.tuner = tunecache.autotune(configs=CONFIG_SETS[variant.configs], key=list(variant.key), do_bench=bench)(fn)
        self.kernel = self.tuner
        if variant.heuristics == "around":
            self.kernel = triton.heuristics({"MODE": mode_heuristic})(self.tuner)
        seam.watch(jf, self.tuner)

    def add_late_hook(self) -> None:
        self.jf.add_pre_run_hook(hook_records)

    def call(self, form: Form, tally: Counter) -> tuple:
        """Everything one call can be told apart by (and, counted in ``tally``, how the hit path served it)."""
        global REC
        REC = seen = []
        self.seam.hit = False
        OUT.zero_()
        try:
            with fast_launch(self.fast):
                ret = form.call(self.kernel)
            outcome: tuple = ("returned", type(ret).__name__)
        except Exception as e:  # noqa: BLE001 - compared, type and message
            outcome = ("raised", type(e).__name__, re.sub(r"0x[0-9a-f]+", "0x", str(e)))
        finally:
            REC = None
        if self.fast:
            tally["calls"] += 1
            tally["served"] += self.seam.hit
            tally["by position"] += self.seam.hit and self.seam.passed > len(form.positional)
        t = self.tuner
        cache = tuple(sorted(((canon(k), canon(c)) for k, c in t.cache.items()), key=repr))
        nargs = getattr(t, "nargs", "unset")  # unset: Triton's run never began
        left = (canon(getattr(t, "best_config", None)), canon(dict(nargs) if isinstance(nargs, dict) else nargs), cache)
        return tuple(seen), outcome, tuple(OUT.tolist()), left


def _differential(seam: Seam, tally: Counter, variant: Variant, calls: list[Form]) -> None:
    fast, slow = Side(variant, True, seam), Side(variant, False, seam)
    sequence = [c for c in calls for _ in range(3)] + calls  # each three times (a miss, hits), then in turn
    for i, form in enumerate(sequence):
        if i == 1 and variant.hook == "added late":  # after the first launch: the plan is built
            fast.add_late_hook(), slow.add_late_hook()
        by_triton = slow.call(form, Counter())
        by_hit_path = fast.call(form, tally)
        if by_hit_path != by_triton:
            parts = ("observed", "outcome", "output", "left")
            pairs = zip(parts, by_triton, by_hit_path)
            diff = [f"{p}: Triton's path {a!r}\n  hit path {b!r}" for p, a, b in pairs if a != b]
            pytest.fail(f"call {i} of {sequence} differs, kernel {variant}:\n" + "\n".join(diff))
    tally["examples"] += 1
    tally["call forms"] += len(calls)


#: Examples per run (``TUNECACHE_DIFFERENTIAL_EXAMPLES`` sets another): 200 on the newest Triton, about
#: 15 s of CPU on the 2-core CI machine; 100 on the older ones, which ``scripts/test`` runs after it.
NEWEST = triton.__version__.startswith("3.9")
EXAMPLES = int(os.environ.get("TUNECACHE_DIFFERENTIAL_EXAMPLES", "200" if NEWEST else "100"))


def test_the_hit_path_is_tritons_path_for_every_call_form(monkeypatch, request):
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")  # both kernels read one empty store, write none
    monkeypatch.setenv("TUNECACHE_PREFETCH", "0")
    seam = Seam(monkeypatch)
    tally: Counter = Counter()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(variant=variants(), calls=st.lists(forms(), min_size=1, max_size=3))
    def differential(variant: Variant, calls: list[Form]) -> None:
        _differential(seam, tally, variant, calls)

    differential()
    line = (
        f"differential hit path: {tally['examples']} examples, {tally['call forms']} call forms, {tally['calls']} calls"
        f" each way, {tally['served']} served by the hit path ({tally['by position']} by position)"
    )
    request.node.user_properties.append(("summary", line))
    assert tally["served"] >= tally["calls"] // 5, line  # the hit path was exercised, not only Triton's run
    if fastpath.binds_alike(triton.jit(_kern)):  # and keywords by position (not Triton 3.4's interpreter)
        assert tally["by position"] >= 10, line
