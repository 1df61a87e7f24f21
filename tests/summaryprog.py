"""A process that tunes or restarts an add kernel, for the summary tests of tests/test_process_end.py:
``python summaryprog.py URL [fork]``.

It launches a fresh kernel over ``SIZES`` and prints its own counters (``tunecache.stats()``) as one
JSON line; with ``fork``, it then forks a child that resolves one more size with a kernel of its
own (a hit once stored) and ends through ``sys.exit`` (so the child's atexit runs, as a forked
server worker's does), and adds the child's counters.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

import tinykernels  # noqa: E402

import tunecache  # noqa: E402

SIZES = [16, 40, 72]
CONFIGS = tinykernels.CONFIGS[:2]

if __name__ == "__main__":
    url = sys.argv[1]
    kernel = tinykernels.make_add(configs=CONFIGS, store=url)
    for n in SIZES:
        tinykernels.launch(kernel, n)
    out = {"pid": os.getpid(), "stats": tunecache.stats()}
    if sys.argv[2:] == ["fork"]:
        tunecache.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            tinykernels.launch(tinykernels.make_add(configs=CONFIGS, store=url), SIZES[0])
            before = dict(out["stats"])
            os.write(w, json.dumps({"pid": os.getpid(), "stats": tunecache.stats(), "before": before}).encode())
            os.close(w)
            sys.exit(0)  # the interpreter's exit: atexit runs in the child
        os.close(w)
        _, status = os.waitpid(pid, 0)
        out["child"] = json.loads(os.read(r, 1 << 20))
        out["child_status"] = status
    print(json.dumps(out), flush=True)
