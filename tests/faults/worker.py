"""Child-process programs for the fault tests: ``python tests/faults/worker.py CMD '<json args>'``.

Each one is a small "server start-up" using the real autotuner on the tiny add kernel under the
Triton interpreter, and prints one ``RESULT {json}`` line on stdout for the parent to assert on.
Logging goes to stderr as ``LOG LEVEL logger: message`` lines so the parent can count warnings.

Environment read here:
  TUNECACHE_FAULTS_BENCH_SLEEP  seconds every config's benchmark sleeps (default 0): makes a
                                benchmark long enough to kill a process in the middle of it
  TUNECACHE_FAULTS_STATUS_DIR   where each worker writes ``<pid>`` = "bench" while it is inside a
                                benchmark and "idle" otherwise (the parent picks its victims there),
                                and appends "<size> <configs benchmarked>" to ``<pid>.done`` for each
                                key it finished tuning
  TUNECACHE_FAULTS_GO           a file: workers that set up first wait for it to appear (at most 120 s)
  TUNECACHE_FAULTS_LOG          log level (default INFO)
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/: tinykernels

faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack (a stuck worker)
BENCH_SLEEP = float(os.environ.get("TUNECACHE_FAULTS_BENCH_SLEEP", "0") or 0)
STATUS_DIR = os.environ.get("TUNECACHE_FAULTS_STATUS_DIR")


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.getMessage()}")


WARNINGS = _Count()
logging.basicConfig(
    level=getattr(logging, os.environ.get("TUNECACHE_FAULTS_LOG", "INFO")),
    format=os.environ.get("TUNECACHE_FAULTS_LOGFMT", "LOG %(levelname)s %(name)s: %(message)s"),
    stream=sys.stderr,
)
logging.getLogger("tunecache").addHandler(WARNINGS)
if os.environ.get("TUNECACHE_FAULTS_LOG") == "DEBUG":
    logging.getLogger("sqlalchemy").setLevel(logging.DEBUG)  # SQLAlchemy sets itself to WARN on import


def _status(state: str) -> None:
    if STATUS_DIR:
        with open(os.path.join(STATUS_DIR, str(os.getpid())), "w") as f:
            f.write(state)


def slow_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)):
    """A benchmarker that runs the config once and then sleeps BENCH_SLEEP seconds."""
    _status("bench")
    try:
        t0 = time.perf_counter()
        kernel_call()
        ms = (time.perf_counter() - t0) * 1e3
        if BENCH_SLEEP:
            time.sleep(BENCH_SLEEP)
        return [ms] * len(quantiles)
    finally:
        _status("idle")


def _prime() -> None:
    """Import torch and run the interpreter once, so that start-up cost is not inside a measured run."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _touch(x, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs) + 1)

    x = torch.zeros(16)
    _touch[(1,)](x, BLOCK=16)
    assert float(x.sum()) == 16.0


def configs() -> list:
    """The add kernel's configs here: large blocks, so a launch under the interpreter runs few programs
    and 16 workers on two cores spend their time in the store protocol, not in the interpreter."""
    import triton

    return [triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128, 256) for w in (1, 2)]


def _kernel(url: str, n_configs: int | None = None, slow: bool = True):
    import tinykernels

    _prime()
    k = tinykernels.make_add(configs=configs()[: n_configs or None], store=url)
    if slow:
        k._do_bench = slow_bench
    return k


def _wait(start_at: float) -> None:
    """Start together: at ``start_at``, or when the file named by TUNECACHE_FAULTS_GO appears."""
    go = os.environ.get("TUNECACHE_FAULTS_GO")
    end = time.time() + 120
    while (not os.path.exists(go) if go else time.time() < start_at) and time.time() < end:
        time.sleep(0.005)


def _finish(deadline_s: float = 30.0) -> bool:
    """Flush deferred writes, retrying for a bounded time; True when nothing is left queued."""
    import tunecache
    from tunecache.process import writeback

    end = time.monotonic() + deadline_s
    while True:
        if tunecache.flush() and writeback.pending_puts() == 0:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.5)


def _result(**extra) -> dict:
    import tunecache
    from tunecache.problem.target import hostname
    from tunecache.process import writeback

    return {
        "pid": os.getpid(),
        "host": hostname(),
        "stats": tunecache.stats(),
        "warnings": WARNINGS.messages,
        "pending_puts": writeback.pending_puts(),
        **extra,
    }


def warm(url: str, sizes: list[int], start_at: float, n_configs: int | None = None) -> dict:
    """Warm the kernel over ``sizes`` in the given order (a server before CUDA-graph capture)."""
    import tinykernels

    import tunecache

    k = _kernel(url, n_configs)
    _status("idle")  # ready: imports done
    _wait(start_at)
    t0, cpu0 = time.time(), time.process_time()
    winners, errors, timeline = {}, [], []
    for n in sizes:
        t1 = time.time()
        before = tunecache.stats()["benchmarks"]
        try:
            winners[n] = str(tinykernels.launch(k, n))
        except Exception as e:  # noqa: BLE001 - reported, and the parent asserts there are none
            errors.append("".join(traceback.format_exception(e))[-2000:])
        timeline.append([n, round(t1 - t0, 2), round(time.time() - t1, 2)])
        done = tunecache.stats()["benchmarks"] - before
        if done and STATUS_DIR:  # a journal that outlives a kill -9: keys this process finished tuning
            with open(os.path.join(STATUS_DIR, f"{os.getpid()}.done"), "a") as f:
                f.write(f"{n} {done}\n")
    flushed = _finish()
    return _result(
        winners=winners,
        errors=errors,
        flushed=flushed,
        started=t0,
        finished=time.time(),
        cpu_s=round(time.process_time() - cpu0, 2),
        timeline=timeline,
    )


