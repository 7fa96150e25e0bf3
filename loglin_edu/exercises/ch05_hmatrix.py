"""Chapter 5: the hierarchical mask from the buckets, and the rank-1 factors of its off-diagonal blocks."""

from __future__ import annotations

import torch

from ..fenwick import buckets
from ..masks import hierarchical_mask, loglinear_mask
from ..viz.figures import fenwick_blocks
from .checking import Case, Exercise, call, describe, random_shape


def my_hierarchical_mask(level_scales):
    """``M^H[t, s] = λ[t, level(t, s)]`` for ``s <= t``, 0 above, filled bucket by bucket.

    level_scales: ``[B, T, H, L]`` -> ``[B, H, T, T]``.
    """
    B, T, H, _ = level_scales.shape
    mask = level_scales.new_zeros(B, H, T, T)
    for t in range(T):
        for lvl, keys in enumerate(buckets(t)):
            mask[:, :, t, keys.start : keys.stop] = level_scales[:, t, :, lvl, None]
    return mask


def _mask_indexed_by_key(level_scales):
    B, T, H, _ = level_scales.shape
    mask = level_scales.new_zeros(B, H, T, T)
    for t in range(T):
        for lvl, keys in enumerate(buckets(t)):
            for s in keys:
                mask[:, :, t, s] = level_scales[:, s, :, lvl]
    return mask


def _level_scales(rng, count=10):
    for _ in range(count):
        sizes = random_shape(rng)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        L = (sizes["T"] - 1).bit_length() + 1 + rng.randint(0, 2)
        lam = torch.rand(sizes["B"], sizes["T"], sizes["H"], L, generator=gen, dtype=torch.float64) + 0.5
        g = -0.5 * torch.rand(sizes["B"], sizes["T"], sizes["H"], generator=gen, dtype=torch.float64)
        yield lam, g, describe({n: sizes[n] for n in "BTH"}) + f", L={L}"


HIERARCHICAL_MASK = Exercise(
    name="hmatrix.hierarchical_mask",
    chapter=5,
    signature="my_hierarchical_mask(level_scales) -> mask",
    task="Build `M^H[t, s] = λ[t, level(t, s)]` (0 above the diagonal) as a `[B, H, T, T]` tensor from "
         "`level_scales: [B, T, H, L]` (`L` may exceed the levels `T` needs).",
    solution=my_hierarchical_mask,
    cases=lambda rng: (Case((lam,), text) for lam, _, text in _level_scales(rng)),
    reference=hierarchical_mask,
    mistakes=((_mask_indexed_by_key, "λ is indexed by the query t (the row) and the level, not by the key s."),),
)


def block_factors(level_scales, log_decay, level, rows, cols):
    """Rank-1 factors of one off-diagonal block of ``M = M^S ⊙ M^H``: ``M[rows, cols] = u wᵀ``.

    level_scales: ``[T, L]``; log_decay: ``[T]``; rows, cols: the block's query and key ranges, all at
    ``level``. With ``e = cols[-1]``: ``exp(G_t - G_s) = exp(G_t - G_e) · exp(G_e - G_s)``, so
    ``u_t = λ[t, level] exp(G_t - G_e)`` and ``w_s = exp(G_e - G_s)`` (both at most 1: no overflow).
    """
    G = log_decay.cumsum(dim=0)
    end = G[cols.stop - 1]
    u = level_scales[rows.start : rows.stop, level] * (G[rows.start : rows.stop] - end).exp()
    return u, (end - G[cols.start : cols.stop]).exp()


def _factors_without_decay(level_scales, log_decay, level, rows, cols):
    return level_scales[rows.start : rows.stop, level], log_decay.new_ones(len(cols))


def _drive_blocks(fn, level_scales, log_decay):
    """Every block's ``u wᵀ`` for one sequence (batch 0, head 0)."""
    lam, g = level_scales[0, :, 0], log_decay[0, :, 0]
    products = {}
    for block in fenwick_blocks(lam.shape[0]):
        u, w = call(fn, lam, g, block.level, block.rows, block.cols)
        products[(block.level, block.rows.start)] = torch.outer(u, w)
    return products


def _mask_blocks(level_scales, log_decay):
    mask = loglinear_mask(level_scales, log_decay)[0, 0]
    return {(b.level, b.rows.start): mask[b.rows.start : b.rows.stop, b.cols.start : b.cols.stop]
            for b in fenwick_blocks(mask.shape[0])}


BLOCK_FACTORS = Exercise(
    name="hmatrix.block_factors",
    chapter=5,
    signature="block_factors(level_scales, log_decay, level, rows, cols) -> (u, w)",
    task="For one sequence (`level_scales: [T, L]`, `log_decay: [T]`) and one off-diagonal block (its `level` "
         "and the `range`s of its query rows and key columns), return vectors `u: [len(rows)]`, "
         "`w: [len(cols)]` with `u wᵀ` equal to that block of `M = M^S ⊙ M^H`: the block has rank 1.",
    solution=block_factors,
    cases=lambda rng: (Case((lam, g), text) for lam, g, text in _level_scales(rng) if lam.shape[1] > 1),
    driver=_drive_blocks,
    reference=_mask_blocks,
    mistakes=((_factors_without_decay, "the decay is part of the block: exp(G_t - G_s) splits into a row "
                                       "factor exp(G_t - G_e) and a column factor exp(G_e - G_s)."),),
)

EXERCISES = (HIERARCHICAL_MASK, BLOCK_FACTORS)
