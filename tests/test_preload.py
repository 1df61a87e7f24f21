"""Preloading the stored winners' binaries: the record, the round trip through Triton's own
``JITFunction.preload``, the store's table, and which specs a restart loads.

Compiling needs no GPU (tests/preload_roundtrip.py builds for sm90 offline); loading into a CUDA
context does, and is checked on the H200 in tests/test_gpu.py.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import sys
import time

import pytest
import tinykernels
import torch
import triton
from processes import run_json

import tunecache
from tunecache.binaries import preload
from tunecache.problem.model import ConfigResult, LaunchSpec, Problem
from tunecache.problem.target import detect_target
from tunecache.process import writeback
from tunecache.store.opening import open_store
from tunecache.tuner import autotuner as at
from tunecache.tuner import background


def spec(i: int, config_hash: str = "c1", version: str | None = None) -> LaunchSpec:
    return LaunchSpec(f"{i:064x}", config_hash, f"{i:064x}"[::-1], f'{{"key": "k{i}"}}', version or "3.9.0")


def test_recorded_specialisation_preloads_the_same_binary_under_the_same_key():
    r = run_json(["preload_roundtrip.py"], timeout=600)
    assert r["unwraps"]  # from the @autotune/@heuristics-decorated kernel to its JITFunction
    # Only the winner config's kernels (both of its specialisations), not 64/4w, not 128/4w.
    assert r["captured"] == ["k128", "k128-unaligned"] and r["other_warps"] == 0
    assert r["roundtrip"] == {k: {"same_hash": True, "cached": True} for k in r["captured"]}
    # A spec whose binary differs from the record, from another Triton, or filed under another launch's
    # key: skipped, nothing cached.
    assert r["bad"] == [0, 3] and r["cache_after_bad"] == []
    assert r["good"] == [2, 0] and r["inits"] and r["cache_after_good"] == r["captured"]
    assert r["again"] == [0, 0]  # already in Triton's cache: nothing done twice
    # What a first launch imports is imported once something was loaded (after both binaries).
    assert r["launch_imports"] == [[], [2]]


def test_a_spec_built_with_options_a_launch_here_would_not_use_is_not_preloaded(tmp_path):
    """A launch key names only the options the launch passed; Triton fills the rest from the host's
    defaults, some of which (PTXAS_OPTIONS, TRITON_LIBDEVICE_PATH) are not even in the binary's hash.
    A spec recorded where they differ (TRITON_DEFAULT_FP_FUSION=0 too, which the hash check already
    caught), or whose record names other options than its key implies, is skipped, never filed under a
    key whose launch here would build another binary."""
    # Another libdevice (Triton hashes its content; one its cache has not seen): an LLVM module that defines
    # nothing, which Triton 3.4 links as it links any (add_one calls none of libdevice's functions).
    other = tmp_path / "libdevice-other.ll"
    other.write_text(f'; not libdevice, from {tmp_path}\ntarget triple = "nvptx64-nvidia-cuda"\n')
    envs = {
        "default": {},
        "no_fusion": {"TRITON_DEFAULT_FP_FUSION": "0"},
        "ptxas": {"PTXAS_OPTIONS": "-O2"},
        "libdevice": {"TRITON_LIBDEVICE_PATH": str(other)},
    }
    recorded = {n: run_json(["preload_options.py", "record"], env=e, timeout=600) for n, e in envs.items()}
    (tmp_path / "specs.json").write_text(json.dumps(recorded))
    r = run_json(["preload_options.py", "load", str(tmp_path / "specs.json"), str(tmp_path)], timeout=600)
    ids = r["ids"]

    def skipped(name: str) -> dict:  # counted skipped on both tries, named once at debug level, no warning
        return {"counts": [[0, 1], [0, 1]], "cached": [], "warnings": [], "named": [ids[name]]}

    def shown(res: dict) -> dict:
        return {k: res[k] for k in ("counts", "cached", "warnings", "named")}

    # Recorded with this host's defaults: the binary a launch here builds, under its key.
    assert r["recorded"]["default"]["hashes"] == [r["here"]] and r["recorded"]["default"]["counts"][0] == [1, 0]
    assert shown(r["recorded"]["libdevice"]) == skipped("libdevice")
    assert "extern_libs" in r["recorded"]["libdevice"]["why"][0]
    if r["ptx_options"]["ptxas"] is None:  # Triton 3.4 reads no PTXAS_OPTIONS: the same spec as the default
        assert ids["ptxas"] == ids["default"] and triton.__version__.startswith("3.4")
    else:
        assert r["ptx_options"]["ptxas"] == "-O2" and shown(r["recorded"]["ptxas"]) == skipped("ptxas")
    # Any option the key does not name counts, here under the plain key with an honest hash.
    assert shown(r["changed"]["default_dot_input_precision"]) == skipped("default_dot_input_precision")
    assert "option default_dot_input_precision" in r["changed"]["default_dot_input_precision"]["why"][0]
    # Recorded with TRITON_DEFAULT_FP_FUSION=0 (its hash has that environment: skipped before too), and
    # built here with enable_fp_fusion=False under the plain key, with an honest hash.
    unfused = {"no_fusion": r["recorded"]["no_fusion"], "enable_fp_fusion": r["changed"]["enable_fp_fusion"]}
    for name, res in unfused.items():
        assert shown(res) == skipped(name) and "option enable_fp_fusion" in res["why"][0]
    # Equal options load: a launch that passed enable_fp_fusion=False builds that binary, and the same
    # libdevice at another path is the same option to Triton.
    assert shown(r["asked"]) == {"counts": [[1, 0], [0, 0]], "cached": ["no_fusion"], "warnings": [], "named": []}
    assert r["moved"]["hashes"] == [r["here"]] and r["moved"]["counts"] == [[1, 0], [0, 0]]


@pytest.fixture(scope="module")
def constexpr_runs() -> dict:
    """tests/preload_constexprs.py's round trips (dtype/enum/None/str, tuples, JIT functions), one process."""
    return run_json(["preload_constexprs.py", "all"], timeout=600)


