"""Step 8 — the backward of log-linear Gated DeltaNet: reverse walks, level gradients, then the WY form.

The forward (step 7) carries, for each level ``ℓ`` and aligned block, a state ``S`` through chunk ``c``
with ``S ← γ_C S + K̃ᵀ (u - W S)`` (``u = U₀`` in the left half, where the block's keys are written, 0 in
the right half, where they are read: ``X_{c,ℓ} = S``, ``o += diag(λ_ℓ) query X_{c,ℓ}``). Three stages:

1. the walks in reverse, carrying the adjoint ``D`` of the state (the transposed transition,
   ``Φᵀ D = γ_C D - Wᵀ (K̃ D)``) and adding each reader's ``queryᵀ diag(λ_ℓ) dO``. They need no forward state:
   only the chunk factors and ``dO``. :func:`level_adjoint_walk_kernel` (the default) makes one walk per value
   tile, from the last chunk to the first, carrying every live level at once: the forward built chunk
   ``c + 1``'s read states from chunk ``c``'s as a binary counter carries (the levels of the trailing ones of
   ``c`` merged into one, every level above carried on alone), so one transposed transition per *distinct*
   level reaches all of chunk ``c``'s, and it stores ``A_{c,ℓ}``, the adjoint of each read state, in that
   state's own slot: ``Σ_c popcount(c)`` blocks, about half as many transitions as the walks per level make.
   ``DeltaLaunchConfig(backward_walk="levels")`` runs the forward's walks instead, every level and block at
   once (:func:`level_walk_bwd_kernel`), storing ``D_{c,ℓ}``, the adjoint of the state *leaving* chunk ``c``,
   for every chunk and level: more parallel programs, twice the transitions and ``N · n`` blocks.
2. the level gradients — per chunk, every level's state entering it and adjoint leaving it.
   The state is ``X_{c,ℓ}`` where bit ``ℓ - 1`` of ``c`` is set (stored by step 7); where it is clear, the
   chunk is in the block's left half and the state is the part of that half before ``c`` — exactly the
   buckets of the lower set bits, ``Z_{c,ℓ} = Σ_{a < ℓ, bit a-1 set} X_{c,a}``, a running sum. Then

       dW -= (K̃ D) Sᵀ,    dK̃ += (u - W S) Dᵀ,    dU₀ += K̃ D  (left halves),    dγ_C += <D, S>
       dquery += diag(λ_ℓ) dO Xᵀ,    dλ[:, c0 + ℓ] = rowsum(dO ⊙ query X)           (set bits)

   The first four are summed over the levels before any product with the chunk's factors: with
   ``G = Σ_ℓ D_ℓ S_ℓᵀ`` (``K × K``) and ``D_left = Σ_{left halves} D_ℓ``,

       dW = -K̃ G,    dK̃ = U₀ D_leftᵀ - W Gᵀ,    dU₀ = K̃ D_left,    dγ_C = trace G

   From the stacked walk, ``G = A_{c+1,j+1} (Σ_{a ≤ j} X_{c,a})ᵀ + Σ_{a > j+1} A_{c+1,a} X_{c,a}ᵀ`` and
   ``D_left = A_{c+1,j+1}`` (``j`` the trailing ones of ``c``; :func:`slot_gram_kernel`); from the walks per
   level, since ``Z`` is a running sum, ``G = Σ_{a read} (D_a + Σ_{ℓ > a, left} D_ℓ) X_aᵀ``
   (:func:`level_gram_kernel`): either way at most ``popcount(c)`` products of a ``[K, V]`` pair per chunk,
   however many levels pass through it, in ``K × K`` blocks of up to 64; then :func:`level_gram_grads_kernel`.
   The reads need one product each, ``M = dO Xᵀ`` (``[C, K]``), for both of theirs: ``dquery += diag(λ_ℓ) M``
   and ``dλ = rowsum(query ⊙ M)`` (:func:`level_read_grad_kernel`). With the walks per level, ``DeltaLaunchConfig(gram_grads=False)`` forms
   the first four level by level instead, one launch per kind of output (:func:`level_write_grad_kernel`: dW, dU₀;
   :func:`level_transition_grad_kernel`: dK̃, dγ_C), each program holding one ``[C, K]`` accumulator over all of K.
3. the WY backward, per chunk, through the WY form of step 6 to ``q, k, v, β`` and the within-chunk cumulative
   decay, plus the intra-chunk product ``(P ⊙ Λ) V`` (``dv``, and ``dλ`` at levels ``0..log2 C``). With
   ``R = T_β`` and ``Γ``, ``γ`` as in step 6:

       dT_β = dW (diag(βγ) K)ᵀ + dU₀ (diag(β) V)ᵀ + (Γ ⊙ Q Kᵀ)ᵀ dP diag(β)
       dA_β = -T_βᵀ dT_β T_βᵀ   (its strict lower part reaches β and Γ ⊙ K Kᵀ)

   and ``dq``, ``dk`` from ``Q Kᵀ``, ``K Kᵀ``, ``W``, ``K̃`` and ``query``. Three launches, each holding far fewer
   tiles at once than one kernel for all of it (which spills registers heavily at ``K = 192``,
   ``V = 384``): :func:`delta_chunk_values_bwd_kernel` (the value tiles: dv, dλ, dP and the
   value share of dT_β and dβ), :func:`delta_chunk_solve_bwd_kernel` (the key tiles, the solve's backward; it
   hands the gradients of ``Q Kᵀ`` and ``K Kᵀ`` on through a ``[C, C]`` pair per chunk) and
   :func:`delta_chunk_qk_bwd_kernel` (dq, dk, one program per chunk and key tile). The decay enters only through
   quantities inside one chunk (``Γ``, ``γ``, ``γ_C``), so ``d log_decay`` is a reverse cumulative sum within
   each chunk: no error carried across the sequence.

Memory: the adjoints are ``Σ_c popcount(c)`` blocks of ``K × V`` per head (fp32; ``N · n`` with the walks per
level, plus ``D_left``, one more per chunk), and ``G``, one ``K × K`` block per chunk, alive during the backward
only; the WY backward hands two ``C × C`` pairs per chunk from launch to launch.
Work: the stacked reverse walk makes one transition per chunk and distinct level (about half the forward
walks'; the walks per level as many as the forward's), and one product per read; the level gradients one
``[K, V] × [V, K]`` product per chunk and carried level, four ``[C, K] × [K, K or V]`` products per chunk, and one
``[C, V] × [V, K]`` product per read (level by level: four ``[C, K] × [K, V]``-sized products per chunk and level).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fenwick import num_chunk_levels
from .config import DeltaLaunchConfig, accumulator_dtype, chunk_precision, dot_precision, key_tiles, solve_precision
from .inputs import reverse_cumsum
from .step6_delta_chunks import DeltaChunks, load_rows, store_rows, value_tiles
from .step7_delta_levels import first_slots, walk_table
from .tiles import (decay_matrix, dot_split, fenwick_levels, load_level_column, load_level_scale_matrix, load_tile,
                    store_level_column, store_level_sums, store_tile, trailing_ones)

SOLVE_KEY_TILE = 32  # key columns the WY backward's pass over the keys holds at once (wider tiles spill registers)
QK_KEY_TILE = 64  # key columns of one program of dq, dk (the rows of a Hopper product of the chunk's C × C blocks)
VALUE_SUB_TILE = 32  # value columns the WY backward's pass over the values holds at once


@triton.jit
def carry_back(a1, a2, k_ptr, skt, w_ptr, gc_ptr, rc, T, K, BK1: tl.constexpr, BK2: tl.constexpr, IP: tl.constexpr):
    """``(Φᵀ D)ᵀ = γ_C Dᵀ - ((K D)ᵀ diag(γ_C / γ)) W`` for the adjoint held transposed, ``Dᵀ = [a1, a2]``
    (``[BV, BK1 + BK2]``), through chunk ``Φ`` (pointers at its first row, rows ``rc < T`` valid). Held transposed,
    the adjoint is the right operand of ``K D`` and W the right operand of the update (both read from shared
    memory), so that besides the adjoint only ``BV``-row tiles and one key tile of K stay in registers."""
    r1 = tl.arange(0, BK1)
    gc = tl.load(gc_ptr + rc)
    g_last = tl.load(gc_ptr + rc.shape[0] - 1)
    k_rows, w_rows = (k_ptr + rc * skt)[:, None], (w_ptr + rc * (BK1 + BK2))[:, None]  # the chunk's rows first: no
    # loop-invariant [C, BK] offsets for the compiler to hoist out of the walk and hold in registers
    k1 = tl.load(k_rows + r1[None, :], mask=(rc[:, None] < T) & (r1[None, :] < K), other=0.0)
    e = tl.dot(k1.to(a1.dtype), tl.trans(a1), input_precision=IP)  # K D: [C, BV]
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        k2 = tl.load(k_rows + r2[None, :], mask=(rc[:, None] < T) & (r2[None, :] < K), other=0.0)
        e += tl.dot(k2.to(a1.dtype), tl.trans(a2), input_precision=IP)
    e = tl.trans(e)
    e *= tl.exp(g_last - gc)[None, :]
    decay = tl.exp(g_last)
    a1 = decay * a1 - tl.dot(e, tl.load(w_rows + r1[None, :]).to(a1.dtype), input_precision=IP)
    if BK2 > 0:
        a2 = decay * a2 - tl.dot(e, tl.load(w_rows + r2[None, :]).to(a1.dtype), input_precision=IP)
    return a1, a2


@triton.jit
def level_walk_bwd_kernel(
    k_ptr, w_ptr, query_ptr, gc_ptr, lam_ptr, do_ptr, d_ptr, walks_ptr,
    T, N, H, K, V, L, n_levels,
    skb, skt, skh, slb, slt, slh, sdob, sdot, sdoh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr,
    BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(VP / BV, B·H, walks)``, as the forward walks. do: [B, T, H, V]; d: [B, H, N, n_levels, BK1 + BK2, VP] receives the
    adjoint of each level's state leaving each chunk (zero after the last reader). The adjoint is carried transposed
    (``[BV, BK1 + BK2]``, :func:`carry_back`): the reads add ``(diag(λ_ℓ) dO)ᵀ query``."""
    i_v, i_bh, i_w = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    KP = BK1 + BK2
    level = tl.load(walks_ptr + 2 * i_w)
    start = tl.load(walks_ptr + 2 * i_w + 1)
    half = 1 << (level - 1)
    rc, rv, r1 = tl.arange(0, C), tl.arange(0, BV), tl.arange(0, BK1)
    k_ptr += i_b.to(tl.int64) * skb + i_h * skh
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh + C_LOG + level
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh + i_v * BV
    base = i_bh.to(tl.int64) * N * C
    gc_ptr += base
    w_ptr += base * KP
    query_ptr += base * KP
    d_ptr += (i_bh.to(tl.int64) * N * n_levels + level - 1) * KP * VP + i_v * BV
    a1 = tl.zeros((BV, BK1), dtype=gc_ptr.dtype.element_ty)
    a2 = tl.zeros((BV, BK2P), dtype=gc_ptr.dtype.element_ty)
    store_adjoint(d_ptr, tl.minimum(start + 2 * half - 1, N - 1), n_levels, KP, VP, rv, a1, a2, BK1, BK2)
    for i in range(half):  # the right half, backwards: each reader adds its queries' gradient
        c = start + 2 * half - 1 - i
        if c < N:
            a1, a2 = carry_back(a1, a2, k_ptr + (c * C).to(tl.int64) * skt, skt, w_ptr + c * C * KP, gc_ptr + c * C,
                                rc, T - c * C, K, BK1, BK2, IP)
            lam = tl.load(lam_ptr + (c * C + rc).to(tl.int64) * slt, mask=(c * C + rc < T) & (rc * 0 + C_LOG + level < L),
                          other=0.0)
            at = (c * C + rc[None, :]).to(tl.int64) * sdot + rv[:, None]
            scaled = tl.load(do_ptr + at, mask=(c * C + rc[None, :] < T) & (i_v * BV + rv[:, None] < V), other=0.0)
            scaled = scaled.to(a1.dtype) * lam.to(a1.dtype)[None, :]  # (diag(λ_ℓ) dO)ᵀ: [BV, C]
            query = (query_ptr + c * C * KP + rc * KP)[:, None]
            a1 += tl.dot(scaled, tl.load(query + r1[None, :]).to(a1.dtype), input_precision=IP)
            if BK2 > 0:
                a2 += tl.dot(scaled, tl.load(query + (BK1 + tl.arange(0, BK2))[None, :]).to(a1.dtype), input_precision=IP)
            store_adjoint(d_ptr, c - 1, n_levels, KP, VP, rv, a1, a2, BK1, BK2)  # leaving chunk c - 1
    for i in range(half - 1):  # the left half, backwards: only the transitions
        c = start + half - 1 - i
        a1, a2 = carry_back(a1, a2, k_ptr + (c * C).to(tl.int64) * skt, skt, w_ptr + c * C * KP, gc_ptr + c * C,
                            rc, T - c * C, K, BK1, BK2, IP)
        store_adjoint(d_ptr, c - 1, n_levels, KP, VP, rv, a1, a2, BK1, BK2)


