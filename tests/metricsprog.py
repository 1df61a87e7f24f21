"""Processes whose metrics tests/test_metrics.py scrapes: ``python metricsprog.py MODE ...``.

``zero [PORT]``: a zero-code process (run it with ``TUNECACHE_INSTALL=1``): a plain
``triton.autotune`` kernel, tuned over two keys, then defined again and launched (two hits, as a
restart has). With ``PORT`` it first serves prometheus_client's default registry on 127.0.0.1:PORT
itself, as an inference server does. It prints ``RESULT {json}`` (its counters), then waits for a
line on stdin before it ends, so that its ``/metrics`` can be scraped while it lives.

``late PORT DIR``: as ``zero``, and only then, as SGLang's launcher does, sets
``PROMETHEUS_MULTIPROC_DIR=DIR``, imports prometheus_client, counts a metric of its own and serves
the directory's sum on 127.0.0.1:PORT; ``RESULT`` also says whether prometheus_client runs in its
multiprocess mode (it would not, had tunecache imported it first).

``worker URL START_AT [fork|live]``: one of several processes tuning one kernel on one store at
once (prometheus_client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR``). ``fork``: it then forks
a child that tunes one more key and ends through ``sys.exit``; ``live``: it syncs every 0.2 s and
waits for a line on stdin before it ends (its counts reach the directory by its thread, not its end).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

SIZES = (16, 40)


def zero(port: int | None, late_dir: str | None = None) -> None:
    if port is not None and late_dir is None:
        import prometheus_client

        prometheus_client.start_http_server(port, addr="127.0.0.1")
    import torch
    import triton
    import triton.language as tl

    def define():
        @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["N"])
        @triton.jit
        def add(x, y, out, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < N
            tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

        return add

    for kernel in (define(), define()):  # tuned, then served as a restart's would be
        for n in SIZES:
            x, out = torch.arange(n, dtype=torch.float32), torch.empty(n)
            kernel[lambda meta, n=n: (triton.cdiv(n, meta["BLOCK"]),)](x, x, out, n)
            assert torch.equal(out, 2 * x)
    stats = sys.modules["tunecache"].stats()  # imported by the start-up hook alone
    out = {"pid": os.getpid(), "stats": stats, "imported": "prometheus_client" in sys.modules}
    if late_dir is not None:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = late_dir
        import prometheus_client
        from prometheus_client import multiprocess, values

        prometheus_client.Counter("server_requests", "the server's own metric").inc()
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
        out["multiprocess"] = values.ValueClass is not values.MutexValue
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdin.readline()


def worker(url: str, start_at: float, how: str | None) -> None:
    import tinykernels

    import tunecache
    from tunecache.metrics import mirror

    if how == "live":
        mirror.SYNC_S = 0.2
    configs = tinykernels.CONFIGS[:2]
    kernel = tinykernels.make_add(configs=configs, store=url)
    while time.time() < start_at:  # start together
        time.sleep(0.005)
    for n in SIZES:
        tinykernels.launch(kernel, n)
    out = {"pid": os.getpid(), "stats": tunecache.stats()}
    if how == "fork":
        tunecache.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            before = tunecache.stats()
            tinykernels.launch(tinykernels.make_add(configs=configs, store=url), 72)
            own = {k: v - before[k] for k, v in tunecache.stats().items()}
            os.write(w, json.dumps({"pid": os.getpid(), "stats": own}).encode())
            os.close(w)
            sys.exit(0)  # the interpreter's exit: its last words sync its files
        os.close(w)
        _, status = os.waitpid(pid, 0)
        out["child"] = json.loads(os.read(r, 1 << 20))
        out["child_status"] = status
    print("RESULT " + json.dumps(out), flush=True)
    if how == "live":
        sys.stdin.readline()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "zero":
        zero(int(args[0]) if args else None)
    elif mode == "late":
        zero(int(args[0]), args[1])
    else:
        worker(args[0], float(args[1]), args[2] if len(args) > 2 else None)
