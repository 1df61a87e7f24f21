"""The hit path (tunecache/tuner/fastpath.py): a resolved key launched without Triton's run, with the
same arguments to ``JITFunction.run``, the same config, ``best_config`` and ``nargs`` as Triton's path;
and Triton's run for everything else.

Runs under TRITON_INTERPRET=1 (conftest). Which path a launch took is seen from inside the launch:
Triton's run sets ``nargs`` to the call's dict before it launches; the hit path leaves it ``None``.
"""

from __future__ import annotations

import inspect
import itertools
import types

import pytest
import torch
import triton
import triton.language as tl

import tunecache
from tunecache import buckets
from tunecache.tuner import autotuner as at
from tunecache.tuner import fastpath, measure

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32) for w in (1, 2)]
N = 40


def _axpy(x, y, out, N, alpha=1.0, SCALE: tl.constexpr = 1, BLOCK: tl.constexpr = 16):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    a = tl.load(x + offs, mask=m).to(tl.float32)
    b = tl.load(y + offs, mask=m).to(tl.float32)
    tl.store(out + offs, (a * alpha + b) * SCALE, mask=m)


def axpy(key=("N", "alpha"), configs=CONFIGS, **kw):
    """A fresh tunecache kernel over a fresh ``@triton.jit`` of ``_axpy`` (keys: ``N`` and the
    defaulted ``alpha``)."""
    return tunecache.autotune(configs=list(configs), key=list(key), **kw)(triton.jit(_axpy))


def grid(meta):
    return (triton.cdiv(N, meta["BLOCK"]),)


X32 = torch.arange(N, dtype=torch.float32)
Y32 = torch.full((N,), 2.0)
X16 = X32.to(torch.float16)
Y16 = Y32.to(torch.float16)
OUT = torch.empty(N)


class Spy:
    """Stands in for the kernel's ``fn.run``: records which path each launch took and what it passed."""

    def __init__(self, tuner, fail: bool = False) -> None:
        self.tuner, self.fail, self.calls = tuner, fail, []
        self.inner = tuner.fn.run
        tuner.fn.run = self

    def __call__(self, *args, **kwargs):
        path = "triton" if isinstance(self.tuner.nargs, dict) else "fast"
        self.calls.append((path, args, dict(kwargs)))
        if self.fail:
            raise RuntimeError("launch failed")
        return self.inner(*args, **kwargs)

    @property
    def last(self):
        return self.calls[-1]


def triton_key(tuner, args, kwargs):
    """The key Triton's ``Autotuner.run`` builds for a call (the same steps in 3.4-3.9)."""
    return at.TunecacheAutotuner._tuning_key(tuner, args, kwargs)


def same_call(a, b) -> bool:
    """Two launches passed the very same objects to ``JITFunction.run``."""
    return a[1:] and len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1])) and a[2] == b[2]


LAUNCHES = {
    "positional, defaults": lambda k: k[grid](X32, Y32, OUT, N),
    "keywords": lambda k: k[grid](x=X32, y=Y32, out=OUT, N=N, alpha=2.0),
    "keywords reordered, two dtypes": lambda k: k[grid](y=Y16, out=OUT, x=X32, N=N),
    "mixed, a defaulted constexpr": lambda k: k[grid](X16, Y32, out=OUT, N=N, SCALE=3),
    "run, as a library's super().run": lambda k: k.run(X32, Y16, OUT, N, 0.5, grid=grid, warmup=False),
}


@pytest.mark.parametrize("launch", list(LAUNCHES.values()), ids=list(LAUNCHES))
def test_a_hit_takes_the_fast_path_with_what_tritons_path_passes_and_sets(launch):
    k = axpy()
    spy = Spy(k)
    OUT.zero_()
    launch(k)  # a miss, benchmarked through Triton's run; the hit path learns the call's shape and winner
    want = OUT.clone()
    OUT.zero_()
    launch(k)
    by_fast, best, nargs = spy.last, k.best_config, k.nargs
    assert torch.equal(OUT, want)
    plan, k._tc_plan = k._tc_plan, False
    launch(k)  # the same hit through Triton's run
    by_triton = spy.last
    k._tc_plan = plan
    assert by_triton[0] == "triton" and by_fast[0] == "fast"
    assert same_call(by_triton, by_fast)  # the same arguments, the same winner's keywords
    assert k.best_config is best and k.nargs is None and nargs is None
    user_kwargs = {n: v for n, v in by_fast[2].items() if n in k.arg_names and n not in best.kwargs}
    assert k.best_config is k.cache[triton_key(k, by_fast[1], user_kwargs)]


