"""Step 4 — the backward kernels: node gradients, then ``dk, dv`` and ``dq, dλ``; ``d log_decay`` last.

The forward of step 3, per chunk ``c`` and chunk level ``ℓ`` (bit ``ℓ - 1`` of ``c`` set), reads node
``e(c, ℓ)`` through the scaled queries ``Q̃_ℓ = diag(λ[:, c0 + ℓ] · exp(gc + G_{start(c)-1} - G_e)) Q``:
``o += Q̃_ℓ S_e``. Its backward, in three launches:

1. :func:`node_grad_kernel` — the gradient of every node, a sum over the chunks that read it:

       dS_e = Σ_{c reads e} Q̃_ℓᵀ dO_c                    ([K, C] × [C, V] per reader)

   The readers of node ``e`` at level ``ℓ`` are the ``2^(ℓ-1)`` chunks right after it. Grid
   ``(H, N / 2^m, B)`` as the tree kernel: a program owns ``2^m`` chunks; nodes whose readers all lie
   in its block it sums and stores; for the levels above ``m`` it sums its own chunks' share and adds
   it atomically (one add per block and level) into the node's slot, zeroed first: a node above the
   blocks ends where a block ends, a slot no node inside the blocks uses (:func:`upper_node_grads`).
2. :func:`dkdv_kernel` — per chunk: the gradient of its leaf ``K̃ᵀ V`` is the sum of the node gradients
   of its ancestors that are read (left children): ``dU_c = Σ_h exp(G_{e_h} - G_{end(c)}) dS_{e_h}``,
   one ``[K, V]`` add per height, then ``dv = ((Q Kᵀ) ⊙ E ⊙ Λ)ᵀ dO + K̃ dU_c`` and
   ``dk = ((dO Vᵀ) ⊙ E ⊙ Λ)ᵀ Q + diag(exp(gc_last - gc)) V dU_cᵀ``. The node gradients are freed after it.
3. :func:`dq_kernel` — per chunk: ``dq = ((dO Vᵀ) ⊙ E ⊙ Λ) K + Σ_ℓ λ_ℓ ⊙ X_ℓ`` with
   ``X_ℓ = diag(exp(gc + G_{start-1} - G_e)) dO S_eᵀ``, and ``dλ``: inside the chunk the sums of
   ``(dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E`` over the keys of each level, and at level ``ℓ`` the row sums of ``Q ⊙ X_ℓ``.

Launches 2 and 3 read the same tiles of a chunk (q, k, v, dO, the decays and level scales) and form the same
products ``Q Kᵀ`` and ``dO Vᵀ``. With ``LaunchConfig.fused_grads`` one program does both,
:func:`chunk_grads_kernel`: each gradient by the same code (:func:`dkdv_of_head`, :func:`dq_of_head` over the tiles
of :func:`chunk_head_tiles`), so with the same roundings; the node gradients then live until dq is done.

With ``LaunchConfig.node_grads_in_blocks`` launches 1 and 2 meet halfway: :func:`node_grad_kernel` sums only the
nodes above the blocks, and one program per block of ``2^m`` chunks, :func:`block_dkdv_kernel`, forms the
gradients of the nodes inside its block and then dk, dv of its chunks, reading those node gradients back while
they are still in the cache, by the same code (:func:`inner_node_grads`, :func:`dkdv_chunk`).

The decay's gradient, as in step 1: ``∂L/∂G_t = q_t · dq_t - k_t · dk_t`` per head, then a reverse
cumulative sum over the sequence in fp64, by PyTorch or (``LaunchConfig.grad_sums_in_kernels``) in two
levels: :func:`dq_kernel` sums inside its chunk, :func:`chunk_offsets_kernel` over the chunks' totals and
:func:`decay_grad_kernel` adds the two. Inside a chunk both dot products are sums of one
``[C, C]`` matrix ``D = (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E ⊙ Λ`` — ``q_t · dq_t`` its row sums, ``k_t · dk_t`` its column
sums — so :func:`dq_kernel` takes ``rowsum(D) - colsum(D)`` in fp32, where the large diagonal terms
cancel exactly. The levels add ``Σ_ℓ λ_ℓ · dλ_ℓ`` and ``- K̃ · dK̃`` of the leaf.

Why every rounding must be the forward's: the terms of ``∂L/∂G`` cancel in total (shifting every ``G``
by a constant changes nothing), and the reverse cumulative sum carries whatever does not cancel to every
earlier token, so an inconsistency of size ε per chunk grows into an error of about ``ε √N``. For node
``e`` the readers contribute ``<dS_e, S_e>`` with the node as stored, the writers
``- Σ_c <dU_c, K̃_cᵀ V_c>``; these agree only if the backward uses exactly what the forward multiplied:

- the leaf keys: the forward rounds ``K̃ = diag(exp(g_last - gc)) K`` to 16 bits before ``K̃ᵀ V``;
  :func:`dkdv_kernel` forms ``K̃ · dK̃`` from that same rounded ``K̃`` (two parts at ``"split"``);
- the stored nodes: 16-bit nodes lose ``ρ_e`` in rounding; the tree keeps it
  (``FenwickTree.residuals``), merges add children unrounded, and the chunk that ends node ``e`` adds
  the correction ``<dS_e, ρ_e>`` at its last token, so each node's terms cancel between its end and
  its readers instead of across the whole sequence;
- the node gradients: tf32 products round ``Q̃`` to 2^-11; in 16-bit calls the fp32 ``Q̃`` and ``dU``
  are split into two 16-bit parts whose products are exact (:func:`~.tiles.split16`), at the cost of
  one tf32 product.

With these, bf16 ``d log_decay`` stays at the level of the other gradients at every length (chapter 9
shows the measurements). fp32 nodes (fp16 calls, and the ``"fp32"`` rung) are still read by
:func:`dq_kernel` through a tf32 product, so fp16's ``d log_decay`` grows slowly with ``T`` (within
the bound). The node gradients are formed and stored in fp32 (``LaunchConfig.exact_node_grads``, the
default): in bf16 ``Q̃`` would be rounded before the product.

With q, k shared by all heads, one program handles ``head_group`` heads (``grad_head_group``) and sums their
dq, dk in registers; the host sums over the groups that remain, or (``grad_sums_in_kernels``) the dq kernel
sums dk's group shares and :func:`decay_grad_kernel` dq's, each output row by one program in a fixed order
(deterministic). Work: about twice the forward's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fenwick import num_chunk_levels
from .config import (
    LaunchConfig,
    accumulator_dtype,
    block,
    dot_precision,
    head_block,
    partial_dtype,
    split_leaf,
    state_dtype,
)
from .inputs import reverse_cumsum
from .tiles import (
    decay_matrix,
    fenwick_levels,
    load_level_column,
    load_level_scale_matrix,
    load_qk_scores,
    load_tile,
    split16,
    store_level_column,
    store_level_sums,
    store_tile,
)


@triton.jit
def reader_share(
    q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, sqt, sdot, slt, c, level, g_e, T, K, V, L,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr, dtype,
    SPLIT_DOTS: tl.constexpr,
):
    """``Q̃ᵀ dO`` of chunk ``c`` reading at chunk level ``level`` the node that ends where ``G = g_e``: [BK, BV].
    The product runs in ``dtype``, the node-gradient type; with SPLIT_DOTS (fp32 node gradients of 16-bit
    inputs) as two exact 16-bit products of ``Q̃``'s parts (see the module)."""
    t = c * C + tl.arange(0, C)
    q = load_tile(q_ptr, sqt, t, T, tl.arange(0, BK), K)
    do = load_tile(do_ptr, sdot, t, T, tl.arange(0, BV), V)
    gc = tl.load(gc_ptr + t)
    lam = load_level_column(lam_ptr, slt, t, T, L, C_LOG + level, gc.dtype)
    decay = (tl.load(gend_ptr + c - 1) - g_e).to(gc.dtype)
    q_scaled = q * (lam * tl.exp(gc + decay))[:, None]
    if SPLIT_DOTS:
        q_high, q_low = split16(q_scaled, do.dtype)
        return tl.dot(tl.trans(q_high), do, input_precision=IP) + tl.dot(tl.trans(q_low), do, input_precision=IP)
    return tl.dot(tl.trans(q_scaled.to(dtype)), do.to(dtype), input_precision=IP)


