"""One timer for every measurement of the package: the median of repeated calls, in milliseconds.

On a CPU: wall-clock ``time.perf_counter`` around each call. On CUDA: ``triton.testing.do_bench`` (CUDA
events, the L2 cache flushed between calls) when triton is installed, else CUDA events around each call.
A median, not a mean: one call slowed by another process does not move it.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch


def median_ms(
    fn: Callable[[], object],
    *,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    grads: Iterable[torch.Tensor] = (),
    cuda_ms: float = 100.0,
) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls.

    device: where ``fn`` runs (CUDA calls are synchronised); grads: tensors whose ``.grad`` is reset to
    None before every call (a backward pass then allocates instead of accumulating); cuda_ms: with triton on
    CUDA, the calls fill about this many milliseconds (``do_bench``'s ``rep``; raise it for slow calls).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    grads = list(grads)
    if torch.device(device).type != "cuda":
        return _median_of_calls(fn, repeats, warmup, grads, _wall_clock_ms)
    try:
        import triton.testing
    except ImportError:
        return _median_of_calls(fn, repeats, warmup, grads, _cuda_events_ms)
    return triton.testing.do_bench(fn, warmup=25, rep=cuda_ms, grad_to_none=grads or None, return_mode="median")


def _median_of_calls(fn, repeats: int, warmup: int, grads: list[torch.Tensor], call_ms) -> float:
    """Median of ``call_ms(fn)`` over ``repeats`` calls after ``warmup`` untimed calls, gradients reset each time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        for g in grads:
            g.grad = None
        times.append(call_ms(fn))
    return sorted(times)[len(times) // 2]


def _wall_clock_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _cuda_events_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)
