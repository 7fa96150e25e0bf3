"""Step 1b — chunked Mamba-2 without the long walk: blocks of chunks in parallel, states passed between them.

    o_t = Σ_{s <= t} (q_t · k_s) exp(G_t - G_s) v_s            (step 1; PAPER.md §1, λ ≡ 1)

Step 1 teaches the chunk recurrence with one program per head walking all ``N = T / C`` chunks. Its
parallelism is ``B·H``: at ``B = 1`` and 48 heads, 48 programs of ``N`` steps in a row, so its time grows
with ``T`` at a fixed number of tokens. This step teaches how to take the walk apart — Mamba-2's *state
passing*: the state is linear in the chunks, so a long walk splits into short ones joined by a scan.

Cut the chunks into blocks of ``W`` chunks (``NB = N / W`` blocks; ``W = block_chunks``, the last block
may be shorter). With ``U_β`` the total of block ``β`` (its keys and values, decayed to its end) and
``d_β = G_end(β) - G_end(β-1)`` its log decay, the state entering block ``β + 1`` is

    S_{β+1} = exp(d_β) S_β + U_β          (S_0 = 0; [K, V] per block, one add per step)

Forward, three launches:

1. :func:`block_state_kernel`, grid ``(NB - 1, H, B)``: every block but the last walks its ``W`` chunks
   (one ``[K, C] × [C, V]`` product each, as step 1's state update) and stores ``U_β``;
2. :func:`block_scan_kernel`, grid ``(K / R, H, B)``: the scan above, ``NB - 1`` steps, in place; the
   ``K × V`` entries are independent, so ``R`` rows of the state per program;
3. :func:`block_output_kernel`, grid ``(NB, H, B)``: step 1's walk over one block, starting from
   ``S_β`` instead of zero.

The backward mirrors it. Step 1's ``dS`` (the gradient of the state entering a chunk) obeys the same
recurrence in reverse, ``dS_c = exp(g_c) dS_{c+1} + Q̃_cᵀ dO_c`` with ``Q̃ = diag(exp(gc)) Q``:

4. :func:`block_state_grad_kernel`, grid ``(NB - 1, H, B)``: every block but the first walks its chunks
   in reverse and stores its own share ``X_β = Σ_c exp(G_start(c) - G_start(β)) Q̃_cᵀ dO_c``;
5. the same scan in reverse: ``dS_β = exp(d_β) dS_{β+1} + X_β``;
6. :func:`block_dq_kernel`, grid ``(NB, H, B)``: the forward walk of the block from ``S_β`` for
   ``dq = ((dO Vᵀ) ⊙ E) K + diag(exp(gc)) dO Sᵀ``;
7. :func:`block_dkdv_kernel`, grid ``(NB, H, B)``: the reverse walk from ``dS_{β+1}`` for
   ``dv = ((Q Kᵀ) ⊙ E)ᵀ dO + K̃ dS`` and ``dk = ((dO Vᵀ) ⊙ E)ᵀ Q + diag(exp(gc_last - gc)) V dSᵀ``.

``W`` is the knob between the two extremes: ``W = N`` is step 1 (one block, launches 1, 2, 4, 5 skipped);
``W = 1`` is the fully chunk-parallel form (every chunk's ``K̃ᵀ V`` in parallel, a scan of ``N`` steps,
every chunk's output in parallel). Per chunk and head the walk keeps the state in registers, while the
block states go through memory: ``K·V`` fp32 numbers (32 KB at ``K = 128``, ``V = 64``) written, scanned
and read per *block*, against ``C·(K + 2V)`` 16-bit numbers of q, k, v, o per chunk (32 KB at ``C = 64``).
At ``W = 1`` the states would be most of the traffic; at ``W = 16`` they are a sixteenth of it, and the
grid is ``B·H·N / 16`` programs of at most 16 steps at every ``T``: at ``B·T = 65,536`` and 48 heads,
3,072 programs, as many as step 1 has at ``T = 1,024``. Work: step 1's, plus one ``K̃ᵀ V`` (forward) and
one ``Q̃ᵀ dO`` (backward) per chunk for the block totals.

dq and dk are computed in fp32 registers and stored once. With q, k shared by all heads, every head's
program stores its own share and one launch of :func:`head_sum_kernel` adds the ``H`` shares in fp32, in
a fixed order (deterministic); per-head q, k are stored directly.

The decay's gradient is step 1's, ``∂L/∂G_t = q_t · dq_t - k_t · dk_t``, folded into one output: the dq walk
stores its part, the dk/dv walk adds its own. Its reverse cumulative sum over ``T`` tokens makes it
sensitive to roundings that do not cancel, so both walks keep the forward's roundings (as step 4 does):

- inside a chunk, ``q_t · dq_t - k_t · dk_t`` is ``rowsum(D) - colsum(D)`` of one fp32 matrix
  ``D = (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E``, whose large diagonal cancels exactly;
- across chunks, the query side ``Σ_t Q̂_t · (S dO_t)`` and the key side ``Σ_t K̂_t · (dS V_t)`` of a chunk
  use the 16-bit ``Q̂, K̂`` (the rounded ``Q̃, K̃``) from which ``dS`` and ``S`` are built, and the fp32
  ``S, dS`` enter their products in two 16-bit parts (exact): summed over the chunks after a token,
  the two sides then cancel but for the pairs that straddle it, as they do in exact arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreted
from .config import MAX_BLOCK, accumulator_dtype, dot_precision, head_block, partial_dtype
from .inputs import chunk_decay, last_dim_contiguous, reverse_cumsum, same_strides
from .tiles import decay_matrix, load_qk_scores, load_tile, split16, store_tile

BLOCK_CHUNKS = 16
"""``W``, chunks per block: ``B·H·N / 16`` programs of at most 16 steps (see the module)."""


@triton.jit
def decayed_keys(k, gc, g_last, dtype):
    """``K̂ = diag(exp(gc_last - gc)) K`` rounded to ``dtype``: the keys as every state product multiplies them."""
    return (k * tl.exp(g_last - gc)[:, None]).to(dtype)


@triton.jit
def decayed_queries(q, gc, dtype):
    """``Q̂ = diag(exp(gc)) Q`` rounded to ``dtype``: the queries as every state product multiplies them."""
    return (q * tl.exp(gc)[:, None]).to(dtype)


@triton.jit
def times_state_t(x, state, IP: tl.constexpr, SPLIT: tl.constexpr):
    """``x Sᵀ`` for ``x: [C, BV]`` (16-bit or fp32) and the fp32 ``S: [BK, BV]``: ``[C, BK]`` fp32. With SPLIT
    (16-bit x), ``S`` enters as two 16-bit parts, so the product is exact (no tf32 rounding of ``S``)."""
    if SPLIT:
        high, low = split16(state, x.dtype)
        return tl.dot(x, tl.trans(high), input_precision=IP) + tl.dot(x, tl.trans(low), input_precision=IP)
    return tl.dot(x, tl.trans(state.to(x.dtype)), input_precision=IP)


@triton.jit
def load_state(ptr, slot, present, BK: tl.constexpr, BV: tl.constexpr):
    """The ``[BK, BV]`` state in ``slot`` of a head's ``[NB, BK, BV]`` buffer, or zeros if not ``present``."""
    tile = tl.arange(0, BK)[:, None] * BV + tl.arange(0, BV)[None, :]
    return tl.load(ptr + slot.to(tl.int64) * BK * BV + tile, mask=tile < tl.where(present, BK * BV, 0), other=0.0)


