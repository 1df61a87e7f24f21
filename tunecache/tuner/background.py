"""Background work: one worker thread per process, Triton's fingerprint warm-up, preloads once CUDA
is up, and what a forked child must not inherit of them.

None of it is on the launch path: a kernel's definition queues its prefetch here, so that the first
launch pays no query, no connection set-up and no compiler fingerprint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from tunecache import tritoncompat
from tunecache.binaries import preload
from tunecache.process import forks

# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread:
# ast.parse in two threads at once can raise "SystemError: AST constructor recursion depth mismatch"
# in either of them (reproduced here on 3.11.7, not on 3.10, 3.12 or 3.13; CPython gh-106905).
# There the source is hashed on the thread that defines the kernel (a few ms per kernel at import)
# and the background work is store I/O only, so it never races Triton's own parse of a kernel.
AST_NOT_THREAD_SAFE = sys.version_info[:2] == (3, 11)


class Tuner(Protocol):
    """What this module needs of a tunecache autotuner."""

    def load_winners(self, device: int | None = None) -> int: ...

    def ready_to_preload(self) -> bool: ...

    def after_fork_in_child(self) -> None: ...


_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_pool_lock = threading.Lock()
_tuners: weakref.WeakSet[Any] = weakref.WeakSet()
_autoload: weakref.WeakSet[Any] = weakref.WeakSet()  # to preload once CUDA is up
_autoload_pid: int | None = None  # the process whose torch queue holds _load_when_cuda_is_up
_key_thread: threading.Thread | None = None
_key_pid: int | None = None  # the process that started it: a forked child starts its own


def register(tuner: Tuner) -> None:
    """Keep ``tuner`` (weakly) for :func:`tuners`, the preloads and the fork handler."""
    _tuners.add(tuner)


def unregister(tuner: Tuner) -> None:
    """Forget ``tuner`` (``uninstall()`` released it to Triton)."""
    _tuners.discard(tuner)
    _autoload.discard(tuner)


def tuners() -> list[Any]:
    """Every tunecache autotuner of this process still alive."""
    return list(_tuners)


def submit(fn: Callable[[], Any]) -> Future:
    """Run ``fn`` on the worker thread: one per process, jobs in order (a preload runs after its
    kernel's prefetch). A forked child gets its own: the parent's thread does not exist there."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunecache")
            _pool_pid = os.getpid()
        return _pool.submit(fn)


def preload_when_cuda_is_up(tuner: Tuner) -> None:
    """Have ``tuner``'s winners loaded in the background once CUDA is initialised: one callback per
    process on torch's lazy-init queue covers every kernel defined before that; a kernel defined
    after it is queued at once."""
    global _autoload_pid
    _autoload.add(tuner)
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        with _pool_lock:
            if _autoload_pid == os.getpid():
                return
            _autoload_pid = os.getpid()
    preload.on_cuda_init(_load_when_cuda_is_up)  # runs it now if CUDA is up already


def forget_cuda_callback() -> None:
    """Forget that this process queued its callback on torch's lazy-init queue (for tests that
    replace that queue)."""
    global _autoload_pid
    with _pool_lock:
        _autoload_pid = None


def _load_when_cuda_is_up() -> None:
    """Queue, behind the prefetches, the preload of every kernel marked for it. Only where the
    device is unambiguous: with several visible GPUs the device a worker will use is not known
    yet, and it calls ``tunecache.load_winners()`` itself."""
    import torch

    if torch.cuda.device_count() != 1:
        return
    todo = list(_autoload)
    _autoload.clear()  # once: a kernel defined later is queued by itself

    def load_ready() -> bool:  # on the worker, whose current device is that one
        todo[:] = [t for t in todo if t in _tuners and not _loaded_if_ready(t)]  # not released by uninstall()
        if not todo:
            preload.summarise_skips()  # the pass is over: one line for what it skipped
        return not todo

    retry(load_ready, first_delay=0.0)


def _loaded_if_ready(tuner: Any) -> bool:
    """Load ``tuner``'s winners if it may hash its source now (its module finished importing)."""
    if not tuner.ready_to_preload():
        return False
    tuner.load_winners()
    return True


#: A kernel whose module still imports when CUDA comes up (a library that queries the GPU while it
#: imports: fla-core) is preloaded again every PRELOAD_RETRY_S, for at most PRELOAD_RETRY_FOR_S.
PRELOAD_RETRY_S = 0.1
PRELOAD_RETRY_FOR_S = 120.0


def retry(job: Callable[[], bool], first_delay: float = PRELOAD_RETRY_S) -> None:
    """Run ``job`` on the worker (after ``first_delay`` seconds; 0: queued at once), then again every
    PRELOAD_RETRY_S until it returns True (done), for at most PRELOAD_RETRY_FOR_S: for a preload
    that waits for a module still importing."""
    give_up_at = time.monotonic() + PRELOAD_RETRY_FOR_S

    def later(delay: float) -> None:
        timer = threading.Timer(delay, lambda: submit(again))
        timer.daemon = True
        timer.start()

    def again() -> None:
        if not job() and time.monotonic() < give_up_at:
            later(PRELOAD_RETRY_S)

    if first_delay > 0:
        later(first_delay)
    else:
        submit(again)


def warm_triton_key() -> None:
    """Once per process, in a daemon thread: compute Triton's compiler fingerprint (``triton_key``).

    Triton computes it at the first compile of every process, cache hits included, by hashing its
    own sources and libtriton (0.33 s on the H200 test host, most of a warm restart's first launch).
    Done while the server is still loading weights, it is off the first launch. Pure file hashing:
    no CUDA. A fork waits (at most 2 s) for it, so that no import lock is held across the fork.
    """
    global _key_thread, _key_pid
    with _pool_lock:
        if _key_pid == os.getpid():
            return
        triton_key = tritoncompat.triton_key()  # moved in 3.5; tests/test_triton_names.py checks it resolves
        if triton_key is None:
            return

        def work() -> None:
            with contextlib.suppress(Exception):
                triton_key()

        _key_pid = os.getpid()
        _key_thread = threading.Thread(target=work, name="tunecache-triton-key", daemon=True)
        _key_thread.start()


def triton_key_thread() -> threading.Thread | None:
    """The thread :func:`warm_triton_key` started (None: not started in this process's parent
    chain), for tests that wait for it."""
    return _key_thread


def fork_locks() -> dict[str, Any]:
    """This module's locks, which a forked child gets fresh (for tests/test_fork.py)."""
    return {"background.pool_lock": _pool_lock}


def _join_key_thread_before_fork() -> None:
    t = _key_thread
    if t is not None and t.is_alive():
        t.join(timeout=2.0)


def _after_fork_in_child() -> None:
    """Fresh locks and background state in a forked child (the parent's threads do not exist there),
    and each tuner drops what belongs to the parent (see ``TunecacheAutotuner.after_fork_in_child``)."""
    global _pool, _pool_pid, _pool_lock
    _pool_lock = threading.Lock()
    _pool, _pool_pid = None, None
    for t in list(_tuners):
        t.after_fork_in_child()


forks.register(__name__, _after_fork_in_child, before=_join_key_thread_before_fork)