@triton.jit
def inner_node_grads(
    q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, c_first, T, N, K, V, L, n_inner, sqt, sdot, slt, tile,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr,
    IP: tl.constexpr, SPLIT_DOTS: tl.constexpr,
):
    """The gradients of the nodes inside the block of ``2^M`` chunks from ``c_first`` (height below ``n_inner``),
    each the sum of its readers' shares, all of which lie in the block: stored in dnode ``[N, BK, BV]``. Pointers
    are those of one (batch, head)."""
    for level in range(1, n_inner + 1):
        half = 1 << (level - 1)
        for group in range(1 << (M - level)):
            e = c_first + group * 2 * half + half - 1
            if e + 1 < N:
                g_e = tl.load(gend_ptr + e)
                acc = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)
                for j in range(half):
                    c = e + 1 + j
                    if c < N:
                        acc += reader_share(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, sqt, sdot, slt, c, level, g_e,
                                            T, K, V, L, C, C_LOG, BK, BV, IP, dnode_ptr.dtype.element_ty, SPLIT_DOTS)
                tl.store(dnode_ptr + e.to(tl.int64) * BK * BV + tile, acc.to(dnode_ptr.dtype.element_ty))


@triton.jit
def node_grad_kernel(
    q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr,
    T, N, H, K, V, L, n_levels, n_inner, sub_h, sub_slot,
    sqb, sqt, sqh, sdob, sdot, sdoh, slb, slt, slh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr,
    IP: tl.constexpr, SPLIT_DOTS: tl.constexpr,
):
    """Grid ``(H, NB, B)``. dnode: ``[B, H, N, BK, BV]`` (nodes below height M); dupper: zeroed, the nodes of
    height >= M, slot ``(e + 1) / 2^M - 1`` of ``(b, h)`` at ``(b·H + h)·sub_h + slot·sub_slot`` (a separate
    buffer, or dnode's block-root slots, which no lower node uses). ``n_inner = min(M, n)``, or 0 to leave the
    nodes inside the blocks to :func:`block_dkdv_kernel`."""
    i_h, i_blk, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    tile = tl.arange(0, BK)[:, None] * BV + tl.arange(0, BV)[None, :]
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh
    gc_ptr += bh * N * C
    gend_ptr += bh * N
    dnode_ptr += bh * N * BK * BV
    dupper_ptr += bh * sub_h
    c_first = i_blk << M
    # nodes inside the block: this program sees all their readers
    inner_node_grads(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, c_first, T, N, K, V, L, n_inner, sqt, sdot,
                     slt, tile, C, C_LOG, BK, BV, M, IP, SPLIT_DOTS)
    for level in range(M + 1, n_levels + 1):  # nodes above: this block's share, added atomically
        if ((i_blk >> (level - 1 - M)) & 1) == 1:
            e = ((i_blk >> (level - M)) << level) + (1 << (level - 1)) - 1
            g_e = tl.load(gend_ptr + e)
            acc = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)
            for j in range(1 << M):
                c = c_first + j
                if c < N:
                    acc += reader_share(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, sqt, sdot, slt, c, level, g_e,
                                        T, K, V, L, C, C_LOG, BK, BV, IP, dnode_ptr.dtype.element_ty, SPLIT_DOTS)
            tl.atomic_add(dupper_ptr + (((e + 1) >> M) - 1).to(tl.int64) * sub_slot + tile, acc)


@triton.jit
def chunk_head_tiles(
    v_ptr, do_ptr, gc_ptr, lam_ptr, i_b, h, bh, t, rv, T, N, V, L, svb, svt, svh, sdob, sdot, sdoh, slb, slt, slh,
    levels, C: tl.constexpr, C_LOG: tl.constexpr, IP: tl.constexpr,
):
    """What both gradients of head ``h``'s chunk (rows ``t``, value columns ``rv``) read: ``(v, do, gc, lam_head,
    decay, scales, weights, d_scores)`` — v, dO ``[C, BV]``, the decay sums ``gc`` ``[C]``, the head's level scales
    (``lam_head``, a pointer), the decay ``E`` and level scales ``Λ`` of the chunk's pairs, ``E ⊙ Λ`` and the product
    ``dO Vᵀ`` (``[C, C]`` each). A kernel that does not use ``E ⊙ Λ`` does not form it (the compiler drops it)."""
    v = load_tile(v_ptr + i_b.to(tl.int64) * svb + h * svh, svt, t, T, rv, V)
    do = load_tile(do_ptr + i_b.to(tl.int64) * sdob + h * sdoh, sdot, t, T, rv, V)
    gc = tl.load(gc_ptr + bh * N * C + t)
    lam_head = lam_ptr + i_b.to(tl.int64) * slb + h * slh
    decay = decay_matrix(gc, C)
    scales = load_level_scale_matrix(lam_head, slt, t, T, L, levels, C_LOG, gc.dtype)
    weights = decay * scales
    d_scores = tl.dot(do, tl.trans(v), input_precision=IP)
    return v, do, gc, lam_head, decay, scales, weights, d_scores