def test_the_fast_path_looks_up_tritons_key_dtypes_in_keyword_order_and_skipped_defaults():
    """Every key a call makes is Triton's: which config runs is whatever Triton's cache holds for it."""
    k = axpy()
    spy = Spy(k)
    calls = [
        lambda: k[grid](X32, Y32, OUT, N),
        lambda: k[grid](X16, Y32, OUT, N),
        lambda: k[grid](y=Y16, x=X32, out=OUT, N=N),
        lambda: k[grid](x=X32, y=Y16, out=OUT, N=N),
        lambda: k[grid](X32, Y32, OUT, N, 2.0),
        lambda: k[grid](X32, Y32, OUT, N, alpha=2.0),
    ]
    for c in calls:  # resolve and learn each
        c(), c()
    keys = set(k.cache)
    assert len(keys) == 4, keys  # (N), 2 dtype orders x..., alpha passed: Triton's own keys
    for shift in range(len(CONFIGS)):  # give every key another config, several times over
        for i, key in enumerate(sorted(keys, key=str)):
            k.cache[key] = CONFIGS[(i + shift) % len(CONFIGS)]
        for c in calls:
            for _ in range(2):  # a config not launched by the hit path yet goes through Triton's run once
                c()
                path, args, kwargs = spy.last
                call_kwargs = {n: v for n, v in kwargs.items() if n in k.arg_names and n not in CONFIGS[0].kwargs}
                assert k.best_config is k.cache[triton_key(k, args, call_kwargs)]
                assert kwargs["BLOCK"] == k.best_config.kwargs["BLOCK"]
                assert kwargs["num_warps"] == k.best_config.num_warps
            assert path == "fast"


def test_a_bucketed_key_resolves_each_value_then_takes_the_fast_path(sqlite_url):
    k = axpy(key=("N",), bucket={"N": buckets.next_power_of_2}, store=sqlite_url)
    spy = Spy(k)
    paths = []
    for n in (33, 33, 33, 40, 40, 40):
        k[grid](X32, Y32, OUT, n)
        paths.append(spy.last[0])
        assert k.best_config is k.cache[(n, "torch.float32", "torch.float32", "torch.float32")]
    assert paths == ["triton", "fast", "fast", "triton", "fast", "fast"]
    assert tunecache.stats()["benchmarks"] == len(CONFIGS)  # 40 is 33's bucket: a store hit


def test_a_failed_fast_launch_leaves_nargs_and_best_config_as_tritons_run_does():
    k = axpy()
    for _ in range(2):
        k[grid](X32, Y32, OUT, N)
    best = k.best_config
    states = []
    for _ in range(2):
        spy = Spy(k, fail=True)
        with pytest.raises(RuntimeError, match="launch failed"):
            k[grid](X32, Y32, OUT, N)
        states.append((spy.last[0], k.best_config, dict(k.nargs)))
        k.fn.run = spy.inner
        k.__dict__["_tc_plan"] = False  # the second time through Triton's run
    (fast, b1, n1), (triton_path, b2, n2) = states
    assert fast == "fast" and triton_path == "triton"
    assert b1 is b2 is best
    assert n1.keys() == n2.keys() and all(n1[a] is n2[a] for a in n1)


HOOKED: list = []


def _prune(configs, nargs, **kw):
    return configs[:2]


FALLBACKS = {
    "pre_hook": dict(pre_hook=lambda kwargs, reset_only=False: None),
    "post_hook": dict(post_hook=lambda kwargs, exception: None),
    "reset_to_zero": dict(reset_to_zero=["out"]),
    "restore_value": dict(restore_value=["out"]),
    "early_config_prune": dict(prune_configs_by={"early_config_prune": _prune}),
    "config pre_hook": dict(
        configs=[triton.Config(c.kwargs, num_warps=c.num_warps, pre_hook=HOOKED.append) for c in CONFIGS]
    ),
    "one config": dict(configs=CONFIGS[:1]),
}