def test_a_kernel_with_dtype_enum_and_none_constexprs_preloads_under_its_own_launch_key(constexpr_runs):
    """A quantized-matmul library passes ``tl.float16``, enum members, ``None`` and strings as
    constexprs: its launch keys hold their ``repr`` (``triton.language.float16``, ``<Mode.A: 1>``),
    which no literal parser reads, and not one of its kernels was preloaded. Each now preloads, and
    Triton's own launch finds it under the key it computes; a spec whose key names other constexprs
    than its binary was built with (its hash honest) is never loaded."""
    r = constexpr_runs["roundtrip"]
    keys = r["keys"]
    assert "triton.language.float16" in keys["fp16"] and "<Mode.PLAIN: 1>" in keys["fp16"]
    assert "('constexpr', None)" in keys["fp16"] and "<Mode.DOUBLE: 2>" in keys["double"]
    # bf16 for fp16, another enum member, 0.5 for None, another string: refused, nothing cached.
    assert r["forged"] == {"bf16": [0, 1], "double": [0, 1], "bias": [0, 1], "first": [0, 1]}
    assert r["cache_after_forged"] == 0
    assert r["loaded"] == [5, 0]
    assert r["found"] == {n: True for n in keys}  # the launch hits the preloaded binary, compiles nothing
    assert r["cache_after_launches"] == 5
    assert r["skips"] == {"key_mismatch": 4}


def test_nested_tuple_constexprs_and_tuple_arguments_preload_where_triton_can_rebuild_them(constexpr_runs):
    """A nested tuple constexpr and a tuple argument holding a pointer and a None: the key is read
    and matched on every Triton; 3.9's preload rebuilds the launch's binary, which the launch then
    finds; before 3.9 Triton's preload cannot (a tuple constexpr comes back a list), so the spec is
    skipped without a compile and the launch builds its own. A spec for other tuple values: never."""
    r = constexpr_runs["tuples"]
    assert "('constexpr', (1, (2, 3)))" in r["key"] and "(('*fp32', 'constexpr'), ('D', None))" in r["key"]
    assert r["forged"] == [0, 1] and r["same_hash"]
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9):
        assert r["loaded"] == [1, 0] and r["found"] and r["skips"] == {"key_mismatch": 1}
    else:
        assert r["loaded"] == [0, 1] and not r["found"] and r["skips"] == {"key_mismatch": 1, "unsupported": 1}


