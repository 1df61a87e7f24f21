"""A host of a fleet that gets and puts torch.compile entries through Inductor's own cache class
(``RemoteFxGraphCache``), as a compile does: on a miss it "compiles" (makes its own value) and puts
it. Prints one JSON line: what it was served, what it computed, its counters.

Run as ``python tests/inductor_put_prog.py JSON`` with ``{"host", "keys", "rounds", "start_at"}``,
and optionally ``"done"`` (a file written when finished) and ``"last_round_after"`` (a file whose
existence the last round waits for: that round runs after another host has finished)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    args = json.loads(sys.argv[1])
    from torch._inductor.remote_cache import RemoteFxGraphCache

    from tunecache.inductor import enable, entries

    enable.enable()
    cache = RemoteFxGraphCache("tc-fleet-v1")
    while time.time() < args["start_at"]:  # start together
        time.sleep(0.005)
    served: list[str] = []
    computed = 0
    for r in range(args["rounds"]):
        if r == args["rounds"] - 1 and args.get("last_round_after"):
            while not Path(args["last_round_after"]).exists():
                time.sleep(0.02)
        for k in args["keys"]:
            got = cache.get(k)
            if got is None:
                computed += 1
                cache.put(k, {"by": args["host"], "round": r})
            else:
                served.append(got["by"])
    if args.get("done"):
        Path(args["done"]).write_text("done")
    print(json.dumps({"served": served, "computed": computed, "stats": entries.stats()}))


if __name__ == "__main__":
    main()
