"""Preloading a kernel's stored winners: their binaries loaded into Triton's cache before the
first launch, and the launch specs a later preload needs recorded for winners launched from the store.

:class:`WinnerPreload` is a mixin of :class:`~tunecache.tuner.autotuner.TunecacheAutotuner`, whose
state it uses through ``self``; what is loaded and how is :mod:`tunecache.binaries.preload`'s, when
is :mod:`tunecache.tuner.background`'s and :mod:`tunecache.tuner.heal`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache.binaries import preload
from tunecache.errors import StoreError
from tunecache.problem.target import detect_target
from tunecache.process import counters
from tunecache.trust import trust

log = logging.getLogger("tunecache")


class WinnerPreload(Autotuner):
    """``ready_to_preload``, ``load_winners`` and ``record_hit_specs`` of a tuner. A subclass of
    Triton's Autotuner, as :class:`~tunecache.tuner.recovery.WinnerRecovery` is (see there)."""

    def ready_to_preload(self) -> bool:
        """Whether :meth:`load_winners` can do its work now: the source is hashed or may be (its
        module finished importing), or the store holds nothing of this kernel."""
        return self._tc_identity is not None or self._tc_ks.holds_nothing() or self._may_hash_here()

    def load_winners(self, device: int | None = None) -> int:
        """Load this kernel's stored winners for ``device`` (default: the current one) into
        Triton's kernel cache; returns how many binaries were loaded. Never raises."""
        t0 = time.perf_counter()
        try:
            import torch

            dev = int(device) if device is not None else torch.cuda.current_device() if torch.cuda.is_available() else 0
            ks = self._tc_ks
            if ks.holds_nothing():
                return 0
            if self._tc_identity is None and not self._may_hash_here():
                return 0  # the first launch loads its kernel as before
            target = detect_target(device)  # device None: also warms the launch's own lookup
            loaded, skipped = ks.preload_winners(
                self.fn, self._known_hash(), lambda: self.identity.source_hash, target.digest, dev
            )
            for c in self.configs:  # the first launch's check_disk_cache finds their identities memoised
                self.config_ids(c)
        except Exception as e:  # noqa: BLE001 - best effort: launches load their kernels as before
            log.debug("tunecache: %s: preload failed: %r", self._tc_name, e)
            return 0
        counters.count(None, None, preloaded=loaded)  # skips: counted by reason in preload.load
        if loaded or skipped:
            log.debug(
                "tunecache: %s: preloaded %d binaries (%d skipped) in %.3f s",
                self._tc_name,
                loaded,
                skipped,
                time.perf_counter() - t0,
            )
        return loaded

    def record_hit_specs(self) -> int:
        """Background, after Triton compiled this kernel (see :mod:`tunecache.tuner.heal`): record the
        specialisations of the stored winners this process launched that the store holds under no
        launch spec of this Triton key, with their binaries. Returns how many specs were recorded."""
        hits: dict[str, dict[str, Any]] = {}  # target digest -> {config hash: config}
        for key, (digest, h) in list(self._tc_from_store.items()):
            config, p = self.cache.get(key), self._tc_ks.held(digest)
            if config is not None and p is not None:
                hits.setdefault(p.target.digest, {})[h] = config
        store = self._tc_ks.store
        ident = self._tc_identity
        if not hits or store is None or store.readonly or ident is None:
            return 0
        captured = {t: [s for h, c in w.items() for s in preload.capture(self.fn, c, h)] for t, w in hits.items()}
        if not any(captured.values()):
            return 0  # interpreted, or compiled for no stored winner
        try:
            stored = store.get_specs(ident.source_hash, [trust.own_slot(store)])  # its own: others' are theirs
        except StoreError as e:
            self._tc_ks.trouble("read", e)
            return 0
        log.debug(
            "tunecache: %s: heal: %d stored winners launched, %d specialisations compiled for them",
            self._tc_name,
            sum(len(w) for w in hits.values()),
            sum(len(c) for c in captured.values()),
        )
        n = 0
        for target, specs in captured.items():
            # Added beside the other texts' specs, never in their place: hosts on two texts of this source
            # (a rolling deploy of a comment edit) would delete each other's. gc drops the superseded ones.
            new = preload.beside(stored.get(target, []), specs)
            if new:
                self._tc_ks.record_specs(store, self.fn, ident.source_hash, target, new)
                n += len(new)
        return n


__all__ = ["WinnerPreload"]
