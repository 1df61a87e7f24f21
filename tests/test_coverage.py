"""Every Triton Autotuner of a process, with no code change (issue 14): libraries' own Autotuner
subclasses, Autotuners constructed directly, ``from triton import autotune`` bound before
``install()``, a process started with only ``TUNECACHE_INSTALL=1``, and its spawned children.

Fresh processes are restarts against one store; benchmarks are counted by autotuner class by
wrapping Triton's own ``Autotuner._bench`` (tests/libmod.py), so a benchmark tunecache does not see
is counted too. Runs under TRITON_INTERPRET=1 (conftest).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import site
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from processes import run_json, run_json_stderr
from triton.runtime.autotuner import Autotuner

import tunecache
from tunecache.tuner import autotuner as at

HERE = Path(__file__).parent

N_KERNELS = (
    3  # tests/libmod.py: lib_kernel (LibAutotuner), direct (Autotuner(...)), plain (from triton import autotune)
)

CHILD = """
    import json, os, sys
    how = sys.argv[1]
    if how == "install-first":
        import tunecache
        tunecache.install()
    import libmod  # builds its autotuners at import; binds `from triton import autotune`
    if how == "install-after-import":
        import tunecache
        tunecache.install()
    counts = libmod.count_benchmarks()
    ok = libmod.run_all(int(os.environ.get("N", "100")))
    out = {"benched": counts, "ok": ok, "tunecache": "tunecache" in sys.modules, "spawned": None}
    if os.environ.get("SPAWN"):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=libmod.spawned, args=(q, 77))
        p.start()
        out["spawned"] = q.get(timeout=300)
        p.join()
    if "tunecache" in sys.modules:
        import tunecache
        tunecache.flush()
    print(json.dumps(out))
