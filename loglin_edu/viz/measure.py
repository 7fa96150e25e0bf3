"""The two measurements the chapters plot: matrix-product FLOPs (counted, exact) and wall-clock time (median)."""

from __future__ import annotations

import time
from typing import Callable

from torch.utils.flop_counter import FlopCounterMode


def matmul_flops(fn: Callable) -> int:
    """FLOPs of the matrix products ``fn()`` runs, counted by ``torch.utils.flop_counter`` (2 per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def median_seconds(fn: Callable, repeats: int = 3) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn()`` (CPU; synchronise first for a GPU)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
