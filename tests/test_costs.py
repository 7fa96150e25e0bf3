"""Costs: the decoding state holds O(log T) levels; the chunk scan does O(T log T) work and never
builds a T × T tensor. Work is counted in multiply-adds of matrix products, never in seconds."""


import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import loglin_edu as le
from operators import LOGLINEAR


def test_decoding_state_is_a_binary_counter():
    B, H, K, V, T = 1, 2, 3, 4, 1000
    state = le.FenwickState()
    x = torch.randn(B, H, K)
    lam = torch.ones(B, H, le.num_levels(T))
    for t in range(T):
        state.step(x, x, x[..., :1].expand(B, H, V), lam)
        assert state.num_states == bin(t).count("1") + 1  # non-empty levels of query t
        assert len(state.levels) <= le.num_levels(t + 1)
        assert state.state_elements() <= le.num_levels(t + 1) * B * H * K * V


@pytest.mark.parametrize("op", LOGLINEAR, ids=[op.name for op in LOGLINEAR])
def test_recurrent_form_is_the_decoding_state(op):
    """Driving a FenwickState by hand gives the recurrent form's outputs."""
    args = op.inputs(B=1, T=40, H=2, K=3, V=2, seed=0)
    expected = op(*args, form="recurrent")
    q, k, v, lam, *gates = args
    gates = gates + [None] * (2 - len(gates))
    state = le.FenwickState()
    for t in range(40):
        step = [None if x is None else x[:, t] for x in (q, k, v, lam, *gates)]
        out = state.step(*step)
        torch.testing.assert_close(out, expected[:, t], rtol=0, atol=1e-12)


def matmul_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("op", [LOGLINEAR[1], LOGLINEAR[3]], ids=["mamba2", "gated_deltanet"])
def test_chunkwise_work_grows_as_T_log_T(op):
    C, lengths = 16, [2**k for k in range(7, 13)]  # 128 .. 4096 tokens: 8 .. 256 chunks, n = 3 .. 8
    per_token = []
    for T in lengths:
        args = op.inputs(B=1, T=T, H=1, K=8, V=8, seed=0, dtype=torch.float32)
        per_token.append(matmul_flops(lambda: op(*args, form="chunkwise", chunk_size=C)) / T)
    # work per token = a + b·n for n = log2(T / C) chunk levels: constant positive steps as T doubles
    steps = [b - a for a, b in zip(per_token, per_token[1:])]
    assert min(steps) > 0 and max(steps) - min(steps) <= 1e-9 * max(steps), per_token
    # a query chunk reads popcount(c) levels, n/2 on average, each a (C×K)(K×V) product: b >= K·V
    assert steps[0] >= 8 * 8, steps
    # ... while the naive form's work grows as T²: 4x per doubling
    small, large = (op.inputs(B=1, T=T, H=1, K=8, V=8, seed=0, dtype=torch.float32) for T in (256, 512))
    ratio = matmul_flops(lambda: op(*large, form="naive")) / matmul_flops(lambda: op(*small, form="naive"))
    assert 3.5 < ratio < 4.5, ratio


class LargestTensor(TorchDispatchMode):
    """Records, for every tensor an operation returns, the product of its two largest dimensions."""

    def __init__(self):
        super().__init__()
        self.largest_pair = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                a, b = sorted(t.shape)[-2:]
                self.largest_pair = max(self.largest_pair, a * b)
        return out


@pytest.mark.parametrize("op", LOGLINEAR, ids=[op.name for op in LOGLINEAR])
def test_chunkwise_never_builds_a_T_by_T_tensor(op):
    T, C = 2048, 16
    args = [None if a is None else a.requires_grad_() for a in op.inputs(B=1, T=T, H=1, K=4, V=4, seed=0)]
    with LargestTensor() as mode:
        op(*args, form="chunkwise", chunk_size=C).sum().backward()
    assert mode.largest_pair < T * T // 8, mode.largest_pair  # [N, C, C] blocks have 2 dims <= T·C
    with LargestTensor() as mode:
        op(*[None if a is None else a.detach() for a in args], form="naive")
    assert mode.largest_pair >= T * T  # the check can see a T × T tensor when there is one
