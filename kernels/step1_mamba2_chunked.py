"""Step 1 — chunked Mamba-2 in Triton: linear attention with a scalar decay, forward and backward.

    o_t = Σ_{s <= t} (q_t · k_s) exp(G_t - G_s) v_s            (PAPER.md §1, λ ≡ 1)

Cut the sequence into chunks of ``C`` tokens. With ``gc`` the within-chunk cumulative decay and
``S_c`` the ``K × V`` state at the start of chunk ``c`` (everything before it, decayed to that point):

    o_chunk = ((Q Kᵀ) ⊙ E) V  +  (diag(exp(gc)) Q) S_c           E[i, j] = exp(gc_i - gc_j), j <= i
    S_{c+1} = exp(gc_last) S_c  +  (diag(exp(gc_last - gc)) K)ᵀ V

One program owns one ``(batch, head, V-block)`` and walks the chunks in order, the state in registers:
the simplest kernel that is right, and the one every later step is checked against. Blocks per chunk:
``q, k: [C, BK]``, ``v, o: [C, BV]``, ``E: [C, C]``, state ``[BK, BV]`` (fp32).

Memory traffic: each of q, k, v read once and o written once, ``T·(2K + 2V)`` elements per head: the
floor. The catch is the walk: ``N = T / C`` dependent steps per program and only ``B·H·V/BV``
programs. At B = 1, T = 65,536 and 48 heads that is 48 programs for 132 multiprocessors, each taking
1,024 steps in a row: latency-bound. Step 1b (:mod:`.step1b_mamba2_parallel`) removes the walk for this
model: short walks over blocks of chunks in parallel, their states passed on by a scan; step 3 does it for
the log-linear levels, with a tree.

Backward, by the same walk twice: forward again for ``dq = ((dO Vᵀ) ⊙ E) K + diag(exp(gc)) dO S_cᵀ``;
then in reverse, carrying ``dS`` (the gradient of the state entering the next chunk), for
``dv = ((Q Kᵀ) ⊙ E)ᵀ dO + K̃ dS`` and ``dk = ((dO Vᵀ) ⊙ E)ᵀ Q + diag(exp(gc_last - gc)) V dSᵀ``.
The decay's gradient needs no kernel of its own: ``o`` depends on ``G`` only through
``exp(G_t - G_s)``, so ``∂L/∂G_t = q_t · dq_t - k_t · dk_t`` and ``∂L/∂g_r = Σ_{t >= r} ∂L/∂G_t``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device
from .config import MAX_BLOCK, accumulator_dtype, dot_precision, head_block, partial_dtype
from .inputs import chunk_decay, fold_members, last_dim_contiguous, reverse_cumsum, same_strides
from .tiles import decay_matrix, load_qk_scores, load_tile, store_tile


@triton.jit
def mamba2_fwd_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, o_ptr,
    T, N, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sob, sot, soh,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(V / BV, H, B)``. q, k: [B, T, H or 1, K] (head stride 0 when shared); v, o: [B, T, H, V]."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    o_ptr += i_b.to(tl.int64) * sob + i_h * soh
    gc_ptr += (i_b * H + i_h).to(tl.int64) * N * C
    state = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)  # fp32 (fp64 for fp64 input)
    for c in range(N):
        t = c * C + tl.arange(0, C)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        scores *= decay_matrix(gc, C)
        out = tl.dot(scores.to(v.dtype), v, input_precision=IP)
        out += tl.dot((q * tl.exp(gc)[:, None]).to(v.dtype), state.to(v.dtype), input_precision=IP)
        store_tile(o_ptr, sot, t, T, rv, V, out)
        k_to_end = (k * tl.exp(g_last - gc)[:, None]).to(v.dtype)
        state = tl.exp(g_last) * state + tl.dot(tl.trans(k_to_end), v, input_precision=IP)


@triton.jit
def mamba2_bwd_kernel(
    q_ptr, k_ptr, v_ptr, gc_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, qdq_ptr, kdk_ptr,
    T, N, H, K, V,
    sqb, sqt, sqh, svb, svt, svh, sdob, sdot, sdoh, sdvb, sdvt, sdvh,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(V / BV, H, B)``. do, dv: [B, T, H, V] (strides ``sdo*``, ``sdv*``). Writes this V-block's share
    of dq, dk (fp32 ``[NV, B, T, H, K]``, summed by the host), dv (``[B, T, H, V]``) and of ``q·dq``, ``k·dk``
    (fp32 ``[NV, B, H, N·C]``)."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    do_ptr += i_b.to(tl.int64) * sdob + i_h * sdoh
    dv_ptr += i_b.to(tl.int64) * sdvb + i_h * sdvh
    part = ((i_v * tl.num_programs(2) + i_b) * T).to(tl.int64) * H * K + i_h * K  # [NV, B, T, H, K]
    dq_ptr += part
    dk_ptr += part
    row = ((i_v * tl.num_programs(2) + i_b) * H + i_h).to(tl.int64) * N * C  # [NV, B, H, N·C]
    qdq_ptr += row
    kdk_ptr += row
    gc_ptr += (i_b * H + i_h).to(tl.int64) * N * C
    # forward walk: dq
    state = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)  # fp32 (fp64 for fp64 input)
    for c in range(N):
        t = c * C + tl.arange(0, C)
        q = load_tile(q_ptr, sqt, t, T, rk, K)
        k = load_tile(k_ptr, sqt, t, T, rk, K)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP) * decay_matrix(gc, C)
        dq = tl.dot(d_scores.to(k.dtype), k, input_precision=IP)
        dq += tl.dot(do, tl.trans(state.to(do.dtype)), input_precision=IP) * tl.exp(gc)[:, None]
        store_tile(dq_ptr, H * K, t, T, rk, K, dq)
        tl.store(qdq_ptr + t, tl.sum(q.to(dq.dtype) * dq, 1))
        k_to_end = (k * tl.exp(g_last - gc)[:, None]).to(v.dtype)
        state = tl.exp(g_last) * state + tl.dot(tl.trans(k_to_end), v, input_precision=IP)
    # reverse walk: dk, dv, with dS the gradient of the state entering chunk c + 1
    d_state = tl.zeros((BK, BV), dtype=gc_ptr.dtype.element_ty)  # fp32 (fp64 for fp64 input)
    for step in range(N):
        c = N - 1 - step
        t = c * C + tl.arange(0, C)
        q, k, scores = load_qk_scores(q_ptr, k_ptr, sqt, t, T, rk, K, IP)
        v = load_tile(v_ptr, svt, t, T, rv, V)
        do = load_tile(do_ptr, sdot, t, T, rv, V)
        gc = tl.load(gc_ptr + t)
        g_last = tl.load(gc_ptr + c * C + C - 1)
        decay = decay_matrix(gc, C)
        scores *= decay
        d_scores = tl.dot(do, tl.trans(v), input_precision=IP) * decay
        to_end = tl.exp(g_last - gc)
        dv = tl.dot(tl.trans(scores.to(do.dtype)), do, input_precision=IP)
        dv += tl.dot((k * to_end[:, None]).to(do.dtype), d_state.to(do.dtype), input_precision=IP)
        dk = tl.dot(tl.trans(d_scores.to(q.dtype)), q, input_precision=IP)
        dk += tl.dot(v, tl.trans(d_state.to(v.dtype)), input_precision=IP) * to_end[:, None]
        store_tile(dv_ptr, sdvt, t, T, rv, V, dv)
        store_tile(dk_ptr, H * K, t, T, rk, K, dk)
        tl.store(kdk_ptr + t, tl.sum(k.to(dk.dtype) * dk, 1))
        q_from_start = (q * tl.exp(gc)[:, None]).to(do.dtype)
        d_state = tl.exp(g_last) * d_state + tl.dot(tl.trans(q_from_start), do, input_precision=IP)


def _launch_shape(q, v, chunk_size):
    B, T, Hq, K = q.shape
    H, V = v.shape[2], v.shape[3]
    if K > MAX_BLOCK:
        raise ValueError(f"the kernel holds K <= {MAX_BLOCK} (wrappers split wider keys), got K={K}")
    BV = min(head_block(V, v.dtype), 64)
    return B, T, H, K, V, head_block(K, q.dtype), BV, -(-V // BV), -(-T // chunk_size)


def default_warps(BK: int, BV: int, chunk_size: int) -> int:
    """Warps per program: 2 for 16 × 16 state tiles and chunks of at most 64 (on an H200 the forward and backward of
    many short sequences of narrow heads take a fifth less time than with 4; 8 computed wrong gradients there),
    else 4."""
    return 2 if BK * BV <= 256 and chunk_size <= 64 else 4


def mamba2_forward(q, k, v, gc, chunk_size: int = 64, num_warps: int | None = None) -> torch.Tensor:
    """Forward of step 1. q, k: ``[B, T, H or 1, K]`` (same strides); v: ``[B, T, H, V]``;
    gc: ``[B, H, N·C]`` from :func:`~loglin_edu.kernels.inputs.chunk_decay`; num_warps: None is
    :func:`default_warps`. Returns o ``[B, T, H, V]``."""
    B, T, H, K, V, BK, BV, NV, N = _launch_shape(q, v, chunk_size)
    num_warps = num_warps or default_warps(BK, BV, chunk_size)
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    sqh = 0 if q.shape[2] == 1 else q.stride(2)
    mamba2_fwd_kernel[(NV, H, B)](
        q, k, v, gc, o, T, N, H, K, V,
        q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        C=chunk_size, BK=BK, BV=BV, IP=dot_precision(q.dtype), num_warps=num_warps,
    )
    return o


def mamba2_backward(q, k, v, gc, do, chunk_size: int = 64, num_warps: int | None = None):
    """Backward of step 1: ``(dq, dk, dv, dG)`` with dq, dk shaped like q, k and
    ``dG: [B, H, N·C]`` (fp32) the gradient of the cumulative decay ``G``."""
    B, T, H, K, V, BK, BV, NV, N = _launch_shape(q, v, chunk_size)
    num_warps = num_warps or default_warps(BK, BV, chunk_size)
    dq = q.new_empty(NV, B, T, H, K, dtype=partial_dtype(q.dtype))
    dk = torch.empty_like(dq)
    dv = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    qdq = q.new_zeros(NV, B, H, N * chunk_size, dtype=accumulator_dtype(q.dtype))
    kdk = torch.zeros_like(qdq)
    sqh = 0 if q.shape[2] == 1 else q.stride(2)
    mamba2_bwd_kernel[(NV, H, B)](
        q, k, v, gc, do, dq, dk, dv, qdq, kdk, T, N, H, K, V,
        q.stride(0), q.stride(1), sqh, v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        C=chunk_size, BK=BK, BV=BV, IP=dot_precision(q.dtype), num_warps=num_warps,
    )
    if NV > 1:
        dq, dk = dq.sum(0), dk.sum(0)
    else:
        dq, dk = dq[0], dk[0]
    if q.shape[2] == 1:
        dq, dk = dq.sum(2, keepdim=True), dk.sum(2, keepdim=True)
    return dq.to(q.dtype), dk.to(k.dtype), dv, (qdq - kdk).sum(0) if NV > 1 else qdq[0] - kdk[0]


@torch.library.custom_op("loglin_edu::mamba2_chunked", mutates_args=())
def mamba2_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None,
                   chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1's forward as one PyTorch operator: ``(o, gc)``, ``gc`` the decay sums its backward reads.

    An operator rather than an ``autograd.Function``: ``torch.compile`` keeps it as one node of the step's graph
    (a Function with a vmap rule would break the graph in two, and everything around it would run uncompiled);
    its gradient (:func:`mamba2_chunked_backward`) and its vmap rule are registered below.
    """
    q, k = same_strides(q, k)
    v = last_dim_contiguous(v)
    B, T, H = v.shape[:3]
    gc, _ = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype)
    return mamba2_forward(q, k, v, gc, chunk_size), gc


