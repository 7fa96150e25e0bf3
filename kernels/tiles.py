"""Triton helpers every kernel of the ladder shares: tiles in and out, the chunk's decay and level patterns.

Naming follows the kernels: a ``[C, BD]`` *tile* holds ``C`` tokens (rows) and ``BD`` columns of one head;
pointers are already offset to that head; ``t`` are the token indices of the tile's rows. Loads outside
``t < T`` or ``col < width`` read zero and stores there are dropped, so no kernel reads or writes past an
input, whatever ``T`` and the head widths are. A *level column* is the ``[C]`` column ``λ[t, level]`` of
``level_scales`` (``[B, T, H, L]``), masked the same way by ``t < T`` and ``level < L``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, stride_t, t, T, cols, width):
    """``x[t, cols]``: rows ``t: [C]`` (tokens), columns ``cols: [BD]``; zero where ``t >= T`` or ``col >= width``."""
    mask = (t[:, None] < T) & (cols[None, :] < width)
    return tl.load(ptr + t[:, None].to(tl.int64) * stride_t + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, stride_t, t, T, cols, width, x):
    """Store ``x: [C, BD]`` at rows ``t`` and columns ``cols``, only inside ``t < T`` and ``col < width``."""
    mask = (t[:, None] < T) & (cols[None, :] < width)
    tl.store(ptr + t[:, None].to(tl.int64) * stride_t + cols[None, :], x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_qk_scores(q_ptr, k_ptr, stride_t, t, T, rk, K, IP: tl.constexpr):
    """One head's chunk of q and k (``[C, BK]`` each, zero past ``T`` and ``K``) and its scores ``Q Kᵀ`` (``[C, C]``)."""
    q = load_tile(q_ptr, stride_t, t, T, rk, K)
    k = load_tile(k_ptr, stride_t, t, T, rk, K)
    return q, k, tl.dot(q, tl.trans(k), input_precision=IP)


@triton.jit
def split16(x, dtype):
    """``(hi, lo)`` in the 16-bit ``dtype`` with ``hi + lo = x`` to about 2^-16 relative: an fp32 block as two
    operands of 16-bit products, which multiply exactly (tf32 would round ``x`` to 2^-11)."""
    hi = x.to(dtype)
    return hi, (x - hi.to(x.dtype)).to(dtype)


@triton.jit
def dot_split(a, b, IP: tl.constexpr):
    """``a b`` for fp32 ``a: [M, K]``, ``b: [K, N]`` (fp32 accumulation: ``[M, N]``), in the precision ``IP``:
    a ``tl.dot`` input precision, or ``"bf16x3"``: both operands split in two bf16 parts (:func:`split16`) and
    the three products that matter summed, ``a_hi b_hi + a_hi b_lo + a_lo b_hi`` (each exact, the dropped
    ``a_lo b_lo`` about 2^-16 of the whole). tf32x3 does the same with tf32 parts, to about 2^-21; bf16x3's
    operands are 16-bit, half the registers of tf32's, and its products run at twice tf32's rate."""
    if IP == "bf16x3":
        a_hi, a_lo = split16(a, tl.bfloat16)
        b_hi, b_lo = split16(b, tl.bfloat16)
        out = tl.dot(a_lo, b_hi)
        out = tl.dot(a_hi, b_lo, out)
        return tl.dot(a_hi, b_hi, out)
    else:
        return tl.dot(a, b, input_precision=IP)


@triton.jit
def decay_matrix(gc, C: tl.constexpr):
    """``E[i, j] = exp(gc_i - gc_j)`` for ``j <= i``, 0 above: the chunk's block of ``M^S``. gc: [C] -> [C, C]."""
    i = tl.arange(0, C)
    causal = i[:, None] >= i[None, :]
    return tl.where(causal, tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)


@triton.jit
def fenwick_levels(C: tl.constexpr, C_LOG: tl.constexpr):
    """``level(i, j) = bit_length(i ^ j)`` for in-chunk offsets ``i, j < C = 2^C_LOG``: ``[C, C]`` int32."""
    i = tl.arange(0, C)
    x = i[:, None] ^ i[None, :]
    levels = tl.zeros((C, C), dtype=tl.int32)
    for bit in tl.static_range(C_LOG):
        levels += ((x >> bit) > 0).to(tl.int32)
    return levels