"""


def _pth_installed() -> bool:
    dirs = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    return any((Path(d) / "tunecache-install.pth").exists() for d in dirs)


def child(how: str, env: dict) -> dict:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return run_json(["-c", textwrap.dedent(CHILD), how], {"PYTHONPATH": path, **env})


def _total(benched: dict) -> int:
    return sum(benched.values())


@pytest.mark.parametrize("how", ["install-first", "install-after-import", "TUNECACHE_INSTALL=1"])
def test_every_autotuner_restarts_with_zero_benchmarks(how, sqlite_url):
    """Stock Triton benchmarks every config of every kernel at every start; with tunecache, a
    library's subclass, a direct Autotuner and ``from triton import autotune`` are all served."""
    if how == "TUNECACHE_INSTALL=1":
        assert _pth_installed(), "tunecache-install.pth is not in site-packages: reinstall (pip install -e .)"
    env = {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1" if how.startswith("TUNECACHE") else ""}
    stock = child("stock", {**env, "TUNECACHE_INSTALL": ""})
    assert stock["ok"] and not stock["tunecache"]
    assert stock["benched"] == {"LibAutotuner": len(libmod().CONFIGS), "Autotuner": 2 * len(libmod().CONFIGS)}
    first = child(how, env)
    assert first["ok"] and first["tunecache"]
    assert _total(first["benched"]) == N_KERNELS * len(libmod().CONFIGS)
    assert all(name.endswith("+tunecache") for name in first["benched"]), first["benched"]
    assert "LibAutotuner+tunecache" in first["benched"]
    restart = child(how, env)
    assert restart["ok"] and restart["benched"] == {}, restart["benched"]
    again = child(
        "stock", {**env, "TUNECACHE_INSTALL": ""}
    )  # the stock path still benchmarks: nothing of tunecache leaks into it
    assert again["benched"] == stock["benched"]


def test_a_spawned_child_is_covered_by_the_environment_alone(sqlite_url):
    assert _pth_installed(), "tunecache-install.pth is not in site-packages: reinstall (pip install -e .)"
    env = {"TUNECACHE_URL": sqlite_url, "TUNECACHE_INSTALL": "1", "SPAWN": "1"}
    first = child("TUNECACHE_INSTALL=1", env)
    sp = first["spawned"]
    assert sp["ok"] and sp["tunecache"], sp  # it imported tunecache only through the .pth hook
    assert _total(sp["benched"]) == N_KERNELS * len(libmod().CONFIGS)  # a key of its own (N=77)
    assert all(name.endswith("+tunecache") for name in sp["benched"]), sp["benched"]
    second = child("TUNECACHE_INSTALL=1", env)
    assert second["benched"] == {} and second["spawned"]["benched"] == {} and second["spawned"]["ok"]


def test_the_startup_hook_imports_nothing_until_triton_and_honours_zero():
    probe = (
        "import sys, json; before = sorted(set(sys.modules) & {'triton', 'torch', 'tunecache'}); "
        "import triton.runtime.autotuner as a; "
        "print(json.dumps([before, hasattr(a.Autotuner.__init__, '__wrapped__'), 'tunecache' in sys.modules]))"
    )
    fresh = {"TUNECACHE_TEST_FRESH": "1"}  # what a new interpreter imports is the point: never the warm pool's
    assert run_json(["-c", probe], {**fresh, "TUNECACHE_INSTALL": ""}) == [[], False, False]
    assert run_json(["-c", probe], {**fresh, "TUNECACHE_INSTALL": "1"}) == [[], True, True]
    assert run_json(["-c", probe], {**fresh, "TUNECACHE_INSTALL": "0"}) == [[], False, True]  # parsed, not installed


def test_the_startup_hook_survives_a_find_spec_probe_before_the_import():
    """Libraries probe for Triton with ``importlib.util.find_spec("triton")`` (torch's logging does so
    for every module named in TORCH_LOGS) before importing it: the probe must not use up the hook, or
    the real import later installs nothing (seen on the H200: TORCH_LOGS naming
    torch._inductor.remote_cache left torch.compile without tunecache)."""
    probe = (
        "import importlib.util, sys, json; "
        "assert importlib.util.find_spec('triton') is not None; "
        "assert importlib.util.find_spec('triton') is not None; "
        "import triton.runtime.autotuner as a; "
        "print(json.dumps([hasattr(a.Autotuner.__init__, '__wrapped__'), 'tunecache' in sys.modules]))"
    )
    assert run_json(["-c", probe], {"TUNECACHE_INSTALL": "1"}) == [True, True]


def hooked(code: str, env: dict) -> tuple[dict, str]:
    """Run ``code`` (which prints one JSON line last) in a new process with the start-up hook on
    (unless ``env`` sets ``TUNECACHE_INSTALL`` otherwise); returns that JSON and the process's stderr
    (it must exit 0). A hook asked for (any value but "") makes it a fresh interpreter (the warm
    pool's rule, tests/warmpool.py); with ``TUNECACHE_INSTALL=""`` it is forked warm, as unset."""
    assert _pth_installed(), "tunecache-install.pth is not in site-packages: reinstall (pip install -e .)"
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return run_json_stderr(["-c", textwrap.dedent(code)], {"PYTHONPATH": path, "TUNECACHE_INSTALL": "1", **env})


COVERED = """
    import json
    {first}
    import libmod
    print(json.dumps({{n: [c.__name__ for c in type(k).__mro__] for n, k in libmod.KERNELS.items()}}))
"""


@pytest.mark.parametrize(
    "first",
    [
        "import tunecache",
        "import triton",
        "from tunecache import autotune",  # tunecache.tuner.decorator imports triton: the hook ran inside it
        "import tunecache.tuner.autotuner",
        "import tunecache.tuner.adoption",
        "from tunecache.tuner.decorator import install",
        "import libmod",  # a library that imports triton.autotune
    ],
)
def test_the_startup_hook_installs_whatever_imports_triton_first(first, sqlite_url):
    """The hook runs inside whichever import reaches Triton first, possibly a half-imported tunecache
    module; every order still installs, silently."""
    mros, err = hooked(COVERED.format(first=first), {"TUNECACHE_URL": sqlite_url})
    assert all("TunecacheAutotuner" in mro for mro in mros.values()), mros
    assert mros["lib_kernel"][0] == "LibAutotuner" and "tunecache" not in err, err


STOCK_RUN = """
    import json, os
    import libmod  # a library's autotuners, built at its import
    counts, ok = libmod.count_benchmarks(), True
    if os.environ.get("LIBRARY"):
        ok = libmod.run_all(8)
    import tinykernels  # the program's own @tunecache.autotune kernel (stock Triton's timer needs a GPU)
    add = tinykernels.make_add(configs=tinykernels.CONFIGS[:2], do_bench=libmod.cpu_bench)
    tinykernels.launch(add, 8)
    print(json.dumps({"ok": ok, "benched": counts, "add": [c.__name__ for c in type(add).__mro__]}))
"""


@pytest.mark.parametrize(
    "variable, value, accepted, hook",
    [
        ("TUNECACHE_MODE", "read-only", "readwrite, readonly, offline, strict, off", "1"),
        ("TUNECACHE_INSTALL", "yes please", "1, true, on, yes, 0, false, off, no", "yes please"),
        ("TUNECACHE_MODE", "bogus", "readwrite, readonly, offline, strict, off", ""),  # no hook: in-process only
    ],
)
def test_a_bad_setting_leaves_triton_stock_with_one_warning(variable, value, accepted, hook, sqlite_url):
    """A typo in a tunecache variable must not break a library's import or its kernels, nor the
    program's own tunecache kernels: tunecache is off (Triton runs stock) and says so once."""
    env = {"TUNECACHE_URL": sqlite_url, variable: value, "TUNECACHE_INSTALL": hook, "LIBRARY": "1" if hook else ""}
    out, err = hooked(STOCK_RUN, env)
    assert "Traceback" not in err, err
    assert out["ok"] and "TunecacheAutotuner" not in out["add"], out
    stock = {"LibAutotuner": len(libmod().CONFIGS), "Autotuner": 2 * len(libmod().CONFIGS)} if hook else {}
    assert out["benched"] == {**stock, "Autotuner": stock.get("Autotuner", 0) + 2}, out  # every kernel: Triton's
    said = [line for line in err.splitlines() if variable in line]
    assert len(said) == 1 and f"{variable}={value!r}" in said[0] and accepted in said[0], err


# ---- in process ---------------------------------------------------------------------------------


def libmod():
    import libmod as m

    return m


def fresh_libmod():
    """A new import of tests/libmod.py: new autotuners, built under whatever is installed now."""
    sys.modules.pop("libmod", None)
    return importlib.import_module("libmod")


def test_uninstall_puts_triton_back_exactly(sqlite_url):
    before = dict(vars(Autotuner))
    tunecache.install()
    assert vars(Autotuner)["__init__"] is not before["__init__"] and vars(Autotuner)["run"] is not before["run"]
    m = fresh_libmod()
    assert isinstance(m.lib_kernel, at.TunecacheAutotuner) and isinstance(m.lib_kernel, m.LibAutotuner)
    assert type(m.lib_kernel).__name__ == "LibAutotuner" and m.lib_kernel.kernel_name == "lib_kernel"  # theirs
    assert type(m.direct) is at.TunecacheAutotuner and type(m.plain) is at.TunecacheAutotuner
    assert m.run_all(40)
    benched = tunecache.stats()["benchmarks"]
    assert benched == N_KERNELS * len(m.CONFIGS)
    restarted = fresh_libmod()  # its keys come from the store: configs_timings built when read
    assert restarted.run_all(40) and tunecache.stats()["benchmarks"] == benched
    tunecache.uninstall()
    assert type(restarted.lib_kernel) is restarted.LibAutotuner
    for k in restarted.KERNELS.values():  # still readable under Triton's class, from the store
        assert len(k.configs_timings) == len(m.CONFIGS) and "configs_timings" in vars(k)
    assert dict(vars(Autotuner)) == before  # the very same objects
    assert type(m.lib_kernel) is m.LibAutotuner and type(m.direct) is Autotuner and type(m.plain) is Autotuner
    assert all(k.cache_results is False for k in m.KERNELS.values())
    counts = m.count_benchmarks()
    try:
        for k in m.KERNELS.values():
            k.cache.clear()
        assert m.run_all(40)
    finally:
        Autotuner._bench = before["_bench"]
    assert counts == {"LibAutotuner": len(m.CONFIGS), "Autotuner": 2 * len(m.CONFIGS)}  # the stock path again
    assert tunecache.stats()["benchmarks"] == benched
    m2 = fresh_libmod()
    assert type(m2.plain) is Autotuner and type(m2.lib_kernel) is m2.LibAutotuner  # built after: stock


def test_an_autotuner_built_before_install_is_adopted_at_its_next_launch(sqlite_url):
    m = fresh_libmod()
    assert type(m.lib_kernel) is m.LibAutotuner
    tunecache.install()
    assert m.run_all(50)
    assert isinstance(m.lib_kernel, at.TunecacheAutotuner) and type(m.direct) is at.TunecacheAutotuner
    assert tunecache.stats()["benchmarks"] == N_KERNELS * len(m.CONFIGS)
    cov = tunecache.coverage()
    assert {n.rsplit(".", 1)[1] for n, c in cov.items() if c["covered"]} >= {"lib_kernel", "_twice", "plain"}


def test_a_library_json_lookup_still_decides_first(sqlite_url, tmp_path, monkeypatch):
    """fla's own JSON config lookup puts its config in ``cache`` before ``super().run``: it still wins,
    and nothing is benchmarked for it."""
    path = tmp_path / "lib.json"
    path.write_text(json.dumps({"lib_kernel": {"kwargs": {"BLOCK": 32}, "num_warps": 2}}))
    monkeypatch.setenv("LIB_CONFIGS", str(path))
    tunecache.install()
    m = fresh_libmod()
    assert m.run_all(60)
    assert m.lib_kernel.best_config.kwargs == {"BLOCK": 32} and m.lib_kernel.best_config.num_warps == 2
    assert tunecache.stats()["benchmarks"] == 2 * len(m.CONFIGS)  # direct and plain only


def test_a_subclass_that_never_reaches_autotuner_run_is_reported_once(sqlite_url, caplog, monkeypatch):
    from click.testing import CliRunner

    from tunecache.cli import main

    monkeypatch.setenv("TUNECACHE_URL", sqlite_url)

    class Rogue(Autotuner):
        def run(self, *args, **kwargs):  # its own choice, never Autotuner.run
            self.best_config = self.configs[-1]
            return self.fn.run(*args, **kwargs, **self.configs[-1].all_kwargs())

    @triton.jit
    def rogue_fn(x, out, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < N) - 1.0, mask=offs < N)

    tunecache.install()
    m = fresh_libmod()
    rogue = Rogue(rogue_fn, rogue_fn.arg_names, m.CONFIGS, ["N"], None, None, do_bench=m.cpu_bench)
    x, out = torch.arange(30.0), torch.empty(30)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for _ in range(3):
            rogue[lambda meta: (triton.cdiv(30, meta["BLOCK"]),)](x, out, 30)
            assert torch.equal(out, x - 1)  # its behaviour is its own, unchanged
    m.run_all(30)
    said = [r.getMessage() for r in caplog.records if "not served by tunecache" in r.getMessage()]
    assert len(said) == 1 and "rogue_fn" in said[0] and "Rogue.run returned without calling Autotuner.run" in said[0]
    cov = tunecache.coverage()
    name = next(n for n in cov if n.endswith("rogue_fn"))
    assert cov[name]["covered"] is False and "Rogue" in cov[name]["class"]
    assert tunecache.stats()["kernels_seen"] == N_KERNELS + 1 and tunecache.stats()["kernels_covered"] == N_KERNELS
    from tunecache.tuner import background

    background.submit(lambda: None).result(timeout=60)  # the uncovered key's record is written there
    tunecache.flush()
    r = CliRunner().invoke(main, ["--url", sqlite_url, "stats", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["kernel"]: row for row in json.loads(r.output)}
    assert rows[name]["covered"] is False and rows[name]["benchmarks"] == 0
    assert all(row["covered"] for k, row in rows.items() if k != name) and len(rows) == N_KERNELS + 1
    r = CliRunner().invoke(main, ["--url", sqlite_url, "stats"])
    assert "kernels seen: 4, covered by tunecache: 3" in r.output and "rogue_fn" in r.output
    r = CliRunner().invoke(main, ["--url", sqlite_url, "misses", "--json"])
    assert [(x["kernel"], x["reason"], x["key"][0]) for x in json.loads(r.output)] == [(name, "uncovered", ["N", 30])]


# ---- every documented Autotuner behaviour, stock vs installed on a cold store ----------------------


@triton.jit
def inc(x, acc, cnt, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    msk = offs < N
    tl.store(acc + offs, tl.load(acc + offs, mask=msk) + tl.load(x + offs, mask=msk), mask=msk)
    tl.store(cnt + offs, tl.load(cnt + offs, mask=msk) + 1.0, mask=msk)


# One kernel per autotuner (each its own source: one store problem each).
@triton.jit
def inc_hooked(x, acc, cnt, N, BLOCK: tl.constexpr):
    inc(x, acc, cnt, N, BLOCK)


@triton.jit
def inc_restored(x, acc, cnt, N, BLOCK: tl.constexpr):
    inc(x, acc, cnt, N, BLOCK)


@triton.jit
def inc_pruned(x, acc, cnt, N, BLOCK: tl.constexpr):
    inc(x, acc, cnt, N, BLOCK)


@triton.jit
def inc_graphed(x, acc, cnt, N, BLOCK: tl.constexpr):
    inc(x, acc, cnt, N, BLOCK)


def picky(jit):
    """A config too big for the "GPU" raises OutOfResources at launch, as on a real one."""
    from triton.runtime.errors import OutOfResources

    real_run = jit.run

    def run(*args, **kwargs):
        if kwargs.get("BLOCK") == 64:
            raise OutOfResources(300000, 232448, "shared memory")
        return real_run(*args, **kwargs)

    jit.run = run
    return jit


for _k in (inc_hooked, inc_restored, inc_pruned, inc_graphed):
    picky(_k)


def _observe(install: bool, monkeypatch) -> dict:
    """Build kernels using each documented Autotuner feature, launch them, and return what the
    features did (not which config won: timings differ between runs)."""
    base_bench = Autotuner.__dict__["_bench"]
    seen: dict[str, list] = {"hooks": [], "pruned": [], "do_bench": [], "cudagraph": [], "perf_model": []}
    graphs = []

    def fake_cudagraph(kernel_call, rep=None, quantiles=None, **kw):  # no CUDA here: a CPU stand-in
        graphs.append(rep)
        kernel_call()
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_cudagraph)
    if install:
        tunecache.install()
    m = libmod()
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]

    def bench(call, quantiles):
        seen["do_bench"].append(1)
        return m.cpu_bench(call, quantiles)

    def pre(nargs, reset_only=False):
        # reset_only: after the benchmark, with the winner's config (which timing noise decides)
        seen["hooks"].append(("reset",) if reset_only else ("pre", nargs["BLOCK"], nargs["num_warps"]))

    def post(nargs, exception):
        seen["hooks"].append(("post", nargs["BLOCK"], type(exception).__name__ if exception else None))

    hooked = Autotuner(
        inc_hooked, inc.arg_names, configs, ["N"], None, None, pre_hook=pre, post_hook=post, do_bench=bench
    )
    restored = Autotuner(inc_restored, inc.arg_names, configs, ["N"], ["cnt"], ["acc"], do_bench=m.cpu_bench)

    def early(cfgs, nargs, **kw):
        seen["pruned"].append(sorted((c.kwargs["BLOCK"], c.num_warps) for c in cfgs))
        return [c for c in cfgs if c.kwargs["BLOCK"] != 16]

    def perf_model(**kw):
        seen["perf_model"].append((kw["BLOCK"], kw["num_warps"]))
        return (0 if kw["BLOCK"] == 32 else 100) + kw["num_warps"]  # the two BLOCK=32 configs

    pruned = Autotuner(
        inc_pruned,
        inc.arg_names,
        configs,
        ["N"],
        ["cnt"],
        ["acc"],
        prune_configs_by={"early_config_prune": early, "perf_model": perf_model, "top_k": 2},
        do_bench=m.cpu_bench,
    )
    with pytest.warns(DeprecationWarning):
        graphed = Autotuner(
            inc_graphed, inc.arg_names, configs[:4], ["N"], ["cnt"], ["acc"], use_cuda_graph=True, rep=7
        )
    n = 40
    x = torch.arange(n, dtype=torch.float32)
    results = {}
    for name, k in (("hooked", hooked), ("restored", restored), ("pruned", pruned), ("graphed", graphed)):
        acc, cnt = torch.full((n,), 10.0), torch.full((n,), 5.0)
        benched = m.count_benchmarks()
        try:
            k[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, acc, cnt, n)
        finally:
            Autotuner._bench = base_bench
        results[name] = {
            "acc_ok": torch.equal(acc, torch.full((n,), 10.0) + x),
            "cnt": cnt.unique().tolist(),
            "best_block": None if name != "pruned" else k.best_config.kwargs["BLOCK"],
            "tunecache": isinstance(k, at.TunecacheAutotuner),
            "benched": sum(benched.values()),
        }
    results["graphs"] = graphs
    results["seen"] = seen
    if install:
        tunecache.uninstall()
    return results


