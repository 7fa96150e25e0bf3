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

The triangular solve (:func:`unit_lower_inverse`), by recursive doubling: ``X = I`` inverts the ``1 × 1``
diagonal blocks, and from the inverses of the diagonal blocks of width ``s`` those of width ``2s`` follow as
``X - X B X``, ``B`` the part of ``M`` that couples the two halves of each ``2s`` block — the block formula
``[[A, 0], [B, D]]⁻¹ = [[A⁻¹, 0], [-D⁻¹ B A⁻¹, D⁻¹]]`` for every block at once. That is ``log2 C`` steps of two
``C × C`` products (twelve for ``C = 64``). Each step is the exact inverse of a block triangular matrix, as a
blocked triangular inversion computes it, so the solve is as stable as one (unlike the Neumann series
``Σ (-M)^j``, whose terms grow as binomial coefficients when keys are correlated). Its products run in the
precision :func:`~.config.solve_precision` names, bf16x3 for 16-bit inputs (:func:`~.tiles.dot_split`).

Memory traffic per chunk and head: v read once, q twice and k three times (the repeats from cache); ``W``, ``query`` (``C·K``
each), ``U₀`` (``C·V``), ``T_β`` and ``P`` (``C²`` each) written in fp32. Work: ``2·C²·(2K + V)`` for
``QKᵀ, KKᵀ`` and the factors, ``O(C³)`` for the solve. The delta rule couples every key column, but no
``[C, K]`` tile is held: the keys are read ``KS <= 64`` columns at a time, in three passes (``K Kᵀ`` before the
solve, ``Q Kᵀ`` after it, then ``W`` and ``query`` column by column), so that only ``C × C`` blocks stay in
registers through the solve; values are read in tiles of ``BV`` columns.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .config import DeltaLaunchConfig, accumulator_dtype, chunk_precision, head_block, key_tiles, solve_precision
from .tiles import decay_matrix, dot_split, load_tile


@triton.jit
def unit_lower_inverse(M, C: tl.constexpr, IP: tl.constexpr):
    """``(I + M)⁻¹`` for a strictly lower-triangular ``M: [C, C]`` (``C`` a power of two), by recursive
    doubling (module docstring): ``X`` holds the inverses of the diagonal blocks of width ``s``; the blocks of
    width ``2s`` follow as ``X - X B X``, with ``B`` the part of ``M`` that couples two halves of a block."""
    i = tl.arange(0, C)
    inverse = tl.where(i[:, None] == i[None, :], 1.0, 0.0).to(M.dtype)
    for step in tl.static_range(8):
        if (1 << step) < C:
            halves = ((i[:, None] >> (step + 1)) == (i[None, :] >> (step + 1))) & ((i[:, None] >> step) != (i[None, :] >> step))
            coupling = dot_split(tl.where(halves, M, 0.0), inverse, IP)
            inverse -= dot_split(inverse, coupling, IP)
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
def delta_chunk_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gc_ptr, tb_ptr, p_ptr, w_ptr, query_ptr, u_ptr,
    T, N, H, K, V,
    sqb, sqt, sqh, svb, svt, svh,
    C: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    IP: tl.constexpr, IPS: tl.constexpr,
):
    """Grid ``(N, H, B)``. q, k: [B, T, H or 1, K]; v: [B, T, H, V]; beta, gc: [B, H, N·C] (fp32, zero past
    ``T``). Writes T_β, P: [B, H, N, C, C]; W, query: [B, H, N·C, KP]; U₀: [B, H, N·C, NV·BV]. The key columns
    are read ``KS`` at a time, ``KP`` (a multiple of ``KS``, at least ``K``) in all."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rc = tl.arange(0, C)
    t = i_c * C + rc
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    rows = bh * N * C + t  # this chunk's rows of the [B, H, N·C, ...] buffers
    gc = tl.load(gc_ptr + rows)
    beta = tl.load(beta_ptr + rows)
    keys = tl.zeros((C, C), dtype=gc.dtype)
    for i_k in range(KP // KS):
        k = load_tile(k_ptr, sqt, t, T, i_k * KS + tl.arange(0, KS), K)
        keys += tl.dot(k, tl.trans(k), input_precision=IP)
    strict = rc[:, None] > rc[None, :]
    t_beta = unit_lower_inverse(tl.where(strict, beta[:, None] * decay_matrix(gc, C) * keys, 0.0), C, IPS)
    square = (bh * N + i_c) * C * C + rc[:, None] * C + rc[None, :]
    tl.store(tb_ptr + square, t_beta)
    scores = tl.zeros((C, C), dtype=gc.dtype)
    for i_k in range(KP // KS):
        cols = i_k * KS + tl.arange(0, KS)
        scores += tl.dot(load_tile(q_ptr, sqt, t, T, cols, K), tl.trans(load_tile(k_ptr, sqt, t, T, cols, K)),
                         input_precision=IP)
    scores *= decay_matrix(gc, C)  # Γ ⊙ Q Kᵀ
    tl.store(p_ptr + square, dot_split(scores, t_beta, IPS) * beta[None, :])
    gamma = tl.exp(gc)
    write = beta * gamma
    for i_k in range(KP // KS):  # W and query, KS key columns at a time
        cols = i_k * KS + tl.arange(0, KS)
        w = tl.dot(t_beta, load_tile(k_ptr, sqt, t, T, cols, K).to(gc.dtype) * write[:, None], input_precision=IP)
        store_rows(w_ptr, KP, rows, cols, w)
        query = load_tile(q_ptr, sqt, t, T, cols, K).to(gc.dtype) * gamma[:, None]
        store_rows(query_ptr, KP, rows, cols, query - tl.dot(scores, w, input_precision=IP))
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
    factor = lambda: torch.empty(B, H, N * chunk_size, BK1 + BK2, device=q.device,  # noqa: E731
                                 dtype=config.factor_storage(q.dtype))  # W and the queries, read once per live level
    out = DeltaChunks(new(B, H, N, chunk_size, chunk_size), new(B, H, N, chunk_size, chunk_size), factor(), factor(),
                      new(B, H, N * chunk_size, NV * BV), gc, beta_c)
    delta_chunk_kernel[(N, H, B)](
        q, k, v, beta_c, gc, out.t_beta, out.intra, out.w, out.query, out.u, T, N, H, K, V,
        q.stride(0), q.stride(1), 0 if Hk == 1 else q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        C=chunk_size, KP=BK1 + BK2, KS=min(BK2 or BK1, 64), BV=BV, NV=NV, IP=chunk_precision(q.dtype, config.precision),
        IPS=solve_precision(q.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