@triton.jit
def dq_of_head(
    q, k, scores, do, gc, lam_head, decay, scales, d_scores, gend_ptr, node_ptr, dlam_head,
    bh, i_c, t, T, N, L, n_levels, slt, sdlt, levels, tile,
    C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """``(dq, d_cum)`` of one head's chunk from its tiles (:func:`chunk_head_tiles`, ``scores = Q Kᵀ``), its dλ
    stored (``dlam_head``, strides ``sdlt``): dq ``[C, BK]`` and ``q·dq`` less the chunk's own ``k·dk`` ``[C]``.
    The forward's nodes as :func:`dq_kernel` takes them (``tile``: the offsets of a ``[BK, BV]`` node)."""
    dq = tl.dot((d_scores * decay * scales).to(k.dtype), k, input_precision=IP)
    pairs = d_scores * scores * decay  # (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E, fp32
    store_level_sums(dlam_head, sdlt, t, T, L, pairs, levels, C_LOG)
    pairs *= scales
    d_cum = tl.sum(pairs, 1) - tl.sum(pairs, 0)  # the chunk's own part of dG, exact: the diagonal cancels
    g_start = tl.load(gend_ptr + bh * N + tl.maximum(i_c - 1, 0))
    for level in range(1, n_levels + 1):
        if ((i_c >> (level - 1)) & 1) == 1:
            e = ((i_c >> level) << level) + (1 << (level - 1)) - 1
            node = tl.load(node_ptr + (bh * N + e) * BK * BV + tile)
            to_node = (g_start - tl.load(gend_ptr + bh * N + e)).to(gc.dtype)
            x = tl.dot(do.to(node.dtype), tl.trans(node), input_precision=IP) * tl.exp(gc + to_node)[:, None]
            d_level = tl.sum(q * x, 1)
            store_level_column(dlam_head, sdlt, t, T, L, C_LOG + level, d_level)
            lam_level = load_level_column(lam_head, slt, t, T, L, C_LOG + level, gc.dtype)
            dq += lam_level[:, None] * x
            d_cum += lam_level * d_level  # q · (this level's share of dq)
    return dq, d_cum


@triton.jit
def store_chunk_decay_grad(qdq_ptr, d_cum, LOCAL: tl.constexpr):
    """Store the chunk's part of ``dG`` (``d_cum``, ``[C]``; with LOCAL already less the leaf's ``K̃·dK̃``): as it is,
    or with LOCAL summed within the chunk from its end, in qdq's type (fp64)."""
    if LOCAL:  # the chunk's part of the reverse cumulative sum of dG, in fp64
        d_cum = tl.cumsum(d_cum.to(qdq_ptr.dtype.element_ty), 0, reverse=True)
    tl.store(qdq_ptr, d_cum)


@triton.jit
def dq_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, do_ptr, dq_ptr, dlam_ptr, qdq_ptr,
    kdk_ptr, dk_shares_ptr, dk_ptr,
    T, N, H, K, V, L, n_levels, shares, share_rows,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdqb, sdqt, sdqh, sdlb, sdlt, sdlh,
    sksb, skst, sksh, sdkb, sdkt,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
    LOCAL: tl.constexpr = False, SUM_DK: tl.constexpr = False, BS: tl.constexpr = 1,
):
    """Grid ``(H / HG, N, B)``. dq: ``[B, T, H, K]`` (strides ``sdq*``), or with SHARED one slot per head
    group; lam and dlam: ``[B, T, H, L]`` (strides ``sl*``, ``sdl*``), read and written one level column at
    a time — dlam zeroed, since only the columns of the levels a chunk uses are written; qdq: ``[B, H, N·C]``
    receives ``q·dq`` less the chunk's own ``k·dk`` (both from the fp32 ``[C, C]`` pair matrix, where they
    cancel exactly). With LOCAL, less the leaf's ``K̃·dK̃`` too (kdk, ``[B, H, N·C]``, from :func:`dkdv_kernel`),
    and summed within the chunk from its end (fp64 qdq): :func:`decay_grad_kernel` adds the later chunks.
    SUM_DK: dk ``[B, T, 1, K]`` (strides ``sdk*``) = the sum of the ``shares`` head groups' shares of dk
    (``[B, T, shares, K]``, strides ``sks*``, ``shares <= BS``), this program summing ``share_rows`` rows of the chunk."""
    i_g, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_c * C + tl.arange(0, C)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    tile = rk[:, None] * BV + rv[None, :]
    levels = fenwick_levels(C, C_LOG)
    q_ptr += i_b.to(tl.int64) * sqb
    k_ptr += i_b.to(tl.int64) * sqb
    if SHARED:
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        dq_group = tl.zeros((C, BK), dtype=gc_ptr.dtype.element_ty)
    for hh in range(HG):
        h = i_g * HG + hh
        bh = (i_b * H + h).to(tl.int64)
        if not SHARED:
            q, k, scores = load_qk_scores(q_ptr + h * sqh, k_ptr + h * sqh, sqt, t, T, rk, K, IP)
        dlam_head = dlam_ptr + i_b.to(tl.int64) * sdlb + h * sdlh
        _, do, gc, lam_head, decay, scales, _, d_scores = chunk_head_tiles(
            v_ptr, do_ptr, gc_ptr, lam_ptr, i_b, h, bh, t, rv, T, N, V, L, svb, svt, svh, sdob, sdot, sdoh, slb, slt,
            slh, levels, C, C_LOG, IP)
        dq, d_cum = dq_of_head(q, k, scores, do, gc, lam_head, decay, scales, d_scores, gend_ptr, node_ptr, dlam_head,
                               bh, i_c, t, T, N, L, n_levels, slt, sdlt, levels, tile, C_LOG, BK, BV, IP)
        if LOCAL:
            d_cum -= tl.load(kdk_ptr + bh * N * C + t)
        store_chunk_decay_grad(qdq_ptr + bh * N * C + t, d_cum, LOCAL)
        if SHARED:
            dq_group += dq
        else:
            store_tile(dq_ptr + i_b.to(tl.int64) * sdqb + h * sdqh, sdqt, t, T, rk, K, dq)
    if SHARED:
        store_tile(dq_ptr + i_b.to(tl.int64) * sdqb + i_g * sdqh, sdqt, t, T, rk, K, dq_group)
    if SUM_DK:  # dk's shares of this program's rows of the chunk, summed in a fixed order
        sum_share_rows(dk_shares_ptr + i_b.to(tl.int64) * sksb, skst, sksh, dk_ptr + i_b.to(tl.int64) * sdkb, sdkt,
                       i_c * C + i_g * share_rows, tl.minimum(share_rows, C - i_g * share_rows), T, shares, K, BS, BK,
                       gc_ptr.dtype.element_ty)