def test_every_documented_autotuner_behaviour_stays_as_triton_defines_it(sqlite_url, monkeypatch):
    base_bench = Autotuner.__dict__["_bench"]
    try:
        stock = _observe(False, monkeypatch)
        installed = _observe(True, monkeypatch)
    finally:
        Autotuner._bench = base_bench
    assert not any(r["tunecache"] for k, r in stock.items() if isinstance(r, dict) and "tunecache" in r)
    assert all(installed[k]["tunecache"] for k in ("hooked", "restored", "pruned", "graphed"))
    for k in ("hooked", "restored", "pruned", "graphed", "graphs", "seen"):
        if isinstance(stock[k], dict):
            stock[k].pop("tunecache", None)
            installed[k].pop("tunecache", None)
        assert installed[k] == stock[k], k
    # and they did what Triton documents (so the comparison is not between two broken runs):
    hooks = stock["seen"]["hooks"]
    assert ("post", 64, "OutOfResources") in hooks and ("post", 16, None) in hooks and hooks[-1] == ("reset",)
    assert stock["restored"] == {"acc_ok": True, "cnt": [1.0], "best_block": None, "benched": 6}
    assert stock["pruned"]["best_block"] == 32 and stock["pruned"]["benched"] == 2  # early prune, then top 2
    assert stock["graphs"] == [7] * 4 and stock["graphed"]["benched"] == 4