@pytest.mark.parametrize("kw", list(FALLBACKS.values()), ids=list(FALLBACKS))
def test_kernels_with_hooks_prune_or_one_config_always_take_tritons_run(kw):
    k = axpy(**kw)
    spy = Spy(k)
    for i in range(4):
        OUT.zero_()
        HOOKED.clear()
        k[grid](X32, Y32, OUT, N)
        assert torch.equal(OUT, X32 + Y32)
        assert spy.last[0] == "triton"
        if i:  # a hit: Triton calls the config's pre_hook once
            assert len(HOOKED) == (1 if k.best_config.pre_hook else 0)


def test_switched_off_a_miss_or_a_shrunk_config_list_take_tritons_run_a_capture_too_on_a_miss(monkeypatch):
    monkeypatch.setenv("TUNECACHE_FAST_LAUNCH", "0")
    off = axpy()
    spy = Spy(off)
    for _ in range(3):
        off[grid](X32, Y32, OUT, N)
    assert off._tc_plan is False and spy.last[0] == "triton"
    monkeypatch.delenv("TUNECACHE_FAST_LAUNCH")

    k = axpy()
    spy = Spy(k)
    for _ in range(3):
        k[grid](X32, Y32, OUT, N)
    assert spy.last[0] == "fast"
    with monkeypatch.context() as m:
        m.setattr(measure, "capturing", lambda: True)  # a CUDA graph capture in progress
        k[grid](X32, Y32, OUT, N)
        assert spy.last[0] == "fast"  # a hit: the winner launched once, as Triton's run launches it
        before = tunecache.stats()
        k[grid](X32, Y32, OUT, N - 2)  # a miss: tunecache's run, which never benchmarks in a capture
        after = tunecache.stats()
        assert spy.last[0] == "triton" and after["benchmarks"] == before["benchmarks"]
        assert after["capture_fallbacks"] == before["capture_fallbacks"] + 1
    k[grid](X32, Y32, OUT, N - 1)  # a miss
    assert spy.last[0] == "triton"
    k.configs = [CONFIGS[3]]  # a library's own lookup leaves one config (fla does): Triton launches it
    k[grid](X32, Y32, OUT, N)
    assert spy.last[0] == "triton" and k.best_config is CONFIGS[3]


def test_a_config_a_library_puts_in_the_cache_is_launched_then_bound():
    k = axpy()
    spy = Spy(k)
    for _ in range(3):
        k[grid](X32, Y32, OUT, N)
    mine = triton.Config({"BLOCK": 32}, num_warps=2)
    k.cache[(N, "torch.float32", "torch.float32", "torch.float32")] = mine
    paths = []
    for _ in range(2):
        k[grid](X32, Y32, OUT, N)
        paths.append(spy.last[0])
        assert k.best_config is mine and spy.last[2]["BLOCK"] == 32
    assert paths == ["triton", "fast"]  # Triton's run launched it first (the hit path had not bound it)


def test_a_library_subclass_with_its_own_run_still_runs_it_and_then_the_fast_path():
    """A library's Autotuner subclass (fla's CachedAutotuner, reduced in tests/libmod.py), adopted by
    install(): its own run is called at every launch and its super().run reaches the hit path."""
    import libmod

    tunecache.install()
    fn = triton.jit(_axpy)
    k = libmod.LibAutotuner(fn, fn.arg_names, CONFIGS, ["N"], None, None, do_bench=libmod.cpu_bench)
    assert isinstance(k, at.TunecacheAutotuner) and isinstance(k, libmod.LibAutotuner)
    spy = Spy(k)
    before, paths = len(libmod.LOOKUPS), []
    for _ in range(3):
        OUT.zero_()
        k[grid](X32, Y32, OUT, N)
        paths.append(spy.last[0])
        assert torch.equal(OUT, X32 + Y32)
    assert len(libmod.LOOKUPS) - before == 3  # its run, every launch
    assert paths == ["triton", "fast", "fast"]
    assert k.kernel_name == "_axpy"  # the library's own


