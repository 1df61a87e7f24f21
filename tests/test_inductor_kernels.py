"""torch.compile's Triton kernels through the store (issue 28: a fresh host compiles no more than a warm one).

Triton cannot compile on this CPU machine, so each test drives the cache manager exactly as
``triton.compile`` does (``get_cache_manager(key).get_group(name.json)``; on a miss, ``put`` of each
file and ``put_group``; on a hit, it loads the group's files): one Triton cache directory per host,
one store between them. The GPU bench and test run the real thing (docs/benchmarks/torch-compile.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("torch._inductor.remote_cache")
triton = pytest.importorskip("triton")

from triton import knobs  # noqa: E402
from triton.runtime.cache import FileCacheManager, get_cache_manager  # noqa: E402

from tunecache.inductor import entries as inductor_entries  # noqa: E402
from tunecache.inductor import tritoncache  # noqa: E402
from tunecache.inductor.entries import InductorStore  # noqa: E402
from tunecache.process import counters  # noqa: E402
from tunecache.store.opening import open_store  # noqa: E402
from tunecache.trust import signing, trust  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    for var in ("TUNECACHE_TRUST_STORE", "TUNECACHE_TRUSTED_KEYS", "TUNECACHE_SIGNING_KEY", "TUNECACHE_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    inductor_entries.inductor_target.cache_clear()
    trust.reset_warnings()
    yield
    tritoncache.uninstall()
    inductor_entries.inductor_target.cache_clear()


@pytest.fixture
def store(sqlite_url: str):
    s = open_store(sqlite_url)
    yield s
    s.close()


def stored(store) -> list[dict]:
    """The store's Triton kernel entries."""
    return [r for r in store.list_inductor() if r["kind"] == "triton_kernel"]


def kernel(n: int, name: str = "triton_red_fused_rms_norm_0") -> tuple[str, str, bytes, bytes]:
    """(Triton key, name, metadata, cubin) of a compiled kernel as Triton files it."""
    key = hashlib.sha256(f"kernel source {n}".encode()).hexdigest()
    md = {"hash": key, "name": name, "target": {"backend": "cuda", "arch": 90, "warp_size": 32}}
    md["triton_version"] = triton.__version__
    return key, name, json.dumps(md).encode(), b"\x7fELF" + bytes([n % 256]) * 64


