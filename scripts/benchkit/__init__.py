"""The benches' shared harness: what every ``scripts/bench_*.py`` used to write for itself.

- :mod:`benchkit.procs`: a child process started with its environment, timed, its result (the last
  JSON line it prints) read back; many at once;
- :mod:`benchkit.timing`: time per call, medians and percentiles, interleaved rounds;
- :mod:`benchkit.memory`: a process's own peak RSS;
- :mod:`benchkit.records`: the JSON record of a run (with its date and device) and markdown tables;
- :mod:`benchkit.gates`: a bench's targets as one gate, which ``--check`` turns into exit status 1;
- :mod:`benchkit.compiles`: Triton's compiles and cache hits, counted in a process or in every
  process of a start (the ``sitecustomize`` hook and its log);
- :mod:`benchkit.calls`: a method's calls counted at the class level (benchmarks, autotunes);
- :mod:`benchkit.tracing`: tunecache's debug log kept with its times, cProfile's top rows;
- :mod:`benchkit.stores`: the stores, key pairs and ``tunecache`` commands a bench sets up.

A bench is its scenario: which processes it starts, in which order, and what it reports. Nothing
here imports tunecache, torch or Triton at import time, so a bench's child can use it without
changing what it measures. ``scripts/`` is on ``sys.path`` when a bench runs as a script; a test or
another bench that imports one puts it there.
"""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent
ROOT = SCRIPTS.parent