def test_stacked_over_heuristics():
    k = tunecache.autotune(configs=CONFIGS, key=["N"])(triton.heuristics({"SCALE": lambda a: 2})(triton.jit(_axpy)))
    for _ in range(3):
        OUT.zero_()
        k[grid](X32, Y32, OUT, N)
        assert torch.equal(OUT, (X32 + Y32) * 2)
    assert k._tc_plan and k._tc_plan.shapes


class _WithDtype:
    def __init__(self, dtype):
        self.dtype = dtype


VALUES = [torch.zeros(1), torch.zeros(1, dtype=torch.float16), 3, None, 2.5, _WithDtype("fp8"), True, "s"]


def test_generated_key_functions_build_tritons_key_for_every_shape_and_value_type():
    """Against Triton's steps for every call shape of a 4-argument kernel: positional counts, keyword
    subsets in every order, names that are no argument (grid), values with and without a dtype,
    learnt from one set of types and called with others (the guarded quick branch and its fallback)."""
    names = ["a", "b", "c", "d"]
    fake = types.SimpleNamespace(arg_names=names, keys=["c", "a", "z"])  # z: no argument, skipped as by Triton
    checked = 0
    for n in range(5):
        rest = names[n:]
        for r in range(len(rest) + 1):
            for kws in itertools.permutations(rest, r):
                kwnames = ["grid", *kws]
                for learnt, used in ((0, 1), (1, 1), (2, 3)):
                    vals = [VALUES[(i * 3 + learnt) % len(VALUES)] for i in range(n + len(kwnames))]
                    call = [VALUES[(i * 5 + used) % len(VALUES)] for i in range(n + len(kwnames))]
                    fn = fastpath.key_function(fake.arg_names, fake.keys, n, kwnames, [type(v) for v in vals], "t")
                    for v in (vals, call):
                        args, kwargs = tuple(v[:n]), dict(zip(kwnames, v[n:]))
                        assert fn(args, kwargs) == triton_key(fake, args, kwargs), (n, kwnames, v)
                        checked += 1
    assert checked > 500
    assert fastpath.key_function(names, ["a"], 5, [], [], "t") is None  # more positional than names
    assert fastpath.key_function(names, ["a"], 2, ["b"], [], "t") is None  # b both ways


def test_run_without_grid_goes_to_tritons_run_as_made():
    """``run`` takes ``grid`` and ``warmup`` apart; a call missing one is no launch it serves: Triton's
    run gets it as made, and fails it as Triton does."""
    k = axpy()
    for _ in range(3):
        k.run(X32, Y32, OUT, N, grid=grid, warmup=False)
    spy = Spy(k)
    k.run(X32, Y32, OUT, N, grid=grid, warmup=False)
    assert spy.last[0] == "fast"
    with pytest.raises((TypeError, KeyError), match="grid"):  # as Triton (3.4 interpreted: KeyError)
        k.run(X32, Y32, OUT, N, warmup=False)
    assert spy.last[0] == "triton" and "grid" not in spy.last[2]


def test_shapes_sharing_names_or_counts_each_get_their_own_launcher():
    """A defaulted argument passed or not, with the same keyword names; all-keyword and mixed calls;
    the same call through kernel[grid] and run: each shape is told apart, and each hit launches the
    config Triton's cache holds for its own key."""
    k = axpy()
    spy = Spy(k)
    calls = [
        lambda: k[grid](X32, Y32, OUT, N, SCALE=1),
        lambda: k[grid](X32, Y32, OUT, N, 2.0, SCALE=1),
        lambda: k[grid](x=X32, y=Y16, out=OUT, N=N),
        lambda: k[grid](X32, y=Y16, out=OUT, N=N),
        lambda: k.run(X32, Y16, OUT, N, grid=grid, warmup=False),
    ]
    for c in calls:
        c(), c()
    assert set(k._tc_plan.shapes) == {(4, "SCALE"), (5, "SCALE"), ("x", "y", "out", "N"), (1, "y", "out", "N"), 4}
    for shift in range(len(CONFIGS)):
        for i, key in enumerate(sorted(k.cache, key=str)):
            k.cache[key] = CONFIGS[(i + shift) % len(CONFIGS)]
        for c in calls:
            c(), c()  # a config not bound yet: Triton's run once
            path, args, kwargs = spy.last
            user = {n: v for n, v in kwargs.items() if n in k.arg_names and n not in CONFIGS[0].kwargs}
            assert path == "fast" and k.best_config is k.cache[triton_key(k, args, user)]