def test_install_refuses_a_library_class_that_defines_any_name_tunecache_adds(sqlite_url):
    """A library's class that defines a name of tunecache's own would shadow tunecache's hooks or
    state once adopted: refused, for every such name. The names are read from a real instance and
    the class, not from a list, so a method or attribute added to the autotuner is covered at once;
    Triton's own hooks stay the library's to override (fla overrides ``run``)."""
    from tunecache.tuner import adoption

    m = fresh_libmod()
    ours = at.TunecacheAutotuner(inc, inc.arg_names, m.CONFIGS, ["N"], None, None, do_bench=m.cpu_bench)
    plain = Autotuner(inc, inc.arg_names, m.CONFIGS, ["N"], None, None, do_bench=m.cpu_bench)

    def added(names) -> set[str]:  # not Triton's (the class's or a plain instance's), not Python's
        return {n for n in names if not n.startswith("__") and not hasattr(Autotuner, n) and n not in vars(plain)}

    # kernel_name: Triton's attribute, given only where the library set none (fla sets its own)
    names = added(vars(ours)) - {"kernel_name"} | added(vars(at.TunecacheAutotuner))
    assert {"companion_store", "reset", "config_ids", "identity", "_tc_ks"} <= names
    assert names <= adoption.own_names()
    for name in sorted(names):
        lib = type(f"Lib_{name}", (Autotuner,), {name: None})
        with pytest.raises(TypeError, match=name):
            adoption.covering_class(lib)
    lib = type("LibRun", (Autotuner,), {"run": lambda self, *a, **k: super(lib, self).run(*a, **k)})
    assert issubclass(adoption.covering_class(lib), at.TunecacheAutotuner)