def test_a_jit_function_constexpr_preloads_under_its_cache_key_on_triton_39(constexpr_runs):
    """Triton 3.9 records a @triton.jit function constexpr by name and keys its launch by the
    function's ``cache_key``: the spec preloads (the function looked up among those this process
    defined, nothing imported), and one built with another function is refused. Earlier Tritons
    cannot serialise it: nothing is recorded."""
    r = constexpr_runs["functions"]
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        assert r == {"recorded": False}
        return
    assert r["forged"] == [0, 1] and r["loaded"] == [1, 0] and r["found"]
    assert r["skips"] == {"key_mismatch": 1}


@pytest.mark.parametrize(
    ("text", "recorded", "same"),
    [
        ("triton.language.float16", "fp16", True),  # serialised as its name, decoded to tl.dtype
        ("triton.language.bfloat16", "fp16", False),
        ("'fp16'", "fp16", False),  # a string naming a dtype: the preload builds with the dtype
        ("<Mode.A: 1>", 1, True),  # an IntEnum member is serialised as its value
        ("<Mode.A: 1>", 2, False),
        ("<Mode.A: 1>", True, False),  # the same value, another type
        ("<Mode.A: 1>", 1.0, False),
        ("<Mode.A: 1>", "1", False),
        ("<Policy.LAST: 'evict_last'>", "evict_last", True),
        ("<Policy.F: 'fp16'>", "fp16", False),  # decoded to a dtype, not the enum's str
        ("<Mode.A: 1>, <Mode.B: 2>", 1, False),
        ("<Mode.A: 01>", 1, False),  # not as repr writes it
        ("None", None, True),
        ("None", 0, False),
        ("0", None, False),
        ("1", True, False),
        ("True", 1, False),
        ("'evict_last'", "evict_last", True),
        ("'evict_last'", "evict_first", False),
        ("(1, (2, 'a'))", [1, [2, "a"]], True),  # JSON made the tuples lists
        ("(1, (2, 'a'))", [1, [2, "b"]], False),
        ("(1,)", [1], True),
        ("(1)", [1], False),
        ("0.5", 0.5, True),
        ("0.5", 0.25, False),
    ],
)
def test_a_constexpr_matches_only_the_constant_its_binary_is_built_with(text, recorded, same):
    assert preload.constant_matches(text, recorded) is same


def test_a_tl_constexpr_argument_matches_where_this_triton_decodes_it():
    """``{"constexpr": v}`` is decoded by the preload from Triton 3.6 (3.4 never records it); elsewhere
    it stays a dict, which no launch's key names."""
    decodes = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 6)
    assert preload.constant_matches("constexpr[3]", {"constexpr": 3}) is decodes
    assert not preload.constant_matches("constexpr[4]", {"constexpr": 3})


def _spec_data(key: str, **changes) -> dict:
    data = {
        "signature": {"X": "*fp32", "N": "i32", "DT": "constexpr", "S": "constexpr"},
        "constant_keys": [[2], [3]],
        "constant_vals": ["fp16", "a,b)"],
        "attrs_keys": [[0], [1], [2], [3]],
        "attrs_vals": [[["tt.divisibility", 16]], [], [], []],
        "options": {"num_warps": 4, "num_stages": 3},
        "key": key,
    }
    return {**data, **changes}


GOOD_KEY = (
    "[('*fp32', 'D'), ('i32', ''), ('constexpr', triton.language.float16), ('constexpr', 'a,b)')]{'num_warps': 4}"
)