class _Tuner:
    """What a launcher reads and sets on its kernel."""

    def __init__(self, config, fail=None):
        self.cache, self.configs, self.best_config, self.nargs = {}, [config, config], None, None
        self.fn = types.SimpleNamespace(run=self.launch)
        self.fail, self.launched, self.failed = fail, [], []

    def launch(self, *args, **kwargs):
        self.launched.append((args, kwargs))
        if self.fail:
            raise self.fail
        return "ran"

    def _tc_launch_failed(self, config, args, kwargs, e):
        self.failed.append((config, args, kwargs, e))
        return isinstance(e, RuntimeError)


def test_a_generated_launcher_hits_and_falls_back_to_tritons_run():
    """One launcher against a stand-in kernel: a hit launches with the bound keywords and sets what
    Triton sets; a miss, an unbound config, an unhashable key value, a value without a torch
    dtype where a tensor was learnt hand over to Triton's run; a failed launch to the recovery."""
    plan = fastpath.LaunchPlan(["x", "N", "BLOCK"], ["N"], "t")
    plan.ns["MISS"] = lambda self, grid, warmup, args, kwargs: ("miss", args, kwargs)
    plan.ns["BASE_RUN"] = lambda self, *args, **kwargs: ("base run", args, kwargs)
    plan.learn((X32,), {"N": N})
    launch = plan.shapes[(1, "N")]
    config = CONFIGS[1]
    t = _Tuner(config)
    assert launch(t, grid, False, (X32,), {"N": N})[0] == "miss"  # not in Triton's cache
    t.cache[(N, "torch.float32")] = config
    assert launch(t, grid, False, (X32,), {"N": N})[0] == "miss"  # not bound yet
    plan.bind(config)
    assert launch(t, grid, False, (X32,), {"N": N}) == "ran"
    assert t.launched[-1] == ((X32,), {"grid": grid, "warmup": False, "N": N, **config.all_kwargs()})
    assert t.best_config is config and t.nargs is None
    t.cache[(N, "torch.float16")] = config
    assert launch(t, grid, True, (X16,), {"N": N}) == "ran"  # another dtype, the same quick key
    assert t.launched[-1][1]["warmup"] is True
    t.cache[(N,)] = t.cache[(N, "fp8")] = config
    assert launch(t, grid, False, (None,), {"N": N}) == "ran"  # no dtype: the general key, Triton's
    assert launch(t, grid, False, (_WithDtype("fp8"),), {"N": N}) == "ran"  # not a torch dtype: the same
    assert launch(t, grid, False, (X32,), {"N": [N]})[0] == "miss"  # an unhashable key value
    t.fail = RuntimeError("launch failed")  # the recovery blames the winner: launched again by Triton's run
    assert launch(t, grid, False, (X32,), {"N": N}) == ("base run", (X32,), {"grid": grid, "warmup": False, "N": N})
    assert t.failed[-1][0] is config and t.failed[-1][2] == {"grid": grid, "warmup": False, "N": N}
    t.fail = ValueError("the call's own")  # not blamed: raised as Triton raises it
    with pytest.raises(ValueError, match="the call's own"):
        launch(t, grid, False, (X32,), {"N": N})


def test_plan_bounds_and_launcher_text():
    plan = fastpath.LaunchPlan(["x", "N"], ["N"], "t")
    for n in range(fastpath.MAX_SHAPES + 5):
        plan.learn((X32,), {f"extra{n}": 1})
    assert len(plan.shapes) == fastpath.MAX_SHAPES  # past the bound: Triton's run
    plan = fastpath.LaunchPlan(["x", "N"], ["N"], "t")
    plan.learn((X32, N, 3), {})
    assert 3 in plan.shapes and plan.shapes[3] is None  # more positional arguments than the kernel has
    src = fastpath.launcher_source(["x", "N"], ["N"], 1, ["N", "weird'name"], [True, False, False])
    assert "kwargs['N']" in src and "weird" not in src  # a keyword that is no argument is never written