@triton.jit
def store_adjoint(d_ptr, c, n_levels, KP, VP, rv, a1, a2, BK1: tl.constexpr, BK2: tl.constexpr):
    """Store the transposed adjoint ``Dᵀ = [a1, a2]`` (``[BV, BK1 + BK2]``) as chunk ``c``'s ``[KP, VP]`` block of
    the walk's level (``d_ptr`` at chunk 0 and the program's value columns), each value column ``rv`` a column."""
    slot = (d_ptr + c.to(tl.int64) * n_levels * KP * VP + rv)[:, None]
    tl.store(slot + tl.arange(0, BK1)[None, :] * VP, a1)
    if BK2 > 0:
        tl.store(slot + (BK1 + tl.arange(0, BK2))[None, :] * VP, a2)


@triton.jit
def entering_state(states_ptr, z, read, rk, rv, VP):
    """One level's state ``S`` entering the chunk, ``[BK, BV]`` (key rows ``rk``, value columns ``rv``): the stored
    read state ``X`` at ``states_ptr`` where the chunk reads (the block's right half), else ``Z``, the running
    sum of the lower buckets' read states (in the left half, the block's state before the chunk)."""
    s = z
    if read:
        s = tl.load(states_ptr + rk[:, None] * VP + rv[None, :])
    return s


@triton.jit
def chunk_rows(x_ptr, first_ptr, i_c, i_bh, N, NX, C: tl.constexpr, KP, VP):
    """``(row0, x_ptr, first)`` of chunk ``i_c`` of head ``i_bh``: its first row in the ``[B, H, N·C, ...]``
    buffers, the head's read states ``X`` (``[NX, KP, VP]``) and the chunk's first read-state slot."""
    return i_bh.to(tl.int64) * N * C + i_c * C, x_ptr + i_bh.to(tl.int64) * NX * KP * VP, tl.load(first_ptr + i_c)


@triton.jit
def decayed_key_columns(k_ptr, skt, gc_ptr, row0, t, T, cols, K, C: tl.constexpr):
    """``K̃[:, cols]``: the chunk's keys decayed to its end, ``diag(γ_C / γ) K`` (``[C, len(cols)]``, zero past ``T``
    and ``K``). k at the head, tokens ``t``; gc: the cumulative decay, the chunk's rows from ``row0``."""
    gc = tl.load(gc_ptr + row0 + tl.arange(0, C))
    ratio = tl.exp(tl.load(gc_ptr + row0 + C - 1) - gc)
    return load_tile(k_ptr, skt, t, T, cols, K).to(gc.dtype) * ratio[:, None]


@triton.jit
def decayed_key_tiles(k_ptr, skt, gc_ptr, row0, t, T, K, C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr):
    """``(K̃₁, K̃₂)``: :func:`decayed_key_columns` of two key tiles (``[C, BK1]``, ``[C, BK2]``; with one tile the
    second repeats the first)."""
    kt1 = decayed_key_columns(k_ptr, skt, gc_ptr, row0, t, T, tl.arange(0, BK1), K, C)
    kt2 = kt1
    if BK2 > 0:
        kt2 = decayed_key_columns(k_ptr, skt, gc_ptr, row0, t, T, BK1 + tl.arange(0, BK2), K, C)
    return kt1, kt2