@triton.jit
def sum_share_rows(shares_ptr, s_t, s_share, out_ptr, so_t, t_first, rows, T, shares, K,
                   BS: tl.constexpr, BK: tl.constexpr, dtype):
    """``out[t] = Σ_s shares[t, s]`` for the ``rows`` tokens from ``t_first`` (those below ``T``), summed in
    ``dtype``: each row a ``[BS, BK]`` tile of the ``shares`` shares and ``K`` columns."""
    rs, rk = tl.arange(0, BS), tl.arange(0, BK)
    for r in range(rows):
        t = t_first + r
        if t < T:
            tile = tl.load(shares_ptr + t.to(tl.int64) * s_t + rs[:, None] * s_share + rk[None, :],
                           mask=(rs[:, None] < shares) & (rk[None, :] < K), other=0.0)
            total = tl.sum(tile.to(dtype), 0)
            tl.store(out_ptr + t.to(tl.int64) * so_t + rk, total.to(out_ptr.dtype.element_ty), mask=rk < K)


@triton.jit
def chunk_offsets_kernel(local_ptr, offset_ptr, N, C: tl.constexpr, BN: tl.constexpr):
    """Grid ``(B·H,)``: ``offset[c] = Σ_{c' > c} local[c'·C]`` in fp64, the later chunks' share of the reverse
    cumulative sum (``local[c·C]`` is chunk ``c``'s total, :func:`dq_kernel` with LOCAL). local: ``[B·H, N·C]``;
    offset: ``[B·H, N]``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BN)
    totals = tl.load(local_ptr + row * N * C + c * C, mask=c < N, other=0.0)
    tl.store(offset_ptr + row * N + c, tl.cumsum(totals, 0, reverse=True) - totals, mask=c < N)


@triton.jit
def decay_grad_kernel(
    local_ptr, offset_ptr, dg_ptr, dq_shares_ptr, dq_ptr, dk_shares_ptr, dk_ptr,
    T, N, H, K, shares, sgb, sgt, sgh, sqsb, sqst, sqsh, sdqb, sdqt, sksb, skst, sksh, sdkb, sdkt,
    C: tl.constexpr, BH: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, SUM_DQ: tl.constexpr, ACC: tl.constexpr,
    SUM_DK: tl.constexpr = False,
):
    """Grid ``(N, B)``: chunk ``c``'s ``d log_decay`` ``[C, H]`` = its local reverse sums plus the later
    chunks' offsets (local: ``[B, H, N·C]``, offset: ``[B, H, N]``, fp64; dg ``[B, T, H]``, strides ``sg*``); with
    SUM_DQ, its rows of dq ``[B, T, 1, K]`` (strides ``sdq*``) = the sum of dq's ``shares`` shares (strides ``sqs*``),
    accumulated in ``ACC``; with SUM_DK likewise dk's (strides ``sdk*``, ``sks*``), which :func:`chunk_grads_kernel`
    leaves unsummed."""
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    t = i_c * C + tl.arange(0, C)
    h = tl.arange(0, BH)
    rows = (i_b * H + h).to(tl.int64)
    local = tl.load(local_ptr + rows[None, :] * N * C + t[:, None], mask=h[None, :] < H, other=0.0)
    offset = tl.load(offset_ptr + rows * N + i_c, mask=h < H, other=0.0)
    tl.store(dg_ptr + i_b.to(tl.int64) * sgb + t[:, None].to(tl.int64) * sgt + h[None, :] * sgh,
             (local + offset[None, :]).to(dg_ptr.dtype.element_ty), mask=(t[:, None] < T) & (h[None, :] < H))
    if SUM_DQ:
        sum_share_rows(dq_shares_ptr + i_b.to(tl.int64) * sqsb, sqst, sqsh, dq_ptr + i_b.to(tl.int64) * sdqb, sdqt,
                       i_c * C, C, T, shares, K, BS, BK, ACC)
    if SUM_DK:
        sum_share_rows(dk_shares_ptr + i_b.to(tl.int64) * sksb, skst, sksh, dk_ptr + i_b.to(tl.int64) * sdkb, sdkt,
                       i_c * C, C, T, shares, K, BS, BK, ACC)


@triton.jit
def dkdv_of_head(
    q, k, scores, v, do, gc, weights, d_scores, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr,
    bh, i_c, N, n_levels, sub_h, sub_slot, tile,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_DOTS: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """``(dk, dv, k_dk)`` of one head's chunk from its tiles (:func:`chunk_head_tiles`, ``scores = Q Kᵀ``): dk
    ``[C, BK]``, dv ``[C, BV]`` and the leaf's ``K̃·dK̃`` ``[C]`` (with, at the chunk's last token, the correction of
    its node's stored rounding). Node gradients (``tile``: a ``[BK, BV]`` one's offsets), residuals and flags as
    :func:`dkdv_kernel` takes them."""
    last = tl.arange(0, C) == C - 1
    d_scores = d_scores * weights
    dv = tl.dot(tl.trans((scores * weights).to(do.dtype)), do, input_precision=IP)
    dk = tl.dot(tl.trans(d_scores.to(q.dtype)), q, input_precision=IP)
    # the gradient of this chunk's leaf: its read ancestors' node gradients, decayed to the chunk's end
    g_end = tl.load(gend_ptr + bh * N + i_c)
    d_leaf = tl.zeros((BK, BV), dtype=gc.dtype)
    own_rounding = tl.zeros((C,), dtype=gc.dtype)  # at the last token: <dS_e, stored - exact>, e = this chunk
    for height in range(n_levels):
        if ((i_c >> height) & 1) == 0:
            e = (((i_c >> height) + 1) << height) - 1  # last chunk of the ancestor of this height
            if e + 1 < N:  # a left child with readers
                if height < M:
                    d_node = tl.load(dnode_ptr + (bh * N + e) * BK * BV + tile).to(gc.dtype)
                else:
                    d_node = tl.load(dupper_ptr + bh * sub_h + (((e + 1) >> M) - 1).to(tl.int64) * sub_slot + tile)
                d_leaf += tl.exp((tl.load(gend_ptr + bh * N + e) - g_end).to(gc.dtype)) * d_node
                if RESIDUAL:
                    if e == i_c:
                        residual = tl.load(res_ptr + (bh * N + e) * BK * BV + tile).to(gc.dtype)
                        own_rounding = tl.where(last, -tl.sum(tl.sum(d_node * residual, 1), 0), 0.0)
    # the leaf's keys exactly as the forward multiplied them (rounded to 16 bits, or in two parts)
    to_end = tl.exp(tl.load(gc_ptr + bh * N * C + i_c * C + C - 1) - gc)
    k_high, k_low = split16(k * to_end[:, None], v.dtype)
    k_leaf = k_high.to(gc.dtype)
    if SPLIT:
        k_leaf += k_low.to(gc.dtype)
    d_leaf = d_leaf.to(dnode_ptr.dtype.element_ty)
    dv += tl.dot(k_leaf.to(d_leaf.dtype), d_leaf, input_precision=IP)
    if SPLIT_DOTS:
        u_high, u_low = split16(d_leaf, v.dtype)
        d_k_leaf = tl.dot(v, tl.trans(u_high), input_precision=IP) + tl.dot(v, tl.trans(u_low), input_precision=IP)
    else:
        d_k_leaf = tl.dot(v.to(d_leaf.dtype), tl.trans(d_leaf), input_precision=IP)
    dk += d_k_leaf * to_end[:, None]
    return dk, dv, tl.sum(k_leaf * d_k_leaf, 1) + own_rounding


@triton.jit
def dkdv_chunk(
    i_g, i_c, i_b,
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr, do_ptr, dk_ptr, dv_ptr, kdk_ptr,
    T, N, H, K, V, L, n_levels, sub_h, sub_slot,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    M: tl.constexpr, HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_DOTS: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """dk, dv and ``K̃·dK̃`` of chunk ``i_c`` of batch ``i_b`` for the heads of group ``i_g``: the work of one
    program of :func:`dkdv_kernel` (arguments as there)."""
    t = i_c * C + tl.arange(0, C)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    tile = rk[:, None] * BV + rv[None, :]
    levels = fenwick_levels(C, C_LOG)
    q_ptr += i_b.to(tl.int64) * sqb
    k_ptr += i_b.to(tl.int64) * sqb
    if SHARED:
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        dk_group = tl.zeros((C, BK), dtype=gc_ptr.dtype.element_ty)
    for hh in range(HG):
        h = i_g * HG + hh
        bh = (i_b * H + h).to(tl.int64)
        if not SHARED:
            q, k, scores = load_qk_scores(q_ptr + h * sqh, k_ptr + h * sqh, sqt, t, T, rk, K, IP)
        v, do, gc, _, _, _, weights, d_scores = chunk_head_tiles(
            v_ptr, do_ptr, gc_ptr, lam_ptr, i_b, h, bh, t, rv, T, N, V, L, svb, svt, svh, sdob, sdot, sdoh, slb, slt,
            slh, levels, C, C_LOG, IP)
        dk, dv, k_dk = dkdv_of_head(q, k, scores, v, do, gc, weights, d_scores, gc_ptr, gend_ptr, dnode_ptr,
                                    dupper_ptr, res_ptr, bh, i_c, N, n_levels, sub_h, sub_slot, tile, C, BK, BV, M, IP,
                                    SPLIT, SPLIT_DOTS, RESIDUAL)
        tl.store(kdk_ptr + bh * N * C + t, k_dk)  # the chunk's own part is in dq_kernel's
        store_tile(dv_ptr + i_b.to(tl.int64) * sdvb + h * sdvh, sdvt, t, T, rv, V, dv)
        if SHARED:
            dk_group += dk
        else:
            store_tile(dk_ptr + i_b.to(tl.int64) * sdkb + h * sdkh, sdkt, t, T, rk, K, dk)
    if SHARED:
        store_tile(dk_ptr + i_b.to(tl.int64) * sdkb + i_g * sdkh, sdkt, t, T, rk, K, dk_group)


@triton.jit
def dkdv_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr, do_ptr, dk_ptr, dv_ptr, kdk_ptr,
    T, N, H, K, V, L, n_levels, sub_h, sub_slot,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    M: tl.constexpr, HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_DOTS: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """Grid ``(H / HG, N, B)``. dnode, dupper: as :func:`node_grad_kernel` filled them (``sub_*`` as there);
    dk: as dq of :func:`dq_kernel` (strides ``sdk*``); dv: ``[B, T, H, V]`` (strides ``sdv*``); kdk:
    ``[B, H, N·C]`` receives ``K̃·dK̃`` of the leaf (the chunk's own part is in qdq), and at the chunk's last
    token the correction of its node's stored rounding (res, with RESIDUAL).
    SPLIT as the tree kernel's; SPLIT_DOTS: fp32 node gradients of 16-bit inputs, multiplied in two parts."""
    i_g, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    dkdv_chunk(i_g, i_c, i_b, q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr,
               do_ptr, dk_ptr, dv_ptr, kdk_ptr, T, N, H, K, V, L, n_levels, sub_h, sub_slot,
               sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
               C, C_LOG, BK, BV, M, HG, SHARED, IP, SPLIT, SPLIT_DOTS, RESIDUAL)


@triton.jit
def block_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr, do_ptr, dk_ptr, dv_ptr, kdk_ptr,
    T, N, H, K, V, L, n_levels, n_inner, sub_h, sub_slot,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    M: tl.constexpr, HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_DOTS: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """Grid ``(H / HG, NB, B)``: the node gradients inside a block of ``2^M`` chunks (:func:`inner_node_grads`,
    for each head of the group), then dk, dv of the block's chunks (:func:`dkdv_chunk`), in one program, so the
    node gradients are read back while they are still in the cache. The nodes above the blocks come from
    :func:`node_grad_kernel` launched with ``n_inner = 0``. Arguments as :func:`dkdv_kernel`'s, ``n_inner`` as
    :func:`node_grad_kernel`'s."""
    i_g, i_blk, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tile = tl.arange(0, BK)[:, None] * BV + tl.arange(0, BV)[None, :]
    c_first = i_blk << M
    for hh in range(HG):
        h = i_g * HG + hh
        bh = (i_b * H + h).to(tl.int64)
        inner_node_grads(q_ptr + i_b.to(tl.int64) * sqb + h * sqh, do_ptr + i_b.to(tl.int64) * sdob + h * sdoh,
                         lam_ptr + i_b.to(tl.int64) * slb + h * slh, gc_ptr + bh * N * C, gend_ptr + bh * N,
                         dnode_ptr + bh * N * BK * BV, c_first, T, N, K, V, L, n_inner, sqt, sdot, slt, tile,
                         C, C_LOG, BK, BV, M, IP, SPLIT_DOTS)
    tl.debug_barrier()  # the block's node gradients, stored by every thread, are read by every thread below
    for j in range(1 << M):
        i_c = c_first + j
        if i_c < N:
            dkdv_chunk(i_g, i_c, i_b, q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, dupper_ptr, res_ptr,
                       do_ptr, dk_ptr, dv_ptr, kdk_ptr, T, N, H, K, V, L, n_levels, sub_h, sub_slot,
                       sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdkb, sdkt, sdkh,
                       sdvb, sdvt, sdvh, C, C_LOG, BK, BV, M, HG, SHARED, IP, SPLIT, SPLIT_DOTS, RESIDUAL)


@triton.jit
def chunk_grads_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, dnode_ptr, dupper_ptr, res_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr, dlam_ptr, qdq_ptr, kdk_ptr,
    T, N, H, K, V, L, n_levels, sub_h, sub_slot,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, sdqb, sdqt, sdqh, sdkb, sdkt, sdkh,
    sdvb, sdvt, sdvh, sdlb, sdlt, sdlh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    M: tl.constexpr, HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_DOTS: tl.constexpr, RESIDUAL: tl.constexpr, LOCAL: tl.constexpr,
):
    """Grid ``(H / HG, N, B)``: :func:`dkdv_kernel` and :func:`dq_kernel` in one program, which loads the chunk's
    q, k, v, dO, decays and level scales once and forms ``Q Kᵀ`` and ``dO Vᵀ`` once for both
    (``LaunchConfig.fused_grads``). Arguments as theirs, each gradient computed by the same code; with LOCAL the
    leaf's ``K̃·dK̃`` leaves the program only inside qdq (kdk is not written), without it kdk receives it.
    dk's head-group shares are left for :func:`decay_grad_kernel` (SUM_DK) or the host to sum: other programs
    of this launch write them."""
    i_g, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_c * C + tl.arange(0, C)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    tile = rk[:, None] * BV + rv[None, :]
    levels = fenwick_levels(C, C_LOG)
    q_ptr += i_b.to(tl.int64) * sqb
    k_ptr += i_b.to(tl.int64) * sqb
    if SHARED:
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        dq_group = tl.zeros((C, BK), dtype=gc_ptr.dtype.element_ty)
        dk_group = tl.zeros((C, BK), dtype=gc_ptr.dtype.element_ty)
    for hh in range(HG):
        h = i_g * HG + hh
        bh = (i_b * H + h).to(tl.int64)
        if not SHARED:
            q, k, scores = load_qk_scores(q_ptr + h * sqh, k_ptr + h * sqh, sqt, t, T, rk, K, IP)
        dlam_head = dlam_ptr + i_b.to(tl.int64) * sdlb + h * sdlh
        v, do, gc, lam_head, decay, scales, weights, d_scores = chunk_head_tiles(
            v_ptr, do_ptr, gc_ptr, lam_ptr, i_b, h, bh, t, rv, T, N, V, L, svb, svt, svh, sdob, sdot, sdoh, slb, slt,
            slh, levels, C, C_LOG, IP)
        dk, dv, k_dk = dkdv_of_head(q, k, scores, v, do, gc, weights, d_scores, gc_ptr, gend_ptr, dnode_ptr,
                                    dupper_ptr, res_ptr, bh, i_c, N, n_levels, sub_h, sub_slot, tile, C, BK, BV, M, IP,
                                    SPLIT, SPLIT_DOTS, RESIDUAL)
        store_tile(dv_ptr + i_b.to(tl.int64) * sdvb + h * sdvh, sdvt, t, T, rv, V, dv)
        dq, d_cum = dq_of_head(q, k, scores, do, gc, lam_head, decay, scales, d_scores, gend_ptr, node_ptr, dlam_head,
                               bh, i_c, t, T, N, L, n_levels, slt, sdlt, levels, tile, C_LOG, BK, BV, IP)
        if LOCAL:  # as dq_kernel subtracts it after dkdv_kernel stored it in kdk's type, the accumulator type of gc
            d_cum -= k_dk
        else:
            tl.store(kdk_ptr + bh * N * C + t, k_dk)
        store_chunk_decay_grad(qdq_ptr + bh * N * C + t, d_cum, LOCAL)
        if SHARED:
            dq_group += dq
            dk_group += dk
        else:
            store_tile(dq_ptr + i_b.to(tl.int64) * sdqb + h * sdqh, sdqt, t, T, rk, K, dq)
            store_tile(dk_ptr + i_b.to(tl.int64) * sdkb + h * sdkh, sdkt, t, T, rk, K, dk)
    if SHARED:
        store_tile(dq_ptr + i_b.to(tl.int64) * sdqb + i_g * sdqh, sdqt, t, T, rk, K, dq_group)
        store_tile(dk_ptr + i_b.to(tl.int64) * sdkb + i_g * sdkh, sdkt, t, T, rk, K, dk_group)


