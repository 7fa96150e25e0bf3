"""The two measurements the chapters plot: matrix-product FLOPs (counted, exact) and wall-clock time (median)."""

from __future__ import annotations

from typing import Callable

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