@pytest.mark.parametrize(
    ("key", "changes", "reason"),
    [
        (GOOD_KEY, {}, None),
        (GOOD_KEY.replace("'a,b)'", "'a,b'"), {}, "key_mismatch"),  # a comma in a string cuts nothing
        (GOOD_KEY.replace("float16", "float32"), {}, "key_mismatch"),
        (GOOD_KEY.replace("('*fp32', 'D')", "('*fp32', '')"), {}, "key_mismatch"),  # alignment
        (GOOD_KEY.replace("'num_warps': 4", "'num_warps': 8"), {}, "key_mismatch"),
        (GOOD_KEY, {"constant_keys": [[1], [2], [3]], "constant_vals": [7, "fp16", "a,b)"]}, "key_mismatch"),
        (GOOD_KEY.replace("('i32', '')", "('constexpr', 7)"), {}, "key_mismatch"),  # i32 in the binary
        (GOOD_KEY.replace("('*fp32', 'D'), ", "('*fp32', 'D'),"), {}, "unparseable"),  # not as str() writes it
        (GOOD_KEY[:-1], {}, "unparseable"),
        (GOOD_KEY.replace("'a,b)'", "<object at 0x1>"), {}, "key_mismatch"),
        ("[('*fp32', 'D'), <Mode.A: 1]{}", {}, "unparseable"),
        (GOOD_KEY.replace("'a,b)'", "'a,b' + ')'"), {}, "key_mismatch"),  # text, never evaluated
    ],
)
def test_a_launch_key_is_read_by_its_text_and_matched_exactly(key, changes, reason):
    why = preload.key_mismatch(_spec_data(key, **changes), 4)
    assert (why[0] if why else None) == reason, why


def test_a_restart_with_many_unparseable_specs_prints_at_most_one_line():
    """Each spec skipped was a warning of its own: 81 lines at every start of that library. Now one
    summary line per process (logging as the library leaves it: Python's last resort, warnings up),
    the reasons counted in ``tunecache.preload_skips()``."""
    import os
    import subprocess

    from processes import HERE

    p = subprocess.run(
        [sys.executable, "-W", "ignore", "preload_constexprs.py", "quiet", "50"],  # Triton's own warnings off
        cwd=str(HERE),
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["counts"] == [[0, 50], [0, 50]]
    assert r["skips"] == {"unparseable": 100} and r["stats"]["preload_skipped"] == 100
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "100 launch specs not preloaded" in lines[0] and "100 unparseable" in lines[0]


def test_the_skip_summary_is_one_line_a_warning_only_for_what_a_user_should_act_on(caplog):
    """Specs of another Triton, built with other host options or whose binary no longer rebuilds
    load at their launch as without tunecache, by design of a mixed fleet: said at info level. A key
    tunecache cannot read or match, or a failed preload, is a warning. Either way once per process."""
    from tunecache.process import counters

    def summary(*reasons: str) -> list[tuple[int, str]]:
        tunecache.reset_stats()
        counters.reset_warnings()
        for r in reasons:
            counters.preload_skipped(r)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="tunecache"):
            first, again = preload.summarise_skips(), preload.summarise_skips()
        assert again is None and (first is None) == (not reasons)
        return [(r.levelno, r.getMessage()) for r in caplog.records]

    assert summary() == []
    ((level, line),) = summary("other_triton", "options", "options", "rebuilt_differs", "unsupported")
    assert level == logging.INFO and "5 launch specs not preloaded: 2 options, 1 other_triton" in line
    for actionable in preload.ACTIONABLE:
        ((level, line),) = summary("other_triton", actionable)
        assert level == logging.WARNING and f"1 {actionable}" in line
    assert tunecache.preload_skips() == {"other_triton": 1, "error": 1}
    assert tunecache.stats()["preload_skipped"] == 2
    assert set(preload.ACTIONABLE) < set(preload.SKIP_REASONS)
    tunecache.reset_stats()
    counters.reset_warnings()


def test_the_modules_a_first_launch_imports_are_imported_by_the_preload():
    probe = (
        "import json, sys, triton\n"
        "from tunecache.binaries import preload\n"
        "before = [n in sys.modules for n in preload.LAUNCH_IMPORTS]\n"
        "preload.import_launch_modules()\n"
        "print(json.dumps([before, [n in sys.modules for n in preload.LAUNCH_IMPORTS]]))"
    )
    before, after = run_json(["-c", probe])
    assert after == [True, True]
    assert not all(before)  # `import triton` alone leaves Gluon's descriptors to the first launch


