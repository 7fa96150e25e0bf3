"""The one timer: a median of repeated calls, so one slow call does not move it."""

import time

import pytest

from loglin_edu import viz
from loglin_edu.timing import median_ms


def test_median_ignores_one_slow_call():
    durations = iter([0.2, 0.001, 0.001, 0.001, 0.2])  # the first and last call slowed by something else
    calls = []

    def fn():
        calls.append(1)
        time.sleep(next(durations))

    ms = median_ms(fn, repeats=5, warmup=0)
    assert len(calls) == 5
    assert 1.0 <= ms < 100.0, ms  # a mean would be above 80 ms


def test_warmup_calls_are_not_timed_and_grads_are_reset():
    import torch

    x = torch.ones(3, requires_grad=True)
    seen = []

    def fn():
        seen.append(x.grad)
        (x * 2).sum().backward()

    median_ms(fn, repeats=3, warmup=2, grads=[x])
    assert len(seen) == 5
    assert seen[2] is None and seen[3] is None and seen[4] is None  # reset before every timed call
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        median_ms(fn, repeats=0)


def test_book_timer_is_the_package_timer():
    durations = iter([0.3, 0.001, 0.001])
    assert viz.median_seconds(lambda: time.sleep(next(durations)), repeats=3) < 0.1
