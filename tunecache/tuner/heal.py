"""Healing: after a comment edit, the first compile of a stored winner records its spec and binary.

tunecache's source hash ignores comments and formatting (:mod:`tunecache.problem.identity`); Triton's cache
key does not. After such an edit every stored problem still hits (the tuning results still apply),
but the launch specs and binaries stored with them are those of the old text, under Triton's old
key: every fresh host compiles every winner again, its preload skips every stored spec, and no
tuning process ever records new ones, since nothing misses.

So when Triton compiles a tuned kernel for a launch (its ``jit_post_compile_hook``, which
:mod:`tunecache.tuner.companions` watches: called once per specialisation a process compiles or loads,
never on the launch path), a readwrite process records, in the background, the specialisations of
the stored winners it launched that the store holds under no spec of this Triton key, with their
binaries (``TunecacheAutotuner.record_hit_specs``: through ``KernelStore.record_specs`` and
``binaries.upload``, as a tuning process records its winners). The first host to compile a winner
after the edit records it; the hosts after it place and preload it. A spec is added beside the other
text's, never in its place (``preload.for_binary``): during a rolling deploy old-text and new-text
hosts would otherwise delete each other's specs; ``Store.gc_launch_specs`` drops the superseded ones.
"""

from __future__ import annotations

import logging
from typing import Any

from tunecache.binaries import preload
from tunecache.process import forks
from tunecache.settings import current_mode
from tunecache.trust import sharing
from tunecache.tuner import background

log = logging.getLogger("tunecache")

_noted: dict[int, Any] = {}  # id -> a tuned JITFunction Triton compiled since the last healing


def enabled() -> bool:
    """Whether this process may record what it compiled: only a readwrite process writes, and only
    builds that may leave the host (:func:`tunecache.trust.sharing.builds_shareable`)."""
    return current_mode() == "readwrite" and sharing.builds_shareable()


def compiled(jf: Any) -> None:
    """Triton compiled a specialisation of the tuned kernel ``jf`` for a launch: check, in the
    background, whether the store holds what its stored winners compiled to here."""
    if not enabled():
        return
    _noted[id(jf)] = jf
    background.submit(_heal)


def _heal() -> None:
    """Background: record what the stored winners of every kernel noted since compiled to."""
    for key in list(_noted):
        jf = _noted.pop(key, None)
        if jf is None:
            continue
        for tuner in background.tuners():
            if preload.jit_function(tuner.fn) is not jf:
                continue
            try:
                n = tuner.record_hit_specs()
            except Exception as e:  # noqa: BLE001 - best effort: the next host compiles it as before
                log.debug("tunecache: %s: compiled winners not recorded: %r", tuner.kernel_name, e)
                continue
            if n:
                log.info(
                    "tunecache: %s: recorded %d launch specs of stored winners compiled under a new Triton key "
                    "(the source changed without changing its meaning, e.g. a comment)",
                    tuner.kernel_name,
                    n,
                )


def _after_fork_in_child() -> None:
    _noted.clear()  # the parent's compiles: the parent records them


forks.register(__name__, _after_fork_in_child)
