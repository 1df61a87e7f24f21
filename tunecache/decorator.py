"""How code gets a tunecache autotuner: the ``@tunecache.autotune`` decorator, ``install()`` for
third-party kernels decorated with plain ``@triton.autotune``, and ``load_winners()`` for every
kernel defined so far.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunecache import background
from tunecache.autotuner import TunecacheAutotuner
from tunecache.settings import current_mode
from tunecache.store import Store


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
        if current_mode() == "off":
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
    return sum(t.load_winners(device) for t in background.tuners())


_originals: dict[str, Any] = {}


def install() -> None:
    """Make ``triton.autotune`` build tunecache autotuners, so unmodified third-party kernels
    decorated after this call use the store. Idempotent."""
    import triton
    import triton.runtime
    import triton.runtime.autotuner as at

    if _originals:
        return
    _originals.update(triton=triton.autotune, runtime=triton.runtime.autotune, autotuner=at.autotune)
    triton.autotune = autotune
    triton.runtime.autotune = autotune
    at.autotune = autotune


def uninstall() -> None:
    """Undo :func:`install`; kernels decorated meanwhile keep their tunecache autotuner."""
    import triton
    import triton.runtime
    import triton.runtime.autotuner as at

    if not _originals:
        return
    triton.autotune = _originals["triton"]
    triton.runtime.autotune = _originals["runtime"]
    at.autotune = _originals["autotuner"]
    _originals.clear()


def installed() -> bool:
    return bool(_originals)


__all__ = ["autotune", "install", "uninstall", "installed", "load_winners"]
