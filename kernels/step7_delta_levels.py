"""Step 7 — the chunk levels of log-linear Gated DeltaNet: one walk per level and block, then the output.

A query in chunk ``c`` reads, at chunk level ``ℓ`` (bit ``ℓ - 1`` of ``c`` set), the keys of the left half
``L`` of the aligned ``2^ℓ``-chunk block holding ``c`` — but, with the delta rule, *carried through the
transitions of every chunk between them*:

    X_{c,ℓ} = Φ_{c-1} ··· Φ_{start(R)} S_L,       S_L = Σ_{c' in L} Φ_{end(L)} ··· Φ_{c'+1} own_{c'}     ([K, V])

with ``Φ_c S = γ_C S - K̃ᵀ (W S)`` and ``own_c = K̃ᵀ U₀`` (step 6). For Mamba-2 the carry is a scalar, so a
node of the tree is read as it is (step 3); here it is a ``K × K`` matrix product, and a node's carried
value differs for every reader. The schedule: **every level and every aligned block is its own walk**,

    S = 0;   for c in L:  S ← γ_C S + K̃ᵀ (U₀ - W S)          (build the left half)
             for c in R:  X_{c,ℓ} = S;  S ← γ_C S - K̃ᵀ (W S)  (carry it to every reader)

so a level-``ℓ`` walk is ``2^ℓ`` chunks long and all walks run at once, grid ``(V / BV, B·H, walks)``,
longest first. The depth is one walk over the whole sequence (the top level), like linear Gated
DeltaNet's state passing; the work is ``N`` chunk transitions per level (the left halves rebuild what
the lower levels also hold: twice the work of a single walk carrying all live levels, for ``log2 N``
times the parallelism). Each transition costs two ``[C, K] × [K, BV]``-sized products — the cost of a
level is the cost of linear Gated DeltaNet's state passing, where Mamba-2's is one scalar per node.
``DeltaLaunchConfig(forward_walk="stacked")`` makes that single walk instead (:func:`level_state_walk_kernel`):
chunk ``c + 1``'s read states from chunk ``c``'s, as a binary counter carries, grid ``(V / BV, B·H)``.

The read states ``X_{c,ℓ}`` are stored, ``popcount(c)`` per chunk (slot ``Σ_{c'<c} popcount(c')`` + rank),
and :func:`delta_output_kernel` adds them up, grid ``(N, V / BV, B·H)``:

    o = (P ⊙ Λ) V  +  Σ_{ℓ: bit ℓ-1 of c}  diag(λ[:, c0 + ℓ]) query X_{c,ℓ}           (c0 = log2 C)

λ is loaded one ``[C]`` column per level it uses (:func:`~.tiles.load_level_column`), so no tile's width
grows with ``T``.

Memory: the stored states are ``Σ_c popcount(c) ≈ N log2(N) / 2`` blocks of ``K × V`` per head (fp32),
kept for the backward.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..fenwick import num_chunk_levels
from .config import DeltaLaunchConfig, dot_precision, key_tiles
from .step6_delta_chunks import DeltaChunks, delta_chunks, load_rows, value_tiles
from .tiles import (fenwick_levels, load_level_column, load_level_scale_matrix, load_tile, store_tile,
                    trailing_ones)


@triton.jit
def read_slot(first_ptr, c, level):
    """Slot of ``X_{c,level}`` among the stored read states: the chunk's first slot (``Σ_{c'<c} popcount(c')``,
    a host table) plus the number of set bits of ``c`` below bit ``level - 1``."""
    bits = tl.arange(0, 32)
    return tl.load(first_ptr + c) + tl.sum(((c >> bits) & 1) * (bits < level - 1))


@triton.jit
def carry(s1, s2, k_ptr, skt, w_ptr, gc_ptr, t, rows, last_row, T, K, u,
          BK1: tl.constexpr, BK2: tl.constexpr, IP: tl.constexpr):
    """``γ_C S + K̃ᵀ (u - W S)`` for the state ``S = [s1; s2]`` (``[BK1 + BK2, BV]``): the transition of the chunk
    with tokens ``t`` (rows ``rows`` of the w, gc buffers; ``last_row`` its last), plus its write when ``u = U₀``
    (``u = 0``: the transition alone). ``K̃ = diag(γ_C / γ) K``; each factor is loaded just before its product
    (W, then K), so that only one of them is in registers beside the state."""
    r1 = tl.arange(0, BK1)
    inside = t[:, None] < T
    y = tl.dot(tl.load(w_ptr + rows[:, None] * (BK1 + BK2) + r1[None, :]).to(s1.dtype), s1, input_precision=IP)
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        y += tl.dot(tl.load(w_ptr + rows[:, None] * (BK1 + BK2) + r2[None, :]).to(s1.dtype), s2, input_precision=IP)
    gc = tl.load(gc_ptr + rows)
    g_last = tl.load(gc_ptr + last_row)
    pseudo = (u - y) * tl.exp(g_last - gc)[:, None]  # diag(γ_C / γ) (u - W S): K̃ᵀ (u - W S) = Kᵀ pseudo
    decay = tl.exp(g_last)
    k1 = tl.load(k_ptr + t[:, None].to(tl.int64) * skt + r1[None, :], mask=inside & (r1[None, :] < K), other=0.0)
    s1 = decay * s1 + tl.dot(tl.trans(k1.to(s1.dtype)), pseudo, input_precision=IP)
    if BK2 > 0:
        k2 = tl.load(k_ptr + t[:, None].to(tl.int64) * skt + r2[None, :], mask=inside & (r2[None, :] < K), other=0.0)
        s2 = decay * s2 + tl.dot(tl.trans(k2.to(s1.dtype)), pseudo, input_precision=IP)
    return s1, s2


@triton.jit
def level_walk_kernel(
    k_ptr, w_ptr, u_ptr, gc_ptr, x_ptr, walks_ptr, first_ptr,
    T, N, H, K, NX,
    skb, skt, skh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr, BV: tl.constexpr,
    VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(VP / BV, B·H, walks)`` — the walk slowest, so every head's longest walks start first. k: [B, T, H or 1,
    K]; w: [B, H, N·C, BK1 + BK2]; u: [B, H, N·C, VP];
    gc: [B, H, N·C]; x: [B, H, NX, BK1 + BK2, VP] receives ``X_{c,ℓ}`` (module docstring); walks: int32
    ``(level, start)`` of every walk (:func:`walk_table`); first: int32 first read slot of every chunk."""
    i_v, i_bh, i_w = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    level = tl.load(walks_ptr + 2 * i_w)
    start = tl.load(walks_ptr + 2 * i_w + 1)
    half = 1 << (level - 1)
    rc, rv = tl.arange(0, C), i_v * BV + tl.arange(0, BV)
    k_ptr += i_b.to(tl.int64) * skb + i_h * skh
    base = i_bh.to(tl.int64) * N * C
    x_ptr += i_bh.to(tl.int64) * NX * (BK1 + BK2) * VP
    s1 = tl.zeros((BK1, BV), dtype=gc_ptr.dtype.element_ty)
    s2 = tl.zeros((BK2P, BV), dtype=gc_ptr.dtype.element_ty)
    for i in range(half):  # the left half: build its state
        c = start + i
        t = c * C + rc
        u = load_rows(u_ptr, VP, base + t, rv)
        s1, s2 = carry(s1, s2, k_ptr, skt, w_ptr, gc_ptr, t, base + t, base + c * C + C - 1, T, K, u, BK1, BK2, IP)
    for i in range(half):  # the right half: each chunk reads the state, which is carried on to the next
        c = start + half + i
        if c < N:
            slot = read_slot(first_ptr, c, level)
            offset = slot.to(tl.int64) * (BK1 + BK2) * VP + rv[None, :]
            tl.store(x_ptr + offset + tl.arange(0, BK1)[:, None] * VP, s1)
            if BK2 > 0:
                tl.store(x_ptr + offset + (BK1 + tl.arange(0, BK2))[:, None] * VP, s2)
            if (i + 1 < half) & (c + 1 < N):
                t = c * C + rc
                s1, s2 = carry(s1, s2, k_ptr, skt, w_ptr, gc_ptr, t, base + t, base + c * C + C - 1, T, K,
                               tl.zeros((C, BV), dtype=s1.dtype), BK1, BK2, IP)


