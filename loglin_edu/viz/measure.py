"""The two measurements the chapters plot: matrix-product FLOPs (counted, exact) and wall-clock time.

On a shared CPU a single timing also measures whatever else the machine is doing at that moment; the FLOP count
does not change. :func:`best_median_seconds` keeps the least disturbed of several medians.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..timing import median_ms


def matmul_flops(fn: Callable) -> int:
    """FLOPs of the matrix products ``fn()`` runs, counted by ``torch.utils.flop_counter`` (2 per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def median_seconds(fn: Callable, repeats: int = 3) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn()`` on the CPU (:func:`~loglin_edu.timing.median_ms`)."""
    return median_ms(fn, repeats=repeats, warmup=0) / 1e3


def best_median_seconds(fn: Callable, repeats: int = 5, rounds: int = 3, threads: int | None = 1) -> float:
    """``min`` over ``rounds`` of the median of ``repeats`` calls of ``fn()``: the least disturbed median.

    Other work on the machine only ever adds time, so the smallest median is the closest to the cost of ``fn``.
    threads: torch's intra-op threads while measuring (restored after; None keeps the current setting). One thread
    by default: on a shared machine the threads of one operation wait for each other whenever a core is busy.
    """
    if repeats < 1 or rounds < 1:
        raise ValueError(f"repeats and rounds must be >= 1, got repeats={repeats}, rounds={rounds}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return min(median_seconds(fn, repeats) for _ in range(rounds))
    finally:
        torch.set_num_threads(before)