@pytest.mark.sql_variants("the store's launch-spec rows: SQL alone, nothing of Triton's")
def test_store_keeps_specs_per_kernel_and_target_and_drops_them_with_the_last_problem(store_url):
    s = open_store(store_url)
    a, b = spec(1), spec(2, "c2")
    assert s.put_specs("k", "src1", "t1", [a, b]) == 2
    assert s.put_specs("k", "src1", "t1", [a]) == 0  # idempotent: another worker recorded it too
    assert s.put_specs("k", "src1", "t2", [a]) == 1
    assert s.put_specs("k", "src2", "t1", [spec(3)]) == 1
    got = s.get_specs("src1")
    assert sorted(got) == ["t1", "t2"] and got["t1"] == [a, b] and got["t2"] == [a]

    def prob(src: str, target_name: str) -> Problem:
        t = detect_target()
        return Problem(
            digest=f"{src}-{target_name}".ljust(64, "0"),
            kernel="k",
            source_hash=src,
            target=t,
            key_json='{"N":1}',
            batch_bucket=None,
            tuning_seconds=0.0,
            host="h",
            search_space_hash="x",
            winner_config_hash="c1",
        )

    cpu = detect_target().digest
    s.put_specs("k", "src3", cpu, [spec(4)])
    s.put(prob("src3", "a"), [ConfigResult("c1", {"BLOCK": 1}, median_ms=1.0)])
    s.put(prob("src3", "b"), [ConfigResult("c1", {"BLOCK": 1}, median_ms=1.0)])
    s.delete(digests=[prob("src3", "a").digest])
    assert s.get_specs("src3") == {cpu: [spec(4)]}  # another problem of that kernel and target is left
    s.delete(source_hash="src3")
    assert s.get_specs("src3") == {}
    s.close()


@pytest.mark.sql_variants("the store's launch-spec rows and their gc: SQL alone, nothing of Triton's")
def test_a_spec_of_another_binary_is_added_beside_the_stored_one_and_gc_drops_the_superseded(store_url):
    """The same specialisation of the same source (hash) compiled to another binary (another text, e.g.
    a comment edit, tunecache.tuner.heal): the store keeps the first one recorded; heal adds the other as
    a spec of its own binary (issue 35, item 8), and gc drops the older of the two once past its age."""
    import datetime as dt

    from tunecache.binaries.preload import for_binary
    from tunecache.problem.model import utcnow

    s = open_store(store_url)
    old, other_version = spec(1), spec(2, version="3.6.0")
    s.put_specs("k", "src", "t", [old, other_version, spec(3)])
    edited = LaunchSpec(old.spec_hash, old.config_hash, "e" * 64, old.spec_json, old.triton_version)
    assert s.put_specs("k", "src", "t", [edited]) == 0  # idempotent: the first recorded is kept
    assert s.get_specs("src")["t"] == [old, other_version, spec(3)]
    added = for_binary(edited)
    assert added.spec_hash != old.spec_hash and for_binary(added) == added
    assert s.put_specs("k", "src", "t", [added]) == 1
    assert s.put_specs("k", "src", "t", [added]) == 0
    assert {x.kernel_hash for x in s.get_specs("src")["t"]} == {
        old.kernel_hash,
        "e" * 64,
        spec(2).kernel_hash,
        spec(3).kernel_hash,
    }
    assert s.gc_launch_specs(older_than=utcnow() - dt.timedelta(days=1)) == []  # both recent: both kept
    gone = s.gc_launch_specs(older_than=utcnow() + dt.timedelta(seconds=1), dry_run=True)
    assert gone == [("src", "t", old.spec_hash)]  # the older of the two; the others have no sibling
    assert s.gc_launch_specs(older_than=utcnow() + dt.timedelta(seconds=1)) == gone
    assert sorted(x.spec_hash for x in s.get_specs("src")["t"]) == sorted(
        [added.spec_hash, spec(2).spec_hash, spec(3).spec_hash]
    )
    s.close()