@triton.jit
def block_state_kernel(
    k_ptr, v_ptr, gc_ptr, state_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(NB - 1, H, B)``: block ``β``'s total ``U_β = Σ_c exp(G_end(β) - G_end(c)) K̂_cᵀ V_c`` into slot
    ``β`` of state: fp32 ``[B, H, NB, BK, BV]``. Every block but the last is ``W`` chunks long."""
    i_blk, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    gc_ptr += bh * N * C
    state = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)
    for c in range(i_blk * W, i_blk * W + W):
        t = c * C + tl.arange(0, C)
        k = load_tile(k_ptr, sqt, t, T, rk, K)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        state = tl.exp(g_last) * state + tl.dot(tl.trans(decayed_keys(k, gc, g_last, v.dtype)), v, input_precision=IP)
    tl.store(state_ptr + (bh * NB + i_blk) * BK * BV + rk[:, None] * BV + rv[None, :], state)


@triton.jit
def block_scan_kernel(
    state_ptr, gend_ptr, N, NB, H,
    W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, R: tl.constexpr, REVERSE: tl.constexpr,
):
    """Grid ``(BK / R, H, B)``, rows ``R·i ..`` of the ``[BK, BV]`` states of one head, in place.

    Forward: slot ``β < NB - 1`` holds ``U_β`` and becomes the state after block ``β``:
    ``r = exp(d_β) r + U_β`` for ``β = 0, 1, ...``. REVERSE: slot ``β >= 1`` holds ``X_β`` and becomes the
    gradient of the state entering block ``β``: the same update for ``β = NB - 1, ..., 1``.
    ``d_β = G_end(β) - G_end(β - 1)`` from gend (fp64, ``[B, H, N]``), taken in fp64."""
    i_r, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    tile = (i_r * R + tl.arange(0, R))[:, None] * BV + tl.arange(0, BV)[None, :]
    state_ptr += bh * NB * BK * BV
    gend_ptr += bh * N
    running = tl.zeros((R, BV), dtype=tl.float32)
    for step in range(NB - 1):
        blk = NB - 1 - step if REVERSE else step
        g_before = tl.load(gend_ptr + tl.maximum(blk * W - 1, 0))
        g_before = tl.where(blk > 0, g_before, 0.0)
        g_end = tl.load(gend_ptr + tl.minimum(blk * W + W, N) - 1)
        offset = blk.to(tl.int64) * BK * BV + tile
        running = tl.exp((g_end - g_before).to(tl.float32)) * running + tl.load(state_ptr + offset).to(tl.float32)
        tl.store(state_ptr + offset, running.to(state_ptr.dtype.element_ty))


@triton.jit
def block_output_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, state_ptr, o_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sob, sot, soh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(NB, H, B)``: step 1's forward over the chunks of block ``β``, from the state after block
    ``β - 1`` (slot ``β - 1`` of the scanned state buffer; zero for the first block). o: [B, T, H, V]."""
    i_blk, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    o_ptr += i_b.to(tl.int64) * sob + i_h * soh
    gc_ptr += bh * N * C
    state = load_state(state_ptr + bh * NB * BK * BV, tl.maximum(i_blk - 1, 0), i_blk > 0, BK, BV)
    state = state.to(gc_ptr.dtype.element_ty)
    for c in range(i_blk * W, tl.minimum(i_blk * W + W, N)):
        t = c * C + tl.arange(0, C)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        out = tl.dot((scores * decay_matrix(gc, C)).to(v.dtype), v, input_precision=IP)
        out += tl.dot(decayed_queries(q, gc, v.dtype), state.to(v.dtype), input_precision=IP)
        store_tile(o_ptr, sot, t, T, rv, V, out)
        state = tl.exp(g_last) * state + tl.dot(tl.trans(decayed_keys(k, gc, g_last, v.dtype)), v, input_precision=IP)


@triton.jit
def block_state_grad_kernel(
    q_ptr, do_ptr, gc_ptr, dstate_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, sdob, sdot, sdoh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(NB - 1, H, B)``: block ``β = 1 + program`` walks its chunks in reverse for its share of the
    gradient of the state entering it, ``X_β = Σ_c exp(G_start(c) - G_start(β)) Q̂_cᵀ dO_c``, into slot ``β``
    of dstate: fp32 ``[B, H, NB, BK, BV]``."""
    i_blk, i_h, i_b = tl.program_id(0) + 1, tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    gc_ptr += bh * N * C
    c_end = tl.minimum(i_blk * W + W, N)
    d_state = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)
    for step in range(c_end - i_blk * W):
        c = c_end - 1 - step
        t = c * C + tl.arange(0, C)
        q = load_tile(q_ptr, sqt, t, T, rk, K)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        d_state = tl.exp(g_last) * d_state + tl.dot(tl.trans(decayed_queries(q, gc, do.dtype)), do, input_precision=IP)
    tl.store(dstate_ptr + (bh * NB + i_blk) * BK * BV + rk[:, None] * BV + rv[None, :], d_state)


@triton.jit
def block_dq_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, state_ptr, do_ptr, dq_ptr, dg_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sdob, sdot, sdoh, sdqb, sdqt, sdqh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr, SPLIT: tl.constexpr,
):
    """Grid ``(NB, H, B)``: the forward walk of block ``β`` from the forward's scanned state (as
    :func:`block_output_kernel`) for dq: ``[B, T, H, K]`` (strides ``sdq*``; with q shared, this head's share).
    dg: fp32 ``[B, H, N·C]`` receives the query side of the decay's gradient between chunks,
    ``Q̂_t · (S dO_t)``."""
    i_blk, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dq_ptr += i_b.to(tl.int64) * sdqb + i_h * sdqh
    gc_ptr += bh * N * C
    dg_ptr += bh * N * C
    state = load_state(state_ptr + bh * NB * BK * BV, tl.maximum(i_blk - 1, 0), i_blk > 0, BK, BV)
    state = state.to(gc_ptr.dtype.element_ty)
    for c in range(i_blk * W, tl.minimum(i_blk * W + W, N)):
        t = c * C + tl.arange(0, C)
        q = load_tile(q_ptr, sqt, t, T, rk, K)
        k = load_tile(k_ptr, sqt, t, T, rk, K)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP) * decay_matrix(gc, C)
        dq = tl.dot(d_scores.to(k.dtype), k, input_precision=IP)
        from_state = times_state_t(do, state, IP, SPLIT)  # dO Sᵀ, [C, BK]
        dq += from_state * tl.exp(gc)[:, None]
        q_side = tl.sum(decayed_queries(q, gc, do.dtype).to(from_state.dtype) * from_state, 1)
        store_tile(dq_ptr, sdqt, t, T, rk, K, dq)
        tl.store(dg_ptr + t, q_side)
        state = tl.exp(g_last) * state + tl.dot(tl.trans(decayed_keys(k, gc, g_last, v.dtype)), v, input_precision=IP)


@triton.jit
def block_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, dstate_ptr, do_ptr, dk_ptr, dv_ptr, dg_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sdob, sdot, sdoh, sdkb, sdkt, sdkh, sdvb, sdvt, sdvh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr, SPLIT: tl.constexpr,
):
    """Grid ``(NB, H, B)``: the reverse walk of block ``β`` from ``dS_{β+1}`` (slot ``β + 1`` of the scanned
    dstate; zero for the last block) for dk (as dq of :func:`block_dq_kernel`) and dv: ``[B, T, H, V]``.
    dg: adds the chunk's own part ``rowsum(D) - colsum(D)`` and the key side ``- K̂_t · (dS V_t)`` to what
    :func:`block_dq_kernel` stored: the gradient of the cumulative decay ``G``."""
    i_blk, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dk_ptr += i_b.to(tl.int64) * sdkb + i_h * sdkh
    dv_ptr += i_b.to(tl.int64) * sdvb + i_h * sdvh
    gc_ptr += bh * N * C
    dg_ptr += bh * N * C
    d_state = load_state(dstate_ptr + bh * NB * BK * BV, tl.minimum(i_blk + 1, NB - 1), i_blk + 1 < NB, BK, BV)
    d_state = d_state.to(gc_ptr.dtype.element_ty)
    c_end = tl.minimum(i_blk * W + W, N)
    for step in range(c_end - i_blk * W):
        c = c_end - 1 - step
        t = c * C + tl.arange(0, C)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        decay = decay_matrix(gc, C)
        scores *= decay  # (Q Kᵀ) ⊙ E
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP)
        pairs = d_scores * scores  # D = (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E, fp32
        d_cum = tl.sum(pairs, 1) - tl.sum(pairs, 0) + tl.load(dg_ptr + t)
        d_scores *= decay
        keys = decayed_keys(k, gc, g_last, v.dtype)
        dv = tl.dot(tl.trans(scores.to(do.dtype)), do, input_precision=IP)
        dv += tl.dot(keys, d_state.to(do.dtype), input_precision=IP)
        from_state = times_state_t(v, d_state, IP, SPLIT)  # V dSᵀ, [C, BK]
        dk = tl.dot(tl.trans(d_scores.to(q.dtype)), q, input_precision=IP)
        dk += from_state * tl.exp(g_last - gc)[:, None]
        d_cum -= tl.sum(keys.to(from_state.dtype) * from_state, 1)
        store_tile(dv_ptr, sdvt, t, T, rv, V, dv)
        store_tile(dk_ptr, sdkt, t, T, rk, K, dk)
        tl.store(dg_ptr + t, d_cum)
        d_state = tl.exp(g_last) * d_state + tl.dot(tl.trans(decayed_queries(q, gc, do.dtype)), do, input_precision=IP)


@triton.jit
def head_sum_kernel(
    share_ptr, out_ptr, rows, H, K,
    R: tl.constexpr, BK: tl.constexpr,
):
    """Grid ``(rows / R, G)``: ``out[g, r, :] = Σ_h share[g, r, h, :]`` in fp32, heads in order; shares
    ``[G, rows, H, K]``, sums ``[G, rows, K]``, both contiguous (``G = 2``: dq and dk in one launch)."""
    i_r, i_g = tl.program_id(0), tl.program_id(1)
    share_ptr += i_g.to(tl.int64) * rows * H * K
    out_ptr += i_g.to(tl.int64) * rows * K
    r = i_r * R + tl.arange(0, R)
    cols = tl.arange(0, BK)
    mask = (r[:, None] < rows) & (cols[None, :] < K)
    total = tl.zeros((R, BK), dtype=tl.float32)
    for h in range(H):
        total += tl.load(share_ptr + (r[:, None].to(tl.int64) * H + h) * K + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + r[:, None].to(tl.int64) * K + cols[None, :], total.to(out_ptr.dtype.element_ty), mask=mask)


def _shape(q, v, chunk_size: int, block_chunks: int):
    B, T, _, K = q.shape
    H, V = v.shape[2], v.shape[3]
    if K > MAX_BLOCK or V > MAX_BLOCK:
        raise ValueError(f"the kernels hold K, V <= {MAX_BLOCK} (the wrapper splits wider heads), got K={K}, V={V}")
    if block_chunks < 1:
        raise ValueError(f"block_chunks must be >= 1, got {block_chunks}")
    N = -(-T // chunk_size)
    return B, T, H, K, V, head_block(K), head_block(V), N, -(-N // block_chunks)


def scan_rows(BK: int) -> int:
    """``R``: state rows one program of :func:`block_scan_kernel` carries (16, or ``BK`` when smaller)."""
    return min(BK, 16)


def parallel_forward(q, k, v, gc, gend, chunk_size: int = 64, block_chunks: int = BLOCK_CHUNKS, num_warps: int = 4):
    """Forward of step 1b. q, k: ``[B, T, H or 1, K]`` (equal strides, ``K <= 128``); v: ``[B, T, H, V]``
    (``V <= 128``); gc, gend from :func:`~loglin_edu.kernels.inputs.chunk_decay`. Returns ``(o, states)``:
    o ``[B, T, H, V]`` and states, fp32 ``[B, H, NB, BK, BV]``, slot ``β`` the state after block ``β``
    (what the backward needs; empty when there is one block)."""
    B, T, H, K, V, BK, BV, N, NB = _shape(q, v, chunk_size, block_chunks)
    acc = accumulator_dtype(q.dtype)
    sqh = 0 if q.shape[2] == 1 else q.stride(2)
    common = dict(C=chunk_size, W=block_chunks, BK=BK, BV=BV, IP=dot_precision(q.dtype), num_warps=num_warps)
    states = torch.empty(B, H, NB if NB > 1 else 0, BK, BV, device=q.device, dtype=acc)
    if NB > 1:
        block_state_kernel[(NB - 1, H, B)](
            k, v, gc, states, T, N, NB, H, K, V, k.stride(0), k.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2),
            **common,
        )
        R = scan_rows(BK)
        block_scan_kernel[(BK // R, H, B)](states, gend, N, NB, H, W=block_chunks, BK=BK, BV=BV, R=R, REVERSE=False)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    block_output_kernel[(NB, H, B)](
        q, k, v, gc, states if NB > 1 else gc, o, T, N, NB, H, K, V,
        q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        **common,
    )
    return o, states


def parallel_backward(q, k, v, gc, gend, states, do, chunk_size: int = 64, block_chunks: int = BLOCK_CHUNKS,
                      num_warps: int = 8):
    """Backward of step 1b: ``(dq, dk, dv, dG)``, dq and dk shaped like q and k (summed over the heads when
    shared), ``dG: [B, H, N·C]`` (fp32) the gradient of the cumulative decay ``G``. Inputs as the forward's;
    states: what it returned; do: ``[B, T, H, V]`` (last dimension contiguous)."""
    B, T, H, K, V, BK, BV, N, NB = _shape(q, v, chunk_size, block_chunks)
    acc = accumulator_dtype(q.dtype)
    shared = q.shape[2] == 1
    sqh = 0 if shared else q.stride(2)
    common = dict(C=chunk_size, W=block_chunks, BK=BK, BV=BV, IP=dot_precision(q.dtype), num_warps=num_warps)
    split = q.dtype in (torch.float16, torch.bfloat16)
    d_states = torch.empty(B, H, NB if NB > 1 else 0, BK, BV, device=q.device, dtype=acc)
    if NB > 1:
        block_state_grad_kernel[(NB - 1, H, B)](
            q, do, gc, d_states, T, N, NB, H, K, V, q.stride(0), q.stride(1), sqh, do.stride(0), do.stride(1), do.stride(2),
            **common,
        )
        R = scan_rows(BK)
        block_scan_kernel[(BK // R, H, B)](d_states, gend, N, NB, H, W=block_chunks, BK=BK, BV=BV, R=R, REVERSE=True)
    grad_dtype = partial_dtype(q.dtype) if shared else q.dtype
    shares = torch.empty(2, B, T, H, K, device=q.device, dtype=grad_dtype)  # dq, dk: one buffer, one launch sums both
    dq, dk = shares
    dv = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    d_cum = torch.empty(B, H, N * chunk_size, device=q.device, dtype=acc)
    strides = (q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1),
               do.stride(2))
    block_dq_kernel[(NB, H, B)](
        q, k, v, gc, states if NB > 1 else gc, do, dq, d_cum, T, N, NB, H, K, V,
        *strides, dq.stride(0), dq.stride(1), dq.stride(2), SPLIT=split, **common,
    )
    block_dkdv_kernel[(NB, H, B)](
        q, k, v, gc, d_states if NB > 1 else gc, do, dk, dv, d_cum, T, N, NB, H, K, V,
        *strides, dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        SPLIT=split, **common,
    )
    if shared:
        dq, dk = sum_heads(shares, q.dtype)
    return dq, dk, dv, d_cum


def sum_heads(shares: torch.Tensor, dtype: torch.dtype):
    """Shares ``[G, B, T, H, K]`` (contiguous) summed over the heads in fp32, in one launch: ``G`` tensors
    ``[B, T, 1, K]`` in ``dtype``."""
    G, B, T, H, K = shares.shape
    sums = torch.empty(G, B, T, 1, K, device=shares.device, dtype=dtype)
    R = 16
    head_sum_kernel[(-(-B * T // R), G)](shares, sums, B * T, H, K, R=R, BK=head_block(K))
    return sums.unbind(0)


class Mamba2Parallel(torch.autograd.Function):
    """Autograd for step 1b: ``o = mamba2(q, k, v, log_decay)`` for ``K, V <= 128``; ``log_decay`` may be None."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, chunk_size, block_chunks):
        q, k = same_strides(q, k)
        v = last_dim_contiguous(v)
        B, T, H = v.shape[:3]
        gc, gend = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype)
        o, states = parallel_forward(q, k, v, gc, gend, chunk_size, block_chunks)
        ctx.save_for_backward(q, k, v, gc, gend, states)
        ctx.chunk_size, ctx.block_chunks = chunk_size, block_chunks
        ctx.decay_dtype = None if log_decay is None else log_decay.dtype
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, gc, gend, states = ctx.saved_tensors
        dq, dk, dv, d_cum = parallel_backward(q, k, v, gc, gend, states, last_dim_contiguous(do), ctx.chunk_size,
                                              ctx.block_chunks)
        dg = None
        if ctx.decay_dtype is not None:
            dg = reverse_cumsum(d_cum, -1)[:, :, : q.shape[1]].transpose(1, 2).to(ctx.decay_dtype)
        return dq, dk, dv, dg, None, None


def mamba2_triton_parallel(q, k, v, log_decay=None, chunk_size: int = 64,
                           block_chunks: int = BLOCK_CHUNKS) -> torch.Tensor:
    """Mamba-2 by the step-1b kernels: q, k ``[B, T, H or 1, K]``, v ``[B, T, H, V]``, log_decay ``[B, T, H]``
    or None -> ``[B, T, H, V]``, differentiable. ``block_chunks`` (``W``) chunks per block; the result does not
    depend on it nor on ``chunk_size`` (raised to 16, the smallest ``tl.dot`` tile). Keys wider than 128 are
    split (``o`` is a sum over key blocks), values wider than 128 too (``o`` is their concatenation)."""
    if not q.is_cuda and not interpreted():
        raise RuntimeError("the Triton kernels got CPU tensors but triton is not in interpreter mode: set "
                           "TRITON_INTERPRET=1 in the environment before triton is first imported")
    chunk_size = max(chunk_size, 16)
    K, V = q.shape[-1], v.shape[-1]
    outputs = []
    for vs in range(0, V, MAX_BLOCK):
        parts = [Mamba2Parallel.apply(q[..., ks : ks + MAX_BLOCK], k[..., ks : ks + MAX_BLOCK],
                                      v[..., vs : vs + MAX_BLOCK], log_decay, chunk_size, block_chunks)
                 for ks in range(0, K, MAX_BLOCK)]
        outputs.append(parts[0] if len(parts) == 1 else sum(parts))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
