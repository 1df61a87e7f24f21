"""Which of a process's builds leave the host (issue 35, items 2, 3, 8, 10).

Real sm90 compiles on a machine without a GPU (ptxas ships with Triton), through the autotuner's own
launch path, each phase a fresh process (tests/heal_roundtrip.py) with its own Triton cache and its
own ``TUNECACHE_HOST_ID``, one store between them (SQLite and the real PostgreSQL):

- item 2: a process with ``TRITON_KERNEL_DUMP`` or ``TRITON_KERNEL_OVERRIDE`` (a real override
  directory, a hand-edited PTX) compiles under Triton's normal key; nothing it built is filed:
  no ``triton_kernel`` entry, no binary from the tuner's upload, no launch spec or binary from heal;
- item 3: a binary placed by tunecache is not filed again as a ``triton_kernel`` entry (re-signed);
- item 8: hosts on two texts of one kernel (a rolling deploy of a comment edit) heal alternately and
  both keep their specs: fresh hosts of either text compile nothing;
- item 10: kernels compiled inside tunecache's benchmark are not filed as ``triton_kernel`` entries
  (the tuner uploads its winner's binary itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from healkernel_runs import kernel_module, run_phase

pytest.importorskip("torch._inductor.remote_cache")


def _run(phase: str, kernel_dir: Path, cache: Path, url: str, host: str, **env: str) -> dict[str, Any]:
    return run_phase(phase, kernel_dir, cache, url, TUNECACHE_HOST_ID=host, TUNECACHE_TRUST_STORE="yes", **env)


def _compiled(r: dict[str, Any]) -> list[str]:
    return [c["hash"] for c in r["compiles_at_preload"] + r["compiles_at_launch"] if not c["cache_hit"]]


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_kernels_compiled_inside_a_benchmark_are_not_filed_the_winners_binary_is(store_url, tmp_path):
    """Item 10: the tune phase compiles both configs inside tunecache's benchmark; none is filed as a
    torch.compile Triton kernel entry, and the winner's binary is uploaded by the tuner."""
    v1 = kernel_module(tmp_path / "v1", "in range")
    tuned = _run("tune", v1, tmp_path / "tuner", store_url, "tuner", TC_TRITONCACHE="1")
    assert tuned["stats"]["benchmarks"] == 2
    assert tuned["triton_kernels"] == []
    assert len(tuned["binaries"]) == 1 and tuned["binaries"] == tuned["spec_kernel_hashes"]


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_a_placed_binary_is_not_filed_again_as_this_hosts_own(store_url, tmp_path):
    """Item 3: a fresh host with the Triton cache seam places the stored winner's binary (a row it
    trusts); that placement is not a build of this process and is not filed as a signed entry."""
    v1 = kernel_module(tmp_path / "v1", "in range")
    tuned = _run("tune", v1, tmp_path / "tuner", store_url, "tuner")
    fresh = _run("restart", v1, tmp_path / "fresh", store_url, "fresh", TC_TRITONCACHE="1")
    assert fresh["loaded"] == 1 and _compiled(fresh) == []  # placed and preloaded: nothing compiled
    assert fresh["triton_kernels"] == []
    assert fresh["binaries"] == tuned["binaries"]


