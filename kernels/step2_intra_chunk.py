"""Step 2 — the log-linear intra-chunk kernel: the ``C × C`` level pattern inside a chunk.

Two tokens of one aligned chunk (``C = 2^c``) are at Fenwick level ``level(i, j) = bit_length(i ^ j)``
of their in-chunk offsets, a level in ``0..c`` and the same pattern in every chunk. Log-linear
attention weights each of those pairs by the query's ``λ`` at that level, so step 1's chunk product
gains one elementwise factor:

    o_chunk = ((Q Kᵀ) ⊙ E ⊙ Λ) V,        Λ[i, j] = λ[i, level(i, j)]   (j <= i)

``Λ`` is built in registers from the chunk's ``[C, BL]`` tile of ``level_scales`` (one row per token,
one column per level): a ``[C, C]`` table of levels from bit arithmetic, then ``c + 1`` selects. No
level table is ever read from memory, so nothing here grows with ``T``.

Memory traffic per chunk and head: q, k ``C·K`` each, v and o ``C·V`` each, λ ``C·L``. Work:
``2·C²·(K + V)`` flops for the two products, ``O(C²·c)`` for the level pattern.

The helpers here (:func:`fenwick_levels`, :func:`level_scale_matrix`, :func:`level_column`) need only the
``log2 C + 1`` intra-chunk levels. The full kernels of steps 3, 4, 7 and 8 use all ``log2 C + 1 + n`` levels
(``n`` chunk levels): a tile of them would be that many columns rounded up to a power of two (16 up to
T = 32,768 at C = 64, 32 beyond), and every column taken out of it a reduction over that width. They build
the same ``Λ`` from one ``[C]`` column of ``level_scales`` per level instead
(:func:`~.tiles.load_level_scale_matrix`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import MAX_BLOCK, block, dot_precision, head_block
from .inputs import chunk_decay, last_dim_contiguous, same_strides
from .tiles import decay_matrix, fenwick_levels, level_scale_matrix, load_level_scales, load_qk_scores, load_tile, store_tile


@triton.jit
def intra_chunk_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, o_ptr,
    T, N, H, K, V, L,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sob, sot, soh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
    IP: tl.constexpr,
):
    """Grid ``(N, H, B)``: one program per chunk and head; o gets only the levels ``0..log2 C``."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_c * C + tl.arange(0, C)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    head = i_b.to(tl.int64) * sqb + i_h * sqh
    _, _, scores = load_qk_scores(q_ptr + head, k_ptr + head, sqt, t, T, rk, K, IP)
    v = load_tile(v_ptr + i_b.to(tl.int64) * svb + i_h * svh, svt, t, T, rv, V)
    gc = tl.load(gc_ptr + (i_b * H + i_h).to(tl.int64) * N * C + t)
    lam = load_level_scales(lam_ptr + i_b.to(tl.int64) * slb + i_h * slh, slt, t, T, L, BL, gc.dtype)
    weights = decay_matrix(gc, C) * level_scale_matrix(lam, fenwick_levels(C, C_LOG), C_LOG, BL)
    out = tl.dot((scores * weights).to(v.dtype), v, input_precision=IP)
    store_tile(o_ptr + i_b.to(tl.int64) * sob + i_h * soh, sot, t, T, rv, V, out)


def intra_chunk(q, k, v, level_scales, log_decay=None, chunk_size: int = 64) -> torch.Tensor:
    """Levels ``0..log2 C`` only: ``o[chunk] = ((Q Kᵀ) ⊙ E ⊙ Λ) V`` for every aligned chunk.

    q, k: ``[B, T, H or 1, K]`` (``K, V <= 128``); v: ``[B, T, H, V]``; level_scales: ``[B, T, H, L]``;
    log_decay: ``[B, T, H]`` or None. Returns ``[B, T, H, V]``. A step of the ladder, checked against
    the intra-chunk term of :func:`loglin_edu.chunk_scan.chunk_scan`.
    """
    q, k = same_strides(q, k)
    v, level_scales = last_dim_contiguous(v), last_dim_contiguous(level_scales)
    B, T, Hq, K = q.shape
    H, V, L = v.shape[2], v.shape[3], level_scales.shape[3]
    if max(K, V) > MAX_BLOCK:
        raise ValueError(f"intra_chunk holds K, V <= {MAX_BLOCK}, got K={K}, V={V}")
    C_LOG = chunk_size.bit_length() - 1
    N = -(-T // chunk_size)
    gc, _ = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    intra_chunk_kernel[(N, H, B)](
        q, k, v, level_scales, gc, o, T, N, H, K, V, L,
        q.stride(0), q.stride(1), 0 if Hq == 1 else q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        level_scales.stride(0), level_scales.stride(1), level_scales.stride(2), o.stride(0), o.stride(1), o.stride(2),
        C=chunk_size, C_LOG=C_LOG, BK=head_block(K, q.dtype), BV=head_block(V, q.dtype), BL=block(C_LOG + 1), IP=dot_precision(q.dtype),
    )
    return o