@pytest.mark.parametrize(
    ("name", "by_position"),
    [("keywords", True), ("keywords reordered, two dtypes", True), ("mixed, a defaulted constexpr", False)],
)
def test_keywords_after_the_positional_arguments_reach_tritons_run_by_position(name, by_position, monkeypatch):
    """Triton's own ``run`` binds positional and keyword arguments alike: a hit whose keywords are the
    kernel's next parameters is handed to it positionally, in the kernel's order (a merged dict less
    per launch), bound to the very values Triton's path binds; a ``run`` of the instance's own (a
    library's wrapper, a spy) gets them as passed (the test above)."""
    k = axpy()
    if not fastpath.binds_alike(k.fn):  # Triton 3.4's interpreter sets run on the instance
        pytest.skip("this Triton's interpreted kernel has a run of its own")
    calls = []
    cls = type(k.fn)
    inner = cls.run

    def recording(self, *args, **kwargs):
        calls.append((args, dict(kwargs)))
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(cls, "run", recording)
    launch = LAUNCHES[name]
    OUT.zero_()
    launch(k)  # a miss through Triton's run
    want = OUT.clone()
    OUT.zero_()
    launch(k)
    fast = calls[-1]
    assert torch.equal(OUT, want)
    plan, k._tc_plan = k._tc_plan, False
    launch(k)  # the same hit through Triton's run
    slow = calls[-1]
    k._tc_plan = plan
    user = [n for n in slow[1] if n in k.arg_names and n not in k.best_config.kwargs]  # the call's keywords
    if by_position:  # the next parameters after the positional ones: all of them by position now
        assert len(fast[0]) == len(slow[0]) + len(user) and not any(n in fast[1] for n in user)
    else:  # a defaulted parameter left out before SCALE: as passed
        assert fast[0] == slow[0] and all(n in fast[1] for n in user)
    sig = inspect.signature(_axpy)

    def bound(call):
        params = {n: v for n, v in call[1].items() if n in sig.parameters}
        return sig.bind_partial(*call[0], **params).arguments

    want_args, got_args = bound(slow), bound(fast)
    assert list(want_args) == list(got_args) and all(want_args[n] is got_args[n] for n in want_args)
    rest = {n: v for n, v in fast[1].items() if n not in sig.parameters}
    assert rest == {n: v for n, v in slow[1].items() if n not in sig.parameters}  # grid, warmup, options


def test_kernel_grid_enters_the_first_shapes_launcher_and_hands_other_shapes_on():
    """``kernel[grid]`` returns the first call shape's entry, bound to the kernel and the grid (no
    dispatching frame between the call and the launch); a call of another shape, positional or by
    keyword, is handed to its own launcher and hits as well, with the config of its own key."""
    k = axpy()
    spy = Spy(k)
    first = lambda: k[grid](X32, Y16, OUT, N)  # noqa: E731
    others = [lambda: k[grid](X32, Y32, OUT, N, 2.0), lambda: k[grid](x=X32, y=Y16, out=OUT, N=N)]
    first(), first()
    plan = k._tc_plan
    entry = plan.entry
    assert entry is not fastpath._launch and k[grid].__func__ is entry
    assert spy.last[0] == "fast"
    for c in others:
        c(), c()
        path, args, kwargs = spy.last
        user = {n: v for n, v in kwargs.items() if n in k.arg_names and n not in CONFIGS[0].kwargs}
        assert path == "fast" and k.best_config is k.cache[triton_key(k, args, user)]
    assert k[grid].__func__ is entry and len(plan.shapes) == 3  # still the first shape's
    src = fastpath.launcher_source(["x", "N"], ["N"], 1, ["N", "weird'name"], [True, False, False], "T0_", entry=True)
    assert "T0_names" in src and "weird" not in src  # the keyword names are a global, not source text


