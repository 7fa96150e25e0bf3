"""Chapter 8's kernel puzzles: the reference solutions, and the typical mistakes their checkers recognise.

Imported only by :mod:`.ch08_kernel_puzzles` when a puzzle is checked (this module imports triton; on a CPU,
``TRITON_INTERPRET=1`` must be set before that — the puzzles do it). Every tensor is contiguous and row-major;
shapes are in each kernel's docstring. The mistakes are kernels too: each differs from its solution by one
line, the one the hint in the puzzle talks about.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels.tiles import decay_matrix, fenwick_levels, level_scale_matrix, trailing_ones

# ---------------------------------------------------------------- 1. the decay matrix


@triton.jit
def decay_matrix_kernel(gc_ptr, out_ptr, C: tl.constexpr):
    """``out[i, j] = exp(gc[i] - gc[j])`` for ``j <= i``, 0 above. gc: [C]; out: [C, C]."""
    i = tl.arange(0, C)
    gc = tl.load(gc_ptr + i)
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))  # no exp of a positive difference
    tl.store(out_ptr + i[:, None] * C + i[None, :], tl.where(causal, decay, 0.0))


@triton.jit
def decay_matrix_transposed(gc_ptr, out_ptr, C: tl.constexpr):
    i = tl.arange(0, C)
    gc = tl.load(gc_ptr + i)
    causal = i[:, None] >= i[None, :]
    tl.store(out_ptr + i[:, None] * C + i[None, :], tl.where(causal, tl.exp(gc[None, :] - gc[:, None]), 0.0))


@triton.jit
def decay_matrix_unmasked(gc_ptr, out_ptr, C: tl.constexpr):
    i = tl.arange(0, C)
    gc = tl.load(gc_ptr + i)
    tl.store(out_ptr + i[:, None] * C + i[None, :], tl.exp(gc[:, None] - gc[None, :]))


@triton.jit
def decay_matrix_strict(gc_ptr, out_ptr, C: tl.constexpr):
    i = tl.arange(0, C)
    gc = tl.load(gc_ptr + i)
    causal = i[:, None] > i[None, :]
    tl.store(out_ptr + i[:, None] * C + i[None, :], tl.where(causal, tl.exp(gc[:, None] - gc[None, :]), 0.0))


# ---------------------------------------------------------------- 2. the level matrix


@triton.jit
def level_matrix_kernel(out_ptr, C: tl.constexpr, C_LOG: tl.constexpr):
    """``out[i, j] = bit_length(i ^ j)`` for in-chunk offsets ``i, j < C = 2^C_LOG``. out: [C, C] int32."""
    i = tl.arange(0, C)
    x = i[:, None] ^ i[None, :]
    levels = tl.zeros((C, C), dtype=tl.int32)
    for bit in tl.static_range(C_LOG):  # bit_length(x) = how many of x >> 0, x >> 1, ... are non-zero
        levels += ((x >> bit) > 0).to(tl.int32)
    tl.store(out_ptr + i[:, None] * C + i[None, :], levels)


@triton.jit
def level_matrix_distance(out_ptr, C: tl.constexpr, C_LOG: tl.constexpr):
    i = tl.arange(0, C)
    x = tl.abs(i[:, None] - i[None, :])
    levels = tl.zeros((C, C), dtype=tl.int32)
    for bit in tl.static_range(C_LOG):
        levels += ((x >> bit) > 0).to(tl.int32)
    tl.store(out_ptr + i[:, None] * C + i[None, :], levels)


@triton.jit
def level_matrix_zero_based(out_ptr, C: tl.constexpr, C_LOG: tl.constexpr):
    i = tl.arange(0, C)
    x = i[:, None] ^ i[None, :]
    levels = tl.zeros((C, C), dtype=tl.int32)
    for bit in tl.static_range(1, C_LOG):
        levels += ((x >> bit) > 0).to(tl.int32)
    tl.store(out_ptr + i[:, None] * C + i[None, :], levels)


@triton.jit
def level_matrix_popcount(out_ptr, C: tl.constexpr, C_LOG: tl.constexpr):
    i = tl.arange(0, C)
    x = i[:, None] ^ i[None, :]
    levels = tl.zeros((C, C), dtype=tl.int32)
    for bit in tl.static_range(C_LOG):
        levels += ((x >> bit) & 1).to(tl.int32)
    tl.store(out_ptr + i[:, None] * C + i[None, :], levels)


# ---------------------------------------------------------------- 3. the intra-chunk product


@triton.jit
def intra_chunk_kernel(q_ptr, k_ptr, v_ptr, gc_ptr, lam_ptr, o_ptr,
                       C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    """One chunk: ``o = ((Q Kᵀ) ⊙ E ⊙ Λ) V`` with ``Λ[i, j] = λ[i, level(i, j)]``. q, k: [C, K]; v, o: [C, V];
    gc: [C]; lam: [C, L] (L >= C_LOG + 1)."""
    i, rk, rv, rl = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + i[:, None] * K + rk[None, :])
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    lam = tl.load(lam_ptr + i[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + i)
    weights = decay_matrix(gc, C) * level_scale_matrix(lam, fenwick_levels(C, C_LOG), C_LOG, L)
    o = tl.dot(tl.dot(q, tl.trans(k)) * weights, v)
    tl.store(o_ptr + i[:, None] * V + rv[None, :], o)


@triton.jit
def intra_chunk_key_scales(q_ptr, k_ptr, v_ptr, gc_ptr, lam_ptr, o_ptr,
                           C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    i, rk, rv, rl = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + i[:, None] * K + rk[None, :])
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    lam = tl.load(lam_ptr + i[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + i)
    weights = decay_matrix(gc, C) * tl.trans(level_scale_matrix(lam, fenwick_levels(C, C_LOG), C_LOG, L))
    o = tl.dot(tl.dot(q, tl.trans(k)) * weights, v)
    tl.store(o_ptr + i[:, None] * V + rv[None, :], o)


@triton.jit
def intra_chunk_without_levels(q_ptr, k_ptr, v_ptr, gc_ptr, lam_ptr, o_ptr,
                               C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    i, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    q = tl.load(q_ptr + i[:, None] * K + rk[None, :])
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    gc = tl.load(gc_ptr + i)
    o = tl.dot(tl.dot(q, tl.trans(k)) * decay_matrix(gc, C), v)
    tl.store(o_ptr + i[:, None] * V + rv[None, :], o)


@triton.jit
def intra_chunk_without_decay(q_ptr, k_ptr, v_ptr, gc_ptr, lam_ptr, o_ptr,
                              C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    i, rk, rv, rl = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + i[:, None] * K + rk[None, :])
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    lam = tl.load(lam_ptr + i[:, None] * L + rl[None, :])
    causal = i[:, None] >= i[None, :]
    weights = tl.where(causal, level_scale_matrix(lam, fenwick_levels(C, C_LOG), C_LOG, L), 0.0)
    o = tl.dot(tl.dot(q, tl.trans(k)) * weights, v)
    tl.store(o_ptr + i[:, None] * V + rv[None, :], o)


# ---------------------------------------------------------------- 4. the leaf state


@triton.jit
def leaf_state_kernel(k_ptr, v_ptr, gc_ptr, s_ptr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """The chunk's state decayed to its last token: ``S = K̃ᵀ V``, ``K̃ = diag(exp(gc[C-1] - gc)) K``.
    k: [C, K]; v: [C, V]; gc: [C]; s: [K, V]."""
    i, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    gc = tl.load(gc_ptr + i)
    g_last = tl.load(gc_ptr + C - 1)
    k_to_end = k * tl.exp(g_last - gc)[:, None]
    tl.store(s_ptr + rk[:, None] * V + rv[None, :], tl.dot(tl.trans(k_to_end), v))


@triton.jit
def leaf_state_from_start(k_ptr, v_ptr, gc_ptr, s_ptr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    i, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    gc = tl.load(gc_ptr + i)
    tl.store(s_ptr + rk[:, None] * V + rv[None, :], tl.dot(tl.trans(k * tl.exp(gc)[:, None]), v))


@triton.jit
def leaf_state_undecayed(k_ptr, v_ptr, gc_ptr, s_ptr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    i, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    tl.store(s_ptr + rk[:, None] * V + rv[None, :], tl.dot(tl.trans(k), v))


@triton.jit
def leaf_state_sign(k_ptr, v_ptr, gc_ptr, s_ptr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    i, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    k = tl.load(k_ptr + i[:, None] * K + rk[None, :])
    v = tl.load(v_ptr + i[:, None] * V + rv[None, :])
    gc = tl.load(gc_ptr + i)
    g_last = tl.load(gc_ptr + C - 1)
    tl.store(s_ptr + rk[:, None] * V + rv[None, :], tl.dot(tl.trans(k * tl.exp(gc - g_last)[:, None]), v))


# ---------------------------------------------------------------- 5. the tree's slots (a binary counter)


@triton.jit
def tree_slots_kernel(leaf_ptr, gend_ptr, node_ptr, N, K: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr):
    """Slot ``e`` of the Fenwick tree over chunks: the node of height ``h = tz(e + 1)`` ending at chunk ``e``,
    ``Σ_{c = e+1-2^h .. e} exp(G_e - G_c) leaf_c``. leaf, node: [N, K, V]; gend: [N] (G at each chunk's end);
    BITS >= bit_length(N). One program walks the chunks like a binary counter."""
    tile = tl.arange(0, K)[:, None] * V + tl.arange(0, V)[None, :]
    for c in range(N):
        state = tl.load(leaf_ptr + c * K * V + tile)
        g_end = tl.load(gend_ptr + c)
        for height in range(trailing_ones(c, BITS)):  # merge with the left sibling of each height c completes
            e = c - (1 << height)
            state = tl.exp(g_end - tl.load(gend_ptr + e)) * tl.load(node_ptr + e * K * V + tile) + state
        tl.store(node_ptr + c * K * V + tile, state)
        tl.debug_barrier()  # on a GPU: the next merge reads what this store wrote


@triton.jit
def tree_slots_undecayed(leaf_ptr, gend_ptr, node_ptr, N, K: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr):
    tile = tl.arange(0, K)[:, None] * V + tl.arange(0, V)[None, :]
    for c in range(N):
        state = tl.load(leaf_ptr + c * K * V + tile)
        for height in range(trailing_ones(c, BITS)):
            state = tl.load(node_ptr + (c - (1 << height)) * K * V + tile) + state
        tl.store(node_ptr + c * K * V + tile, state)
        tl.debug_barrier()


@triton.jit
def tree_slots_right_decayed(leaf_ptr, gend_ptr, node_ptr, N, K: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr):
    tile = tl.arange(0, K)[:, None] * V + tl.arange(0, V)[None, :]
    for c in range(N):
        state = tl.load(leaf_ptr + c * K * V + tile)
        g_end = tl.load(gend_ptr + c)
        for height in range(trailing_ones(c, BITS)):
            e = c - (1 << height)
            state = tl.load(node_ptr + e * K * V + tile) + tl.exp(g_end - tl.load(gend_ptr + e)) * state
        tl.store(node_ptr + c * K * V + tile, state)
        tl.debug_barrier()


@triton.jit
def tree_slots_one_merge_short(leaf_ptr, gend_ptr, node_ptr, N, K: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr):
    tile = tl.arange(0, K)[:, None] * V + tl.arange(0, V)[None, :]
    for c in range(N):
        state = tl.load(leaf_ptr + c * K * V + tile)
        g_end = tl.load(gend_ptr + c)
        for height in range(trailing_ones(c, BITS) - 1):
            e = c - (1 << height)
            state = tl.exp(g_end - tl.load(gend_ptr + e)) * tl.load(node_ptr + e * K * V + tile) + state
        tl.store(node_ptr + c * K * V + tile, state)
        tl.debug_barrier()


# ---------------------------------------------------------------- 6. the level reads


@triton.jit
def level_reads_kernel(q_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr,
                       C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                       LEVELS: tl.constexpr):
    """Program ``c``: the inter-chunk output of chunk ``c``,
    ``Σ_{ℓ: bit ℓ-1 of c} diag(λ[:, C_LOG + ℓ] · exp(gc + G_{start-1} - G_e)) Q S_e``, ``e`` the slot it reads at
    level ℓ and ``G_{start-1} = gend[c - 1]``. q: [N·C, K]; lam: [N·C, L]; gc: [N·C]; gend: [N];
    node: [N, K, V]; o: [N·C, V]."""
    c = tl.program_id(0)
    t = c * C + tl.arange(0, C)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
    lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + t)
    g_start = tl.load(gend_ptr + tl.maximum(c - 1, 0))
    out = tl.zeros((C, V), dtype=tl.float32)
    for level in range(1, LEVELS + 1):
        if ((c >> (level - 1)) & 1) == 1:
            e = ((c >> level) << level) + (1 << (level - 1)) - 1  # the left half of c's aligned 2^level block
            node = tl.load(node_ptr + e * K * V + rk[:, None] * V + rv[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + level, lam, 0.0), 1)
            scale = lam_level * tl.exp(gc + g_start - tl.load(gend_ptr + e))
            out += tl.dot(q * scale[:, None], node)
    tl.store(o_ptr + t[:, None] * V + rv[None, :], out)


@triton.jit
def level_reads_next_slot(q_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr,
                          C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                          LEVELS: tl.constexpr):
    c = tl.program_id(0)
    t = c * C + tl.arange(0, C)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
    lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + t)
    g_start = tl.load(gend_ptr + tl.maximum(c - 1, 0))
    out = tl.zeros((C, V), dtype=tl.float32)
    for level in range(1, LEVELS + 1):
        if ((c >> (level - 1)) & 1) == 1:
            e = ((c >> level) << level) + (1 << (level - 1))
            node = tl.load(node_ptr + e * K * V + rk[:, None] * V + rv[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + level, lam, 0.0), 1)
            scale = lam_level * tl.exp(gc + g_start - tl.load(gend_ptr + e))
            out += tl.dot(q * scale[:, None], node)
    tl.store(o_ptr + t[:, None] * V + rv[None, :], out)


@triton.jit
def level_reads_chunk_level_column(q_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr,
                                   C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                   L: tl.constexpr, LEVELS: tl.constexpr):
    c = tl.program_id(0)
    t = c * C + tl.arange(0, C)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
    lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + t)
    g_start = tl.load(gend_ptr + tl.maximum(c - 1, 0))
    out = tl.zeros((C, V), dtype=tl.float32)
    for level in range(1, LEVELS + 1):
        if ((c >> (level - 1)) & 1) == 1:
            e = ((c >> level) << level) + (1 << (level - 1)) - 1
            node = tl.load(node_ptr + e * K * V + rk[:, None] * V + rv[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == level, lam, 0.0), 1)
            scale = lam_level * tl.exp(gc + g_start - tl.load(gend_ptr + e))
            out += tl.dot(q * scale[:, None], node)
    tl.store(o_ptr + t[:, None] * V + rv[None, :], out)


@triton.jit
def level_reads_no_node_decay(q_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr,
                              C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                              LEVELS: tl.constexpr):
    c = tl.program_id(0)
    t = c * C + tl.arange(0, C)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
    lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
    gc = tl.load(gc_ptr + t)
    out = tl.zeros((C, V), dtype=tl.float32)
    for level in range(1, LEVELS + 1):
        if ((c >> (level - 1)) & 1) == 1:
            e = ((c >> level) << level) + (1 << (level - 1)) - 1
            node = tl.load(node_ptr + e * K * V + rk[:, None] * V + rv[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + level, lam, 0.0), 1)
            out += tl.dot(q * (lam_level * tl.exp(gc))[:, None], node)
    tl.store(o_ptr + t[:, None] * V + rv[None, :], out)


# ---------------------------------------------------------------- 7. a node's gradient


@triton.jit
def node_gradient_kernel(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, N,
                         C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    """Program ``e``: ``dS_e = Σ_{c reads e} Q̃ᵀ dO_c`` over the chunks ``c = e + 1 .. e + 2^h`` (``c < N``) that read
    slot ``e`` (height ``h = tz(e + 1)``, read at chunk level ``h + 1``), ``Q̃ = diag(λ[:, C_LOG + h + 1] ·
    exp(gc + G_{start(c)-1} - G_e)) Q_c``. Inputs as :func:`level_reads_kernel`, do: [N·C, V];
    dnode: [N, K, V]."""
    e = tl.program_id(0)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    height = trailing_ones(e, 32)
    g_e = tl.load(gend_ptr + e)
    acc = tl.zeros((K, V), dtype=tl.float32)
    for j in range(1 << height):
        c = e + 1 + j
        if c < N:
            t = c * C + tl.arange(0, C)
            q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
            do = tl.load(do_ptr + t[:, None] * V + rv[None, :])
            lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + height + 1, lam, 0.0), 1)
            scale = lam_level * tl.exp(tl.load(gc_ptr + t) + tl.load(gend_ptr + c - 1) - g_e)
            acc += tl.dot(tl.trans(q * scale[:, None]), do)
    tl.store(dnode_ptr + e * K * V + rk[:, None] * V + rv[None, :], acc)


@triton.jit
def node_gradient_own_chunks(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, N,
                             C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    e = tl.program_id(0)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    height = trailing_ones(e, 32)
    g_e = tl.load(gend_ptr + e)
    acc = tl.zeros((K, V), dtype=tl.float32)
    for j in range(1 << height):
        c = e - j
        t = c * C + tl.arange(0, C)
        q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
        do = tl.load(do_ptr + t[:, None] * V + rv[None, :])
        lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
        lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + height + 1, lam, 0.0), 1)
        scale = lam_level * tl.exp(tl.load(gc_ptr + t) + tl.load(gend_ptr + tl.maximum(c - 1, 0)) - g_e)
        acc += tl.dot(tl.trans(q * scale[:, None]), do)
    tl.store(dnode_ptr + e * K * V + rk[:, None] * V + rv[None, :], acc)


@triton.jit
def node_gradient_height_column(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, N,
                                C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    e = tl.program_id(0)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    height = trailing_ones(e, 32)
    g_e = tl.load(gend_ptr + e)
    acc = tl.zeros((K, V), dtype=tl.float32)
    for j in range(1 << height):
        c = e + 1 + j
        if c < N:
            t = c * C + tl.arange(0, C)
            q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
            do = tl.load(do_ptr + t[:, None] * V + rv[None, :])
            lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + height, lam, 0.0), 1)
            scale = lam_level * tl.exp(tl.load(gc_ptr + t) + tl.load(gend_ptr + c - 1) - g_e)
            acc += tl.dot(tl.trans(q * scale[:, None]), do)
    tl.store(dnode_ptr + e * K * V + rk[:, None] * V + rv[None, :], acc)


@triton.jit
def node_gradient_undecayed(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, N,
                            C: tl.constexpr, C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    e = tl.program_id(0)
    rk, rv, rl = tl.arange(0, K), tl.arange(0, V), tl.arange(0, L)
    height = trailing_ones(e, 32)
    acc = tl.zeros((K, V), dtype=tl.float32)
    for j in range(1 << height):
        c = e + 1 + j
        if c < N:
            t = c * C + tl.arange(0, C)
            q = tl.load(q_ptr + t[:, None] * K + rk[None, :])
            do = tl.load(do_ptr + t[:, None] * V + rv[None, :])
            lam = tl.load(lam_ptr + t[:, None] * L + rl[None, :])
            lam_level = tl.sum(tl.where(rl[None, :] == C_LOG + height + 1, lam, 0.0), 1)
            acc += tl.dot(tl.trans(q * lam_level[:, None]), do)
    tl.store(dnode_ptr + e * K * V + rk[:, None] * V + rv[None, :], acc)
