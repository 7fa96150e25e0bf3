"""Step 3 — the inter-chunk levels: a Fenwick tree of states over chunks, and the output kernel.

A query in chunk ``c`` reads, at chunk level ``ℓ`` (bit ``ℓ - 1`` of ``c`` set), the keys of exactly
one aligned block of ``2^(ℓ-1)`` chunks: the left half of the aligned ``2^ℓ``-chunk block holding
``c``. Call its state, decayed to its own last token ``e``,

    S_node = Σ_{s in node} exp(G_e - G_s) k_s v_sᵀ                 ([K, V])

Every such node is the sum of two children, ``S = exp(G_e - G_mid) S_left + S_right``, so all of them
together form a segment tree over the chunks, built bottom-up in ``log2 N`` rounds instead of a walk
of ``N`` steps. The nodes that are ever read are the *left* children, and the left child of height
``h`` ending at chunk ``e`` is exactly the node for which ``e + 1`` has ``h`` trailing zeros: one node
per chunk. So the nodes live in a ``[B, H, N, K, V]`` buffer, slot ``e`` holding the node that ends at
chunk ``e`` — a Fenwick tree over chunks.

The output of chunk ``c`` (``c0 = log2 C``):

    o = ((Q Kᵀ) ⊙ E ⊙ Λ) V                                                     (step 2)
      + Σ_{ℓ: bit ℓ-1 of c} diag(λ[:, c0 + ℓ] · exp(gc + G_{start(c)-1} - G_e(ℓ))) Q S_node(ℓ)

The first exponential per token, the second a scalar per level; all levels are summed in fp32
registers and o is written once.

Three launches (shapes per program in brackets):

1. :func:`fenwick_tree_kernel`, grid ``(H, N / 2^m, B)``: one program owns ``2^m`` chunks (the fused
   subtree). For each chunk: the leaf ``K̃ᵀ V`` (``[C, K]ᵀ [C, V]``), then a binary counter merges it
   with the left siblings it completes (stored a moment earlier by the same program, so read back
   from L2) and stores the result in its Fenwick slot. The block's root goes to a small fp32 buffer.
   Or :func:`fenwick_block_kernel` (``LaunchConfig.tree_registers``): the same, the block unrolled so that
   the pending left siblings stay in registers and the next chunk's tiles load during this chunk's work.
   Either may split the state's key rows over ``tree_key_split`` programs (``[C, K / split]ᵀ [C, V]``).
2. :func:`fenwick_upper_kernel`, grid ``(H, B)``: the same binary counter over block roots, for the
   ``log2(N / 2^m)`` levels above the blocks: ``N / 2^m`` steps of a ``[K, V]`` add (the rows split over
   ``upper_row_split`` programs).
3. :func:`loglinear_fwd_kernel`, grid ``(H / head_group, N, B)``: step 2's product plus one
   ``[C, K] × [K, V]`` product per level read. λ is loaded one ``[C]`` column per level it uses
   (:func:`~.tiles.load_level_column`), so no tile's width grows with ``T``.

Memory traffic: q, k, v read twice (tree and output), o written once, one ``K × V`` node written per
chunk (with 16-bit nodes, its residual too: the tree kernel writes four bytes per state element, which
bounds its time more than its products do) and read by ``popcount(c)`` chunks (mostly from L2: a node of level ``ℓ`` is read by the
``2^(ℓ-1)`` consecutive chunks that follow it). Work: ``2·T·K·V`` flops for the leaves,
``2·C·T·(K + V)`` inside chunks, ``2·T·K·V`` per level read — on average ``log2(N) / 2`` of them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..fenwick import num_chunk_levels
from .config import LaunchConfig, accumulator_dtype, dot_precision, head_block, split_leaf, state_dtype
from .tiles import (
    decay_matrix,
    fenwick_levels,
    load_level_column,
    load_level_scale_matrix,
    load_qk_scores,
    load_tile,
    split16,
    store_tile,
    trailing_ones,
)


@triton.jit
def store_node(node_ptr, res_ptr, offset, state, RESIDUAL: tl.constexpr, mask=None):
    """Store the fp32 ``state`` in the node type; with RESIDUAL, also what that rounding lost (``res_ptr``); with a
    ``mask`` (of offset's shape), only where it holds."""
    stored = state.to(node_ptr.dtype.element_ty)
    tl.store(node_ptr + offset, stored, mask=mask)
    if RESIDUAL:
        tl.store(res_ptr + offset, (state - stored.to(state.dtype)).to(res_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_node(node_ptr, res_ptr, offset, dtype, RESIDUAL: tl.constexpr):
    """A stored node in ``dtype``, its rounding undone with RESIDUAL: merges add unrounded children."""
    node = tl.load(node_ptr + offset).to(dtype)
    if RESIDUAL:
        node += tl.load(res_ptr + offset).to(dtype)
    return node


@triton.jit
def merge_held(state, left, g_end, g_left):
    """``exp(G_end - G_left) S_left + state`` for a left node held in registers."""
    return tl.exp((g_end - g_left).to(state.dtype)) * left + state


@triton.jit
def merge_left(state, node_ptr, res_ptr, gend_ptr, e, g_end, tile, BK: tl.constexpr, BV: tl.constexpr,
               RESIDUAL: tl.constexpr):
    """``exp(G_end - G_e) S_e + state``: the parent of the stored left node ``S_e`` (slot ``e``, ending where
    ``G = G_e``) and ``state``, the right part ending where ``G = g_end``; the node read unrounded (RESIDUAL)."""
    left = load_node(node_ptr, res_ptr, e.to(tl.int64) * BK * BV + tile, state.dtype, RESIDUAL)
    return merge_held(state, left, g_end, tl.load(gend_ptr + e))


@triton.jit
def load_chunk(k_ptr, v_ptr, gc_ptr, sqt, svt, c, T, N, rk, rv, K, V, C: tl.constexpr, PAST_END: tl.constexpr = True):
    """Chunk ``c``'s keys ``[C, BKS]`` (the rows ``rk`` of the state), values ``[C, BV]``, ``gc`` ``[C]`` and
    ``gc`` at its last token; zero when ``c >= N`` (a chunk past the sequence), so a program may run past it.
    ``PAST_END=False``: the caller knows ``c < N``, and the decay's loads go unmasked."""
    t = c * C + tl.arange(0, C)
    k = load_tile(k_ptr, sqt, t, T, rk, K)
    v = load_tile(v_ptr, svt, t, T, rv, V)
    if PAST_END:
        gc = tl.load(gc_ptr + t, mask=t < N * C, other=0.0)
        g_last = tl.load(gc_ptr + c * C + C - 1, mask=c < N, other=0.0)
    else:
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
    return k, v, gc, g_last


@triton.jit
def chunk_leaf(k, v, gc, g_last, IP: tl.constexpr, SPLIT: tl.constexpr):
    """The leaf ``K̃ᵀ V`` (``[BKS, BV]`` fp32), ``K̃ = diag(exp(g_last - gc)) K`` rounded to v's type (with SPLIT,
    what that rounding lost as a second product)."""
    k_to_end = k * tl.exp(g_last - gc)[:, None]
    k_high, k_low = split16(k_to_end, v.dtype)
    state = tl.dot(tl.trans(k_high), v, input_precision=IP)
    if SPLIT:
        state += tl.dot(tl.trans(k_low), v, input_precision=IP)
    return state


@triton.jit
def fenwick_tree_kernel(
    k_ptr, v_ptr, gc_ptr, gend_ptr, node_ptr, res_ptr, root_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr = False, RESIDUAL: tl.constexpr = False, KS: tl.constexpr = 1,
):
    """Grid ``(H·KS, NB, B)``, ``NB = ceil(N / 2^M)``; program ``(h·KS + j, ...)`` owns rows ``j·BK/KS ..`` of the
    states. node (and res, with RESIDUAL): ``[B, H, N, BK, BV]``; root: fp32 ``[B, H, NB, BK, BV]``."""
    i_h, i_blk, i_b = tl.program_id(0) // KS, tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = (tl.program_id(0) % KS) * (BK // KS) + tl.arange(0, BK // KS), tl.arange(0, BV)
    tile = rk[:, None] * BV + rv[None, :]
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    gc_ptr += bh * N * C
    gend_ptr += bh * N
    node_ptr += bh * N * BK * BV
    res_ptr += bh * N * BK * BV
    for i in range(1 << M):
        c = (i_blk << M) + i
        if c < N:
            k, v, gc, g_last = load_chunk(k_ptr, v_ptr, gc_ptr, sqt, svt, c, T, N, rk, rv, K, V, C, PAST_END=False)
            state = chunk_leaf(k, v, gc, g_last, IP, SPLIT)  # the leaf, decayed to its end
            g_end = tl.load(gend_ptr + c)
            merges = trailing_ones(i, M)
            for height in range(merges):  # merge with the left sibling of each height this chunk completes
                e = c - (1 << height)
                state = merge_left(state, node_ptr, res_ptr, gend_ptr, e, g_end, tile, BK, BV, RESIDUAL)
            if merges < M:  # a left node inside the block
                store_node(node_ptr, res_ptr, c.to(tl.int64) * BK * BV + tile, state, RESIDUAL)
            else:  # the block's root: the tree above the blocks needs it, left or right
                tl.store(root_ptr + (bh * NB + i_blk) * BK * BV + tile, state)
                if (i_blk & 1) == 0:
                    store_node(node_ptr, res_ptr, c.to(tl.int64) * BK * BV + tile, state, RESIDUAL)
            tl.debug_barrier()  # the next merge reads what this one stored


@triton.jit
def fenwick_block_kernel(
    k_ptr, v_ptr, gc_ptr, gend_ptr, node_ptr, res_ptr, root_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr, IP: tl.constexpr,
    SPLIT: tl.constexpr, RESIDUAL: tl.constexpr, KS: tl.constexpr, PREFETCH: tl.constexpr,
):
    """:func:`fenwick_tree_kernel`'s function (same grid, buffers and stores), its ``2^M`` chunks unrolled so
    that the binary counter is known when compiling: the pending left node of height ``j`` stays in registers
    (``s0 .. s5``, ``M <= 6``) until the chunk that completes its parent merges it, so no merge waits for memory
    and no barrier orders a store before a load; the next chunk's tiles are loaded before this chunk's
    product. Chunks past the sequence (the last block) run on zero tiles with every store masked."""
    tl.static_assert(M <= 6)
    i_h, i_blk, i_b = tl.program_id(0) // KS, tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = (tl.program_id(0) % KS) * (BK // KS) + tl.arange(0, BK // KS), tl.arange(0, BV)
    tile = rk[:, None] * BV + rv[None, :]
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    gc_ptr += bh * N * C
    gend_ptr += bh * N
    node_ptr += bh * N * BK * BV
    res_ptr += bh * N * BK * BV
    c_first = i_blk << M
    if PREFETCH:
        k_next, v_next, gc_next, g_last_next = load_chunk(k_ptr, v_ptr, gc_ptr, sqt, svt, c_first, T, N, rk, rv,
                                                          K, V, C)
    for i in tl.static_range(1 << M):
        c = c_first + i
        if PREFETCH:  # this chunk's tiles were loaded during the previous chunk; load the next one's now
            k, v, gc, g_last = k_next, v_next, gc_next, g_last_next  # noqa: F821
            if i + 1 < (1 << M):
                k_next, v_next, gc_next, g_last_next = load_chunk(k_ptr, v_ptr, gc_ptr, sqt, svt, c + 1, T, N, rk, rv,
                                                                  K, V, C)
        else:
            k, v, gc, g_last = load_chunk(k_ptr, v_ptr, gc_ptr, sqt, svt, c, T, N, rk, rv, K, V, C)
        state = chunk_leaf(k, v, gc, g_last, IP, SPLIT)
        g_end = tl.load(gend_ptr + tl.minimum(c, N - 1))
        # merge height j when the lowest j + 1 bits of i are ones: the left siblings this chunk completes
        if (i & 1) == 1:
            state = merge_held(state, s0, g_end, g0)  # noqa: F821 (held since chunk i - 1)
        if (i & 3) == 3:
            state = merge_held(state, s1, g_end, g1)  # noqa: F821
        if (i & 7) == 7:
            state = merge_held(state, s2, g_end, g2)  # noqa: F821
        if (i & 15) == 15:
            state = merge_held(state, s3, g_end, g3)  # noqa: F821
        if (i & 31) == 31:
            state = merge_held(state, s4, g_end, g4)  # noqa: F821
        if (i & 63) == 63:
            state = merge_held(state, s5, g_end, g5)  # noqa: F821
        offset = c.to(tl.int64) * BK * BV + tile
        c_tile = tl.zeros_like(offset) + c  # c at every element: a mask keeps the whole tile or nothing
        if i == (1 << M) - 1:  # the block's root: the tree above the blocks needs it, left or right
            tl.store(root_ptr + (bh * NB + i_blk) * BK * BV + tile, state, mask=(tl.zeros_like(tile) + c) < N)
            store_node(node_ptr, res_ptr, offset, state, RESIDUAL, c_tile < N * (1 - (i_blk & 1)))  # even blocks
        else:  # a left node of height j = the trailing ones of i: stored for its readers, held for its parent
            store_node(node_ptr, res_ptr, offset, state, RESIDUAL, c_tile < N)
            if (i & 1) == 0:
                s0, g0 = state, g_end
            elif (i & 3) == 1:
                s1, g1 = state, g_end
            elif (i & 7) == 3:
                s2, g2 = state, g_end
            elif (i & 15) == 7:
                s3, g3 = state, g_end
            elif (i & 31) == 15:
                s4, g4 = state, g_end
            else:
                s5, g5 = state, g_end


@triton.jit
def fenwick_upper_kernel(
    gend_ptr, node_ptr, res_ptr, root_ptr, N, NB, NB_FULL, H, ROOT_BITS,
    BK: tl.constexpr, BV: tl.constexpr, M: tl.constexpr, RESIDUAL: tl.constexpr = False,
    RS: tl.constexpr = 1, FROM_ROOTS: tl.constexpr = False,
):
    """Grid ``(H·RS, B)``: the binary counter over the ``NB_FULL`` complete block roots (levels above ``M``),
    program ``(h·RS + j, b)`` on rows ``j·BK/RS ..`` of the states. FROM_ROOTS: a left node is read in fp32 from
    the root slot of the block where it ends (each merged node is written back to its own block's slot), not
    from the stored node and its residual."""
    i_h, i_b = tl.program_id(0) // RS, tl.program_id(1)
    bh = (i_b * H + i_h).to(tl.int64)
    rows = (tl.program_id(0) % RS) * (BK // RS) + tl.arange(0, BK // RS)
    tile = rows[:, None] * BV + tl.arange(0, BV)[None, :]
    gend_ptr += bh * N
    node_ptr += bh * N * BK * BV
    res_ptr += bh * N * BK * BV
    for beta in range(NB_FULL):
        c = ((beta + 1) << M) - 1  # last chunk of block beta
        state = tl.load(root_ptr + (bh * NB + beta) * BK * BV + tile)
        g_end = tl.load(gend_ptr + c)
        merges = trailing_ones(beta, ROOT_BITS)
        for height in range(merges):
            e = c - (1 << (M + height))
            if FROM_ROOTS:
                left = tl.load(root_ptr + (bh * NB + beta - (1 << height)) * BK * BV + tile)
                state = merge_held(state, left, g_end, tl.load(gend_ptr + e))
            else:
                state = merge_left(state, node_ptr, res_ptr, gend_ptr, e, g_end, tile, BK, BV, RESIDUAL)
        if merges > 0:  # an even block's root was stored by the tree kernel already
            store_node(node_ptr, res_ptr, c.to(tl.int64) * BK * BV + tile, state, RESIDUAL)
            if FROM_ROOTS:
                tl.store(root_ptr + (bh * NB + beta) * BK * BV + tile, state)
        tl.debug_barrier()


@triton.jit
def read_levels(
    out, q, lam_ptr, slt, t, T, L, gc, gend_ptr, node_ptr, i_c, n_levels,
    C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """``out + Σ_ℓ diag(λ[t, C_LOG + ℓ] · exp(gc + G_{start-1} - G_e)) q S_node(ℓ)`` over the chunk levels
    ``ℓ`` whose bit is set in ``i_c``, each level's column of λ loaded when it is read. q: [C, BK];
    lam_ptr: the head's ``level_scales`` (token stride ``slt``); t, gc: [C]; out: [C, BV] fp32."""
    tile = tl.arange(0, BK)[:, None] * BV + tl.arange(0, BV)[None, :]
    g_start = tl.load(gend_ptr + tl.maximum(i_c - 1, 0))  # G at the token before the chunk
    for level in range(1, n_levels + 1):
        if ((i_c >> (level - 1)) & 1) == 1:
            e = ((i_c >> level) << level) + (1 << (level - 1)) - 1  # the node this level reads
            node = tl.load(node_ptr + e.to(tl.int64) * BK * BV + tile)
            decay = (g_start - tl.load(gend_ptr + e)).to(gc.dtype)
            scale = load_level_column(lam_ptr, slt, t, T, L, C_LOG + level, gc.dtype) * tl.exp(gc + decay)
            out += tl.dot((q * scale[:, None]).to(node.dtype), node, input_precision=IP)
    return out


@triton.jit
def loglinear_fwd_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr,
    T, N, H, K, V, L, n_levels,
    sqb, sqt, sqh, svb, svt, svh, slb, slt, slh, sob, sot, soh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HG: tl.constexpr, SHARED: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(H / HG, N, B)``: chunk ``i_c`` for heads ``i_g·HG ..``; levels inside the chunk, then the nodes.
    lam: ``[B, T, H, L]`` (strides ``sl*``), read one level column at a time."""
    i_g, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_c * C + tl.arange(0, C)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    levels = fenwick_levels(C, C_LOG)
    q_ptr += i_b.to(tl.int64) * sqb
    k_ptr += i_b.to(tl.int64) * sqb
    if SHARED:  # one q, k for every head: Q Kᵀ once per chunk
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
    for hh in range(HG):
        h = i_g * HG + hh
        bh = (i_b * H + h).to(tl.int64)
        if not SHARED:
            q, k, scores = load_qk_scores(q_ptr + h * sqh, k_ptr + h * sqh, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr + i_b.to(tl.int64) * svb + h * svh, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + bh * N * C + t)
        lam_head = lam_ptr + i_b.to(tl.int64) * slb + h * slh
        weights = decay_matrix(gc, C) * load_level_scale_matrix(lam_head, slt, t, T, L, levels, C_LOG, gc.dtype)
        out = tl.dot((scores * weights).to(v.dtype), v, input_precision=IP)
        out = read_levels(out, q, lam_head, slt, t, T, L, gc, gend_ptr + bh * N, node_ptr + bh * N * BK * BV, i_c,
                          n_levels, C_LOG, BK, BV, IP)
        store_tile(o_ptr + i_b.to(tl.int64) * sob + h * soh, sot, t, T, rv, V, out)


class FenwickTree(NamedTuple):
    """The forward's tree, kept for the backward.

    nodes: ``[B, H, N, BK, BV]`` in the state dtype, slot ``e`` = the left node ending at chunk ``e``;
    residuals: what storing each node in a 16-bit type rounded away (same shape, same type), or an empty
    tensor when nodes are stored in fp32 or no backward will read them (:func:`build_tree` with ``residuals=False``
    and ``tree_registers``). The backward needs them for ``d log_decay`` (:mod:`.step4_tree_backward`).
    """

    nodes: torch.Tensor
    residuals: torch.Tensor


def build_tree(k, v, gc, gend, chunk_size: int, config: LaunchConfig = LaunchConfig(),
               residuals: bool = True) -> FenwickTree:
    """The Fenwick tree of chunk states (:class:`FenwickTree`). k: ``[B, T, H or 1, K]``; v: ``[B, T, H, V]``;
    gc, gend from ``chunk_decay``. ``residuals=False``: no backward will read the 16-bit nodes' residuals, so
    the tree kernels that do not merge through them (``config.tree_registers``) store none."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[3]
    N = -(-T // chunk_size)
    BK, BV, M = head_block(K, k.dtype), head_block(V, k.dtype), config.tree_levels()
    NB = -(-N // (1 << M))
    nodes = torch.empty(B, H, N, BK, BV, device=k.device, dtype=state_dtype(k.dtype, config.precision))
    residual = nodes.dtype in (torch.float16, torch.bfloat16) and (residuals or not config.tree_registers)
    kept = torch.empty_like(nodes) if residual else nodes.new_empty(0)
    res_arg = kept if residual else nodes  # a valid pointer the kernels never use without RESIDUAL
    upper = num_chunk_levels(T, chunk_size) > M
    roots = torch.empty(B, H, NB if upper else 1, BK, BV, device=k.device, dtype=accumulator_dtype(k.dtype))
    sqh = 0 if Hk == 1 else k.stride(2)
    KS = config.key_split(BK)
    tree_kernel = fenwick_block_kernel if config.tree_registers else fenwick_tree_kernel
    tree_kernel[(H * KS, NB, B)](
        k, v, gc, gend, nodes, res_arg, roots, T, N, NB if upper else 0, H, K, V,
        k.stride(0), k.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2),
        C=chunk_size, BK=BK, BV=BV, M=M, IP=dot_precision(k.dtype, config.precision), num_warps=config.tree_warps,
        SPLIT=split_leaf(k.dtype, config.precision), RESIDUAL=residual, KS=KS,
        **(dict(PREFETCH=config.tree_prefetch) if config.tree_registers else {}),
        **({} if config.tree_max_registers is None else dict(maxnreg=config.tree_max_registers)),
    )
    if upper:
        nb_full = N >> M
        RS = config.row_split(BK)
        fenwick_upper_kernel[(H * RS, B)](
            gend, nodes, res_arg, roots, N, NB, nb_full, H, max(nb_full.bit_length(), 1),
            BK=BK, BV=BV, M=M, RESIDUAL=residual, RS=RS, FROM_ROOTS=config.tree_registers,
            num_warps=config.tree_warps,
        )
    return FenwickTree(nodes, kept)


def loglinear_forward(q, k, v, level_scales, gc, gend, chunk_size: int = 64,
                      config: LaunchConfig = LaunchConfig(), out: torch.Tensor | None = None, residuals: bool = True):
    """Log-linear Mamba-2 forward.

    q, k: ``[B, T, H or 1, K]`` with equal strides and ``K <= 128``; v: ``[B, T, H, V]`` (``V <= 128``);
    level_scales: ``[B, T, H, L]``; gc, gend from :func:`~loglin_edu.kernels.inputs.chunk_decay`;
    every last dimension contiguous. ``out`` (optional, ``[B, T, H, V]``, any strides) receives o.
    Returns ``(o, tree)``, ``tree`` the :class:`FenwickTree` the backward needs (``residuals=False``: no
    backward will run, see :func:`build_tree`).
    """
    B, T, Hk, K = q.shape
    H, V, L = v.shape[2], v.shape[3], level_scales.shape[3]
    N = -(-T // chunk_size)
    tree = build_tree(k, v, gc, gend, chunk_size, config, residuals)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype) if out is None else out
    HG = config.group(H)
    loglinear_fwd_kernel[(H // HG, N, B)](
        q, k, v, level_scales, gc, gend, tree.nodes, o, T, N, H, K, V, L, num_chunk_levels(T, chunk_size),
        q.stride(0), q.stride(1), 0 if Hk == 1 else q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        level_scales.stride(0), level_scales.stride(1), level_scales.stride(2), o.stride(0), o.stride(1), o.stride(2),
        C=chunk_size, C_LOG=chunk_size.bit_length() - 1, BK=head_block(K, q.dtype), BV=head_block(V, q.dtype),
        HG=HG, SHARED=Hk == 1, IP=dot_precision(q.dtype, config.precision), num_warps=config.num_warps,
    )
    return o, tree