def test_restart_loads_only_this_targets_winners(sqlite_url, monkeypatch):
    k = tinykernels.make_add(store=sqlite_url)
    tinykernels.launch(k, 64)  # tunes: a winner stored for this target
    win = k.cache[next(iter(k.cache))]
    win_hash = k.config_ids(win)[1]
    here = detect_target().digest
    other = [h for h in (k.config_ids(c)[1] for c in k.configs) if h != win_hash][0]
    version = preload.triton_version()
    s = open_store(sqlite_url)
    s.put_specs("k", k.identity.source_hash, here, [spec(1, win_hash, version), spec(2, other, version)])
    s.put_specs("k", k.identity.source_hash, "f" * 64, [spec(3, win_hash, version)])  # another target
    s.close()

    seen = []
    monkeypatch.setattr(preload, "load", lambda fn, specs, dev: (seen.extend(specs), (len(specs), 0))[1])
    tunecache.reset_stats()
    restart = tinykernels.make_add(store=sqlite_url)
    assert restart.load_winners() == 1
    assert seen == [spec(1, win_hash, version)]
    assert tunecache.stats()["preloaded"] == 1
    assert tunecache.load_winners() >= 1  # every kernel defined so far, through the package


def test_preload_skips_kernels_with_nothing_stored_without_hashing_them(sqlite_url, tmp_path, monkeypatch):
    """A library defines hundreds of autotuned kernels (fla-core: 197 autotuners) and a start uses a
    few (10). The preload runs on one background thread in definition order: a kernel with nothing in
    the store must cost no source hash and no query there, or the few with winners wait behind it."""
    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)  # tuned: that store has its row
    hashed = []
    real_identity, real_imported = at.kernel_identity, at.module_imported
    monkeypatch.setattr(at, "kernel_identity", lambda fn: hashed.append(fn) or real_identity(fn))

    def defined_while_importing(url: str):  # as a library's kernels are: the prefetch cannot hash
        monkeypatch.setattr(at, "module_imported", lambda fn: False)
        k = tinykernels.make_add(store=url)
        k.wait_for_prefetch()
        monkeypatch.setattr(at, "module_imported", real_imported)
        return k

    empty = defined_while_importing(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    assert hashed == []
    assert empty.load_winners() == 0
    assert hashed == []  # no source parsed for a kernel the store holds nothing of
    stored = defined_while_importing(sqlite_url)
    stored.load_winners()
    assert len(hashed) == 1  # a kernel with rows is hashed there, as before


def test_a_library_of_kernels_with_nothing_stored_costs_one_query_and_no_hashing(sqlite_url, monkeypatch):
    """The prefetch runs on one background thread: for fla-core's 197 autotuners, a query and a source
    hash each (0.01-0.1 s apiece) kept that thread busy for seconds, into the first launches, which it
    slowed (GPU run U). The names of the kernels the store holds are read once per store and process;
    a kernel not among them costs neither a query nor a hash."""
    import sqlalchemy as sa

    from tunecache.store.opening import shared_store

    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)  # one kernel with rows
    # Its deferred counters and result written now, not by the flusher's timer inside the window
    # measured below (on a loaded machine the timer fired there: 4 more statements).
    writeback.flush()
    statements: list[str] = []
    engine = shared_store(sqlite_url).engine  # the store every kernel here opens

    def seen(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", seen)
    hashed = []
    real_identity = at.kernel_identity
    monkeypatch.setattr(at, "kernel_identity", lambda fn: hashed.append(fn) or real_identity(fn))
    try:
        lib = [tinykernels.make_add(store=sqlite_url, name=f"libkernel{i}") for i in range(5)]
        if background.AST_NOT_THREAD_SAFE:  # 3.11 hashes on the defining thread (see there), not in the prefetch
            hashed.clear()
        for k in lib:
            k.wait_for_prefetch()
            assert k.load_winners() == 0
        assert len(statements) <= 1 and hashed == [], statements  # the names of the stored kernels, once
        stored = tinykernels.make_add(store=sqlite_url)  # the one with rows: fetched as before
        stored.wait_for_prefetch()
        assert len(statements) > 1 and len(hashed) == 1
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)