def compile_on(host: Path, monkeypatch, k: tuple[str, str, bytes, bytes]) -> tuple[str, dict[str, bytes]]:
    """What ``triton.compile`` does on ``host`` (a Triton cache directory): 'hit' with the group's files,
    or 'compile' after writing its files, as Triton does."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(host))
    key, name, md, cubin = k
    mgr = get_cache_manager(key)
    group = mgr.get_group(f"{name}.json")
    if group is not None:
        return "hit", {f: Path(p).read_bytes() for f, p in group.items()}
    paths = {f"{name}.ttir": mgr.put("module {}", f"{name}.ttir"), f"{name}.cubin": mgr.put(cubin, f"{name}.cubin")}
    paths[f"{name}.json"] = mgr.put(md.decode(), f"{name}.json", binary=False)
    mgr.put_group(f"{name}.json", paths)
    return "compile", {}


def test_a_kernel_compiled_on_one_host_loads_on_a_fresh_one_without_compiling(store, tmp_path, monkeypatch):
    assert tritoncache.install(InductorStore(store))
    assert knobs.cache.manager_class is tritoncache.StoreCacheManager
    a, b = tritoncache_kernels = [kernel(1), kernel(2, "triton_poi_fused_gelu_1")]

    assert [compile_on(tmp_path / "host1", monkeypatch, k)[0] for k in tritoncache_kernels] == ["compile", "compile"]
    rows = stored(store)
    assert sorted(r["key"] for r in rows) == sorted([a[0], b[0]])

    before = counters.stats()["inductor_hits"]
    what, files = compile_on(tmp_path / "host2", monkeypatch, a)  # an empty Triton cache, the same store
    assert what == "hit"
    assert files == {f"{a[1]}.json": a[2], f"{a[1]}.cubin": a[3]}  # metadata and binary, byte for byte
    assert counters.stats()["inductor_hits"] == before + 1
    # Now local: Triton's next lookup is a local hit, with no store query.
    assert compile_on(tmp_path / "host2", monkeypatch, a)[0] == "hit"
    assert counters.stats()["inductor_hits"] == before + 1
    # Storing is idempotent: a kernel placed from the store is not written back.
    assert len(stored(store)) == 2


def test_the_base32_directory_name_maps_back_to_tritons_key():
    from triton.runtime.cache import _base32

    key = kernel(7)[0]
    assert tritoncache.hex_key(_base32(key)) == key
    assert tritoncache.hex_key("not base32!") is None
    assert tritoncache.hex_key(_base32("ab" * 8)) is None  # not a 32-byte key


def test_kernels_are_code_placed_only_when_a_trusted_key_vouches_and_the_checks_pass(
    store, tmp_path, monkeypatch, caplog
):
    (tmp_path / "keys").mkdir()
    keys = {k: signing.keygen(tmp_path / "keys" / k) for k in ("builder", "attacker")}
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["builder"]["public_key"])
    tritoncache.install(InductorStore(store))
    signed, altered, attacker, unsigned = (kernel(n) for n in range(10, 14))
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["builder"]["private_key"])
    compile_on(tmp_path / "builder", monkeypatch, signed)
    compile_on(tmp_path / "builder", monkeypatch, altered)
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["attacker"]["private_key"])
    compile_on(tmp_path / "attacker", monkeypatch, attacker)
    monkeypatch.delenv("TUNECACHE_SIGNING_KEY")
    compile_on(tmp_path / "unsigned", monkeypatch, unsigned)
    # A signed kernel's binary swapped in the database.
    db = sqlite3.connect(store.url.database)
    value = json.loads(db.execute("SELECT value FROM inductor_entries WHERE key = ?", (altered[0],)).fetchone()[0])
    value["binary"] = "f0VMRmV2aWw="
    db.execute("UPDATE inductor_entries SET value = ? WHERE key = ?", (json.dumps(value).encode(), altered[0]))
    db.commit()
    db.close()

    tritoncache.install(InductorStore(store))  # a fresh process: a fresh trust policy
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert compile_on(fresh, monkeypatch, signed)[0] == "hit"
        for k in (altered, attacker, unsigned):
            assert compile_on(fresh / "x", monkeypatch, k)[0] == "compile", k[0]
    # Nothing refused was written into the local cache (it compiled instead), and the compiles replaced
    # the refused entries with this process's own (unsigned here: still refused by a fleet that trusts keys).
    assert counters.stats()["untrusted"] >= 3


def test_a_stored_kernel_filed_under_another_key_is_refused(store, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    entries = InductorStore(store)
    tritoncache.install(entries)
    real, other = kernel(20), kernel(21)
    # An entry for `other`'s key whose metadata is `real`'s (a binary moved to another key).
    key, name, md, cubin = real
    from tunecache.problem.model import Binary, binary_sha256

    moved = Binary(key, binary_sha256(key, name, "cubin", triton.__version__, md, cubin), name, "cubin", "x", md, cubin)
    entries.put("triton_kernel", other[0], tritoncache.encode(moved))
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert compile_on(tmp_path / "h", monkeypatch, other)[0] == "compile"
    assert any("not placed" in r.getMessage() and "Triton key" in r.getMessage() for r in caplog.records)


def test_a_store_outage_compiles_as_without_it_and_stores_nothing(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/none")  # nothing listens
    monkeypatch.setenv("TUNECACHE_CONNECT_TIMEOUT", "1")
    tritoncache.install()
    k = kernel(30)
    assert compile_on(tmp_path / "h", monkeypatch, k)[0] == "compile"  # no exception into Triton
    assert compile_on(tmp_path / "h", monkeypatch, k)[0] == "hit"  # Triton's own cache still works
    assert counters.stats()["store_errors"] >= 1
    # The store back, the kernel is not written by a put whose lookup failed: only what the store lacked.
    tritoncache.install(InductorStore(store))
    assert compile_on(tmp_path / "h", monkeypatch, k)[0] == "hit"
    assert stored(store) == []


def test_readonly_mode_places_kernels_and_writes_none(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    tritoncache.install(InductorStore(store))
    kept, new = kernel(40), kernel(41)
    compile_on(tmp_path / "rw", monkeypatch, kept)
    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    assert compile_on(tmp_path / "ro", monkeypatch, kept)[0] == "hit"
    assert compile_on(tmp_path / "ro", monkeypatch, new)[0] == "compile"
    assert [r["key"] for r in stored(store)] == [kept[0]]


def test_a_cache_manager_of_the_users_stays_and_enable_disable_install_and_undo_ours(monkeypatch):
    class Mine(FileCacheManager):
        pass

    monkeypatch.setattr(knobs.cache, "manager_class", Mine)
    assert not tritoncache.install()
    assert knobs.cache.manager_class is Mine
    monkeypatch.setattr(knobs.cache, "manager_class", None)

    from tunecache.inductor import enable

    try:
        enable.enable(switch_on=False)
        assert knobs.cache.manager_class is tritoncache.StoreCacheManager
    finally:
        enable.disable()
    assert knobs.cache.manager_class is None
    monkeypatch.setenv("TUNECACHE_INDUCTOR_KERNELS", "0")
    try:
        enable.enable(switch_on=False)
        assert knobs.cache.manager_class is None
    finally:
        enable.disable()


def test_candidates_compiled_inside_inductors_select_algorithm_are_not_filed(store, tmp_path, monkeypatch):
    """Issue 35, item 10: max-autotune's benchmark candidates (compiled under Inductor's select_algorithm,
    whose winner the stored graph bundles) are not filed; a kernel compiled outside it is."""
    import torch._inductor.select_algorithm as select_algorithm

    tritoncache.install(InductorStore(store))
    candidate, kept = kernel(50), kernel(51)
    # A frame of select_algorithm's code on the stack, as its precompile threads have.
    code = compile("def precompile(f, *a):\n    return f(*a)\n", select_algorithm.__file__, "exec")
    scope: dict = {}
    exec(code, scope)
    assert scope["precompile"](compile_on, tmp_path / "h", monkeypatch, candidate)[0] == "compile"
    assert compile_on(tmp_path / "h", monkeypatch, kept)[0] == "compile"
    assert [r["key"] for r in stored(store)] == [kept[0]]


def test_a_process_with_an_override_or_dump_knob_neither_files_nor_fetches(store, tmp_path, monkeypatch, caplog):
    """Issue 35, item 2: Triton's key does not cover TRITON_KERNEL_OVERRIDE or TRITON_KERNEL_DUMP; such a
    process's builds stay on its host (said once), and it compiles what its cache lacks (its override applies)."""
    from tunecache.trust import sharing

    # Said once per reason and process: a test that ran an overridden build before on this worker
    # (test_shared_builds) has said one already.
    monkeypatch.setattr(sharing, "_said", set())
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "yes")
    tritoncache.install(InductorStore(store))
    shared, built = kernel(60), kernel(61)
    compile_on(tmp_path / "a", monkeypatch, shared)
    # Through the environment, as a user sets them: setting a knob attribute would pin it (and write
    # the variable into os.environ) for every later test of the session.
    for knob, var in (("override", "TRITON_KERNEL_OVERRIDE"), ("dump_ir", "TRITON_KERNEL_DUMP")):
        monkeypatch.delitem(vars(knobs.compilation), knob, raising=False)
        monkeypatch.setenv(var, "1")
        assert sharing.unshared_reason() is not None
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            assert compile_on(tmp_path / knob, monkeypatch, shared)[0] == "compile"  # not fetched
            assert compile_on(tmp_path / knob, monkeypatch, built)[0] == "compile"
        monkeypatch.delenv(var)
    assert [r["key"] for r in stored(store)] == [shared[0]]
    said = [r for r in caplog.records if "nothing this process builds is shared" in r.getMessage()]
    assert len(said) == 2  # once per reason
    assert sharing.unshared_reason() is None


