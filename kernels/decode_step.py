"""One decoding step of log-linear Mamba-2 for a batch, in one launch: carry, decay, write and read.

The state is the :class:`~loglin_edu.decoding.FenwickCache` buffer ``levels: [B, H, L, K, V]`` (fp32)
with ``position: [B]`` the tokens each sequence has consumed. For the token at position ``t`` with
``low = t & -t`` (``2^j``; 0 at ``t = 0``), level by level (PAPER.md §2):

    S^(l) <- Σ_{m <= l} S^(m)  if l = j + 1  (low >> (l-1) = 1),
             0                 if l <= j     (low >> l > 0),          the binary-counter carry
             S^(l)             otherwise
    S^(l) <- exp(g) S^(l);      S^(0) <- k vᵀ;      o = Σ_l λ_l S^(l)ᵀ q

One program owns one ``(batch, head, V-block)`` and walks the ``L`` levels once, keeping the running sum
``Σ_{m <= l} S^(m)`` of the carry in registers: every level is read at most once and written at most
once. A level empty before the step is not read (its load is masked off: it holds zeros), and one empty
before and after is not written, so a step moves ``(popcount(t - 1) + 1)`` states in and about as many
out — ``2 · (popcount + 1) · K · V · 4`` bytes per head, the floor for a state that decays every token.
The step is memory-bound: ``2 · L · K · V`` flops per head against those bytes.

:func:`mamba2_decode_step_` is the same step for Mamba-2's single state (``S <- exp(g) S + k vᵀ``,
``o = Sᵀ q``): one state in, one out — the baseline a log-linear step is measured against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import MAX_BLOCK, block


@triton.jit
def fenwick_decode_kernel(
    levels_ptr, position_ptr, q_ptr, k_ptr, v_ptr, lam_ptr, g_ptr, o_ptr,
    H, K, V, L,
    s_lb, s_lh, s_ll, s_lk, sqb, sqh, svb, svh, s_lam_b, s_lam_h, sgb, sgh, sob, soh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Grid ``(V / BV, H, B)``. levels: [B, H, L, K, V] (V contiguous); q, k: [B, H or 1, K] (head stride 0
    when shared); v, o: [B, H, V]; lam: [B, H, >= L]; g: [B, H]; position: [B] int64."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    t = tl.load(position_ptr + i_b).to(tl.int64)
    low = t & (-t)  # 2^j, 0 at t = 0
    last = t - 1
    q = tl.load(q_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + i_b.to(tl.int64) * svb + i_h * svh + rv, mask=rv < V, other=0.0).to(tl.float32)
    decay = 1.0
    if HAS_DECAY:
        decay = tl.exp(tl.load(g_ptr + i_b.to(tl.int64) * sgb + i_h * sgh).to(tl.float32))
    written = k[:, None] * v[None, :]
    base = levels_ptr + i_b.to(tl.int64) * s_lb + i_h.to(tl.int64) * s_lh
    tile = rk[:, None].to(tl.int64) * s_lk + rv[None, :]
    lam_row = lam_ptr + i_b.to(tl.int64) * s_lam_b + i_h * s_lam_h
    carried = tl.zeros((BK, BV), dtype=tl.float32)  # Σ_{m <= l} S^(m) before the step
    out = tl.zeros((BV,), dtype=tl.float32)
    for i_l in range(L):
        lvl = tl.full((), 0, tl.int64) + i_l  # a tensor in the interpreter too: its comparisons stay booleans
        below = tl.maximum(lvl - 1, 0)
        live_before = (t >= 1) & ((lvl == 0) | (((last >> below) & 1) == 1))
        live_after = (lvl == 0) | (((t >> below) & 1) == 1)
        into = (lvl >= 1) & ((low >> below) == 1)
        cleared = (low >> lvl) > 0
        ptrs = base + i_l * s_ll + tile
        rows_read = tl.where(live_before, K, 0)  # a level's rows, or none: masks built from full-shape compares
        rows_written = tl.where(live_before | live_after, K, 0)
        state = tl.load(ptrs, mask=(rk[:, None] < rows_read) & (rv[None, :] < V), other=0.0)
        carried += state
        state = tl.where(into, carried, tl.where(cleared, 0.0, state)) * decay
        state = tl.where(lvl == 0, written, state)
        tl.store(ptrs, state, mask=(rk[:, None] < rows_written) & (rv[None, :] < V))
        out += tl.load(lam_row + i_l).to(tl.float32) * tl.sum(q[:, None] * state, 0)
    tl.store(o_ptr + i_b.to(tl.int64) * sob + i_h * soh + rv, out.to(o_ptr.dtype.element_ty), mask=rv < V)


def decode_step_(
    levels: torch.Tensor,
    position: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    block_v: int | None = None,
    num_warps: int = 4,
    advance: bool = True,
) -> torch.Tensor:
    """One step of log-linear Mamba-2 for every sequence, in place (module docstring).

    levels: ``[B, H, L, K, V]`` fp32, V contiguous (updated in place); position: ``[B]`` int64 (advanced by
    one in place unless ``advance=False``, which a benchmark uses to repeat one position); q, k: ``[B, H or 1, K]`` (one head shared by all, as Mamba-2's B and C); v: ``[B, H, V]``;
    level_scales: ``[B, H, >= L]``; log_decay: ``[B, H]`` or None. Returns o ``[B, H, V]`` in v's dtype.
    block_v: the V-tile of one program (more programs for a small batch); K must be at most 128.
    """
    B, H, L, K, V = levels.shape
    if levels.dtype != torch.float32 or levels.stride(-1) != 1:
        raise ValueError(f"levels must be float32 with V contiguous, got {levels.dtype} strides {levels.stride()}")
    if K > MAX_BLOCK:
        raise ValueError(f"the decode kernel holds K <= {MAX_BLOCK}, got K={K}")
    if q.shape != k.shape or q.shape[0] != B or q.shape[1] not in (1, H) or q.shape[2] != K:
        raise ValueError(f"q, k must have shape [B={B}, H={H} or 1, K={K}], got {tuple(q.shape)}, {tuple(k.shape)}")
    if tuple(v.shape) != (B, H, V) or level_scales.shape[:2] != (B, H) or level_scales.shape[2] < L:
        raise ValueError(
            f"v must be [B={B}, H={H}, V={V}] and level_scales [B, H, >= {L}], got {tuple(v.shape)}, "
            f"{tuple(level_scales.shape)}"
        )
    if q.stride() != k.stride() or q.stride(-1) != 1:  # one set of strides serves both
        q, k = q.contiguous(), k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    level_scales = level_scales if level_scales.stride(-1) == 1 else level_scales.contiguous()
    BV = block_v or min(block(V), 64)
    o = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    g = log_decay if log_decay is not None else v  # a placeholder pointer when there is no decay
    sqh = 0 if q.shape[1] == 1 else q.stride(1)
    fenwick_decode_kernel[(triton.cdiv(V, BV), H, B)](
        levels, position, q, k, v, level_scales, g, o,
        H, K, V, L,
        levels.stride(0), levels.stride(1), levels.stride(2), levels.stride(3), q.stride(0), sqh,
        v.stride(0), v.stride(1), level_scales.stride(0), level_scales.stride(1), g.stride(0), g.stride(1),
        o.stride(0), o.stride(1),
        HAS_DECAY=log_decay is not None, BK=block(K), BV=BV, num_warps=num_warps,
    )
    if advance:
        position.add_(1)
    return o


@triton.jit
def mamba2_decode_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, o_ptr,
    K, V,
    s_sb, s_sh, s_sk, sqb, sqh, svb, svh, sgb, sgh, sob, soh,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Grid ``(V / BV, H, B)``. state: [B, H, K, V] fp32 (V contiguous); q, k: [B, H or 1, K]; v, o: [B, H, V]."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    tile_mask = (rk[:, None] < K) & (rv[None, :] < V)
    q = tl.load(q_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + i_b.to(tl.int64) * sqb + i_h * sqh + rk, mask=rk < K, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + i_b.to(tl.int64) * svb + i_h * svh + rv, mask=rv < V, other=0.0).to(tl.float32)
    ptrs = state_ptr + i_b.to(tl.int64) * s_sb + i_h.to(tl.int64) * s_sh + rk[:, None].to(tl.int64) * s_sk + rv[None, :]
    state = tl.load(ptrs, mask=tile_mask, other=0.0)
    if HAS_DECAY:
        state *= tl.exp(tl.load(g_ptr + i_b.to(tl.int64) * sgb + i_h * sgh).to(tl.float32))
    state += k[:, None] * v[None, :]
    tl.store(ptrs, state, mask=tile_mask)
    out = tl.sum(q[:, None] * state, 0)
    tl.store(o_ptr + i_b.to(tl.int64) * sob + i_h * soh + rv, out.to(o_ptr.dtype.element_ty), mask=rv < V)


def mamba2_decode_step_(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    *,
    block_v: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """One Mamba-2 step in place: ``S <- exp(g) S + k vᵀ``, returns ``o = Sᵀ q``.

    state: ``[B, H, K, V]`` fp32, V contiguous; q, k: ``[B, H or 1, K]``; v: ``[B, H, V]``; log_decay:
    ``[B, H]`` or None. Returns o ``[B, H, V]`` in v's dtype.
    """
    B, H, K, V = state.shape
    if state.dtype != torch.float32 or state.stride(-1) != 1:
        raise ValueError(f"state must be float32 with V contiguous, got {state.dtype} strides {state.stride()}")
    if K > MAX_BLOCK or q.shape != k.shape or q.shape[0] != B or q.shape[1] not in (1, H) or q.shape[2] != K:
        raise ValueError(f"q, k must have shape [B={B}, H={H} or 1, K={K}] with K <= {MAX_BLOCK}, got {tuple(q.shape)}")
    if q.stride() != k.stride() or q.stride(-1) != 1:
        q, k = q.contiguous(), k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    BV = block_v or min(block(V), 64)
    o = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    g = log_decay if log_decay is not None else v
    mamba2_decode_kernel[(triton.cdiv(V, BV), H, B)](
        state, q, k, v, g, o, K, V,
        state.stride(0), state.stride(1), state.stride(2), q.stride(0), 0 if q.shape[1] == 1 else q.stride(1),
        v.stride(0), v.stride(1), g.stride(0), g.stride(1), o.stride(0), o.stride(1),
        HAS_DECAY=log_decay is not None, BK=block(K), BV=BV, num_warps=num_warps,
    )
    return o
