"""Step 6 — the delta rule inside a chunk: the WY/UT factors of every chunk, in one kernel.

With the delta rule the transition of a token is a matrix, ``exp(g_t)(I - β_t k_t k_tᵀ)``, and the chunk
of ``C`` tokens is solved in closed form (:mod:`loglin_edu.chunking`). With ``gc`` the within-chunk
cumulative decay, ``γ = exp(gc)``, ``Γ[i, j] = exp(gc_i - gc_j)`` (``j <= i``) and ``γ_C`` its last entry:

    A_β = I + strict_lower(diag(β) (Γ ⊙ K Kᵀ)),      T_β = A_β⁻¹              ([C, C])
    W = T_β diag(β γ) K,   U₀ = T_β diag(β) V,   K̃ = diag(γ_C / γ) K          ([C, K], [C, V], [C, K])
    query = diag(γ) Q - (Γ ⊙ Q Kᵀ) W,            P = (Γ ⊙ Q Kᵀ) T_β diag(β)   ([C, K], [C, C])

so that a state ``S`` (``[K, V]``) entering the chunk leaves it as ``γ_C S + K̃ᵀ (U₀ - W S)``, a query reads
it as ``query S``, and the chunk's own tokens reach each other through ``P`` (the chunk's block of
``A ⊙ M^S``). Everything a later step needs about a chunk is in these factors; they are computed once,
all chunks in parallel, grid ``(N, H, B)``.

The triangular solve (:func:`unit_lower_inverse`): forward substitution on the ``16 × 16`` diagonal
blocks — all blocks at once, one row per block and step, 15 steps — then the blocks below the diagonal
in ``C / 16 - 1`` products, ``(I + Mb + Mo)⁻¹ = (I + Db Mo)⁻¹ Db`` with ``Db = (I + Mb)⁻¹`` and
``(I + N)⁻¹ = I - N (I - N (I - ...))`` for the block-nilpotent ``N = Db Mo``. Each step computes what
block forward substitution computes, so it is as stable as a triangular solve (unlike the Neumann series
``Σ (-M)^j``, whose terms grow as binomial coefficients when keys are correlated).

Memory traffic per chunk and head: q, k, v read once; ``W``, ``query`` (``C·K`` each), ``U₀`` (``C·V``),
``T_β`` and ``P`` (``C²`` each) written in fp32. Work: ``2·C²·(2K + V)`` for ``QKᵀ, KKᵀ`` and the
factors, ``O(C³)`` for the solve. The key dimension is held whole — the delta rule couples every key
column — as one tile, or two when ``K > 128`` (``BK1 + BK2``, :func:`~.config.key_tiles`); values are
read in tiles of ``BV`` columns.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .config import DeltaLaunchConfig, accumulator_dtype, chunk_precision, head_block, key_tiles, solve_precision
from .tiles import decay_matrix, load_tile


@triton.jit
def unit_lower_inverse(M, C: tl.constexpr, IP: tl.constexpr):
    """``(I + M)⁻¹`` for a strictly lower-triangular ``M: [C, C]`` (``C`` a multiple of 16), by block forward
    substitution (module docstring)."""
    i = tl.arange(0, C)
    eye = tl.where(i[:, None] == i[None, :], 1.0, 0.0).to(M.dtype)
    same_block = (i[:, None] // 16) == (i[None, :] // 16)
    inside = tl.where(same_block, M, 0.0)
    inverse = eye
    for row in tl.static_range(1, 16):  # row `row` of every diagonal block, from the rows above it
        inverse = tl.where((i % 16 == row)[:, None], eye - tl.dot(inside, inverse, input_precision=IP), inverse)
    if C > 16:
        below = tl.dot(inverse, tl.where(same_block, 0.0, M), input_precision=IP)  # Db Mo, block-nilpotent
        solve = eye
        for _ in tl.static_range(C // 16 - 1):
            solve = eye - tl.dot(below, solve, input_precision=IP)
        inverse = tl.dot(solve, inverse, input_precision=IP)
    return inverse


@triton.jit
def store_rows(ptr, row_stride, t, cols, x):
    """Store ``x: [C, BD]`` at rows ``t`` and columns ``cols`` of a padded buffer (no masks: it has room)."""
    tl.store(ptr + t[:, None].to(tl.int64) * row_stride + cols[None, :], x)


@triton.jit
def load_rows(ptr, row_stride, t, cols):
    """``x[t, cols]`` of a padded buffer."""
    return tl.load(ptr + t[:, None].to(tl.int64) * row_stride + cols[None, :])


@triton.jit
def key_tile_products(q_ptr, k_ptr, stride_t, t, T, cols, width, IP: tl.constexpr):
    """One key tile of the chunk: q, k ``[C, BK]`` at rows ``t`` and columns ``cols`` (zero past ``T`` and
    ``width``) and their shares of ``Q Kᵀ`` and ``K Kᵀ`` (``[C, C]``), which sum over the key tiles."""
    q = load_tile(q_ptr, stride_t, t, T, cols, width)
    k = load_tile(k_ptr, stride_t, t, T, cols, width)
    return q, k, tl.dot(q, tl.trans(k), input_precision=IP), tl.dot(k, tl.trans(k), input_precision=IP)


@triton.jit
def delta_chunk_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gc_ptr, tb_ptr, p_ptr, w_ptr, query_ptr, u_ptr,
    T, N, H, K, V,
    sqb, sqt, sqh, svb, svt, svh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    IP: tl.constexpr, IPS: tl.constexpr,
):
    """Grid ``(N, H, B)``. q, k: [B, T, H or 1, K]; v: [B, T, H, V]; beta, gc: [B, H, N·C] (fp32, zero past
    ``T``). Writes T_β, P: [B, H, N, C, C]; W, query: [B, H, N·C, BK1 + BK2]; U₀: [B, H, N·C, NV·BV]."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    t = i_c * C + rc
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    rows = bh * N * C + t  # this chunk's rows of the [B, H, N·C, ...] buffers
    gc = tl.load(gc_ptr + rows)
    beta = tl.load(beta_ptr + rows)
    q1, k1, scores, keys = key_tile_products(q_ptr, k_ptr, sqt, t, T, r1, K, IP)
    if BK2 > 0:
        r2 = tl.arange(0, BK2)
        q2, k2, scores2, keys2 = key_tile_products(q_ptr + BK1, k_ptr + BK1, sqt, t, T, r2, K - BK1, IP)
        scores += scores2
        keys += keys2
    decay = decay_matrix(gc, C)
    gamma = tl.exp(gc)
    strict = rc[:, None] > rc[None, :]
    t_beta = unit_lower_inverse(tl.where(strict, beta[:, None] * decay * keys, 0.0), C, IPS)
    scores *= decay  # Γ ⊙ Q Kᵀ
    square = (bh * N + i_c) * C * C + rc[:, None] * C + rc[None, :]
    tl.store(tb_ptr + square, t_beta)
    tl.store(p_ptr + square, tl.dot(scores, t_beta, input_precision=IPS) * beta[None, :])
    write = beta * gamma
    w1 = tl.dot(t_beta, k1.to(gc.dtype) * write[:, None], input_precision=IP)
    store_rows(w_ptr, BK1 + BK2, rows, r1, w1)
    store_rows(query_ptr, BK1 + BK2, rows, r1, q1.to(gc.dtype) * gamma[:, None] - tl.dot(scores, w1, input_precision=IP))
    if BK2 > 0:
        w2 = tl.dot(t_beta, k2.to(gc.dtype) * write[:, None], input_precision=IP)
        store_rows(w_ptr + BK1, BK1 + BK2, rows, r2, w2)
        store_rows(query_ptr + BK1, BK1 + BK2, rows, r2,
                   q2.to(gc.dtype) * gamma[:, None] - tl.dot(scores, w2, input_precision=IP))
    for i_v in range(NV):
        cols = i_v * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, svt, t, T, cols, V).to(gc.dtype)
        store_rows(u_ptr, NV * BV, rows, cols, tl.dot(t_beta, v * beta[:, None], input_precision=IP))