# ---- host modules: the C extensions Triton builds with gcc ----------------------------------------

UTILS_SRC = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(%d); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "cuda_utils", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cuda_utils(void) { return PyModule_Create(&mod); }
"""


def build_utils(host: Path, monkeypatch, answer: int = 42, *, builds: bool) -> int:
    """Triton's own ``compile_module_from_src`` of a ``cuda_utils`` module on ``host`` (a Triton cache
    directory): gcc builds it unless ``builds`` is False (then building fails the test); its answer."""
    from triton.runtime import build

    monkeypatch.setenv("TRITON_CACHE_DIR", str(host))
    real, ran = getattr(build._build, "__wrapped__", build._build), []  # Triton's own, not an earlier call's

    def counted(*args, **kwargs):
        ran.append(1)
        assert builds, "Triton built a host module the store should have served"
        return real(*args, **kwargs)

    counted.__wrapped__ = real  # type: ignore[attr-defined]
    monkeypatch.setattr(build, "_build", counted)
    monkeypatch.delitem(__import__("sys").modules, "cuda_utils", raising=False)
    mod = build.compile_module_from_src(src=UTILS_SRC % answer, name="cuda_utils")
    assert len(ran) == (1 if builds else 0)
    return mod.answer()


def test_a_host_module_built_on_one_host_is_placed_on_a_fresh_one_only_when_a_trusted_key_vouches(
    store, tmp_path, monkeypatch
):
    """What a fresh torch.compile host built with gcc before its first lookup (Triton's driver
    utilities, 0.3 s on the H200 host) travels like a kernel: signed where built, placed only where a
    trusted key vouches for it, never filed again by the host it was placed on; bound to the
    interpreter and machine, not to a device (it is asked for while the device is being read)."""
    (tmp_path / "keys").mkdir()
    keys = {k: signing.keygen(tmp_path / "keys" / k) for k in ("fleet", "other")}
    monkeypatch.setenv("TUNECACHE_TRUST_STORE", "no")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", keys["fleet"]["public_key"])
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["fleet"]["private_key"])
    tritoncache.install(InductorStore(store))

    assert build_utils(tmp_path / "first", monkeypatch, builds=True) == 42
    (row,) = stored(store)
    assert row["backend"] == "host" and row["device_name"] == "" and row["signed"]
    assert build_utils(tmp_path / "fresh", monkeypatch, builds=False) == 42  # placed, loaded, no gcc
    assert len(stored(store)) == 1  # placed bytes are not filed again

    # Another key's build of another module: refused by this fleet, which builds its own.
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["other"]["private_key"])
    assert build_utils(tmp_path / "other", monkeypatch, 7, builds=True) == 7
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", keys["fleet"]["private_key"])
    tritoncache.install(InductorStore(store))  # a fresh process: a fresh trust policy
    assert build_utils(tmp_path / "fleet", monkeypatch, 7, builds=True) == 7


def test_a_failure_while_filing_or_placing_never_reaches_tritons_build(store, tmp_path, monkeypatch, caplog):
    """The store side of Triton's cache never raises into Triton: a host module whose filing fails is
    still built, loaded and kept locally, and the failure is said once."""
    from tunecache.binaries import hostmodules

    tritoncache.install(InductorStore(store))

    def broken(*args):
        raise RuntimeError("no metadata today")

    monkeypatch.setattr(hostmodules, "metadata", broken)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert build_utils(tmp_path / "host", monkeypatch, 9, builds=True) == 9
    assert "filing a host module failed" in caplog.text and "no metadata today" in caplog.text
    assert stored(store) == []