@triton.jit
def level_state_walk_kernel(
    k_ptr, w_ptr, u_ptr, gc_ptr, x_ptr, first_ptr,
    T, N, H, K, n_levels, NX,
    skb, skt, skh,
    C: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BK2P: tl.constexpr, BV: tl.constexpr,
    VP: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(VP / BV, B·H)``: one walk over the chunks carrying every live level at once, as a binary counter
    carries. With ``j`` the trailing ones of ``c``, chunk ``c + 1``'s read states are chunk ``c``'s, the levels
    ``1..j`` merged with the chunk's own keys and every level above carried on alone,

        X_{c+1, j+1} = Φ_c (Σ_{a ≤ j} X_{c,a}) + K̃ᵀ U₀,      X_{c+1, a} = Φ_c X_{c,a}   (a > j + 1),

    read back from the slots the step before stored (x as :func:`level_walk_kernel`'s): one transition per chunk
    and distinct level, about half the walks per level's, in one chain per program instead of many short ones."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    KP = BK1 + BK2
    rc, rv = tl.arange(0, C), i_v * BV + tl.arange(0, BV)
    r1, r2 = tl.arange(0, BK1), BK1 + tl.arange(0, BK2P)
    k_ptr += i_b.to(tl.int64) * skb + i_h * skh
    base = i_bh.to(tl.int64) * N * C
    x_ptr += i_bh.to(tl.int64) * NX * KP * VP + rv[None, :]
    for c in range(N - 1):
        first = tl.load(first_ptr + c)
        later = tl.load(first_ptr + c + 1)
        reads = later - first
        merges = trailing_ones(c, n_levels)
        t = c * C + rc
        s1 = tl.zeros((BK1, BV), dtype=gc_ptr.dtype.element_ty)
        s2 = tl.zeros((BK2P, BV), dtype=gc_ptr.dtype.element_ty)
        for rank in range(merges):  # the merged levels' sum
            s1 += tl.load(x_ptr + (first + rank).to(tl.int64) * KP * VP + r1[:, None] * VP)
            if BK2 > 0:
                s2 += tl.load(x_ptr + (first + rank).to(tl.int64) * KP * VP + r2[:, None] * VP)
        for rank in range(merges - 1, reads):  # rank merges - 1: the merged level; above: each level alone
            if rank >= merges:
                s1 = tl.load(x_ptr + (first + rank).to(tl.int64) * KP * VP + r1[:, None] * VP)
                if BK2 > 0:
                    s2 = tl.load(x_ptr + (first + rank).to(tl.int64) * KP * VP + r2[:, None] * VP)
                u = tl.zeros((C, BV), dtype=s1.dtype)
            else:
                u = load_rows(u_ptr, VP, base + t, rv)
            s1, s2 = carry(s1, s2, k_ptr, skt, w_ptr, gc_ptr, t, base + t, base + c * C + C - 1, T, K, u, BK1, BK2, IP)
            slot = x_ptr + (later + rank - merges + 1).to(tl.int64) * KP * VP
            tl.store(slot + r1[:, None] * VP, s1)
            if BK2 > 0:
                tl.store(slot + r2[:, None] * VP, s2)
        tl.debug_barrier()  # chunk c + 1's states are stored before any thread loads them


@triton.jit
def delta_output_kernel(
    v_ptr, lam_ptr, p_ptr, query_ptr, x_ptr, first_ptr, o_ptr,
    T, N, H, V, L, n_levels, NX,
    svb, svt, svh, slb, slt, slh, sob, sot, soh,
    C: tl.constexpr, C_LOG: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr, BV: tl.constexpr,
    NV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, B·H)``: o of chunk ``i_c`` (module docstring), value tile by value tile. lam: ``[B, T, H, L]``
    (strides ``sl*``), read one level column at a time."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    rc, r1 = tl.arange(0, C), tl.arange(0, BK1)
    t = i_c * C + rc
    rows = i_bh.to(tl.int64) * N * C + t
    intra = tl.load(p_ptr + (i_bh.to(tl.int64) * N + i_c) * C * C + rc[:, None] * C + rc[None, :])
    lam_ptr += i_b.to(tl.int64) * slb + i_h * slh
    weights = intra * load_level_scale_matrix(lam_ptr, slt, t, T, L, fenwick_levels(C, C_LOG), C_LOG, intra.dtype)
    query1 = load_rows(query_ptr, BK1 + BK2, rows, r1).to(intra.dtype)
    if BK2 > 0:
        r2 = BK1 + tl.arange(0, BK2)
        query2 = load_rows(query_ptr, BK1 + BK2, rows, r2).to(intra.dtype)
    x_ptr += i_bh.to(tl.int64) * NX * (BK1 + BK2) * NV * BV
    first = tl.load(first_ptr + i_c)
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    o_ptr += i_b.to(tl.int64) * sob + i_h * soh
    for i_v in range(NV):
        rv = i_v * BV + tl.arange(0, BV)
        out = tl.dot(weights, load_tile(v_ptr, svt, t, T, rv, V).to(intra.dtype), input_precision=IP)
        slot = first
        for level in range(1, n_levels + 1):
            if ((i_c >> (level - 1)) & 1) == 1:
                states = x_ptr + slot.to(tl.int64) * (BK1 + BK2) * NV * BV + rv[None, :]
                read = tl.dot(query1, tl.load(states + r1[:, None] * NV * BV), input_precision=IP)
                if BK2 > 0:
                    read += tl.dot(query2, tl.load(states + r2[:, None] * NV * BV), input_precision=IP)
                out += load_level_column(lam_ptr, slt, t, T, L, C_LOG + level, intra.dtype)[:, None] * read
                slot += 1
        store_tile(o_ptr, sot, t, T, rv, V, out)


@functools.lru_cache(maxsize=64)
def walk_table(N: int, device) -> torch.Tensor:
    """int32 ``[walks, 2]``: ``(level, start)`` of every level walk over ``N`` chunks, longest first — level
    ``ℓ`` has one walk per aligned ``2^ℓ``-chunk block whose right half holds a chunk."""
    rows = [(lev, start) for lev in range((N - 1).bit_length(), 0, -1)
            for start in range(0, N, 1 << lev) if start + (1 << (lev - 1)) < N]
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 2)


@functools.lru_cache(maxsize=64)
def read_slot_count(N: int) -> int:
    """``Σ_{c < N} popcount(c)``: how many (chunk, level) read states ``N`` chunks have, on the host (no device
    read, so a step that calls it can be captured in a CUDA graph)."""
    return sum(bin(c).count("1") for c in range(N))


@functools.lru_cache(maxsize=64)
def first_slots(N: int, device) -> torch.Tensor:
    """int32 ``[N + 1]``: ``Σ_{c' < c} popcount(c')``, the first read-state slot of chunk ``c`` (the last entry
    is :func:`read_slot_count`)."""
    counts = torch.tensor([0] + [bin(c).count("1") for c in range(N)], dtype=torch.int64)
    return counts.cumsum(0).to(device=device, dtype=torch.int32)


def level_states(k, chunks: DeltaChunks, T: int, V: int, chunk_size: int,
                 config: DeltaLaunchConfig = DeltaLaunchConfig()) -> torch.Tensor:
    """The read states ``X_{c,ℓ}``: ``[B, H, Σ_c popcount(c), BK1 + BK2, NV·BV]`` (fp32), chunk by chunk, levels
    ascending, by the walks per level and block (:func:`level_walk_kernel`) or, with
    ``config.forward_walk="stacked"``, one walk carrying every live level (:func:`level_state_walk_kernel`).
    k: ``[B, T, H or 1, K]``; chunks: step 6's factors; V: the value width."""
    B, H = chunks.gc.shape[:2]
    K = k.shape[3]
    N = -(-T // chunk_size)
    BK1, BK2 = key_tiles(K, config.key_tile)
    BV, NV = value_tiles(V, config)
    first = first_slots(N, k.device)
    states = torch.empty(B, H, max(read_slot_count(N), 1), BK1 + BK2, NV * BV, device=k.device, dtype=chunks.u.dtype)
    if config.forward_walk == "stacked":
        if N > 1:
            level_state_walk_kernel[(NV, B * H)](
                k, chunks.w, chunks.u, chunks.gc, states, first, T, N, H, K, (N - 1).bit_length(), states.shape[2],
                k.stride(0), k.stride(1), 0 if k.shape[2] == 1 else k.stride(2),
                C=chunk_size, BK1=BK1, BK2=BK2, BK2P=max(BK2, 16), BV=BV, VP=NV * BV,
                IP=dot_precision(k.dtype, config.precision), **config.walk_launch(),
            )
        return states
    walks = walk_table(N, k.device)
    if len(walks):
        level_walk_kernel[(NV, B * H, len(walks))](
            k, chunks.w, chunks.u, chunks.gc, states, walks, first, T, N, H, K, states.shape[2],
            k.stride(0), k.stride(1), 0 if k.shape[2] == 1 else k.stride(2),
            C=chunk_size, BK1=BK1, BK2=BK2, BK2P=max(BK2, 16), BV=BV, VP=NV * BV,
            IP=dot_precision(k.dtype, config.precision), **config.walk_launch(),
        )
    return states


def loglinear_delta_forward(q, k, v, level_scales, beta, log_decay, chunk_size: int = 64,
                            config: DeltaLaunchConfig = DeltaLaunchConfig(), out: torch.Tensor | None = None):
    """Log-linear Gated DeltaNet forward.

    q, k: ``[B, T, H or 1, K]`` with equal strides (``K <= 256``); v: ``[B, T, H, V]``; level_scales:
    ``[B, T, H, L]``; beta: ``[B, T, H]``; log_decay: ``[B, T, H]`` or None; every last dimension contiguous.
    ``out`` (optional, ``[B, T, H, V]``, any strides) receives o. Returns ``(o, chunks, states)``: step 6's
    factors and the read states, which the backward needs.
    """
    B, T, Hk, K = q.shape
    H, V, L = v.shape[2], v.shape[3], level_scales.shape[3]
    N = -(-T // chunk_size)
    chunks = delta_chunks(q, k, v, beta, log_decay, chunk_size, config)
    states = level_states(k, chunks, T, V, chunk_size, config)
    BK1, BK2 = key_tiles(K, config.key_tile)
    BV, NV = value_tiles(V, config)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype) if out is None else out
    delta_output_kernel[(N, B * H)](
        v, level_scales, chunks.intra, chunks.query, states, first_slots(N, v.device), o,
        T, N, H, V, L, num_chunk_levels(T, chunk_size), states.shape[2],
        v.stride(0), v.stride(1), v.stride(2), level_scales.stride(0), level_scales.stride(1), level_scales.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        C=chunk_size, C_LOG=chunk_size.bit_length() - 1, BK1=BK1, BK2=BK2, BV=BV, NV=NV,
        IP=dot_precision(q.dtype, config.precision), num_warps=config.num_warps, num_stages=config.stages("read"),
    )
    return o, chunks, states