@mamba2_chunked.register_fake
def _(q, k, v, log_decay, chunk_size):
    B, T, H, V = v.shape
    o = v.new_empty(B, T, H, V)
    return o, q.new_empty(B, H, -(-T // chunk_size) * chunk_size, dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("loglin_edu::mamba2_chunked_backward", mutates_args=())
def mamba2_chunked_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gc: torch.Tensor, do: torch.Tensor,
                            chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 1's backward as one operator: ``(dq, dk, dv, dG)`` (:func:`mamba2_backward`)."""
    q, k = same_strides(q, k)
    dq, dk, dv, d_cum = mamba2_backward(q, k, last_dim_contiguous(v), gc, last_dim_contiguous(do), chunk_size)
    return dq.contiguous(), dk.contiguous(), dv, d_cum


@mamba2_chunked_backward.register_fake
def _(q, k, v, gc, do, chunk_size):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), torch.empty_like(gc)


def _setup_context(ctx, inputs, output):
    q, k, v, log_decay, chunk_size = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, output[1])
    ctx.chunk_size, ctx.decay_dtype = chunk_size, getattr(log_decay, "dtype", None)


def _backward(ctx, do, _):
    if do is None:
        return None, None, None, None, None
    q, k, v, gc = ctx.saved_tensors
    dq, dk, dv, d_cum = mamba2_chunked_backward(q, k, v, gc, do, ctx.chunk_size)
    dg = None
    if ctx.decay_dtype is not None:
        dg = reverse_cumsum(d_cum, -1)[:, :, : q.shape[1]].transpose(1, 2).to(ctx.decay_dtype)
    return dq, dk, dv, dg, None


mamba2_chunked.register_autograd(_backward, setup_context=_setup_context)


torch.library.register_vmap(mamba2_chunked, fold_members(mamba2_chunked, 4))
torch.library.register_vmap(mamba2_chunked_backward, fold_members(mamba2_chunked_backward, 5))


def mamba2_triton(q, k, v, log_decay=None, chunk_size: int = 64) -> torch.Tensor:
    """Mamba-2 by the step-1 kernel, differentiable: q, k ``[B, T, H or 1, K]``, v ``[B, T, H, V]``, log_decay
    ``[B, T, H]`` or None -> ``[B, T, H, V]``. chunk_size: a power of two, raised to 16 (the smallest ``tl.dot``
    tile); the result does not depend on it. Keys wider than 128 are split: ``o`` is a sum over key blocks.
    Inputs are assumed checked (``mamba2_attention`` does)."""
    check_device(q)
    chunk_size = max(chunk_size, 16)
    K = q.shape[-1]
    parts = [
        mamba2_chunked(q[..., s : s + MAX_BLOCK], k[..., s : s + MAX_BLOCK], v, log_decay, chunk_size)[0]
        for s in range(0, K, MAX_BLOCK)
    ]
    return parts[0] if len(parts) == 1 else sum(parts)