def test_interpreted_kernels_record_nothing(sqlite_url):
    k = tinykernels.make_add(store=sqlite_url)
    tinykernels.launch(k, 64)
    assert preload.capture(k, k.configs[0], "x") == []
    s = open_store(sqlite_url)
    assert s.get_specs(k.identity.source_hash) == {}


def test_cuda_init_callback_is_queued_without_touching_cuda_and_never_raises(monkeypatch):
    queued = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda fn, **kw: queued.append(fn))
    ran = []
    assert preload.on_cuda_init(lambda: ran.append(1))
    assert preload.on_cuda_init(lambda: 1 / 0)
    assert ran == [] and len(queued) == 2
    for fn in queued:  # what torch does once CUDA is initialised
        fn()
    assert ran == [1]  # the failing one was swallowed: torch's CUDA init must not fail for it
    monkeypatch.delattr(torch.cuda, "_lazy_call")
    assert not preload.on_cuda_init(lambda: None)


def _child_background(q) -> None:
    q.put(background.submit(lambda: 42).result(timeout=10))


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_background_worker_runs_in_a_forked_child():
    background.submit(lambda: None).result(timeout=10)  # the parent's worker thread exists
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_background, args=(q,))
    p.start()
    p.join(30)
    assert p.exitcode == 0 and q.get(timeout=1) == 42


def test_one_cuda_init_callback_per_process_loads_every_kernel_once(monkeypatch):
    """Kernels defined before CUDA is up share one callback on torch's queue (not one each: torch
    formats a stack per entry); one defined after CUDA is up is loaded at once."""
    state = {"up": False}
    queue = []

    def lazy_call(fn, **kw):  # torch.cuda._lazy_call: run now if initialised, else queue
        fn() if state["up"] else queue.append(fn)

    monkeypatch.setattr(torch.cuda, "_lazy_call", lazy_call)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    background.forget_cuda_callback()
    loads = []
    monkeypatch.setattr(at.TunecacheAutotuner, "load_winners", lambda self, device=None: loads.append(self) or 1)
    before = [tinykernels.make_add() for _ in range(3)]
    for k in before:
        background.preload_when_cuda_is_up(k)
    assert len(queue) == 1 and loads == []
    state["up"] = True
    queue.pop()()
    background.submit(lambda: None).result(timeout=10)
    assert sorted(map(id, loads)) == sorted(map(id, before))
    late = tinykernels.make_add()
    background.preload_when_cuda_is_up(late)
    background.submit(lambda: None).result(timeout=10)
    assert loads[-1] is late and len(loads) == 4 and queue == []


def test_a_kernel_whose_module_still_imports_when_cuda_comes_up_is_preloaded_once_it_finished(monkeypatch, sqlite_url):
    """fla-core queries the GPU while its modules import (``check_shared_mem()`` in ``cumsum.py``), so
    CUDA is up before the kernels defined below that line exist; their preload ran while their module
    was still importing, could not hash the source, and was never tried again: 2 of fla's 10 used
    kernels loaded at their first launch (GPU run V). It is tried again once the module may have
    finished importing."""
    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)  # stored: there is something to preload
    state = {"importing": True}
    monkeypatch.setattr(background, "AST_NOT_THREAD_SAFE", False)  # as on 3.12, where preloads run
    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda fn, **kw: fn())  # CUDA is up already
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    real_imported = at.module_imported
    monkeypatch.setattr(at, "module_imported", lambda fn: not state["importing"] and real_imported(fn))
    loads = []
    monkeypatch.setattr(at.TunecacheAutotuner, "load_winners", lambda self, device=None: loads.append(self) or 1)
    background.forget_cuda_callback()
    k = tinykernels.make_add(store=sqlite_url)  # defined "while its module imports"
    k.wait_for_prefetch()
    background.preload_when_cuda_is_up(k)  # CUDA is up: queued at once
    background.submit(lambda: None).result(timeout=10)
    assert loads == []  # not now: the source may not be hashed while the module imports
    state["importing"] = False  # the module's body finished
    deadline = time.monotonic() + 10
    while not loads and time.monotonic() < deadline:
        time.sleep(0.05)
        background.submit(lambda: None).result(timeout=10)
    assert loads == [k]