def churn(url: str, sizes: list[int], start_at: float, duration: float, new_every: float, n_configs: int) -> dict:
    """Keep launching for ``duration`` s: a new key every ``new_every`` s, known keys in between.

    Every launch checks the kernel's output. Exceptions are counted, not raised, so the parent
    sees all of them; the parent asserts there are none.
    """
    import tinykernels

    k = _kernel(url, n_configs, slow=False)
    _status("idle")  # ready
    _wait(start_at)
    t0 = time.monotonic()
    end = t0 + duration
    known: list[int] = []
    launches, errors, introduced, ok_at = 0, [], [], []
    next_new = t0
    for _ in range(100_000):  # bounded: ends by time long before this
        now = time.monotonic()
        if now > end:
            break
        if now >= next_new and len(known) < len(sizes):
            n = sizes[len(known)]
            known.append(n)
            introduced.append([n, round(time.time(), 3)])
            next_new = now + new_every
        else:
            n = known[launches % len(known)]
        try:
            tinykernels.launch(k, n)
            ok_at.append(round(time.time(), 2))
        except Exception as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-2000:])
        launches += 1
        time.sleep(0.01)
    flushed = _finish(30.0)
    return _result(launches=launches, errors=errors, introduced=introduced, flushed=flushed, ok_at=ok_at)


def open_only(url: str, start_at: float) -> dict:
    """Open (and, being first, create) the store at the same moment as the siblings."""
    from tunecache.store.opening import open_store

    _status("idle")  # ready
    _wait(start_at)
    t0 = time.time()
    error = None
    rev = None
    try:
        s = open_store(url)
        rev = s.revision()
        s.close()
    except Exception as e:  # noqa: BLE001
        error = "".join(traceback.format_exception(e))[-3000:]
    return _result(revision=rev, error=error, seconds=time.time() - t0)


def kernel(url: str, sizes: list[int], fill: str | None = None, die: bool = False) -> dict:
    """Launch the kernel for ``sizes`` on ``url``; with ``fill``, fill that filesystem after the first.

    With ``die``, end by kill -9 of itself once everything is written: SQLite's WAL is left behind
    un-checkpointed, as after a crash.
    """
    import tinykernels

    k = _kernel(url, slow=False)
    winners, errors = {}, []
    for i, n in enumerate(sizes):
        if i == 1 and fill:
            _fill(fill)
        try:
            winners[n] = str(tinykernels.launch(k, n))
        except Exception as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-2000:])
    flushed = _finish(2.0)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    return _result(winners=winners, errors=errors, flushed=flushed)


def _fill(path: str) -> None:
    """Write to ``path`` until the filesystem is full (bounded by the filesystem's own size)."""
    chunk = b"\0" * 4096
    with open(path, "wb", buffering=0) as f:
        for _ in range(1_000_000):
            try:
                f.write(chunk)
            except OSError:
                break
    small = b"\0" * 64
    with open(path + ".tail", "wb", buffering=0) as f:  # the last partial block
        for _ in range(1000):
            try:
                f.write(small)
            except OSError:
                break


def poisoned(url: str, bad_index: int, sizes: list[int]) -> dict:
    """A fresh process whose config list holds a config that cannot compile (BLOCK=3) at ``bad_index``."""
    import tinykernels
    import triton

    cfgs = configs()
    cfgs[bad_index] = triton.Config({"BLOCK": 3}, num_warps=cfgs[bad_index].num_warps)
    _prime()
    k = tinykernels.make_add(configs=cfgs, store=url)
    used, errors = {}, []
    for n in sizes:
        try:
            cfg = tinykernels.launch(k, n)  # asserts the output
            used[n] = {"kwargs": cfg.kwargs, "num_warps": cfg.num_warps}
        except Exception as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-2000:])
    flushed = _finish(5.0)
    return _result(used=used, errors=errors, flushed=flushed)


def open_threads(urls: list[str]) -> dict:
    """Open (and create) every store of ``urls`` at once, one thread each, in this one process."""
    import threading

    from tunecache.store.opening import open_store

    errors: list[str] = []
    revisions: dict[str, str | None] = {}
    barrier = threading.Barrier(len(urls), timeout=60)

    def one(url: str) -> None:
        try:
            barrier.wait()
            s = open_store(url)
            revisions[url] = s.revision()
            s.close()
        except Exception as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-2000:])

    threads = [threading.Thread(target=one, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return _result(errors=errors, revisions=revisions)


def counters(url: str, start_at: float, rounds: int) -> dict:
    """Flush hit counts and per-kernel counters for every stored problem, in a shuffled order,
    ``rounds`` times, at the same moment as the siblings (a fleet's deferred writes)."""
    import random

    from tunecache.errors import StoreError
    from tunecache.store.opening import open_store

    s = open_store(url)
    digests = [p.digest for p in s.find_problems()]
    _status("idle")
    _wait(start_at)
    errors: list[str] = []
    for _ in range(rounds):
        random.shuffle(digests)
        kernels = ["k.a", "k.b", "k.c"]
        random.shuffle(kernels)
        try:
            s.record_hits({d: 1 for d in digests})
            s.bump_stats({k: {"hits": 1, "bench_seconds": 0.5} for k in kernels})
        except StoreError as e:
            errors.append(str(e))
    s.close()
    return _result(errors=errors)


if __name__ == "__main__":
    cmd, args = sys.argv[1], json.loads(sys.argv[2])
    fn = {
        "warm": warm,
        "churn": churn,
        "open": open_only,
        "kernel": kernel,
        "poisoned": poisoned,
        "counters": counters,
        "open_threads": open_threads,
    }[cmd]
    out = fn(**args)
    print("RESULT " + json.dumps(out), flush=True)