@triton.jit
def level_column(lam, level, BL: tl.constexpr):
    """``λ[:, level]`` from a ``[C, BL]`` tile of level scales: ``[C]``."""
    return tl.sum(tl.where(tl.arange(0, BL)[None, :] == level, lam, 0.0), 1)


@triton.jit
def level_scale_matrix(lam, levels, C_LOG: tl.constexpr, BL: tl.constexpr):
    """``Λ[i, j] = λ[i, level(i, j)]`` for the intra-chunk levels ``0..C_LOG``: ``[C, C]`` (not yet causal)."""
    out = tl.zeros(levels.shape, dtype=lam.dtype)
    for level in tl.static_range(C_LOG + 1):
        out = tl.where(levels == level, level_column(lam, level, BL)[:, None], out)
    return out


@triton.jit
def load_level_scales(lam_ptr, stride_t, t, T, L, BL: tl.constexpr, dtype):
    """The chunk's ``[C, BL]`` tile of ``level_scales`` as ``dtype``, zero beyond ``T`` and ``L``."""
    return load_tile(lam_ptr, stride_t, t, T, tl.arange(0, BL), L).to(dtype)


@triton.jit
def load_level_column(lam_ptr, stride_t, t, T, L, level, dtype):
    """``λ[t, level]`` as ``dtype``: one ``[C]`` column of ``level_scales``, zero where ``t >= T`` or ``level >= L``.

    Unlike a ``[C, BL]`` tile, whose width rounds the level count up to a power of two that grows with ``T``,
    one column per level compiles to the same code at every ``T``."""
    mask = (t < T) & (tl.zeros_like(t) + level < L)  # level and L may both be plain integers: a [C] mask either way
    return tl.load(lam_ptr + t.to(tl.int64) * stride_t + level, mask=mask, other=0.0).to(dtype)


@triton.jit
def store_level_column(dlam_ptr, stride_t, t, T, L, level, x):
    """Store ``x: [C]`` as ``dλ[t, level]``, only inside ``t < T`` and ``level < L``."""
    mask = (t < T) & (tl.zeros_like(t) + level < L)
    tl.store(dlam_ptr + t.to(tl.int64) * stride_t + level, x.to(dlam_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_level_scale_matrix(lam_ptr, stride_t, t, T, L, levels, C_LOG: tl.constexpr, dtype):
    """``Λ[i, j] = λ[t_i, level(i, j)]`` for the intra-chunk levels ``0..C_LOG``, from one column load per
    level: ``[C, C]`` in ``dtype`` (not yet causal). levels: ``[C, C]`` from :func:`fenwick_levels`."""
    out = tl.zeros(levels.shape, dtype=dtype)
    for level in tl.static_range(C_LOG + 1):
        out = tl.where(levels == level, load_level_column(lam_ptr, stride_t, t, T, L, level, dtype)[:, None], out)
    return out


@triton.jit
def store_level_sums(dlam_ptr, stride_t, t, T, L, d, levels, C_LOG: tl.constexpr):
    """The backward of :func:`load_level_scale_matrix`: ``dλ[t_i, l] = Σ_{j: level(i, j) = l} d[i, j]`` for
    ``l <= C_LOG``, stored one ``[C]`` column per level. d: ``[C, C]``."""
    for level in tl.static_range(C_LOG + 1):
        store_level_column(dlam_ptr, stride_t, t, T, L, level, tl.sum(tl.where(levels == level, d, 0.0), 1))


@triton.jit
def trailing_ones(x, BITS):
    """Number of trailing one bits of ``x`` among its lowest ``BITS``: how many merges a binary counter
    makes when the item ``x`` (0-based) completes."""
    ones = 0
    run = 1
    for bit in range(BITS):
        run = run & ((x >> bit) & 1)
        ones += run
    return ones