@triton.jit
def level_write_grad_kernel(
    k_ptr, gc_ptr, x_ptr, first_ptr, d_ptr, dw_ptr, du_ptr, T, N, H, K, n_levels, NX, skb, skt, skh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, B·H)``. The gradients of what chunk ``i_c`` writes into a level: with ``E = K̃ D`` (``[C, BV]``
    per value tile),

        dW = -Σ_ℓ E Sᵀ,    dU₀ = Σ_{ℓ: left half} E

    k: [B, T, H or 1, K]; d: the adjoints ``[B, H, N, n_levels, BK1 + BK2, VP]``; x: the read states
    ``[B, H, NX, BK1 + BK2, VP]``; writes dw ``[B, H, N·C, BK1 + BK2]`` and du ``[B, H, N·C, VP]`` (fp32)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    KP = BK1 + BK2
    row0, x_ptr, first = chunk_rows(x_ptr, first_ptr, i_c, i_bh, N, NX, C, KP, VP)
    d_ptr += (i_bh.to(tl.int64) * N + i_c) * n_levels * KP * VP  # the chunk's adjoints, [n_levels, KP, VP]
    k_ptr += (i_bh // H).to(tl.int64) * skb + (i_bh % H) * skh
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    kt1, kt2 = decayed_key_tiles(k_ptr, skt, gc_ptr, row0, i_c * C + rc, T, K, C, BK1, BK2)
    d_w1 = tl.zeros((C, BK1), dtype=kt1.dtype)
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        d_w2 = tl.zeros((C, BK2), dtype=kt1.dtype)
    for i_v in range(VP // BV):
        rv = i_v * BV + tl.arange(0, BV)
        d_u = tl.zeros((C, BV), dtype=kt1.dtype)
        z1 = tl.zeros((BK1, BV), dtype=kt1.dtype)
        if BK2 > 0:
            z2 = tl.zeros((BK2, BV), dtype=kt1.dtype)
        slot = first
        for level in range(1, n_levels + 1):
            if ((i_c >> level) << level) + (1 << (level - 1)) < N:  # this level's walk passes through chunk i_c
                read = ((i_c >> (level - 1)) & 1) == 1
                adjoint = d_ptr + (level - 1) * KP * VP
                states = x_ptr + slot.to(tl.int64) * KP * VP
                d1 = tl.load(adjoint + r1[:, None] * VP + rv[None, :])
                s1 = entering_state(states, z1, read, r1, rv, VP)
                e = tl.dot(kt1, d1, input_precision=IP)
                if BK2 > 0:
                    d2 = tl.load(adjoint + r2[:, None] * VP + rv[None, :])
                    s2 = entering_state(states, z2, read, r2, rv, VP)
                    e += tl.dot(kt2, d2, input_precision=IP)
                    d_w2 -= tl.dot(e, tl.trans(s2), input_precision=IP)
                d_w1 -= tl.dot(e, tl.trans(s1), input_precision=IP)
                d_u += e * tl.where(read, 0.0, 1.0)
                if read:
                    z1 += s1
                    if BK2 > 0:
                        z2 += s2
                    slot += 1
        store_rows(du_ptr + row0 * VP, VP, rc, rv, d_u)
    store_rows(dw_ptr + row0 * KP, KP, rc, r1, d_w1)
    if BK2 > 0:
        store_rows(dw_ptr + row0 * KP, KP, rc, r2, d_w2)


@triton.jit
def level_transition_grad_kernel(
    w_ptr, u_ptr, x_ptr, first_ptr, d_ptr, dkt_ptr, dgamma_ptr, N, n_levels, NX,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, B·H)``. The gradients of the decayed keys and the decay of chunk ``i_c``'s step
    ``S ← γ_C S + K̃ᵀ (u - W S)`` (``u = U₀`` in left halves, 0 in right halves):

        dK̃ = Σ_ℓ (u - W S) Dᵀ,    dγ_C = Σ_ℓ <D, S>

    d, x as :func:`level_write_grad_kernel`'s; writes dkt ``[B, H, N·C, BK1 + BK2]`` and dgamma ``[B, H, N]``."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    KP = BK1 + BK2
    row0, x_ptr, first = chunk_rows(x_ptr, first_ptr, i_c, i_bh, N, NX, C, KP, VP)
    d_ptr += (i_bh.to(tl.int64) * N + i_c) * n_levels * KP * VP  # the chunk's adjoints, [n_levels, KP, VP]
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    w1 = load_rows(w_ptr + row0 * KP, KP, rc, r1).to(u_ptr.dtype.element_ty)
    d_kt1 = tl.zeros((C, BK1), dtype=w1.dtype)
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        w2 = load_rows(w_ptr + row0 * KP, KP, rc, r2).to(w1.dtype)
        d_kt2 = tl.zeros((C, BK2), dtype=w1.dtype)
    d_gamma = tl.sum(tl.zeros((C,), dtype=w1.dtype), 0)
    for i_v in range(VP // BV):
        rv = i_v * BV + tl.arange(0, BV)
        u = load_rows(u_ptr + row0 * VP, VP, rc, rv)
        z1 = tl.zeros((BK1, BV), dtype=w1.dtype)
        if BK2 > 0:
            z2 = tl.zeros((BK2, BV), dtype=w1.dtype)
        slot = first
        for level in range(1, n_levels + 1):
            if ((i_c >> level) << level) + (1 << (level - 1)) < N:
                read = ((i_c >> (level - 1)) & 1) == 1
                adjoint = d_ptr + (level - 1) * KP * VP
                states = x_ptr + slot.to(tl.int64) * KP * VP
                s1 = entering_state(states, z1, read, r1, rv, VP)
                pseudo = u * tl.where(read, 0.0, 1.0) - tl.dot(w1, s1, input_precision=IP)
                if BK2 > 0:
                    s2 = entering_state(states, z2, read, r2, rv, VP)
                    pseudo -= tl.dot(w2, s2, input_precision=IP)
                    d2 = tl.load(adjoint + r2[:, None] * VP + rv[None, :])
                    d_kt2 += tl.dot(pseudo, tl.trans(d2), input_precision=IP)
                    d_gamma += tl.sum(tl.sum(d2 * s2, 1), 0)
                d1 = tl.load(adjoint + r1[:, None] * VP + rv[None, :])
                d_kt1 += tl.dot(pseudo, tl.trans(d1), input_precision=IP)
                d_gamma += tl.sum(tl.sum(d1 * s1, 1), 0)
                if read:
                    z1 += s1
                    if BK2 > 0:
                        z2 += s2
                    slot += 1
    store_rows(dkt_ptr + row0 * KP, KP, rc, r1, d_kt1)
    if BK2 > 0:
        store_rows(dkt_ptr + row0 * KP, KP, rc, r2, d_kt2)
    tl.store(dgamma_ptr + i_bh.to(tl.int64) * N + i_c, d_gamma)


@triton.jit
def level_gram_kernel(
    d_ptr, x_ptr, first_ptr, gram_ptr, dleft_ptr, dgamma_ptr, N, n_levels, NX,
    KP: tl.constexpr, GK: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``((KP / GK)², N, B·H)``: block ``(i, j)`` of chunk ``i_c``'s ``G = Σ_ℓ D_ℓ S_ℓᵀ`` (``[KP, KP]``, key
    rows of ``D`` by key rows of ``S``), summed over the levels whose walk passes through the chunk.

    The state entering a left-half chunk is the running sum of the lower read states, ``Z_ℓ = Σ_{a < ℓ, read}
    X_a``, so each read state meets its own adjoint plus every left-half adjoint above it:

        G = Σ_{a read} (D_a + Σ_{ℓ > a, left} D_ℓ) X_aᵀ,      D_left = Σ_{ℓ left} D_ℓ

    — the levels walked from the top down, one running sum of adjoints and ``popcount(i_c)`` products per value
    tile. The programs of column block ``j = 0`` store their rows of ``D_left`` (``[B, H, N, KP, VP]``); those of
    the diagonal, ``Σ <D_ℓ, S_ℓ>`` over their rows (the trace of their block, summed exactly, not by a product) in
    dgamma ``[B, H, N, KP / GK]``. d, x as :func:`level_write_grad_kernel`'s; gram: ``[B, H, N, KP, KP]``."""
    i_t, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NT = KP // GK
    t_i, t_j = i_t // NT, i_t % NT
    ri, rj = t_i * GK + tl.arange(0, GK), t_j * GK + tl.arange(0, GK)
    chunk = i_bh.to(tl.int64) * N + i_c
    d_ptr += chunk * n_levels * KP * VP  # the chunk's adjoints, [n_levels, KP, VP]
    x_ptr += i_bh.to(tl.int64) * NX * KP * VP
    last_slot = tl.load(first_ptr + i_c + 1) - 1
    gram = tl.zeros((GK, GK), dtype=d_ptr.dtype.element_ty)
    d_gamma = tl.sum(tl.zeros((GK,), dtype=d_ptr.dtype.element_ty), 0)
    for i_v in range(VP // BV):
        rv = i_v * BV + tl.arange(0, BV)
        left = tl.zeros((GK, BV), dtype=d_ptr.dtype.element_ty)
        slot = last_slot
        for step in range(n_levels):
            level = n_levels - step
            if ((i_c >> level) << level) + (1 << (level - 1)) < N:  # this level's walk passes through chunk i_c
                d = tl.load(d_ptr + (level - 1) * KP * VP + ri[:, None] * VP + rv[None, :])
                if ((i_c >> (level - 1)) & 1) == 1:
                    r = d + left
                    x = tl.load(x_ptr + slot.to(tl.int64) * KP * VP + rj[:, None] * VP + rv[None, :])
                    gram += tl.dot(r, tl.trans(x), input_precision=IP)
                    if t_i == t_j:  # then rj = ri
                        d_gamma += tl.sum(tl.sum(r * x, 1), 0)
                    slot -= 1
                else:
                    left += d
        if t_j == 0:
            tl.store(dleft_ptr + chunk * KP * VP + ri[:, None] * VP + rv[None, :], left)
    tl.store(gram_ptr + chunk * KP * KP + ri[:, None] * KP + rj[None, :], gram)
    if t_i == t_j:
        tl.store(dgamma_ptr + chunk * NT + t_i, d_gamma)


@triton.jit
def load_adjoint(slot_ptr, rv, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr, VP):
    """The transposed adjoint ``[a1, a2]`` (``[BV, BK1]``, ``[BV, BK2P]``) of a ``[KP, VP]`` block at ``slot_ptr``
    (the program's value columns ``rv``)."""
    columns = (slot_ptr + rv)[:, None]
    a1 = tl.load(columns + tl.arange(0, BK1)[None, :] * VP)
    if BK2 > 0:
        a2 = tl.load(columns + (BK1 + tl.arange(0, BK2P))[None, :] * VP)
    else:
        a2 = tl.zeros((rv.shape[0], BK2P), dtype=a1.dtype)
    return a1, a2


@triton.jit
def add_read_and_store(a1, a2, do_rows, do_mask, lam_ptr, slt, t, T, L, level, query, slot_ptr, rv,
                       BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr, VP, IP: tl.constexpr):
    """Store ``A = [a1, a2] + ((diag(λ_level) dO)ᵀ query)`` (held transposed, ``[BV, BK1 + BK2]``) in the
    ``[KP, VP]`` block at ``slot_ptr``: the adjoint of a read state, its own read added. do_rows, do_mask:
    pointers and mask of ``dOᵀ`` (``[BV, C]``), loaded here rather than held by the caller; query: pointers
    ``[C, 1]`` to the chunk's query rows."""
    read = tl.load(do_rows, mask=do_mask, other=0.0).to(a1.dtype) * load_level_column(lam_ptr, slt, t, T, L, level, a1.dtype)[None, :]
    a1 += tl.dot(read, tl.load(query + tl.arange(0, BK1)[None, :]).to(a1.dtype), input_precision=IP)
    columns = (slot_ptr + rv)[:, None]
    tl.store(columns + tl.arange(0, BK1)[None, :] * VP, a1)
    if BK2 > 0:
        a2 += tl.dot(read, tl.load(query + (BK1 + tl.arange(0, BK2P))[None, :]).to(a1.dtype), input_precision=IP)
        tl.store(columns + (BK1 + tl.arange(0, BK2P))[None, :] * VP, a2)


@triton.jit
def level_adjoint_walk_kernel(
    k_ptr, w_ptr, query_ptr, gc_ptr, lam_ptr, do_ptr, first_ptr, a_ptr,
    T, N, H, K, V, L, n_levels, NX,
    skb, skt, skh, slb, slt, slh, sdob, sdot, sdoh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr,
    BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(VP / BV, B·H)``: one walk from the last chunk to the first carrying every live level's adjoint at
    once. It stores ``A_{c,a}``, the adjoint of each read state ``X_{c,a}``, in the read states' own slots (a:
    ``[B, H, NX, BK1 + BK2, VP]``, as x). With ``j`` the trailing ones of ``c``, the forward made chunk ``c + 1``'s
    states from chunk ``c``'s as a binary counter makes its carry,

        X_{c+1, j+1} = Φ_c (Σ_{a ≤ j} X_{c,a}) + K̃ᵀ U₀,      X_{c+1, a} = Φ_c X_{c,a}   (a > j + 1),

    so backwards ``A_{c,a} = Φ_cᵀ A_{c+1, j+1} + R_{c,a}`` for ``a ≤ j`` (one transition for all of them),
    ``A_{c,a} = Φ_cᵀ A_{c+1, a} + R_{c,a}`` above, with the read's own ``R_{c,a} = queryᵀ diag(λ_a) dO``
    (held transposed, ``(diag(λ_a) dO)ᵀ query``)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    KP = BK1 + BK2
    rc, rv = tl.arange(0, C), tl.arange(0, BV)
    k_ptr += i_b.to(tl.int64) * skb + i_h * skh
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh + i_v * BV
    base = i_bh.to(tl.int64) * N * C
    gc_ptr += base
    w_ptr += base * KP
    query_ptr += base * KP
    a_ptr += i_bh.to(tl.int64) * NX * KP * VP + i_v * BV
    for step in range(N):
        c = N - 1 - step
        first = tl.load(first_ptr + c)
        later = tl.load(first_ptr + c + 1)  # chunk c + 1's first slot: its level j + 1, then c's levels above
        merges = trailing_ones(c, n_levels)
        k_c, w_c, gc_c = k_ptr + (c * C).to(tl.int64) * skt, w_ptr + c * C * KP, gc_ptr + c * C
        t = c * C + rc
        do_rows = do_ptr + t[None, :].to(tl.int64) * sdot + rv[:, None]
        do_mask = (t[None, :] < T) & (i_v * BV + rv[:, None] < V)
        query = (query_ptr + c * C * KP + rc * KP)[:, None]
        m1 = tl.zeros((BV, BK1), dtype=gc_ptr.dtype.element_ty)  # Φ_cᵀ A_{c+1, j+1}, shared by the merged levels
        m2 = tl.zeros((BV, BK2P), dtype=gc_ptr.dtype.element_ty)
        if (merges > 0) & (c + 1 < N):
            m1, m2 = load_adjoint(a_ptr + later.to(tl.int64) * KP * VP, rv, BK1, BK2, BK2P, VP)
            m1, m2 = carry_back(m1, m2, k_c, skt, w_c, gc_c, rc, T - c * C, K, BK1, BK2, IP)
        slots = a_ptr + first.to(tl.int64) * KP * VP
        for bit in range(merges):  # the merged levels (the trailing ones of c) all start from Φ_cᵀ A_{c+1, j+1}
            add_read_and_store(m1, m2, do_rows, do_mask, lam_ptr, slt, t, T, L, C_LOG + bit + 1, query, slots + bit * KP * VP,
                               rv, BK1, BK2, BK2P, VP, IP)
        rank = merges
        for bit in range(merges + 1, n_levels):  # every level above alone (bit `merges` of c is clear)
            if ((c >> bit) & 1) == 1:
                a1 = tl.zeros((BV, BK1), dtype=m1.dtype)
                a2 = tl.zeros((BV, BK2P), dtype=m1.dtype)
                if c + 1 < N:
                    a1, a2 = load_adjoint(a_ptr + (later + rank - merges + 1).to(tl.int64) * KP * VP, rv, BK1, BK2,
                                          BK2P, VP)
                    a1, a2 = carry_back(a1, a2, k_c, skt, w_c, gc_c, rc, T - c * C, K, BK1, BK2, IP)
                add_read_and_store(a1, a2, do_rows, do_mask, lam_ptr, slt, t, T, L, C_LOG + bit + 1, query,
                                   slots + rank * KP * VP, rv, BK1, BK2, BK2P, VP, IP)
                rank += 1
        tl.debug_barrier()  # chunk c's adjoints are stored before any thread loads them for chunk c - 1


@triton.jit
def slot_gram_kernel(
    a_ptr, x_ptr, first_ptr, gram_ptr, dgamma_ptr, N, n_levels, NX,
    KP: tl.constexpr, GK: tl.constexpr, BV: tl.constexpr, VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``((KP / GK)², N, B·H)``: block ``(i, j)`` of chunk ``i_c``'s ``G = Σ_ℓ D_ℓ S_ℓᵀ`` from the stacked
    walk's adjoints (:func:`level_adjoint_walk_kernel`): the adjoint leaving chunk ``c`` of the merged level is
    ``A_{c+1, j+1}``, its state ``Σ_{a ≤ j} X_{c,a}``; every level ``a`` above carries ``X_{c,a}`` into ``A_{c+1,a}``:

        G = A_{c+1, j+1} (Σ_{a ≤ j} X_{c,a})ᵀ + Σ_{a > j+1} A_{c+1,a} X_{c,a}ᵀ,      D_left = A_{c+1, j+1}

    (zero for the last chunk). Diagonal blocks also store ``Σ <D_ℓ, S_ℓ>`` over their rows, summed exactly, in
    dgamma ``[B, H, N, KP / GK]``; ``D_left`` is read in place by :func:`level_gram_grads_kernel`."""
    i_t, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NT = KP // GK
    t_i, t_j = i_t // NT, i_t % NT
    ri, rj = t_i * GK + tl.arange(0, GK), t_j * GK + tl.arange(0, GK)
    chunk = i_bh.to(tl.int64) * N + i_c
    a_ptr += i_bh.to(tl.int64) * NX * KP * VP
    x_ptr += i_bh.to(tl.int64) * NX * KP * VP
    first = tl.load(first_ptr + i_c)
    later = tl.load(first_ptr + i_c + 1)
    reads = later - first
    merges = trailing_ones(i_c, n_levels)
    gram = tl.zeros((GK, GK), dtype=a_ptr.dtype.element_ty)
    d_gamma = tl.sum(tl.zeros((GK,), dtype=a_ptr.dtype.element_ty), 0)
    if i_c + 1 < N:
        for i_v in range(VP // BV):
            rv = i_v * BV + tl.arange(0, BV)
            merged = tl.zeros((GK, BV), dtype=a_ptr.dtype.element_ty)
            for rank in range(merges):
                merged += tl.load(x_ptr + (first + rank).to(tl.int64) * KP * VP + rj[:, None] * VP + rv[None, :])
            for rank in range(merges, reads + 1):
                x = merged
                if rank > merges:  # the level of chunk i_c's read state of this rank, carried on alone
                    x = tl.load(x_ptr + (first + rank - 1).to(tl.int64) * KP * VP + rj[:, None] * VP + rv[None, :])
                if (rank > merges) | (merges > 0):
                    d = tl.load(a_ptr + (later + rank - merges).to(tl.int64) * KP * VP + ri[:, None] * VP + rv[None, :])
                    gram += tl.dot(d, tl.trans(x), input_precision=IP)
                    if t_i == t_j:  # then rj = ri
                        d_gamma += tl.sum(tl.sum(d * x, 1), 0)
    tl.store(gram_ptr + chunk * KP * KP + ri[:, None] * KP + rj[None, :], gram)
    if t_i == t_j:
        tl.store(dgamma_ptr + chunk * NT + t_i, d_gamma)


@triton.jit
def gram_block(gram_ptr, rows, cols, KP):
    """``G[rows, cols]`` of one chunk's ``[KP, KP]`` block."""
    return tl.load(gram_ptr + rows[:, None] * KP + cols[None, :])


@triton.jit
def level_gram_grads_kernel(
    k_ptr, w_ptr, u_ptr, gc_ptr, gram_ptr, dleft_ptr, first_ptr, dgamma_part_ptr, dw_ptr, du_ptr, dkt_ptr, dgamma_ptr,
    T, N, H, K, NX, skb, skt, skh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr, GK: tl.constexpr, BV: tl.constexpr,
    VP: tl.constexpr, NT: tl.constexpr, LEFT_IN_SLOTS: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, B·H)``. Chunk ``i_c``'s level gradients from its ``G`` and ``D_left`` (:func:`level_gram_kernel`):

        dW = -K̃ G,    dK̃ = U₀ D_leftᵀ - W Gᵀ,    dU₀ = K̃ D_left,    dγ_C = trace G

    (``Σ_ℓ -(K̃ D_ℓ) S_ℓᵀ`` and ``Σ_ℓ (u_ℓ - W S_ℓ) D_ℓᵀ`` regrouped: ``u_ℓ = U₀`` in left halves only). k, w,
    u, gc as the walks'; dleft: ``[B, H, N, KP, VP]``, or with ``LEFT_IN_SLOTS`` the stacked walk's adjoints
    (``D_left`` of chunk ``c`` is chunk ``c + 1``'s first slot, none for the last chunk); writes dw, dkt
    ``[B, H, N·C, BK1 + BK2]``, du ``[B, H, N·C, VP]``, dgamma ``[B, H, N]``. The products by ``G`` sum over
    ``NT`` blocks of ``GK`` keys (``BK2P``: ``BK2``, at least 16)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    KP = BK1 + BK2
    chunk = i_bh.to(tl.int64) * N + i_c
    row0 = chunk * C
    gram_ptr += chunk * KP * KP
    if LEFT_IN_SLOTS:
        dleft_ptr += (i_bh.to(tl.int64) * NX + tl.load(first_ptr + i_c + 1)) * KP * VP
        left_rows = tl.where(i_c + 1 < N, KP, 0)  # rows of D_left to load: none for the last chunk
    else:
        dleft_ptr += chunk * KP * VP
        left_rows = KP
    k_ptr += (i_bh // H).to(tl.int64) * skb + (i_bh % H) * skh
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    # dW = -K̃ G, then dK̃ = -W Gᵀ, each summed over column blocks j of GK keys: blocks of G, W and K̃ small
    # enough for shared memory at K = 256, and two accumulators live at a time
    acc = gc_ptr.dtype.element_ty
    r2 = BK1 + tl.arange(0, BK2P)
    d_w1 = tl.zeros((C, BK1), dtype=acc)
    d_w2 = tl.zeros((C, BK2P), dtype=acc)
    for j in tl.static_range(NT):
        rj = j * GK + tl.arange(0, GK)
        kt_j = decayed_key_columns(k_ptr, skt, gc_ptr, row0, i_c * C + rc, T, rj, K, C)
        d_w1 -= tl.dot(kt_j, gram_block(gram_ptr, rj, r1, KP), input_precision=IP)
        if BK2 > 0:
            d_w2 -= tl.dot(kt_j, gram_block(gram_ptr, rj, r2, KP), input_precision=IP)
    store_rows(dw_ptr + row0 * KP, KP, rc, r1, d_w1)
    if BK2 > 0:
        store_rows(dw_ptr + row0 * KP, KP, rc, r2, d_w2)
    d_kt1 = tl.zeros((C, BK1), dtype=acc)
    d_kt2 = tl.zeros((C, BK2P), dtype=acc)
    for j in tl.static_range(NT):
        rj = j * GK + tl.arange(0, GK)
        w_j = load_rows(w_ptr + row0 * KP, KP, rc, rj).to(acc)
        d_kt1 -= tl.dot(w_j, tl.trans(gram_block(gram_ptr, r1, rj, KP)), input_precision=IP)
        if BK2 > 0:
            d_kt2 -= tl.dot(w_j, tl.trans(gram_block(gram_ptr, r2, rj, KP)), input_precision=IP)
    kt1, kt2 = decayed_key_tiles(k_ptr, skt, gc_ptr, row0, i_c * C + rc, T, K, C, BK1, BK2)
    for i_v in range(VP // BV):
        rv = i_v * BV + tl.arange(0, BV)
        u = load_rows(u_ptr + row0 * VP, VP, rc, rv)
        left1 = tl.load(dleft_ptr + r1[:, None] * VP + rv[None, :],
                        mask=(r1[:, None] < left_rows) & (rv[None, :] < VP), other=0.0)
        d_kt1 += tl.dot(u, tl.trans(left1), input_precision=IP)
        d_u = tl.dot(kt1, left1, input_precision=IP)
        if BK2 > 0:
            left2 = tl.load(dleft_ptr + r2[:, None] * VP + rv[None, :],
                            mask=(r2[:, None] < left_rows) & (rv[None, :] < VP), other=0.0)
            d_kt2 += tl.dot(u, tl.trans(left2), input_precision=IP)
            d_u += tl.dot(kt2, left2, input_precision=IP)
        store_rows(du_ptr + row0 * VP, VP, rc, rv, d_u)
    store_rows(dkt_ptr + row0 * KP, KP, rc, r1, d_kt1)
    if BK2 > 0:
        store_rows(dkt_ptr + row0 * KP, KP, rc, r2, d_kt2)
    d_gamma = tl.load(dgamma_part_ptr + chunk * NT)
    for part in range(1, NT):
        d_gamma += tl.load(dgamma_part_ptr + chunk * NT + part)
    tl.store(dgamma_ptr + chunk, d_gamma)


@triton.jit
def level_read_grad_kernel(
    query_ptr, lam_ptr, do_ptr, x_ptr, first_ptr, dquery_ptr, dlam_ptr, T, N, H, V, L, n_levels, NX,
    slb, slt, slh, sdob, sdot, sdoh, sdlb, sdlt, sdlh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BV: tl.constexpr,
    VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, B·H)``. The gradients of chunk ``i_c``'s reads ``o += diag(λ_ℓ) query X_ℓ`` (bit ``ℓ - 1`` of
    ``i_c`` set), through one product per read, ``M_ℓ = dO X_ℓᵀ`` (``[C, K]``, summed over the value tiles):

        dquery = Σ_ℓ diag(λ_ℓ) M_ℓ,    dλ[:, c0 + ℓ] = rowsum(query ⊙ M_ℓ)    (= rowsum(dO ⊙ query X_ℓ))

    lam: [B, T, H, L]; do: [B, T, H, V]; x as :func:`level_write_grad_kernel`'s; writes dquery
    ``[B, H, N·C, BK1 + BK2]`` (fp32) and the columns of dlam (``[B, T, H, L]``, zeroed) of the levels read, one
    ``[C]`` column per level (no tile of all the levels, whose width would grow with ``T``)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    KP = BK1 + BK2
    row0, x_ptr, first = chunk_rows(x_ptr, first_ptr, i_c, i_bh, N, NX, C, KP, VP)
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dlam_ptr += i_b.to(tl.int64) * sdlb + i_h * sdlh
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    t = i_c * C + rc
    acc = dquery_ptr.dtype.element_ty
    d_query1 = tl.zeros((C, BK1), dtype=acc)
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        d_query2 = tl.zeros((C, BK2), dtype=acc)
    slot = first
    for level in range(1, n_levels + 1):
        if ((i_c >> (level - 1)) & 1) == 1:
            states = x_ptr + slot.to(tl.int64) * KP * VP
            m1 = tl.zeros((C, BK1), dtype=acc)
            if BK2 > 0:
                m2 = tl.zeros((C, BK2), dtype=acc)
            for i_v in range(VP // BV):
                rv = i_v * BV + tl.arange(0, BV)
                do = load_tile(do_ptr, sdot, t, T, rv, V).to(acc)
                m1 += tl.dot(do, tl.trans(tl.load(states + r1[:, None] * VP + rv[None, :])), input_precision=IP)
                if BK2 > 0:
                    m2 += tl.dot(do, tl.trans(tl.load(states + r2[:, None] * VP + rv[None, :])), input_precision=IP)
            lam_level = load_level_column(lam_ptr, slt, t, T, L, C_LOG + level, acc)[:, None]
            d_query1 += lam_level * m1
            d_level = tl.sum(load_rows(query_ptr + row0 * KP, KP, rc, r1).to(acc) * m1, 1)
            if BK2 > 0:
                d_query2 += lam_level * m2
                d_level += tl.sum(load_rows(query_ptr + row0 * KP, KP, rc, r2).to(acc) * m2, 1)
            store_level_column(dlam_ptr, sdlt, t, T, L, C_LOG + level, d_level)
            slot += 1
    store_rows(dquery_ptr + row0 * KP, KP, rc, r1, d_query1)
    if BK2 > 0:
        store_rows(dquery_ptr + row0 * KP, KP, rc, r2, d_query2)


@triton.jit
def delta_chunk_values_bwd_kernel(
    v_ptr, lam_ptr, do_ptr, beta_ptr, tb_ptr, p_ptr, du_ptr, dv_ptr, dlam_ptr, dsq_ptr, dbeta_ptr,
    T, N, H, V, L,
    svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdvb, sdvt, sdvh, sdlb, sdlt, sdlh,
    C: tl.constexpr, C_LOG: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, H, B)``. The values' share of the WY backward, tile by tile of ``BV`` value columns: through the
    intra-chunk product ``(P ⊙ Λ) V`` and ``U₀ = T_β diag(β) V``,

        dv = (P ⊙ Λ)ᵀ dO + diag(β) T_βᵀ dU₀,      dλ[:, l] = Σ_{j: level(i, j) = l} (dO Vᵀ ⊙ P)[i, j]  (l <= C_LOG)
        dP = causal(dO Vᵀ ⊙ Λ),      dT_β ∋ dU₀ (diag(β) V)ᵀ,      dβ ∋ rowsum(V ⊙ T_βᵀ dU₀)

    v, do, dv: [B, T, H, V]; lam, dlam: [B, T, H, L]; du: [B, H, N·C, NV·BV]; writes dv, dlam's columns
    ``0..C_LOG``, dsq ``[B, H, N, 2, C, C]`` (the value share of dT_β, then dP) and dbeta's value share
    (``[B, H, N·C]``, fp32): :func:`delta_chunk_keys_bwd_kernel` finishes both."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    chunk = (i_b * H + i_h).to(tl.int64) * N + i_c
    rc = tl.arange(0, C)
    t = i_c * C + rc
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh + (i_c * C).to(tl.int64) * svt
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh + (i_c * C).to(tl.int64) * sdot
    dv_ptr += i_b.to(tl.int64) * sdvb + i_h * sdvh + (i_c * C).to(tl.int64) * sdvt
    du_ptr += chunk * C * NV * BV
    within = rc[:, None] * C + rc[None, :]  # offsets inside a C × C block
    beta = tl.load(beta_ptr + chunk * C + rc)
    t_beta = tl.load(tb_ptr + chunk * C * C + within)
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh
    levels = fenwick_levels(C, C_LOG)
    weights = tl.load(p_ptr + chunk * C * C + within) * load_level_scale_matrix(lam_ptr, slt, t, T, L, levels, C_LOG,
                                                                                beta.dtype)
    d_pairs = tl.zeros((C, C), dtype=beta.dtype)  # dO Vᵀ
    d_t = tl.zeros((C, C), dtype=beta.dtype)
    d_beta = tl.zeros((C,), dtype=beta.dtype)
    for i_v in range(NV):
        rv = i_v * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, svt, rc, T - i_c * C, rv, V).to(beta.dtype)
        do = load_tile(do_ptr, sdot, rc, T - i_c * C, rv, V).to(beta.dtype)
        du = tl.load(du_ptr + rc[:, None] * (NV * BV) + rv[None, :])
        d_pairs += tl.dot(do, tl.trans(v), input_precision=IP)
        d_t += tl.dot(du, tl.trans(v * beta[:, None]), input_precision=IP)
        d_vb = tl.dot(tl.trans(t_beta), du, input_precision=IP)
        d_beta += tl.sum(v * d_vb, 1)
        dv = tl.dot(tl.trans(weights), do, input_precision=IP) + beta[:, None] * d_vb
        store_tile(dv_ptr, sdvt, rc, T - i_c * C, rv, V, dv)
    dlam_ptr += i_b.to(tl.int64) * sdlb + i_h * sdlh
    store_level_sums(dlam_ptr, sdlt, t, T, L, d_pairs * tl.load(p_ptr + chunk * C * C + within), levels, C_LOG)
    causal = rc[:, None] >= rc[None, :]
    d_intra = tl.where(causal, d_pairs * load_level_scale_matrix(lam_ptr, slt, t, T, L, levels, C_LOG, beta.dtype),
                       0.0)
    tl.store(dsq_ptr + chunk * 2 * C * C + within, d_t)
    tl.store(dsq_ptr + chunk * 2 * C * C + C * C + within, d_intra)
    tl.store(dbeta_ptr + chunk * C + rc, d_beta)


@triton.jit
def key_products(q_ptr, k_ptr, stride_t, rc, T, K, dtype, BK1: tl.constexpr, BK2: tl.constexpr, KS1: tl.constexpr,
                 KS2: tl.constexpr, KEYS: tl.constexpr, IP: tl.constexpr):
    """``Q Kᵀ`` of the chunk, or ``K Kᵀ`` where ``KEYS`` (``[C, C]`` in ``dtype``), summed over key sub-tiles of
    ``KS1`` columns in the first key tile and ``KS2`` in the second (q, k multiplied in their own type); q, k at the
    chunk's first row, rows ``rc < T`` valid."""
    out = tl.zeros((rc.shape[0], rc.shape[0]), dtype=dtype)
    for j in range(BK1 // KS1):
        cols = j * KS1 + tl.arange(0, KS1)
        at, inside = rc[:, None] * stride_t + cols[None, :], (rc[:, None] < T) & (cols[None, :] < K)
        k = tl.load(k_ptr + at, mask=inside, other=0.0)
        left = k if KEYS else tl.load(q_ptr + at, mask=inside, other=0.0)
        out += tl.dot(left, tl.trans(k), input_precision=IP)
    if BK2 > 0:
        for j in range(BK2 // KS2):
            cols = BK1 + j * KS2 + tl.arange(0, KS2)
            at, inside = rc[:, None] * stride_t + cols[None, :], (rc[:, None] < T) & (cols[None, :] < K)
            k = tl.load(k_ptr + at, mask=inside, other=0.0)
            left = k if KEYS else tl.load(q_ptr + at, mask=inside, other=0.0)
            out += tl.dot(left, tl.trans(k), input_precision=IP)
    return out


@triton.jit
def wy_key_tile(q_ptr, k_ptr, stride_t, rc, T, K, cols, dquery_ptr, dw_ptr, dkt_ptr, w_ptr, KP, scores, d_scores,
                d_kw, d_gamma, d_ratio, IP: tl.constexpr):
    """One key sub-tile (columns ``cols``; pointers at the chunk's first row, rows ``rc < T`` valid) back through
    ``query = diag(γ) Q - (Γ ⊙ Q Kᵀ) W``: stores the total gradient of ``W``, ``dW - (Γ ⊙ Q Kᵀ)ᵀ dquery``, over
    dw's own, and returns the accumulators ``d(Γ ⊙ Q Kᵀ) -= dquery Wᵀ``, ``K dWᵀ``, ``Σ_cols q ⊙ dquery`` and
    ``Σ_cols k ⊙ dK̃`` with the sub-tile's terms. ``dWᵀ`` (``[KS, C]``) is formed transposed, ``dWᵀ - dqueryᵀ
    (Γ ⊙ Q Kᵀ)``, so that the ``C × C`` scores, the same for every sub-tile, are a product's right operand (read
    from shared memory, not held in registers)."""
    at, at_in = rc[:, None] * KP + cols[None, :], rc[:, None] * stride_t + cols[None, :]
    inside = (rc[:, None] < T) & (cols[None, :] < K)
    dquery = tl.load(dquery_ptr + at)
    d_gamma += tl.sum(tl.load(q_ptr + at_in, mask=inside, other=0.0).to(dquery.dtype) * dquery, 1)
    d_scores -= tl.dot(dquery, tl.trans(tl.load(w_ptr + at).to(dquery.dtype)), input_precision=IP)
    at_t = cols[:, None] + rc[None, :] * KP
    d_w = tl.load(dw_ptr + at_t) - tl.dot(tl.trans(dquery), scores, input_precision=IP)  # dWᵀ: [KS, C]
    tl.store(dw_ptr + at_t, d_w)
    k = tl.load(k_ptr + at_in, mask=inside, other=0.0).to(dquery.dtype)
    d_kw += tl.dot(k, d_w, input_precision=IP)
    d_ratio += tl.sum(k * tl.load(dkt_ptr + at), 1)
    return d_scores, d_kw, d_gamma, d_ratio


@triton.jit
def delta_chunk_solve_bwd_kernel(
    q_ptr, k_ptr, beta_ptr, gc_ptr, tb_ptr, w_ptr, dquery_ptr, dw_ptr, dkt_ptr, dgamma_ptr, dsq_ptr,
    dpairs_ptr, dbeta_ptr, dgc_ptr,
    T, N, H, K, sqb, sqt, sqh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, KS1: tl.constexpr, KS2: tl.constexpr,
    IP: tl.constexpr, IPS: tl.constexpr,
):
    """Grid ``(N, H, B)``. The keys' share of the WY backward up to the triangular solve, after
    :func:`delta_chunk_values_bwd_kernel` (``dP`` and the value share of ``dT_β`` in dsq). Over the key columns, in
    sub-tiles of ``KS1`` / ``KS2`` (:func:`wy_key_tile`), with ``dW`` the total gradient of ``W``:

        d(Γ ⊙ Q Kᵀ) = dP diag(β) T_βᵀ - dquery Wᵀ,      dT_β += (Γ ⊙ Q Kᵀ)ᵀ dP diag(β) + dW Kᵀ diag(βγ),
        dβ += γ ⊙ colsum(T_β ⊙ dW Kᵀ) + colsum((Γ ⊙ Q Kᵀ) T_β ⊙ dP)

    (``colsum(T_β ⊙ dW Kᵀ) = rowsum(K ⊙ T_βᵀ dW)``: the gradient of the row scales ``βγ`` of ``diag(βγ) K``), then
    the solve's backward ``dA_β = -T_βᵀ dT_β T_βᵀ`` (strictly lower) to ``β`` and ``Γ ⊙ K Kᵀ``. q, k:
    [B, T, H or 1, K]. Overwrites dw (``[B, H, N·C, KP]``) with the total ``dW``, adds the keys' share to dbeta,
    writes dgc (fp32 ``[B, H, N·C]``, the gradient of the within-chunk cumulative decay) and dpairs
    ``[B, H, N, 2, C, C]``: the gradients of ``Q Kᵀ`` and of ``K Kᵀ`` (symmetrised), for
    :func:`delta_chunk_qk_bwd_kernel`. Every pointer is moved to the chunk first, so that the tiles' offsets are
    32-bit."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    chunk = (i_b * H + i_h).to(tl.int64) * N + i_c
    rc = tl.arange(0, C)
    KP = BK1 + BK2
    T_c = T - i_c * C  # valid rows of the chunk
    shift = i_b.to(tl.int64) * sqb + i_h * sqh + (i_c * C).to(tl.int64) * sqt
    q_ptr += shift
    k_ptr += shift
    gc_ptr += chunk * C
    beta_ptr += chunk * C
    dbeta_ptr += chunk * C
    dgc_ptr += chunk * C
    tb_ptr += chunk * C * C
    dsq_ptr += chunk * 2 * C * C
    dpairs_ptr += chunk * 2 * C * C
    w_ptr += chunk * C * KP
    dquery_ptr += chunk * C * KP
    dw_ptr += chunk * C * KP
    dkt_ptr += chunk * C * KP
    within = rc[:, None] * C + rc[None, :]  # offsets inside a C × C block
    gc = tl.load(gc_ptr + rc)
    scores = decay_matrix(gc, C) * key_products(q_ptr, k_ptr, sqt, rc, T_c, K, gc.dtype, BK1, BK2, KS1, KS2, False,
                                                IP)  # Γ ⊙ Q Kᵀ
    beta = tl.load(beta_ptr + rc)
    d_scores = dot_split(tl.load(dsq_ptr + C * C + within) * beta[None, :], tl.trans(tl.load(tb_ptr + within)), IPS)
    d_kw = tl.zeros((C, C), dtype=gc.dtype)  # K dWᵀ
    d_gamma = tl.zeros((C,), dtype=gc.dtype)
    d_ratio = tl.zeros((C,), dtype=gc.dtype)
    for j in range(BK1 // KS1):
        d_scores, d_kw, d_gamma, d_ratio = wy_key_tile(
            q_ptr, k_ptr, sqt, rc, T_c, K, j * KS1 + tl.arange(0, KS1), dquery_ptr, dw_ptr, dkt_ptr, w_ptr, KP,
            scores, d_scores, d_kw, d_gamma, d_ratio, IP)
    if BK2 > 0:
        for j in range(BK2 // KS2):
            d_scores, d_kw, d_gamma, d_ratio = wy_key_tile(
                q_ptr, k_ptr, sqt, rc, T_c, K, BK1 + j * KS2 + tl.arange(0, KS2), dquery_ptr, dw_ptr, dkt_ptr, w_ptr,
                KP, scores, d_scores, d_kw, d_gamma, d_ratio, IP)
    tl.store(dpairs_ptr + within, decay_matrix(gc, C) * d_scores)  # dQK
    d_decay = scores * d_scores  # dΓ ⊙ Γ, its Q Kᵀ part
    d_gc = tl.sum(d_decay, 1) - tl.sum(d_decay, 0)
    t_beta = tl.load(tb_ptr + within)
    kd = tl.sum(tl.trans(t_beta) * d_kw, 1)  # rowsum(K ⊙ T_βᵀ dW)
    gamma = tl.exp(gc)
    d_t = tl.load(dsq_ptr + within) + tl.trans(d_kw) * (beta * gamma)[None, :]
    d_intra = tl.load(dsq_ptr + C * C + within)  # dP
    d_beta = tl.load(dbeta_ptr + rc) + gamma * kd + tl.sum(dot_split(scores, t_beta, IPS) * d_intra, 0)
    d_t += dot_split(tl.trans(scores), d_intra * beta[None, :], IPS)
    d_gamma += beta * kd
    # the triangular solve: T_β = (I + M)⁻¹ with M = strict_lower(diag(β) (Γ ⊙ K Kᵀ))
    d_m = -dot_split(dot_split(tl.trans(t_beta), d_t, IPS), tl.trans(t_beta), IPS)
    d_m = tl.where(rc[:, None] > rc[None, :], d_m, 0.0) * decay_matrix(gc, C)
    kk = key_products(q_ptr, k_ptr, sqt, rc, T_c, K, gc.dtype, BK1, BK2, KS1, KS2, True, IP)
    d_beta += tl.sum(d_m * kk, 1)
    d_kk = d_m * beta[:, None]
    tl.store(dpairs_ptr + C * C + within, d_kk + tl.trans(d_kk))  # dKK
    d_decay = kk * d_kk  # dΓ ⊙ Γ, its K Kᵀ part
    g_last = tl.load(gc_ptr + C - 1)
    ratio = tl.exp(g_last - gc)
    d_gc += d_gamma * gamma + tl.sum(d_decay, 1) - tl.sum(d_decay, 0) - d_ratio * ratio
    d_last = tl.sum(d_ratio * ratio, 0) + tl.load(dgamma_ptr + chunk) * tl.exp(g_last)
    d_gc += tl.where(rc == C - 1, d_last, 0.0)
    tl.store(dgc_ptr + rc, d_gc)
    tl.store(dbeta_ptr + rc, d_beta)


@triton.jit
def delta_chunk_qk_bwd_kernel(
    q_ptr, k_ptr, beta_ptr, gc_ptr, tb_ptr, dquery_ptr, dw_ptr, dkt_ptr, dpairs_ptr, dq_ptr, dk_ptr,
    T, N, H, K, sqb, sqt, sqh,
    C: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N · KP / KS, H, B)``: one program per chunk and key sub-tile of ``KS`` columns. dq and dk, after
    :func:`delta_chunk_solve_bwd_kernel`:

        dq = diag(γ) dquery + dQK K,      dk = diag(βγ) T_βᵀ dW + diag(γ_C / γ) dK̃ + dKK K + dQKᵀ Q

    (``dW`` the total gradient of W, ``dQK``, ``dKK`` those of ``Q Kᵀ``, ``K Kᵀ`` from dpairs), formed transposed
    (``[KS, C]``: ``dqᵀ = dqueryᵀ diag(γ) + Kᵀ dQKᵀ``, ...) so that the chunk's ``C × C`` matrices are the right
    operands of the products (read from shared memory). q, k: [B, T, H or 1, K]; writes dq, dk (fp32
    ``[B, T, H, K]``, per head)."""
    i_c, i_h, i_b = tl.program_id(0) // (KP // KS), tl.program_id(1), tl.program_id(2)
    chunk = (i_b * H + i_h).to(tl.int64) * N + i_c
    rc = tl.arange(0, C)
    cols = tl.program_id(0) % (KP // KS) * KS + tl.arange(0, KS)
    within = rc[:, None] * C + rc[None, :]  # offsets inside a C × C block
    inside = (cols[:, None] < K) & (i_c * C + rc[None, :] < T)
    shift = i_b.to(tl.int64) * sqb + i_h * sqh + (i_c * C).to(tl.int64) * sqt  # the chunk's q, k
    q_ptr += shift
    k_ptr += shift
    dq_ptr += (i_b.to(tl.int64) * T + i_c * C) * H * K + i_h * K
    dk_ptr += (i_b.to(tl.int64) * T + i_c * C) * H * K + i_h * K
    gc_ptr += chunk * C
    beta_ptr += chunk * C
    tb_ptr += chunk * C * C
    dpairs_ptr += chunk * 2 * C * C
    dquery_ptr += chunk * C * KP
    dw_ptr += chunk * C * KP
    dkt_ptr += chunk * C * KP
    at_in = cols[:, None] + rc[None, :] * sqt
    at = cols[:, None] + rc[None, :] * KP
    at_out = cols[:, None] + rc[None, :] * (H * K)
    gc = tl.load(gc_ptr + rc)
    gamma = tl.exp(gc)
    d_qk = tl.load(dpairs_ptr + within)
    k = tl.load(k_ptr + at_in, mask=inside, other=0.0).to(gc.dtype)  # Kᵀ: [KS, C]
    dq = tl.load(dquery_ptr + at) * gamma[None, :] + tl.dot(k, tl.trans(d_qk), input_precision=IP)
    tl.store(dq_ptr + at_out, dq.to(dq_ptr.dtype.element_ty), mask=inside)
    dk = tl.dot(tl.load(dw_ptr + at), tl.load(tb_ptr + within), input_precision=IP)
    dk *= (tl.load(beta_ptr + rc) * gamma)[None, :]
    dk += tl.load(dkt_ptr + at) * tl.exp(tl.load(gc_ptr + C - 1) - gc)[None, :]
    dk += tl.dot(k, tl.load(dpairs_ptr + C * C + within), input_precision=IP)
    dk += tl.dot(tl.load(q_ptr + at_in, mask=inside, other=0.0).to(gc.dtype), d_qk, input_precision=IP)
    tl.store(dk_ptr + at_out, dk.to(dk_ptr.dtype.element_ty), mask=inside)


def loglinear_delta_backward(q, k, v, level_scales, chunks: DeltaChunks, states, do, chunk_size: int = 64,
                             config: DeltaLaunchConfig = DeltaLaunchConfig(), grads: dict | None = None):
    """Gradients of :func:`~loglin_edu.kernels.step7_delta_levels.loglinear_delta_forward`:
    ``(dq, dk, dv, dlam, dbeta, dgc)``.

    Inputs as the forward's (``chunks``, ``states`` what it returned), do: ``[B, T, H, V]``. dq, dk are shaped
    like q, k (summed over heads when shared); dbeta: ``[B, T, H]`` (fp32); dgc: ``[B, H, N·C]`` (fp32) is the gradient of
    the within-chunk cumulative decay. ``grads`` may hold preallocated ``"dv"`` and ``"dlam"`` (zeroed), any
    strides with the last dimension contiguous.
    """
    grads = dict(grads or {})
    B, T, Hk, K = q.shape
    H, V, L = v.shape[2], v.shape[3], level_scales.shape[3]
    N = -(-T // chunk_size)
    n_levels = num_chunk_levels(T, chunk_size)
    acc = accumulator_dtype(q.dtype)
    BK1, BK2 = key_tiles(K, config.key_tile)
    BV, NV = value_tiles(V, config)
    KP, VP = BK1 + BK2, NV * BV
    BVG = min(BV, config.level_grad_value_tile())  # the level gradients' value tile (it divides BV)
    C_LOG = chunk_size.bit_length() - 1
    IP = dot_precision(q.dtype, config.precision)
    sqh = 0 if Hk == 1 else q.stride(2)
    new = lambda *shape: torch.empty(*shape, device=q.device, dtype=acc)  # noqa: E731
    lam_strides = (level_scales.stride(0), level_scales.stride(1), level_scales.stride(2))
    do_strides = (do.stride(0), do.stride(1), do.stride(2))
    d_query, d_w, d_kt = new(B, H, N * chunk_size, KP), new(B, H, N * chunk_size, KP), new(B, H, N * chunk_size, KP)
    d_u, d_gamma = new(B, H, N * chunk_size, VP), new(B, H, N)
    dlam = grads.get("dlam", torch.zeros(B, T, H, L, device=q.device, dtype=level_scales.dtype))
    dlam_strides = (dlam.stride(0), dlam.stride(1), dlam.stride(2))
    first = first_slots(N, q.device)
    NX = states.shape[2]
    grid, tiles = (N, B * H), dict(C=chunk_size, BK1=BK1, BK2=BK2, BV=BVG, VP=VP, IP=IP, num_warps=config.grad_warps,
                                   num_stages=config.stages("read"))
    GK = min(64, BK1, BK2 or BK1)  # a power of two dividing BK1 + BK2
    through_gram = config.backward_walk == "stacked" or config.gram_grads
    gram, d_gamma_parts = (new(B, H, N, KP, KP), new(B, H, N, KP // GK)) if through_gram else (None, None)
    gram_launch = dict(KP=KP, GK=GK, BV=BV, VP=VP, IP=IP, num_warps=config.grad_warps, num_stages=config.stages("gram"))
    if config.backward_walk == "stacked":
        d_left = torch.empty_like(states)  # the adjoints of the read states, in their slots
        BVA = min(BV, config.adjoint_value_tile or BV)  # a power of two dividing VP
        level_adjoint_walk_kernel[(VP // BVA, B * H)](
            k, chunks.w, chunks.query, chunks.gc, level_scales, do, first, d_left, T, N, H, K, V, L, n_levels, NX,
            k.stride(0), k.stride(1), sqh, *lam_strides, *do_strides,
            C=chunk_size, C_LOG=C_LOG, BK1=BK1, BK2=BK2, BK2P=max(BK2, 16), BV=BVA, VP=VP, IP=IP,
            **config.walk_launch(reverse=True),
        )
        slot_gram_kernel[((KP // GK) ** 2, N, B * H)](d_left, states, first, gram, d_gamma_parts, N, n_levels, NX,
                                                       **gram_launch)
    else:
        adjoints = new(B, H, N, max(n_levels, 1), KP, VP)
        walks = walk_table(N, q.device)
        if len(walks):
            level_walk_bwd_kernel[(NV, B * H, len(walks))](
                k, chunks.w, chunks.query, chunks.gc, level_scales, do, adjoints, walks, T, N, H, K, V, L, n_levels,
                k.stride(0), k.stride(1), sqh, *lam_strides, *do_strides,
                C=chunk_size, C_LOG=C_LOG, BK1=BK1, BK2=BK2, BK2P=max(BK2, 16), BV=BV, VP=VP, IP=IP,
                **config.walk_launch(reverse=True),
            )
        if config.gram_grads:
            d_left = new(B, H, N, KP, VP)
            level_gram_kernel[((KP // GK) ** 2, N, B * H)](adjoints, states, first, gram, d_left, d_gamma_parts, N,
                                                           n_levels, NX, **gram_launch)
        else:
            level_write_grad_kernel[grid](k, chunks.gc, states, first, adjoints, d_w, d_u, T, N, H, K, n_levels, NX,
                                          k.stride(0), k.stride(1), sqh, **tiles)
            level_transition_grad_kernel[grid](chunks.w, chunks.u, states, first, adjoints, d_kt, d_gamma, N,
                                               n_levels, NX, **tiles)
        del adjoints
    if through_gram:
        level_gram_grads_kernel[grid](
            k, chunks.w, chunks.u, chunks.gc, gram, d_left, first, d_gamma_parts, d_w, d_u, d_kt, d_gamma, T, N, H, K,
            NX, k.stride(0), k.stride(1), sqh, C=chunk_size, BK1=BK1, BK2=BK2, BK2P=max(BK2, 16), GK=GK,
            BV=BV, VP=VP, NT=KP // GK,
            LEFT_IN_SLOTS=config.backward_walk == "stacked", IP=IP, num_warps=config.grad_warps,
            num_stages=config.stages("gram"),
        )
        del d_left
    del gram, d_gamma_parts
    level_read_grad_kernel[grid](chunks.query, level_scales, do, states, first, d_query, dlam, T, N, H, V, L,
                                 n_levels, NX, *lam_strides, *do_strides, *dlam_strides, C_LOG=C_LOG, **tiles)
    dq, dk = torch.empty(B, T, H, K, device=q.device, dtype=acc), torch.empty(B, T, H, K, device=q.device, dtype=acc)
    dv = grads.get("dv", torch.empty(B, T, H, V, device=q.device, dtype=v.dtype))
    d_beta, d_gc = new(B, H, N * chunk_size), new(B, H, N * chunk_size)
    d_squares = new(B, H, N, 2, chunk_size, chunk_size)
    IPC = chunk_precision(q.dtype, config.precision)
    BVA = min(BV, VALUE_SUB_TILE)
    delta_chunk_values_bwd_kernel[(N, H, B)](
        v, level_scales, do, chunks.beta, chunks.t_beta, chunks.intra, d_u, dv, dlam, d_squares, d_beta, T, N, H, V, L,
        v.stride(0), v.stride(1), v.stride(2), *lam_strides, *do_strides, dv.stride(0), dv.stride(1), dv.stride(2),
        *dlam_strides, C=chunk_size, C_LOG=C_LOG, BV=BVA, NV=VP // BVA, IP=IPC,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    del d_u
    d_pairs = new(B, H, N, 2, chunk_size, chunk_size)
    delta_chunk_solve_bwd_kernel[(N, H, B)](
        q, k, chunks.beta, chunks.gc, chunks.t_beta, chunks.w, d_query, d_w, d_kt, d_gamma, d_squares, d_pairs, d_beta,
        d_gc, T, N, H, K, q.stride(0), q.stride(1), sqh, C=chunk_size, BK1=BK1, BK2=BK2, KS1=min(BK1, SOLVE_KEY_TILE),
        KS2=min(max(BK2, 16), SOLVE_KEY_TILE), IP=IPC, IPS=solve_precision(q.dtype), num_warps=config.solve_warps,
        num_stages=config.num_stages,
    )
    del d_squares
    KS = min(BK2 or BK1, QK_KEY_TILE)
    delta_chunk_qk_bwd_kernel[(N * (KP // KS), H, B)](
        q, k, chunks.beta, chunks.gc, chunks.t_beta, d_query, d_w, d_kt, d_pairs, dq, dk, T, N, H, K,
        q.stride(0), q.stride(1), sqh, C=chunk_size, KP=KP, KS=KS, IP=IPC, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if Hk == 1:
        dq, dk = dq.sum(2, keepdim=True), dk.sum(2, keepdim=True)
    dbeta = d_beta[:, :, :T].transpose(1, 2)
    return dq.to(q.dtype), dk.to(k.dtype), dv, dlam, dbeta, d_gc


def chunk_reverse_cumsum(d_gc: torch.Tensor, T: int, chunk_size: int) -> torch.Tensor:
    """``d log_decay: [B, T, H]`` from the gradient of the within-chunk cumulative decay ``d_gc: [B, H, N·C]``:
    a reverse cumulative sum inside each chunk (fp64)."""
    B, H, NC = d_gc.shape
    per_chunk = reverse_cumsum(d_gc.view(B, H, NC // chunk_size, chunk_size), -1)
    return per_chunk.reshape(B, H, NC)[:, :, :T].transpose(1, 2)
