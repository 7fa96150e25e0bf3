"""Step 1b — chunked Mamba-2 without the long walk: blocks of chunks in parallel, states passed between them.

    o_t = Σ_{s <= t} (q_t · k_s) exp(G_t - G_s) v_s            (step 1; PAPER.md §1, λ ≡ 1)

Step 1 is the simplest kernel that is right: one program per head walks all ``N = T / C`` chunks, its
state in registers. Its parallelism is ``B·H`` programs of ``N`` steps in a row, so at a fixed number of
tokens its time grows with ``T`` (at ``B = 1`` and 48 heads, 48 programs of 1,024 steps). This step
computes the same function and teaches how to take a walk apart — Mamba-2's *state passing*: the state
is linear in the chunks, so one long walk is many short ones joined by a short scan.

Cut the chunks into blocks of ``W`` chunks (``NB = N / W`` blocks, the last one possibly shorter). With
``U_β`` the total of block ``β`` (its keys and values decayed to its end, step 1's state update
:func:`state_after_chunk` summed over the block) and ``d_β = G_end(β) - G_end(β-1)`` its log decay, the state
after block ``β`` is

    S_(β) = exp(d_β) S_(β-1) + U_β          (S_(-1) = 0; a [K, V] add per block)

Forward, three launches (grid in brackets):

1. :func:`block_state_kernel` ``(NB - 1, H, B)``: every block but the last walks its ``W`` chunks (one
   ``[K, C] × [C, V]`` product each) and stores ``U_β``;
2. :func:`block_scan_kernel` ``(K / 16, H, B)``: the scan above, ``NB - 1`` steps, in place; the state's
   entries are independent, so 16 of its rows per program;
3. :func:`block_output_kernel` ``(NB, H, B)``: step 1's walk over one block, from ``S_(β-1)`` instead of zero.

The backward mirrors it. The gradient of the state entering chunk ``c`` obeys step 1's recurrence in
reverse, ``dS_c = exp(g_c) dS_{c+1} + Q̂_cᵀ dO_c`` (``Q̂ = diag(exp(gc)) Q``, ``g_c`` the chunk's log decay;
:func:`state_grad_before_chunk`):

4. :func:`block_state_grad_kernel` ``(NB - 1, H, B)``: every block but the first walks its chunks in reverse
   for its share ``X_β`` of the gradient of the state entering it;
5. :func:`block_scan_kernel` in reverse: ``dS_(β) = exp(d_β) dS_(β+1) + X_β``;
6. :func:`block_dq_kernel` ``(NB · K / 64, H, B)``: the forward walk of a block from ``S_(β-1)`` for
   ``dq = ((dO Vᵀ) ⊙ E) K + diag(exp(gc)) dO Sᵀ``;
7. :func:`block_dk_kernel` ``(NB · K / 64, H, B)``: the reverse walk from ``dS_(β+1)`` for
   ``dk = ((dO Vᵀ) ⊙ E)ᵀ Q + diag(exp(gc_last - gc)) V dSᵀ``;
8. :func:`block_dv_kernel` ``(NB, H, B)``: the reverse walk for ``dv = ((Q Kᵀ) ⊙ E)ᵀ dO + K̂ dS``
   (``K̂ = diag(exp(gc_last - gc)) K``);
9. with q, k shared by the heads, :func:`head_sum_kernel`: every head's program stored its own share of dq
   and dk; one launch adds the ``H`` shares of both in fp32, heads in order (deterministic). Per-head
   q, k are stored directly.

``dq`` and ``dk`` need only the state's rows of their own keys, so their walks split the keys in blocks of
64 columns (``LinearLaunchConfig.key_split``): a program then holds a ``[64, V]`` state and ``[C, 64]``
gradients instead of twice that (no narrower than :func:`~.config.head_block` allows on a GPU). Registers decide the speed of a walk: step 1's backward keeps a state and
tiles of dq, dk and dv live in one program, and as compiled for Hopper it spills kilobytes per thread to
local memory at every step; each walk here keeps one state and one gradient. ``dv`` sums over all keys and
walks them whole.

``W`` (``LinearLaunchConfig.block_chunks``) is the knob between two extremes: ``W = N`` is step 1 (one
block: launches 1, 2, 4, 5 are skipped); ``W = 1`` is the fully chunk-parallel form (every chunk's state
in parallel, a scan of ``N`` steps, every chunk's output in parallel). A walk keeps its state in registers,
while block states go through memory: ``K·V`` fp32 numbers (32 KB at ``K = 128``, ``V = 64``) per *block*,
written, read and rewritten by the scan, and read again — four passes, 128 KB per block — against the
``C·(2K + 2V)`` 16-bit numbers of q, k, v, o of a chunk (48 KB at ``C = 64``; 16 KB of v and o when q, k are
shared by the heads and read from L2). At ``W = 1`` the states would be most of the traffic; at ``W = 16`` they
are 8 KB per chunk, and the grid has ``B·H·N / 16`` programs of at most 16 steps, a number set by the tokens
per step ``B·T`` alone.
At ``B·T = 65,536``, 48 heads, ``C = 64``: 3,072 programs (6,144 for dq and dk), as many as step 1 has
at ``T = 1,024`` only.

Cost per chunk and head at ``C = 64``, ``K = 128``, ``V = 64`` (product flops; 16-bit tiles of 8 KB for v,
dO, o, dv and 16 KB for a share of dq or dk; q, k shared by the heads are read from L2). Forward: 3.7 MFLOP,
step 1's, plus 1.0 for the block totals; v read twice, o written once, 32 KB of block states per 16 chunks.
Backward: 15.2 MFLOP (plus 1.0 for the block totals) against step 1's 10.0 — ``(dO Vᵀ)`` once per walk and
key block, the state products of the decay's gradient in two parts (below), each walk its own state
update — and about 115 KB moved, as step 1's 104 KB: v and dO read by each walk, dv written, the dq and dk
shares written and read back by the head sum (64 KB of it). At the benchmark's 49,152 chunk-heads that is
0.23 + 0.75 TFLOP and about 1.3 + 5.8 GB (the backward's if the second key block's reads of v and dO hit L2),
so the backward is bound by memory (about 1.3 ms at 4.3 TB/s) rather than by its products (about 1 ms at
790 TFLOP/s), at every ``T``.

The decay's gradient is step 1's, ``∂L/∂G_t = q_t · dq_t - k_t · dk_t``; its reverse cumulative sum over
``T`` tokens carries every rounding that does not cancel to all earlier tokens, so the walks keep the
forward's roundings (as step 4 does):

- inside a chunk, ``q_t · dq_t - k_t · dk_t`` is ``rowsum(D) - colsum(D)`` of one fp32 matrix
  ``D = (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E`` (a sum over key blocks), whose large diagonal cancels exactly;
- between chunks, the query side ``Q̂_t · (S dO_t)`` and the key side ``K̂_t · (dS V_t)`` use the 16-bit
  ``Q̂, K̂`` (rounded to the input type) from which ``dS`` and ``S`` are built, and the fp32 ``S, dS`` enter
  those products in two bf16 parts (the parts sum to them to about ``2^-16``, each product exact; fp16 calls in
  tf32x3, fp32 calls exactly). Summed over the chunks
  after a token, the two sides then cancel but for the pairs that straddle it, as in exact arithmetic.

The dq walks store the query side and the chunk's own part, the dk walks the key side, one fp32 plane per
key block; the dv walk adds the planes into the one output ``dG: [B, H, N·C]``, whose reverse cumulative
sum (fp64, on the host) is ``d log_decay``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device
from .config import MAX_BLOCK, LinearLaunchConfig, accumulator_dtype, dot_precision, head_block, partial_dtype
from .inputs import chunk_decay, last_dim_contiguous, reverse_cumsum, same_strides
from .tiles import decay_matrix, load_qk_scores, load_tile, split16, store_tile


@triton.jit
def decayed_keys(k, gc, g_last, dtype):
    """``K̂ = diag(exp(gc_last - gc)) K`` rounded to ``dtype``: the keys as every state product multiplies them."""
    return (k * tl.exp(g_last - gc)[:, None]).to(dtype)


@triton.jit
def decayed_queries(q, gc, dtype):
    """``Q̂ = diag(exp(gc)) Q`` rounded to ``dtype``: the queries as every state product multiplies them."""
    return (q * tl.exp(gc)[:, None]).to(dtype)


@triton.jit
def state_after_chunk(state, k, v, gc, g_last, IP: tl.constexpr):
    """Step 1's state update over one chunk, ``S <- exp(gc_last) S + K̂ᵀ V`` (``K̂`` by :func:`decayed_keys`, in v's
    type): state ``[R, BV]`` fp32 (fp64) on the key rows of k ``[C, R]`` (all ``BK`` of them or one key block);
    v ``[C, BV]``; gc ``[C]``, g_last its last entry."""
    return tl.exp(g_last) * state + tl.dot(tl.trans(decayed_keys(k, gc, g_last, v.dtype)), v, input_precision=IP)


@triton.jit
def state_grad_before_chunk(d_state, q, do, gc, g_last, IP: tl.constexpr):
    """The state's gradient carried back over one chunk, ``dS <- exp(gc_last) dS + Q̂ᵀ dO`` (``Q̂`` by
    :func:`decayed_queries`, in dO's type): d_state ``[R, BV]`` fp32 (fp64) on the key rows of q ``[C, R]`` (all
    ``BK`` of them or one key block); do ``[C, BV]``; gc ``[C]``, g_last its last entry."""
    return tl.exp(g_last) * d_state + tl.dot(tl.trans(decayed_queries(q, gc, do.dtype)), do, input_precision=IP)


@triton.jit
def times_state(x, state, IP: tl.constexpr, BF16: tl.constexpr):
    """``x S`` for ``x: [C, BK]`` in the input type and the fp32 (fp64) state ``S: [BK, BV]``: ``[C, BV]``. bf16
    inputs multiply ``S`` rounded to bf16; fp16 inputs multiply it in fp32 (tf32: an fp16 state could overflow),
    fp32 inputs exactly."""
    if BF16:
        return tl.dot(x, state.to(x.dtype), input_precision=IP)
    return tl.dot(x.to(state.dtype), state, input_precision=IP)


@triton.jit
def times_state_t(x, state, IPX: tl.constexpr, BF16: tl.constexpr):
    """``x Sᵀ`` for ``x: [C, BV]`` in the input type and the fp32 (fp64) state ``S: [BK, BV]``: ``[C, BK]``, as
    exact as the decay's gradient needs: bf16 inputs multiply ``S`` as two bf16 parts (:func:`~.tiles.split16`,
    exact products); others in the state's type at precision IPX (:func:`exact_precision`)."""
    if BF16:
        high, low = split16(state, x.dtype)
        return tl.dot(x, tl.trans(high)) + tl.dot(x, tl.trans(low))
    return tl.dot(x.to(state.dtype), tl.trans(state), input_precision=IPX)