class DeltaChunks(NamedTuple):
    """The WY factors of every chunk (module docstring), fp32 (fp64 for fp64 inputs), padded to whole tiles.

    t_beta, intra: ``[B, H, N, C, C]`` (``T_β`` and ``P``); w, query: ``[B, H, N·C, BK1 + BK2]``;
    u: ``[B, H, N·C, NV·BV]`` (``U₀``); gc, beta: ``[B, H, N·C]`` (the inputs the kernels read).
    """

    t_beta: torch.Tensor
    intra: torch.Tensor
    w: torch.Tensor
    query: torch.Tensor
    u: torch.Tensor
    gc: torch.Tensor
    beta: torch.Tensor


def value_tiles(V: int, config: DeltaLaunchConfig) -> tuple[int, int]:
    """``(BV, NV)``: the value tile width and how many tiles cover ``V``."""
    BV = min(head_block(V), config.value_tile)
    return BV, -(-V // BV)


def chunk_inputs(beta: torch.Tensor, log_decay: torch.Tensor | None, B: int, T: int, H: int, chunk_size: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gc, beta)`` as the kernels read them: ``[B, H, N·C]`` in the accumulator type, zero past ``T``
    (padded tokens neither write nor decay). ``gc`` is the within-chunk cumulative sum of ``log_decay``."""
    from .inputs import chunk_decay

    gc, _ = chunk_decay(log_decay, B, T, H, chunk_size, beta.device, dtype)
    padded = torch.zeros_like(gc)
    padded[:, :, :T] = beta.transpose(1, 2)
    return gc, padded


def delta_chunks(q, k, v, beta, log_decay, chunk_size: int = 64,
                 config: DeltaLaunchConfig = DeltaLaunchConfig()) -> DeltaChunks:
    """The WY factors of every chunk. q, k: ``[B, T, H or 1, K]`` (equal strides, last dimension contiguous,
    ``K <= 256``); v: ``[B, T, H, V]``; beta: ``[B, T, H]``; log_decay: ``[B, T, H]`` or None. chunk_size:
    a power of two >= 16. Checked against :func:`loglin_edu.chunking.chunk_terms`."""
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N = -(-T // chunk_size)
    acc = accumulator_dtype(q.dtype)
    BK1, BK2 = key_tiles(K, config.key_tile)
    BV, NV = value_tiles(V, config)
    gc, beta_c = chunk_inputs(beta, log_decay, B, T, H, chunk_size, q.dtype)
    new = lambda *shape: torch.empty(*shape, device=q.device, dtype=acc)  # noqa: E731
    out = DeltaChunks(new(B, H, N, chunk_size, chunk_size), new(B, H, N, chunk_size, chunk_size),
                      new(B, H, N * chunk_size, BK1 + BK2), new(B, H, N * chunk_size, BK1 + BK2),
                      new(B, H, N * chunk_size, NV * BV), gc, beta_c)
    delta_chunk_kernel[(N, H, B)](
        q, k, v, beta_c, gc, out.t_beta, out.intra, out.w, out.query, out.u, T, N, H, K, V,
        q.stride(0), q.stride(1), 0 if Hk == 1 else q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        C=chunk_size, BK1=BK1, BK2=BK2, BV=BV, NV=NV, IP=chunk_precision(q.dtype, config.precision),
        IPS=solve_precision(q.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
