"""The masks of O = (A ⊙ M) V, checked entry by entry against their definitions."""

import math

import torch

import loglin_edu as le
from loglin_edu.masks import segment_sum


def test_decay_mask_entries():
    B, T, H = 2, 13, 3
    g = -torch.rand(B, T, H, dtype=torch.float64)
    mask = le.decay_mask(g)
    for t in range(T):
        for s in range(T):
            expect = math.exp(g[1, s + 1 : t + 1, 2].sum().item()) if s <= t else 0.0
            assert abs(mask[1, 2, t, s].item() - expect) < 1e-14


def test_segment_sum_stays_exact_for_long_sequences():
    """G_t - G_s as a sum of the g_r in between, not a difference of two large prefix sums."""
    g = torch.full((1, 4096), -1.0, dtype=torch.float32)
    seg = segment_sum(g)
    assert seg[0, 4095, 4094].item() == -1.0 and seg[0, 4095, 4095].item() == 0.0


def test_hierarchical_mask_entries_and_unit_scales():
    B, T, H = 1, 21, 2
    lam = torch.rand(B, T, H, le.num_levels(T), dtype=torch.float64)
    mask = le.hierarchical_mask(lam)
    for t in range(T):
        for s in range(T):
            expect = lam[0, t, 1, le.level(t, s)].item() if s <= t else 0.0
            assert mask[0, 1, t, s].item() == expect
    ones = le.hierarchical_mask(torch.ones_like(lam))
    assert torch.equal(ones[0, 0], le.causal_mask(T).double())


def test_loglinear_mask_is_the_product():
    lam = torch.rand(2, 9, 2, 5, dtype=torch.float64)
    g = -torch.rand(2, 9, 2, dtype=torch.float64)
    assert torch.equal(le.loglinear_mask(lam, g), le.hierarchical_mask(lam) * le.decay_mask(g))
    assert torch.equal(le.loglinear_mask(lam), le.hierarchical_mask(lam))


def test_off_diagonal_blocks_have_rank_one():
    """Queries in the right half of an aligned 2^m block read its left half at one level: rank 1."""
    T = 64
    lam = torch.rand(1, T, 1, le.num_levels(T), dtype=torch.float64)
    g = -torch.rand(1, T, 1, dtype=torch.float64)
    mask = le.loglinear_mask(lam, g)[0, 0]
    for m in range(1, 7):
        half = 2 ** (m - 1)
        for start in range(0, T, 2**m):
            block = mask[start + half : start + 2 * half, start : start + half]
            assert torch.linalg.matrix_rank(block).item() == 1, (m, start)
