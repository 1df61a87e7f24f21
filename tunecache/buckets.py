"""Batch-bucket functions: map a real batch size to the size a server tunes and captures for.

Inference servers pad every batch up to one of a fixed list of CUDA-graph sizes, so tuning per
bucket instead of per batch size keeps the number of tuned problems small and equal to what the
server will ever launch. Use them with ``tunecache.autotune(..., bucket={"B": buckets.sglang})``:
the tuning key then holds the bucket while the kernel still receives the real batch size.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

__all__ = ["SGLANG_CAPTURE_SIZES", "sglang", "next_power_of_2", "from_list", "sglang_capture_sizes"]


def sglang_capture_sizes(max_bs: int = 256) -> list[int]:
    """SGLang's default CUDA-graph capture list up to ``max_bs`` (36 sizes for 256).

    >>> sglang_capture_sizes(16)
    [1, 2, 4, 8, 12, 16]
    """
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [s for s in sizes if s <= max_bs]


SGLANG_CAPTURE_SIZES: tuple[int, ...] = tuple(sglang_capture_sizes(256))


def from_list(sizes: Sequence[int]) -> Callable[[int], int]:
    """A bucket function that rounds up to the next size of ``sizes``; beyond the largest, a batch
    keeps its real size.

    >>> bucket = from_list([4, 8])
    >>> [bucket(n) for n in (1, 4, 5, 9)]
    [4, 4, 8, 9]
    >>> sglang(13), sglang(256), sglang(300)
    (16, 256, 300)
    """
    ordered = sorted({int(s) for s in sizes})
    if not ordered or ordered[0] < 1:
        raise ValueError("bucket sizes must be a non-empty list of positive integers")

    def bucket(n: int) -> int:
        i = bisect.bisect_left(ordered, int(n))
        # Beyond the last captured size a server runs eagerly at the real size: keep it distinct.
        return ordered[i] if i < len(ordered) else int(n)

    bucket.__name__ = f"from_list_{len(ordered)}"
    bucket.sizes = tuple(ordered)  # type: ignore[attr-defined]
    return bucket


sglang = from_list(SGLANG_CAPTURE_SIZES)
sglang.__name__ = "sglang"
sglang.__doc__ = "Round a batch size up to SGLang's default capture list (1, 2, 4, 8, 12, 16, 24, ... 256)."


def next_power_of_2(n: int) -> int:
    """Round up to the next power of two (1 for n <= 1).

    >>> next_power_of_2(100), next_power_of_2(128), next_power_of_2(0)
    (128, 128, 1)
    """
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
