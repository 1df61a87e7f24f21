"""How code gets a tunecache autotuner: the ``@tunecache.autotune`` decorator, ``install()`` for
every other Autotuner of the process (plain ``@triton.autotune``, libraries' own subclasses), and
``load_winners()`` for every kernel defined so far.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache import settings
from tunecache.binaries import preload
from tunecache.settings import current_mode
from tunecache.store.store import Store
from tunecache.trust import signing
from tunecache.tuner import adoption, background, basepatch, companions, firstcall
from tunecache.tuner.autotuner import TunecacheAutotuner


def autotune(
    configs: Any,
    key: Sequence[str],
    prune_configs_by: Any = None,
    reset_to_zero: Any = None,
    restore_value: Any = None,
    pre_hook: Any = None,
    post_hook: Any = None,
    warmup: Any = None,
    rep: Any = None,
    use_cuda_graph: bool = False,
    do_bench: Any = None,
    cache_results: bool = False,
    *,
    store: str | Store | None = None,
    bucket: Mapping[str, Callable[[int], int]] | None = None,
) -> Callable[[Any], Any]:
    """``triton.autotune`` with a shared store behind it. Same arguments, plus:

    store: a SQLAlchemy URL or a :class:`Store` (default: ``TUNECACHE_URL`` or the per-user SQLite).
    bucket: ``{"B": tunecache.buckets.sglang}`` puts the batch bucket of argument ``B`` in the tuning
        key while the kernel still receives the real ``B``.
    """

    def decorator(fn: Any) -> Any:
        kw = dict(
            prune_configs_by=prune_configs_by,
            warmup=warmup,
            rep=rep,
            use_cuda_graph=use_cuda_graph,
            do_bench=do_bench,
            cache_results=cache_results,
            pre_hook=pre_hook,
            post_hook=post_hook,
        )
        if not settings.usable() or current_mode() == "off":  # a bad setting: Triton's own, warned once
            return Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value, **kw)
        return TunecacheAutotuner(
            fn, fn.arg_names, configs, key, reset_to_zero, restore_value, **kw, store=store, bucket=bucket
        )

    return decorator


def load_winners(device: int | None = None) -> int:
    """Load the stored winners' binaries of every tunecache kernel defined so far onto ``device``
    (default: the current one); returns how many were loaded.

    With one visible GPU this happens by itself in the background once CUDA is initialised. A
    process that sees several GPUs calls it after ``torch.cuda.set_device`` (it may run in a
    thread while weights load). Never raises: whatever is not loaded here loads at its launch.
    """
    loaded = sum(t.load_winners(device) for t in background.tuners())
    preload.summarise_skips()  # once per process: what was not preloaded, and why
    return loaded


def install() -> None:
    """Serve every Triton Autotuner of this process from the store, with no change to the code that
    builds them: ``triton.autotune`` however it was imported, Autotuners constructed directly,
    libraries' own subclasses (their methods run first; their ``super()`` calls reach tunecache),
    and instances built before this call (adopted at their next launch). Patches the base class's
    ``__init__`` and ``run`` only; :func:`uninstall` puts them back. Idempotent.

    ``TUNECACHE_INSTALL=1`` does this in every Python process at start (see ``_tunecache_startup``).
    Raises :class:`~tunecache.errors.ConfigurationError` where a ``TUNECACHE_*`` variable is bad (the
    start-up hook instead warns once and leaves Triton as it is).
    """
    settings.check_all()
    basepatch.patch()  # covered by tunecache.tuner.adoption, imported above
    signing.warn_key_files()  # a key file that cannot be read: one line now, not silence until a lookup


def uninstall() -> None:
    """Undo :func:`install`: Autotuner's own ``__init__`` and ``run`` back (the very objects), and every
    instance it adopted back to its own class and ``cache_results``. Kernels built with
    ``tunecache.autotune`` stay tunecache's."""
    with basepatch.LOCK:
        if not basepatch.restore():
            return
        for t in firstcall.adopted():
            adoption.release(t)
        companions.unwatch()


def installed() -> bool:
    return basepatch.patched()


__all__ = ["autotune", "install", "uninstall", "installed", "load_winners"]