def _dump_then_edit(dump_dir: Path) -> Path:
    """Hand-edit the PTX a dump wrote (what a perf engineer's override is): returns the edited file."""
    ptx = sorted(dump_dir.rglob("add_two.ptx"))
    assert ptx, f"nothing dumped under {dump_dir}"
    for p in ptx:
        p.write_text(p.read_text() + "\n// hand-edited\n")
    return ptx[0]


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_a_dump_or_override_process_shares_nothing_it_built(store_url, tmp_path):
    """Item 2: TRITON_KERNEL_DUMP and TRITON_KERNEL_OVERRIDE do not enter Triton's key. A process with
    either compiles under the normal key; the tuner's upload, heal and the Triton cache seam file
    nothing of it, nor does the tuner store its timings. The same process without them shares as before."""
    v1, v2 = kernel_module(tmp_path / "v1", "in range"), kernel_module(tmp_path / "v2", "the lanes inside N")
    over = tmp_path / "override"
    dump = {"TRITON_KERNEL_DUMP": "1", "TRITON_DUMP_DIR": str(over), "TC_TRITONCACHE": "1"}
    dumped = _run("tune", v1, tmp_path / "dumper", store_url, "dumper", **dump)
    assert dumped["stats"]["benchmarks"] == 2
    assert dumped["binaries"] == [] and dumped["triton_kernels"] == []  # no code
    # ... and no timing (tuned in memory): a stock host finds nothing to hit and tunes (no code filed).
    tuned = _run("tune", v1, tmp_path / "tuner", store_url, "tuner")
    assert tuned["stats"]["benchmarks"] == 2 and tuned["binaries"] and tuned["spec_kernel_hashes"]

    # The edited text, dumped then overridden: heal must record nothing of what this process built.
    healed = _run("restart", v2, tmp_path / "dumper2", store_url, "dumper2", **dump)
    assert healed["stats"]["hits"] == 1 and _compiled(healed)
    assert healed["spec_kernel_hashes"] == tuned["spec_kernel_hashes"] and healed["binaries"] == tuned["binaries"]
    _dump_then_edit(over)
    override = {"TRITON_KERNEL_OVERRIDE": "1", "TRITON_OVERRIDE_DIR": str(over), "TC_TRITONCACHE": "1"}
    r = _run("restart", v2, tmp_path / "overrider", store_url, "overrider", **override)
    assert _compiled(r) == healed["launched"]  # Triton's normal key, built from the edited PTX
    assert r["spec_kernel_hashes"] == tuned["spec_kernel_hashes"]
    assert r["binaries"] == tuned["binaries"] and r["triton_kernels"] == []

    # Without the knobs, the same text heals: its spec and binary are recorded beside the old text's.
    clean = _run("restart", v2, tmp_path / "clean", store_url, "clean", TC_TRITONCACHE="1")
    assert clean["launched"] == healed["launched"] and not set(clean["launched"]) & set(tuned["binaries"])
    assert set(clean["launched"]) <= set(clean["spec_kernel_hashes"])
    assert clean["binaries"] == sorted(tuned["binaries"] + clean["launched"])


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_hosts_on_two_texts_heal_alternately_and_both_keep_their_specs(store_url, tmp_path):
    """Item 8: a rolling deploy of a comment edit. Old-text and new-text hosts each heal; neither
    deletes the other's spec, and a fresh host of either text compiles nothing."""
    v1, v2 = kernel_module(tmp_path / "v1", "in range"), kernel_module(tmp_path / "v2", "the lanes inside N")
    tuned = _run("tune", v1, tmp_path / "tuner", store_url, "old-1")
    old = tuned["spec_kernel_hashes"]
    new_host = _run("restart", v2, tmp_path / "new-1", store_url, "new-1")
    new = new_host["launched"]
    assert new != old and sorted(old + new) == new_host["spec_kernel_hashes"]
    # An old-text host and a new-text host, fresh, in turn: each places, preloads, compiles nothing.
    for kernel_dir, want, host in ((v1, old, "old-2"), (v2, new, "new-2")):
        r = _run("restart", kernel_dir, tmp_path / host, store_url, host)
        assert _compiled(r) == [] and r["launched"] == want and r["loaded"] == 1, host
        assert r["stats"]["preload_skipped"] == 0, host
        assert r["spec_kernel_hashes"] == sorted(old + new) and r["binaries"] == sorted(old + new), host


def test_a_process_whose_builds_stay_here_keeps_its_timings_here_too(sqlite_url, monkeypatch):
    """Timings of overridden builds are timings of other code under Triton's stock key (issue 35,
    item 2): such a process tunes its misses in memory and stores no problem, so no fresh host takes
    a winner chosen on hand-edited IR; what the store already holds it still reads."""
    import tinykernels

    from tunecache.store.opening import open_store

    tinykernels.launch(tinykernels.make_add(store=sqlite_url), 64)  # a stock host tunes N=64
    from triton import knobs

    monkeypatch.delitem(vars(knobs.compilation), "override", raising=False)  # the variable decides
    monkeypatch.setenv("TRITON_KERNEL_OVERRIDE", "1")
    k = tinykernels.make_add(store=sqlite_url)
    tinykernels.launch(k, 64)  # a hit: read as any host reads it
    tinykernels.launch(k, 128)  # a miss: benchmarked here, launched, not stored
    assert len(k.cache) == 2
    s = open_store(sqlite_url)
    try:
        assert s.counts()["problems"] == 1  # N=64 only
    finally:
        s.close()