def test_kernel_grid_follows_the_shape_it_keeps_handing_on():
    """A kernel first launched with one shape (a warm-up, say) and from then on with another: after
    FOLLOW_AFTER calls handed on, ``kernel[grid]`` enters the other shape's launcher; the first shape
    is then handed on, and both keep launching the config of their own key."""
    k = axpy()
    spy = Spy(k)
    warmup = lambda: k[grid](X32, Y32, OUT, N, 2.0)  # noqa: E731
    serve = lambda: k[grid](x=X32, y=Y16, out=OUT, N=N)  # noqa: E731
    warmup(), warmup()
    plan = k._tc_plan
    first = plan.entry
    for _ in range(fastpath.FOLLOW_AFTER + 1):  # the first serve goes through Triton's run (a miss)
        serve()
        assert spy.last[0] in ("fast", "triton")
    assert spy.last[0] == "fast" and k[grid].__func__ is not first
    assert k[grid].__func__ is plan.entries[("x", "y", "out", "N")] and plan.handed == {}
    for c in (warmup, serve, warmup):
        c()
        path, args, kwargs = spy.last
        user = {n: v for n, v in kwargs.items() if n in k.arg_names and n not in CONFIGS[0].kwargs}
        assert path == "fast" and k.best_config is k.cache[triton_key(k, args, user)]


def _each_way(monkeypatch, make, calls):
    """Run ``calls`` (functions of a kernel) on a kernel from ``make()`` through Triton's run
    (``TUNECACHE_FAST_LAUNCH=0``), then on another through the hit path: per path, what each call
    returned or raised (type and message) with OUT after it, and how many launches the hit path served
    (seen from inside ``JITFunction.run``, patched on its class so the kernel's run stays Triton's)."""
    served = []
    cls = type(triton.jit(_axpy))
    if "run" in vars(cls):
        inner = cls.run

        def recording(self, *args, **kwargs):
            served.append(kernel.nargs is None)  # Triton's run sets nargs before it launches
            return inner(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", recording)
    outcomes = []
    for fast in ("0", "1"):
        monkeypatch.setenv("TUNECACHE_FAST_LAUNCH", fast)
        kernel, seen = make(), []
        served.clear()
        for call in calls:
            OUT.zero_()
            try:
                outcome = ("returned", call(kernel))
            except Exception as e:  # noqa: BLE001 - compared
                outcome = ("raised", type(e).__name__, str(e))
            seen.append((outcome, OUT.tolist()))
        outcomes.append(seen)
    return outcomes[0], outcomes[1], sum(served)


@pytest.mark.parametrize("late", [False, True], ids=["added first", "added after the first launch"])
def test_a_pre_run_hook_reads_the_calls_keywords_by_name_on_a_hit_as_on_tritons_path(late, monkeypatch):
    """Issue 43: a hook added with ``add_pre_run_hook`` gets the launch's own positional and keyword
    arguments; on a hit it got keywords by position (KeyError on every hit)."""
    if not hasattr(triton.jit(_axpy), "add_pre_run_hook"):
        pytest.skip("Triton 3.4's interpreter has no pre-run hooks")
    seen = []

    def hook(*args, **kwargs):
        seen.append((len(args), kwargs["N"], sorted(kwargs)))

    def make():
        fn = triton.jit(_axpy)
        if not late:
            fn.add_pre_run_hook(hook)
        return tunecache.autotune(configs=CONFIGS, key=["N", "alpha"])(fn)

    def later(k):
        k.fn.add_pre_run_hook(hook)

    calls = [lambda k: k[grid](X32, Y32, OUT, N=N), lambda k: k[grid](x=X32, y=Y32, out=OUT, N=N, alpha=2.0)] * 3
    if late:
        calls.insert(2, later)
    triton_path, hit_path, served = _each_way(monkeypatch, make, calls)
    assert hit_path == triton_path
    assert all(o[0][0] == "returned" for o in hit_path), hit_path
    assert served >= 3 and len(seen) >= 2 * served  # hits, with the hook on both paths


def test_a_heuristic_wins_over_the_value_the_caller_passes_on_a_hit_as_on_tritons_path(monkeypatch):
    """Issue 43: ``triton.heuristics`` under the autotuner sets its value over the caller's; on a hit
    the caller's value went by position and the heuristic's by name (TypeError on every hit)."""

    def make():
        fn = triton.heuristics({"SCALE": lambda a: 2})(triton.jit(_axpy))
        return tunecache.autotune(configs=CONFIGS, key=["N"])(fn)

    calls = [lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0, SCALE=3), lambda k: k[grid](X32, Y32, OUT, N, SCALE=3)] * 3
    triton_path, hit_path, served = _each_way(monkeypatch, make, calls)
    assert hit_path == triton_path
    want = ((X32 + Y32) * 2).tolist()
    assert all(o == (("returned", None), want) for o in hit_path), hit_path
    assert served >= 3 or "run" not in vars(type(triton.jit(_axpy)))