def upper_node_grads(d_nodes: torch.Tensor, block_levels: int, n_levels: int, dtype: torch.dtype) -> torch.Tensor:
    """Where :func:`node_grad_kernel` sums the gradients of the nodes above the blocks (height ``>= m``,
    ``m = block_levels``), zeroed: ``[B, H, slots, BK, BV]``, slot ``(e + 1) / 2^m - 1`` for the node ending at
    chunk ``e``. d_nodes: ``[B, H, N, BK, BV]``.

    Such a node ends where a block ends, ``e ≡ 2^m - 1 (mod 2^m)``, and no node below height ``m`` does
    (``e + 1`` has ``height`` trailing zeros), so when the node gradients have the accumulator type ``dtype``
    their own slots ``e`` hold them: a strided view of ``d_nodes``. 16-bit node gradients get a separate
    fp32 buffer (the atomic sums stay in fp32). Without levels above the blocks nothing is read or written
    there, and ``d_nodes`` itself stands in.
    """
    B, H, N, BK, BV = d_nodes.shape
    if n_levels <= block_levels:
        return d_nodes
    block = 1 << block_levels
    if d_nodes.dtype == dtype:
        return d_nodes[:, :, block - 1 :: block].zero_()
    return torch.zeros(B, H, -(-N // block), BK, BV, device=d_nodes.device, dtype=dtype)


def loglinear_backward(q, k, v, level_scales, gc, gend, tree, do, chunk_size: int = 64,
                       config: LaunchConfig = LaunchConfig(), grads: dict | None = None):
    """Gradients of :func:`~loglin_edu.kernels.step3_chunk_tree.loglinear_forward`: ``(dq, dk, dv, dlam, dg)``.

    Inputs as the forward's (``tree`` is what it returned), do: ``[B, T, H, V]``. dq, dk are shaped
    like q, k (summed over heads when shared); dg: ``[B, T, H]`` is the gradient of the log decay, the reverse
    cumulative sum of the cumulative decay's gradient (fp64 unless preallocated). ``grads`` may hold
    preallocated outputs ``"dv"``, ``"dlam"``, ``"dlog_decay"`` and, for per-head q/k, ``"dq"``, ``"dk"`` (any
    strides, last dimension contiguous; ``dlam`` zeroed).

    Buffers besides the outputs: the node gradients (``[B, H, N, BK, BV]``, fp32 by default; those above the
    blocks in their block-root slots, :func:`upper_node_grads`), ``k·dk`` and ``q·dq`` (``[B, H, N·C]``, fp32;
    ``q·dq`` fp64 with ``config.grad_sums_in_kernels``) and, with q, k shared and more than one head group, each
    group's share of dk and of dq (``[B, T, H / grad_head_group, K]``, ``partial_dtype``), summed over the
    groups by the host, or with ``config.grad_sums_in_kernels`` by :func:`dq_kernel` (dk's) and
    :func:`decay_grad_kernel` (dq's). dk and dv are computed first, as they read the node gradients; those are
    freed before dq's shares and dλ are allocated, so the node gradients, dk's shares, dv and ``k·dk`` are the
    most that is alive at once.

    With ``config.fused_grads`` one launch (:func:`chunk_grads_kernel`) computes dk, dv, dq and dλ, so the node
    gradients stay alive next to dq's buffers as well: the node gradients, both gradients' shares, dv, dλ, ``q·dq``
    and ``k·dk`` at once (``k·dk`` is not stored with ``grad_sums_in_kernels``, which also moves the sum of dk's
    shares to :func:`decay_grad_kernel`). Hence off by default.
    """
    grads = dict(grads or {})
    B, T, Hk, K = q.shape
    H, V, L = v.shape[2], v.shape[3], level_scales.shape[3]
    N = -(-T // chunk_size)
    BK, BV, M = head_block(K, q.dtype), head_block(V, q.dtype), config.block_levels
    n_levels = num_chunk_levels(T, chunk_size)
    NB = -(-N // (1 << M))
    acc = accumulator_dtype(q.dtype)
    shared = Hk == 1
    HG = config.grad_group(H)
    groups = H // HG
    in_kernels = config.grad_sums_in_kernels
    nodes, residuals = tree
    d_nodes = torch.empty(B, H, N, BK, BV, device=q.device, dtype=acc if config.exact_node_grads else state_dtype(q.dtype, config.precision))
    split_dots = q.dtype in (torch.float16, torch.bfloat16) and d_nodes.dtype == torch.float32
    d_upper = upper_node_grads(d_nodes, M, n_levels, acc)
    sqh = 0 if shared else q.stride(2)
    in_blocks = config.node_grads_in_blocks  # the nodes inside the blocks by block_dkdv_kernel
    n_inner = min(M, n_levels)
    if not in_blocks or n_levels > M:
        node_grad_kernel[(H, NB, B)](
            q, do, level_scales, gc, gend, d_nodes, d_upper, T, N, H, K, V, L, n_levels, 0 if in_blocks else n_inner,
            d_upper.stride(1), d_upper.stride(2),
            q.stride(0), q.stride(1), sqh, do.stride(0), do.stride(1), do.stride(2),
            level_scales.stride(0), level_scales.stride(1), level_scales.stride(2),
            C=chunk_size, C_LOG=chunk_size.bit_length() - 1, BK=BK, BV=BV, M=M,
            IP=dot_precision(q.dtype, config.precision), SPLIT_DOTS=split_dots, **config.grad_launch(node_grads=True),
        )
    common = dict(C=chunk_size, C_LOG=chunk_size.bit_length() - 1, BK=BK, BV=BV, HG=HG, SHARED=shared,
                  IP=dot_precision(q.dtype, config.precision), **config.grad_launch())
    input_strides = (q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2),
                     level_scales.stride(0), level_scales.stride(1), level_scales.stride(2),
                     do.stride(0), do.stride(1), do.stride(2))
    if shared:  # one share per head group; a single group's share is the gradient itself
        dk = torch.empty(B, T, groups, K, device=q.device, dtype=partial_dtype(q.dtype))
    else:
        dk = grads["dk"] if "dk" in grads else torch.empty(B, T, H, K, device=q.device, dtype=q.dtype)
    dv = grads["dv"] if "dv" in grads else torch.empty(B, T, H, V, device=q.device, dtype=v.dtype)
    fused = config.fused_grads
    kdk = None if fused and in_kernels else torch.empty(B, H, N * chunk_size, device=q.device, dtype=acc)
    node_grads = (d_nodes, d_upper, residuals if residuals.numel() else nodes)
    upper_strides = (d_upper.stride(1), d_upper.stride(2))
    leaf = dict(M=M, SPLIT=split_leaf(q.dtype, config.precision), SPLIT_DOTS=split_dots, RESIDUAL=residuals.numel() > 0)
    if in_blocks:
        block_dkdv_kernel[(H // HG, NB, B)](
            q, k, v, level_scales, gc, gend, *node_grads, do, dk, dv, kdk, T, N, H, K, V, L, n_levels, n_inner,
            *upper_strides, *input_strides, dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2), **leaf, **common,
        )
    elif not fused:
        dkdv_kernel[(H // HG, N, B)](
            q, k, v, level_scales, gc, gend, *node_grads, do, dk, dv, kdk, T, N, H, K, V, L, n_levels, *upper_strides,
            *input_strides, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            **leaf, **common,
        )
    if not fused:
        del d_nodes, d_upper, node_grads  # dq reads the forward's nodes, not their gradients
    summed = shared and groups > 1  # shares to sum over the head groups
    dk_shares = dk
    if summed and not fused:  # the fused kernel writes dk's shares next to dq's: summed after it
        dk = torch.empty(B, T, 1, K, device=q.device, dtype=q.dtype) if in_kernels else dk.sum(2, keepdim=True).to(q.dtype)
    if shared:
        dq = torch.empty(B, T, groups, K, device=q.device, dtype=partial_dtype(q.dtype))
    else:
        dq = grads["dq"] if "dq" in grads else torch.empty(B, T, H, K, device=q.device, dtype=q.dtype)
    sum_dk = summed and in_kernels and not fused  # by the dq kernel
    if not sum_dk:
        del dk_shares
        dk_shares = dk  # a valid pointer the dq kernel does not read
    dlam = grads["dlam"] if "dlam" in grads else torch.zeros(B, T, H, L, device=q.device, dtype=level_scales.dtype)
    qdq = torch.empty(B, H, N * chunk_size, device=q.device, dtype=torch.float64 if in_kernels else acc)
    if fused:
        chunk_grads_kernel[(H // HG, N, B)](
            q, k, v, level_scales, gc, gend, nodes, *node_grads, do, dq, dk, dv, dlam, qdq, qdq if kdk is None else kdk,
            T, N, H, K, V, L, n_levels, *upper_strides,
            *input_strides, dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2), dlam.stride(0), dlam.stride(1), dlam.stride(2),
            LOCAL=in_kernels, **leaf, **common,
        )
        del d_nodes, d_upper, node_grads
        if summed and not in_kernels:
            dk = dk.sum(2, keepdim=True).to(q.dtype)
    else:
        share_rows = -(-chunk_size // groups)
        dq_kernel[(H // HG, N, B)](
            q, k, v, level_scales, gc, gend, nodes, do, dq, dlam, qdq, kdk, dk_shares, dk,
            T, N, H, K, V, L, n_levels, groups, share_rows,
            *input_strides, dq.stride(0), dq.stride(1), dq.stride(2), dlam.stride(0), dlam.stride(1), dlam.stride(2),
            dk_shares.stride(0), dk_shares.stride(1), dk_shares.stride(2), dk.stride(0), dk.stride(1),
            LOCAL=in_kernels, SUM_DK=sum_dk, BS=block(groups, 1), **common,
        )
    del dk_shares
    if in_kernels:
        dq, dk_sum, dg = finish_in_kernels(qdq, dq, q.dtype, T, chunk_size, grads.get("dlog_decay"), summed,
                                           dk if fused and summed else None)
        return dq, dk if dk_sum is None else dk_sum, dv, dlam, dg
    if summed:
        dq = dq.sum(2, keepdim=True).to(q.dtype)
    d_cum = qdq - kdk
    del qdq, kdk
    dg = reverse_cumsum(d_cum, -1)[:, :, :T].transpose(1, 2)
    if "dlog_decay" in grads:
        dg = grads["dlog_decay"].copy_(dg)
    return dq, dk, dv, dlam, dg


def finish_in_kernels(local, dq, dtype: torch.dtype, T: int, chunk_size: int, dg: torch.Tensor | None = None,
                      summed: bool = True, dk: torch.Tensor | None = None) -> tuple:
    """``(dq, dk, dg)`` from the per-chunk kernels' outputs with LOCAL: ``local`` (``[B, H, N·C]`` fp64, each chunk's
    reverse cumulative sums of the decay's gradient) and ``dq`` (``[B, T, shares, K]``: with ``summed``, the head
    groups' shares, summed here into ``[B, T, 1, K]`` of ``dtype``). Two launches: :func:`chunk_offsets_kernel`
    (the later chunks' totals) and :func:`decay_grad_kernel`. ``dg`` (``[B, T, H]``, any float type and strides)
    receives d log_decay; fp64 when not given. ``dk``: with ``summed``, dk's shares as :func:`chunk_grads_kernel`
    leaves them (shaped as dq's), summed here too; ``None`` (returned as ``None``) when :func:`dq_kernel` summed
    them."""
    B, H, NC = local.shape
    N, K, shares = NC // chunk_size, dq.shape[3], dq.shape[2]
    offsets = torch.empty(B, H, N, device=local.device, dtype=torch.float64)
    chunk_offsets_kernel[(B * H,)](local, offsets, N, C=chunk_size, BN=block(N, 1))
    dg = torch.empty(B, T, H, device=local.device, dtype=torch.float64) if dg is None else dg
    dq_sum = torch.empty(B, T, 1, K, device=dq.device, dtype=dtype) if summed else dq
    sum_dk = summed and dk is not None
    dk_shares, dk_sum = (dk, torch.empty_like(dq_sum)) if sum_dk else (dq, dq_sum)  # dq's: pointers not read
    decay_grad_kernel[(N, B)](
        local, offsets, dg, dq, dq_sum, dk_shares, dk_sum, T, N, H, K, shares, dg.stride(0), dg.stride(1), dg.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2), dq_sum.stride(0), dq_sum.stride(1),
        dk_shares.stride(0), dk_shares.stride(1), dk_shares.stride(2), dk_sum.stride(0), dk_sum.stride(1),
        C=chunk_size, BH=block(H, 1), BS=block(shares, 1), BK=block(K), SUM_DQ=summed, SUM_DK=sum_dk,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32,
    )
    return dq_sum, dk_sum if sum_dk else None, dg
