"""The benchmark's bookkeeping: per-kernel work adds up to the schedule's counted work."""

import pytest

from loglin_edu.bench.profile import kernel_work
from loglin_edu.bench.settings import CPU, GPU, counted_work


@pytest.mark.parametrize("setting, T", [(GPU, 1024), (GPU, 65536), (GPU, 3000), (CPU, 32)])
def test_kernel_work_adds_up_to_the_counted_work(setting, T):
    B = setting.tokens // T
    work = counted_work(B, T, setting)
    assert sum(kernel_work(B, T, setting).values()) == work["forward_flops"] + work["backward_flops"]
