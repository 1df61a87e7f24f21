"""One process of a host of a torch.compile fleet, for tests/test_inductor_leases.py:
``python inductor_lease_prog.py ROLE CACHE KEY`` with ``TUNECACHE_URL``, ``TUNECACHE_HOST_ID`` and
the lease settings in the environment.

It drives Inductor's own remote cache class ``CACHE`` (``RemoteFxGraphCache``, ``RemoteAutotuneCache``...)
with tunecache as its backend (``enable()``), as Inductor does on a miss. Roles:

- ``get``: a get, then exit without a put (an entry Inductor does not keep, a process that ends);
- ``hold``: a get, then live on, idle, without a put until killed (a kernel never launched);
- ``compiling-hold``: a get inside a compile that goes on until the process is killed;
- ``compile-end``: a get inside a compile (dynamo's compile callbacks, as torch.compile runs them),
  the compile ends without a put, the process lives on;
- ``compute-put SECONDS``: a get inside a compile, then (once a line comes on stdin) SECONDS of
  computing, then the put;
- ``put``: only the put (another process of a host whose process took the lease);
- ``wait``: prints ``LOOKING PID``, then a get; prints how long it took, when it ended and what it returned.

It prints ``HELD PID`` once its get is done (the test then starts the other host), and one JSON line
as its last line of output (for the roles that end by themselves).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import torch._dynamo  # noqa: F401 - loaded before Inductor's caches, as by torch.compile
from torch._inductor import remote_cache

from tunecache.inductor import enable
from tunecache.process import counters

VALUE = {"data": "Y29tcGlsZWQgZ3JhcGg=", "time_taken_ms": 1234}


def compiling():
    """The compile callbacks torch.compile runs around a frame's compile (torch >= 2.6)."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    return callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/0")


def main() -> None:
    role, cls_name, key = sys.argv[1:4]
    enable.enable(switch_on=False)
    cache = getattr(remote_cache, cls_name)("tc-lease-test")
    out: dict = {"role": role}
    if role == "get":
        out["got"] = cache.get(key)
    elif role == "hold":
        out["got"] = cache.get(key)
        print("HELD", os.getpid(), flush=True)
        time.sleep(600)
    elif role == "compiling-hold":
        with compiling():
            out["got"] = cache.get(key)
            print("HELD", os.getpid(), flush=True)
            time.sleep(600)
    elif role == "compile-end":
        with compiling():
            out["got"] = cache.get(key)
        print("HELD", os.getpid(), flush=True)
        time.sleep(600)
    elif role == "compute-put":
        with compiling():
            out["got"] = cache.get(key)
            print("HELD", os.getpid(), flush=True)
            sys.stdin.readline()  # the test's go: the other host is looking now
            time.sleep(float(sys.argv[4]))
            cache.put(key, VALUE)
    elif role == "put":
        cache.put(key, VALUE)
    elif role == "wait":
        print("LOOKING", os.getpid(), flush=True)
        t = time.monotonic()
        out["got"] = cache.get(key)
        out["seconds"], out["end"] = time.monotonic() - t, time.time()
    out["stats"] = {k: v for k, v in counters.stats().items() if v}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