@triton.jit
def load_state(ptr, slot, present, rows, BK: tl.constexpr, BV: tl.constexpr):
    """Rows ``rows`` of the ``[BK, BV]`` state in ``slot`` of a head's ``[NB, BK, BV]`` buffer (zeros if not
    ``present``), as ``[len(rows), BV]``."""
    tile = rows[:, None] * BV + tl.arange(0, BV)[None, :]
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
        state = state_after_chunk(state, k, v, gc, g_last, IP)
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
    running = tl.zeros((R, BV), dtype=state_ptr.dtype.element_ty)
    for step in range(NB - 1):
        blk = NB - 1 - step if REVERSE else step
        g_before = tl.where(blk > 0, tl.load(gend_ptr + tl.maximum(blk * W - 1, 0)), 0.0)
        g_end = tl.load(gend_ptr + tl.minimum(blk * W + W, N) - 1)
        offset = blk.to(tl.int64) * BK * BV + tile
        running = tl.exp((g_end - g_before).to(running.dtype)) * running + tl.load(state_ptr + offset)
        tl.store(state_ptr + offset, running)


@triton.jit
def block_output_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, state_ptr, o_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sob, sot, soh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr, BF16: tl.constexpr,
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
    state = load_state(state_ptr + bh * NB * BK * BV, tl.maximum(i_blk - 1, 0), i_blk > 0, rk, BK, BV)
    state = state.to(gc_ptr.dtype.element_ty)
    for c in range(i_blk * W, tl.minimum(i_blk * W + W, N)):
        t = c * C + tl.arange(0, C)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        out = tl.dot((scores * decay_matrix(gc, C)).to(v.dtype), v, input_precision=IP)
        out += times_state(decayed_queries(q, gc, v.dtype), state, IP, BF16)
        store_tile(o_ptr, sot, t, T, rv, V, out)
        state = state_after_chunk(state, k, v, gc, g_last, IP)


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
        d_state = state_grad_before_chunk(d_state, q, do, gc, g_last, IP)
    tl.store(dstate_ptr + (bh * NB + i_blk) * BK * BV + rk[:, None] * BV + rv[None, :], d_state)