def test_a_miss_whose_launch_fails_is_launched_once_as_by_tritons_run():
    """A miss goes to Triton's run; when its launch raised, the hit path called Triton's run a
    second time (found by tests/test_hitpath_differential.py): the kernel ran twice."""
    k = axpy()
    k[grid](X32, Y32, OUT, N), k[grid](X32, Y32, OUT, N)  # the call shape's launcher is learnt
    spy = Spy(k, fail=True)
    with pytest.raises(RuntimeError, match="launch failed"):
        k[grid](X32, Y32, OUT, N - 1)  # a miss: every config benchmarked (each fails), one launch
    assert [c[0] for c in spy.calls] == ["triton"] * (len(CONFIGS) + 1)


def test_a_keyword_a_config_also_sets_fails_on_a_hit_as_on_tritons_path(monkeypatch):
    """A config that sets a constexpr the caller passes as well: Triton's run fails the launch
    (``got multiple values for keyword argument``); the hit path must fail it alike, not bind the
    caller's value by position and fail it otherwise."""
    configs = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32, "SCALE": 2}, num_warps=2)]
    key = (N, "torch.float32", "torch.float32", "torch.float32")

    def make():
        return axpy(key=("N",), configs=configs)

    def prefer(k):  # a library's own choice (or another process's): the config that sets SCALE
        k.cache[key] = configs[1]

    calls = [
        lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0, SCALE=3),
        lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0, SCALE=3),
        prefer,
        lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0),  # launched by Triton's run, then bound
        lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0),
        lambda k: k[grid](X32, Y32, OUT, N, alpha=1.0, SCALE=3),
    ]
    triton_path, hit_path, _ = _each_way(monkeypatch, make, calls)
    assert hit_path == triton_path
    assert triton_path[-1][0][:2] == ("raised", "TypeError")


def test_a_launch_keyword_given_to_kernel_grid_fails_as_by_tritons_launcher(monkeypatch):
    """``kernel[grid](..., warmup=True)`` gives a launch keyword twice: Triton's launcher fails it
    (``run() got multiple values for keyword argument``); the hit path's entry handed it to Triton's
    run, which failed it under another name (found by tests/test_hitpath_differential.py)."""
    calls = [lambda k: k[grid](X32, Y32, OUT, N)] * 2 + [lambda k: k[grid](X32, Y32, OUT, N, warmup=True)] * 2
    calls += [lambda k: k[grid](X32, Y32, OUT, N=N, grid=grid)]
    triton_path, hit_path, _ = _each_way(monkeypatch, axpy, calls)
    assert hit_path == triton_path
    assert all(o[0][:2] == ("raised", "TypeError") for o in triton_path[2:])


def test_keywords_go_by_position_only_where_nothing_can_tell():
    """The launcher's positional launch is generated only for the kernel's next parameters, none of
    them a keyword ``JITFunction.run`` sets itself, and taken only while the kernel has no pre-run
    hooks; a ``Heuristics`` or a ``run`` of the instance's own gets keywords as passed."""
    by_position = fastpath.launcher_source(["x", "N", "BLOCK"], ["N"], 1, ["N"], [True, False], positional=True)
    assert "if HOOKS:" in by_position and "self.fn.run(a0, w0," in by_position and "TBOUND" in by_position
    for names, kwnames in ((["x", "debug", "BLOCK"], ["debug"]), (["x", "N", "M"], ["M"])):  # run sets it; a gap
        src = fastpath.launcher_source(names, [], 1, kwnames, [True, False], positional=True)
        assert "HOOKS" not in src and "**kwargs, **bound)" in src
    fn = triton.jit(_axpy)
    assert fastpath.binds_alike(fn) == ("run" not in vars(fn))  # Triton 3.4's interpreter: a run of its own
    assert not fastpath.binds_alike(triton.heuristics({"SCALE": lambda a: 2})(fn))
