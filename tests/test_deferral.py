"""tunecache.defer_busy() (issue 36): a walk over many keys skips, for now, a key another live process
is benchmarking, so that a cold fleet spreads its keys over its hosts instead of waiting key by key.

Inside the context a launch whose key misses and whose lease (or host lock) another live process holds
raises ``tunecache.Busy`` at once: nothing launched or benchmarked, nothing cached, no lease taken, no
wait counted, the tuner as it was. Outside it, and wherever tunecache would not wait, nothing changes.
The fleet itself (processes warming the bundled kernel together) is in tests/test_rollout.py and
tests/test_rollout_spread.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
import tinykernels
import torch
import triton

import tunecache
from tunecache.store.opening import open_store
from tunecache.store.schema import leases
from tunecache.tuner import singleflight

N = 100


def digest_of(tmp_path) -> str:
    """The store's digest of tinykernels' add kernel at N (tuned once, in a store of its own)."""
    url = f"sqlite:///{tmp_path / 'probe.sqlite3'}"
    tinykernels.launch(tinykernels.make_add(store=url), N)
    tunecache.flush()
    (p,) = open_store(url).find_problems()
    tunecache.reset_stats()
    return p.digest


def lease_elsewhere(url: str, digest: str) -> None:
    """The benchmark lease of ``digest`` as a live process on another host holds it (renewed: a minute left)."""
    s = open_store(url)
    with s.engine.connect() as c:
        c.execute(
            sa.insert(leases).values(
                digest=digest, holder="other-host:4242:x", host="other-host", pid=4242, expires_at=time.time() + 60
            )
        )
        c.commit()


def holder(url: str, digest: str) -> str | None:
    row = open_store(url).lease_of(digest)
    return row and row["holder"]


def launch_raw(kernel) -> torch.Tensor:
    """Launch the add kernel at N into an output filled with -1; the output."""
    x, y, out = torch.arange(N, dtype=torch.float32), torch.full((N,), 2.0), torch.full((N,), -1.0)
    kernel[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, y, out, N)
    return out


def test_inside_defer_busy_a_key_another_process_benchmarks_raises_busy_at_once_and_changes_nothing(
    store_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "30")
    digest = digest_of(tmp_path)
    lease_elsewhere(store_url, digest)
    k = tinykernels.make_add(store=store_url)
    out = torch.full((N,), -1.0)
    t = time.monotonic()
    with tunecache.defer_busy(), pytest.raises(tunecache.Busy) as e:
        out = launch_raw(k)
    assert time.monotonic() - t < 5  # not the 30 s wait
    assert isinstance(e.value, tunecache.TunecacheError)
    assert e.value.kernel == k._tc_name and '"N"' in e.value.key and "100" in e.value.key
    assert "another process is benchmarking" in str(e.value)
    assert torch.all(out == -1)  # nothing launched
    assert k.nargs is None and k.cache == {} and getattr(k, "best_config", None) is None
    s = tunecache.stats()
    assert (s["benchmarks"], s["waits"], s["misses"], s["hits"]) == (0, 0, 0, 0)
    assert holder(store_url, digest) == "other-host:4242:x"  # theirs still; none taken here
    assert open_store(store_url).find_problems() == []  # nothing stored

    # Once the other process is done (here: gone, its lease released), the deferred key launches.
    open_store(store_url).release_lease(digest, None)
    with tunecache.defer_busy():
        tinykernels.launch(k, N)
    assert tunecache.stats()["benchmarks"] == len(tinykernels.CONFIGS)
    assert tunecache.stats()["misses"] == 1  # the deferred launch counted nothing


def test_outside_defer_busy_the_launch_waits_as_before(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "0.5")
    digest = digest_of(tmp_path)
    lease_elsewhere(sqlite_url, digest)
    k = tinykernels.make_add(store=sqlite_url)
    with tunecache.defer_busy():
        pass  # left: nothing holds
    t = time.monotonic()
    tinykernels.launch(k, N)  # waits in vain for the other host, then benchmarks here
    assert time.monotonic() - t >= 0.4
    s = tunecache.stats()
    assert s["waits"] == 1 and s["benchmarks"] == len(tinykernels.CONFIGS)


def test_a_thread_that_did_not_enter_the_context_waits(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "0.3")
    digest = digest_of(tmp_path)
    lease_elsewhere(sqlite_url, digest)
    k = tinykernels.make_add(store=sqlite_url)
    got: list[object] = []

    def other() -> None:
        try:
            got.append(tinykernels.launch(k, N))
        except BaseException as e:  # noqa: BLE001 - reported below
            got.append(e)

    with tunecache.defer_busy():
        th = threading.Thread(target=other)
        th.start()
        th.join()
    assert isinstance(got[0], triton.Config), got  # it waited, then benchmarked: no Busy
    assert tunecache.stats()["waits"] == 1


def test_a_key_held_by_another_process_of_this_host_is_busy_too(sqlite_url, tmp_path, monkeypatch):
    """Its host lock, not only the store's lease: another worker on this host is benchmarking it."""
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "5")
    digest = digest_of(tmp_path)
    lock = singleflight.host_lock(open_store(sqlite_url), digest)
    code = "import sys, filelock; l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); input()"
    p = subprocess.Popen([sys.executable, "-c", code, lock.lock_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"held"
        k = tinykernels.make_add(store=sqlite_url)
        with tunecache.defer_busy(), pytest.raises(tunecache.Busy):
            launch_raw(k)
        assert k.nargs is None and k.cache == {}
    finally:
        p.communicate(b"\n", timeout=30)


def test_inside_defer_busy_stored_and_free_keys_launch_as_always(sqlite_url):
    k = tinykernels.make_add(store=sqlite_url)
    with tunecache.defer_busy():
        tinykernels.launch(k, N)  # nobody holds it: benchmarked here
        tinykernels.launch(tinykernels.make_add(store=sqlite_url), N)  # stored: served
    s = tunecache.stats()
    assert s["benchmarks"] == len(tinykernels.CONFIGS) and s["hits"] == 1


def cpu_bench(call, quantiles):  # stock Triton's benchmarker needs a GPU
    call()
    t0 = time.perf_counter()
    call()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms, ms, ms]


def test_with_tunecache_off_nothing_is_deferred(sqlite_url, tmp_path, monkeypatch):
    digest = digest_of(tmp_path)
    lease_elsewhere(sqlite_url, digest)
    k = tinykernels.make_add(store=sqlite_url)  # tunecache's, then turned off before its launch
    monkeypatch.setenv("TUNECACHE_MODE", "off")
    stock = tinykernels.make_add(store=sqlite_url, do_bench=cpu_bench)  # defined while off: Triton's own
    with tunecache.defer_busy():
        assert isinstance(tinykernels.launch(k, N), triton.Config)  # benchmarked, no lease asked for
        assert isinstance(tinykernels.launch(stock, N), triton.Config)
    assert holder(sqlite_url, digest) == "other-host:4242:x"


def test_a_stock_triton_kernel_is_never_deferred():
    import triton.language as tl

    @triton.autotune(configs=tinykernels.CONFIGS[:2], key=["N"], do_bench=cpu_bench)
    @triton.jit
    def stock_add(x, y, out, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    with tunecache.defer_busy():
        assert torch.equal(launch_raw(stock_add), torch.arange(N, dtype=torch.float32) + 2)