@triton.jit
def block_dq_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, state_ptr, do_ptr, dq_ptr, dg_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sdob, sdot, sdoh, sdqb, sdqt, sdqh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KS: tl.constexpr,
    IP: tl.constexpr, IPX: tl.constexpr, BF16: tl.constexpr,
):
    """Grid ``(BK / KS · NB, H, B)``: key columns ``KS·j ..`` of ``dq = ((dO Vᵀ) ⊙ E) K + diag(exp(gc)) dO Sᵀ``
    by the forward walk of block ``β`` (the state's rows of those keys, from the forward's scanned states).
    dq: ``[B, T, H, K]`` (strides ``sdq*``; with q shared, this head's share). dg: fp32 ``[2, BK / KS, B, H, N·C]``;
    plane ``(0, j)`` receives these keys' part of the query side ``Q̂_t · (S dO_t)`` and of the chunk's own part
    ``rowsum(D) - colsum(D)``."""
    i_j, i_blk = tl.program_id(0) % (BK // KS), tl.program_id(0) // (BK // KS)
    i_h, i_b = tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = i_j * KS + tl.arange(0, KS), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dq_ptr += i_b.to(tl.int64) * sdqb + i_h * sdqh
    gc_ptr += bh * N * C
    dg_ptr += (i_j * tl.num_programs(2) * H + bh) * N * C
    state = load_state(state_ptr + bh * NB * BK * BV, tl.maximum(i_blk - 1, 0), i_blk > 0, rk, BK, BV)
    state = state.to(gc_ptr.dtype.element_ty)
    for c in range(i_blk * W, tl.minimum(i_blk * W + W, N)):
        t = c * C + tl.arange(0, C)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        from_state = times_state_t(do, state, IPX, BF16)  # dO Sᵀ, [C, KS]
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)  # these keys' share of Q Kᵀ
        d_cum = tl.sum(decayed_queries(q, gc, do.dtype).to(from_state.dtype) * from_state, 1)
        dq = from_state * tl.exp(gc)[:, None]
        v = load_tile(v_ptr, svt, t, T, rv, V)
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP) * decay_matrix(gc, C)  # (dO Vᵀ) ⊙ E
        pairs = d_scores * scores  # these keys' share of D = (dO Vᵀ) ⊙ (Q Kᵀ) ⊙ E, fp32
        tl.store(dg_ptr + t, d_cum + tl.sum(pairs, 1) - tl.sum(pairs, 0))  # the diagonal of D cancels exactly
        dq = tl.dot(d_scores.to(k.dtype), k, acc=dq, input_precision=IP)
        store_tile(dq_ptr, sdqt, t, T, rk, K, dq)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        state = state_after_chunk(state, k, v, gc, g_last, IP)


@triton.jit
def block_dk_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, dstate_ptr, do_ptr, dk_ptr, dg_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sdob, sdot, sdoh, sdkb, sdkt, sdkh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KS: tl.constexpr,
    IP: tl.constexpr, IPX: tl.constexpr, BF16: tl.constexpr,
):
    """Grid ``(BK / KS · NB, H, B)``: key columns ``KS·j ..`` of
    ``dk = ((dO Vᵀ) ⊙ E)ᵀ Q + diag(exp(gc_last - gc)) V dSᵀ`` by the reverse walk of block ``β`` from
    ``dS_(β+1)`` (those rows of slot ``β + 1`` of the scanned dstate; zero for the last block), stored as dq of
    :func:`block_dq_kernel`. dg: plane ``(1, j)`` receives these keys'
    part of the key side ``K̂_t · (dS V_t)``."""
    i_j, i_blk = tl.program_id(0) % (BK // KS), tl.program_id(0) // (BK // KS)
    i_h, i_b = tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = i_j * KS + tl.arange(0, KS), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dk_ptr += i_b.to(tl.int64) * sdkb + i_h * sdkh
    gc_ptr += bh * N * C
    dg_ptr += ((BK // KS + i_j) * tl.num_programs(2) * H + bh) * N * C
    d_state = load_state(dstate_ptr + bh * NB * BK * BV, tl.minimum(i_blk + 1, NB - 1), i_blk + 1 < NB, rk, BK, BV)
    d_state = d_state.to(gc_ptr.dtype.element_ty)
    c_end = tl.minimum(i_blk * W + W, N)
    for step in range(c_end - i_blk * W):
        c = c_end - 1 - step
        t = c * C + tl.arange(0, C)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        from_state = times_state_t(v, d_state, IPX, BF16)  # V dSᵀ, [C, KS]
        k = load_tile(k_ptr, sqt, t, T, rk, K)
        tl.store(dg_ptr + t, tl.sum(decayed_keys(k, gc, g_last, v.dtype).to(from_state.dtype) * from_state, 1))
        dk = from_state * tl.exp(g_last - gc)[:, None]
        q = load_tile(q_ptr, sqt, t, T, rk, K)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP) * decay_matrix(gc, C)
        dk = tl.dot(tl.trans(d_scores.to(q.dtype)), q, acc=dk, input_precision=IP)
        store_tile(dk_ptr, sdkt, t, T, rk, K, dk)
        d_state = state_grad_before_chunk(d_state, q, do, gc, g_last, IP)


@triton.jit
def block_dv_kernel(
    q_ptr, k_ptr, gc_ptr, dstate_ptr, do_ptr, dv_ptr, dg_ptr, dg_sides_ptr,
    T, N, NB, H, K, V,
    sqb, sqt, sqh, sdob, sdot, sdoh, sdvb, sdvt, sdvh,
    C: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KS: tl.constexpr, IP: tl.constexpr,
    BF16: tl.constexpr,
):
    """Grid ``(NB, H, B)``: the reverse walk of block ``β`` from ``dS_(β+1)`` (as :func:`block_dk_kernel`, all
    rows) for ``dv = ((Q Kᵀ) ⊙ E)ᵀ dO + K̂ dS``: ``[B, T, H, V]`` (strides ``sdv*``). dg: fp32 ``[B, H, N·C]``
    receives the gradient of the cumulative decay ``G``, the planes of dg_sides added up: the query side and the
    chunk's own part (:func:`block_dq_kernel`) less the key side (:func:`block_dk_kernel`)."""
    i_blk, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rk, rv = tl.arange(0, BK), tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dv_ptr += i_b.to(tl.int64) * sdvb + i_h * sdvh
    gc_ptr += bh * N * C
    dg_ptr += bh * N * C
    plane = tl.num_programs(2).to(tl.int64) * H * N * C
    dg_sides_ptr += bh * N * C
    d_state = load_state(dstate_ptr + bh * NB * BK * BV, tl.minimum(i_blk + 1, NB - 1), i_blk + 1 < NB, rk, BK, BV)
    d_state = d_state.to(gc_ptr.dtype.element_ty)
    c_end = tl.minimum(i_blk * W + W, N)
    for step in range(c_end - i_blk * W):
        c = c_end - 1 - step
        t = c * C + tl.arange(0, C)
        d_cum = tl.zeros((C,), dtype=gc_ptr.dtype.element_ty)
        for j in tl.static_range(BK // KS):  # what the dq walks (query side, own part) and dk walks (key side) found
            d_cum += tl.load(dg_sides_ptr + j * plane + t) - tl.load(dg_sides_ptr + (BK // KS + j) * plane + t)
        tl.store(dg_ptr + t, d_cum)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        dv = times_state(decayed_keys(k, gc, g_last, do_ptr.dtype.element_ty), d_state, IP, BF16)  # K̂ dS
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        dv = tl.dot(tl.trans((scores * decay_matrix(gc, C)).to(do.dtype)), do, acc=dv, input_precision=IP)
        store_tile(dv_ptr, sdvt, t, T, rv, V, dv)
        d_state = state_grad_before_chunk(d_state, q, do, gc, g_last, IP)


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


def exact_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision of the state products of the decay's gradient in fp16 and fp32 calls: tf32x3 (three
    tf32 passes, about fp32 accuracy: a single tf32 pass would round the state to 2^-11, which does not cancel)
    for fp16, exact for fp32 and fp64. bf16 calls multiply the state in two bf16 parts instead."""
    return "tf32x3" if dtype == torch.float16 else "ieee"


def block_count(T: int, chunk_size: int, block_chunks: int) -> tuple[int, int]:
    """``(N, NB)``: chunks of ``T`` tokens and blocks of ``block_chunks`` chunks."""
    N = -(-T // chunk_size)
    return N, -(-N // block_chunks)


def _tiles(q, v):
    K, V = q.shape[3], v.shape[3]
    if K > MAX_BLOCK or V > MAX_BLOCK:
        raise ValueError(f"the kernels hold K, V <= {MAX_BLOCK} (mamba2_triton_parallel splits wider heads), "
                         f"got K={K}, V={V}")
    return head_block(K), head_block(V)


def parallel_forward(q, k, v, gc, gend, chunk_size: int = 64, config: LinearLaunchConfig = LinearLaunchConfig()):
    """Forward of step 1b. q, k: ``[B, T, H or 1, K]`` (equal strides, ``K <= 128``); v: ``[B, T, H, V]``
    (``V <= 128``); gc, gend from :func:`~loglin_edu.kernels.inputs.chunk_decay`; last dimensions contiguous.
    Returns ``(o, states)``: o ``[B, T, H, V]`` and the scanned block states, fp32 ``[B, H, NB, BK, BV]``
    (slot ``β``: the state after block ``β``; no slots when there is one block), which the backward reads."""
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    BK, BV = _tiles(q, v)
    N, NB = block_count(T, chunk_size, config.block_chunks)
    sqh = 0 if Hk == 1 else q.stride(2)
    common = dict(C=chunk_size, W=config.block_chunks, BK=BK, BV=BV, IP=dot_precision(q.dtype),
                  num_warps=config.num_warps, num_stages=config.num_stages)
    states = torch.empty(B, H, NB if NB > 1 else 0, BK, BV, device=q.device, dtype=accumulator_dtype(q.dtype))
    if NB > 1:
        block_state_kernel[(NB - 1, H, B)](
            k, v, gc, states, T, N, NB, H, K, V, k.stride(0), k.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2),
            **common,
        )
        scan_blocks(states, gend, N, config.block_chunks, reverse=False)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    block_output_kernel[(NB, H, B)](
        q, k, v, gc, states if NB > 1 else gc, o, T, N, NB, H, K, V,
        q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        BF16=q.dtype == torch.bfloat16, **common,
    )
    return o, states


def scan_blocks(states, gend, N: int, block_chunks: int, reverse: bool) -> None:
    """:func:`block_scan_kernel` over ``states: [B, H, NB, BK, BV]`` in place (forward or reverse)."""
    B, H, NB, BK, BV = states.shape
    R = min(BK, 16)
    block_scan_kernel[(BK // R, H, B)](states, gend, N, NB, H, W=block_chunks, BK=BK, BV=BV, R=R, REVERSE=reverse)


def parallel_backward(q, k, v, gc, gend, states, do, chunk_size: int = 64,
                      config: LinearLaunchConfig = LinearLaunchConfig()):
    """Backward of step 1b: ``(dq, dk, dv, dG)``. Inputs as :func:`parallel_forward`'s, states what it returned,
    do: ``[B, T, H, V]`` (last dimension contiguous). dq, dk are shaped like q, k (summed over the heads when
    shared); ``dG: [B, H, N·C]`` (fp32) is the gradient of the cumulative decay ``G``.

    Buffers besides the outputs: the block states' gradients (fp32 ``[B, H, NB, BK, BV]``), the decay gradient's
    planes (fp32 ``[2, BK / key_split, B, H, N·C]``) and, with q, k shared, the heads' shares of dq and dk
    (``[2, B, T, H, K]``, ``partial_dtype``)."""
    B, T, Hk, K = q.shape
    H, V = v.shape[2], v.shape[3]
    BK, BV = _tiles(q, v)
    N, NB = block_count(T, chunk_size, config.block_chunks)
    KS = config.key_columns(BK)
    acc = accumulator_dtype(q.dtype)
    shared = Hk == 1
    sqh = 0 if shared else q.stride(2)
    common = dict(C=chunk_size, W=config.block_chunks, BK=BK, BV=BV, IP=dot_precision(q.dtype),
                  BF16=q.dtype == torch.bfloat16, num_warps=config.num_warps, num_stages=config.num_stages)
    d_states = torch.empty(B, H, NB if NB > 1 else 0, BK, BV, device=q.device, dtype=acc)
    if NB > 1:
        block_state_grad_kernel[(NB - 1, H, B)](
            q, do, gc, d_states, T, N, NB, H, K, V, q.stride(0), q.stride(1), sqh, do.stride(0), do.stride(1),
            do.stride(2), **{key: value for key, value in common.items() if key != "BF16"},
        )
        scan_blocks(d_states, gend, N, config.block_chunks, reverse=True)
    shares = torch.empty(2, B, T, H, K, device=q.device, dtype=partial_dtype(q.dtype) if shared else q.dtype)
    dq, dk = shares  # with q, k shared: the heads' shares, summed below in one launch
    dv = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    d_sides = torch.empty(2, BK // KS, B, H, N * chunk_size, device=q.device, dtype=acc)
    d_cum = torch.empty(B, H, N * chunk_size, device=q.device, dtype=acc)
    strides = (q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1),
               do.stride(2))
    block_dq_kernel[(BK // KS * NB, H, B)](
        q, k, v, gc, states if NB > 1 else gc, do, dq, d_sides, T, N, NB, H, K, V,
        *strides, dq.stride(0), dq.stride(1), dq.stride(2), KS=KS, IPX=exact_precision(q.dtype), **common,
    )
    block_dk_kernel[(BK // KS * NB, H, B)](
        q, k, v, gc, d_states if NB > 1 else gc, do, dk, d_sides, T, N, NB, H, K, V,
        *strides, dk.stride(0), dk.stride(1), dk.stride(2), KS=KS, IPX=exact_precision(q.dtype), **common,
    )
    block_dv_kernel[(NB, H, B)](
        q, k, gc, d_states if NB > 1 else gc, do, dv, d_cum, d_sides, T, N, NB, H, K, V,
        q.stride(0), q.stride(1), sqh, do.stride(0), do.stride(1), do.stride(2), dv.stride(0), dv.stride(1),
        dv.stride(2), KS=KS, **common,
    )
    if shared:
        dq, dk = sum_heads(shares, q.dtype)
    return dq, dk, dv, d_cum


def sum_heads(shares: torch.Tensor, dtype: torch.dtype) -> tuple:
    """Shares ``[G, B, T, H, K]`` (contiguous) summed over the heads in fp32, in one launch of
    :func:`head_sum_kernel`: ``G`` tensors ``[B, T, 1, K]`` in ``dtype``."""
    G, B, T, H, K = shares.shape
    sums = torch.empty(G, B, T, 1, K, device=shares.device, dtype=dtype)
    R = 16
    head_sum_kernel[(-(-B * T // R), G)](shares, sums, B * T, H, K, R=R, BK=head_block(K))
    return sums.unbind(0)


class Mamba2Parallel(torch.autograd.Function):
    """Autograd for step 1b: ``o = Mamba2Parallel.apply(q, k, v, log_decay, chunk_size, config)`` for
    ``K, V <= 128``; ``log_decay`` may be None (no decay)."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, chunk_size, config):
        q, k = same_strides(q, k)
        v = last_dim_contiguous(v)
        B, T, H = v.shape[:3]
        gc, gend = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype)
        o, states = parallel_forward(q, k, v, gc, gend, chunk_size, config)
        ctx.save_for_backward(q, k, v, gc, gend, states)
        ctx.chunk_size, ctx.config = chunk_size, config
        ctx.decay_dtype = None if log_decay is None else log_decay.dtype
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, gc, gend, states = ctx.saved_tensors
        dq, dk, dv, d_cum = parallel_backward(q, k, v, gc, gend, states, last_dim_contiguous(do), ctx.chunk_size,
                                              ctx.config)
        dg = None
        if ctx.decay_dtype is not None:
            dg = reverse_cumsum(d_cum, -1)[:, :, : q.shape[1]].transpose(1, 2).to(ctx.decay_dtype)
        return dq, dk, dv, dg, None, None


def mamba2_triton_parallel(q, k, v, log_decay=None, chunk_size: int = 64,
                           config: LinearLaunchConfig | None = None) -> torch.Tensor:
    """Mamba-2 by the step-1b kernels, differentiable: q, k ``[B, T, H or 1, K]``, v ``[B, T, H, V]``, log_decay
    ``[B, T, H]`` or None -> ``[B, T, H, V]``, as step 1's :func:`~.step1_mamba2_chunked.mamba2_triton`.

    chunk_size: a power of two, raised to 16 (the smallest ``tl.dot`` tile); config: the launch knobs
    (:class:`~loglin_edu.kernels.config.LinearLaunchConfig`). The result depends on neither. Keys wider than 128
    are split (``o`` is a sum over key blocks), values wider than 128 too (``o`` is their concatenation)."""
    check_device(q)
    chunk_size = max(chunk_size, 16)
    config = config or LinearLaunchConfig()
    K, V = q.shape[-1], v.shape[-1]
    outputs = []
    for vs in range(0, V, MAX_BLOCK):
        parts = [Mamba2Parallel.apply(q[..., ks : ks + MAX_BLOCK], k[..., ks : ks + MAX_BLOCK],
                                      v[..., vs : vs + MAX_BLOCK], log_decay, chunk_size, config)
                 for ks in range(0, K, MAX_BLOCK)]
        outputs.append(parts[0] if len(parts) == 1 else sum(parts))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
