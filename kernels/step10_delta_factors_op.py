"""Step 10 — the WY factors of the delta rule as one PyTorch operator, forward and backward on chip.

The chunkwise forms of (log-linear) Gated DeltaNet spend most of their time on the WY factors of each chunk
(:func:`loglin_edu.chunking.wy_factors`): ``C × C`` products and a triangular solve, each a pass over
device memory when PyTorch runs them one by one. This operator computes them with step 6's kernel, one
program per chunk holding its ``C × C`` blocks in registers, and its gradient with one more kernel of the
same shape; everything else of the forms (the states carried across chunks, the levels) stays in PyTorch.
With ``Γ[i, j] = exp(gc_i - gc_j)`` (``j <= i``), ``γ = exp(gc)``, ``S = Γ ⊙ Q Kᵀ`` and
``A = strict_lower(diag(β) (Γ ⊙ K Kᵀ))``:

    T = (I + A)⁻¹,   P = S T diag(β),   W = T diag(βγ) K,   query = diag(γ) Q - S W,   U₀ = T diag(β) V

and, given the gradients of the four outputs, the backward (one program per chunk, :func:`factors_bwd_kernel`):

    dS = dP diag(β) Tᵀ - dquery Wᵀ,    dW' = dW - Sᵀ dquery,
    dT = Sᵀ dP diag(β) + dW' (diag(βγ) K)ᵀ + dU₀ (diag(β) V)ᵀ,    dA = -strict_lower(Tᵀ dT Tᵀ)
    dQ = diag(γ) dquery + (Γ ⊙ dS) K,    dK = diag(βγ) Tᵀ dW' + (Γ ⊙ dS)ᵀ Q + (dK_A + dK_Aᵀ) K,   dK_A = diag(β) Γ ⊙ dA
    dV = diag(β) Tᵀ dU₀,   and dβ, d gc from the same terms (``Γ`` and ``γ`` are exponentials of ``gc``).

The kernel never forms ``dT``: with ``R = S T``, ``dX = Tᵀ dW'`` and ``dY = Tᵀ dU₀`` (which dK and dV need anyway),

    Tᵀ dT = Rᵀ dP diag(β) + dX (diag(βγ) K)ᵀ + dY (diag(β) V)ᵀ,

one ``C × C`` product fewer than ``Tᵀ (dT Tᵀ)``. Its ``C × C`` blocks are what fills a program's registers, so it
keeps as few alive at once as it can: ``S`` is formed from q and k at the start and again at the end rather than
held through the middle, where ``T``, ``R``, ``dP`` and ``Tᵀ dT`` are.

The products run in tf32 while ``torch.backends.cuda.matmul.allow_tf32`` is set (as ``torch.matmul`` beside
them does), in tf32x3 otherwise (about fp32), exactly for fp64 inputs (the interpreter's checks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device, interpreted
from .config import block
from .inputs import fold_members, last_dim_contiguous, same_strides
from .step6_delta_chunks import delta_chunk_kernel
from .tiles import decay_matrix, dot_split, load_tile, store_tile

FACTOR_WARPS = 4
"""Warps per program of both kernels."""


def factor_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision of the operator's products for ``dtype`` inputs (module docstring)."""
    if dtype == torch.float64:
        return "ieee"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 and not interpreted() else "tf32x3"


def factor_tiles(K: int, V: int) -> tuple[int, int, int, int]:
    """``(KP, KS, BV, NV)``: the key columns held (one tile, ``KP >= K``), read ``KS`` at a time by the forward,
    and ``NV`` value tiles of ``BV`` columns."""
    KP = block(K)
    BV = min(block(V), 64)
    return KP, min(KP, 64), BV, -(-V // BV)


def factors_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor,
                    precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward, one operator below: ``(intra, query, w, u0, t_beta)``.

    q, k: ``[B, H, T, K]`` (``K <= 256``); v: ``[B, H, T, V]``; beta, gc: ``[B, H, N, C]`` (``N = ceil(T / C)``
    chunks of ``C`` tokens, a power of two >= 16; zero past ``T``; gc the within-chunk cumulative log decay).
    fp32 or fp64. Returns intra (``P``), t_beta (``T``): ``[B, H, N, C, C]``; query, w: ``[B, H, N, C, K]``; u0:
    ``[B, H, N, C, V]``. Only t_beta is not differentiable: the backward reads it instead of solving again.
    """
    B, H, T, K = q.shape
    V, N, C = v.shape[-1], beta.shape[2], beta.shape[3]
    q, k = same_strides(q, k)
    v = last_dim_contiguous(v)
    KP, KS, BV, NV = factor_tiles(K, V)
    new = lambda *shape: torch.empty(*shape, device=q.device, dtype=q.dtype)  # noqa: E731
    t_beta, intra = new(B, H, N, C, C), new(B, H, N, C, C)
    w, query, u0 = new(B, H, N, C, KP), new(B, H, N, C, KP), new(B, H, N, C, NV * BV)
    delta_chunk_kernel[(N, H, B)](
        q, k, v, beta.contiguous(), gc.contiguous(), t_beta, intra, w, query, u0, T, N, H, K, V,
        q.stride(0), q.stride(2), q.stride(1), v.stride(0), v.stride(2), v.stride(1),
        C=C, KP=KP, KS=KS, BV=BV, NV=NV, IP=precision, IPS=precision, num_warps=FACTOR_WARPS,
    )
    fit = lambda x, width: x if x.shape[-1] == width else x[..., :width].contiguous()  # noqa: E731
    return intra, fit(query, K), fit(w, K), fit(u0, V), t_beta


delta_factors = torch.library.custom_op("loglin_edu::delta_factors", factors_kernels, mutates_args=())
"""The operator :func:`factors_kernels` makes; its fake, gradient and vmap rule are registered below."""


@delta_factors.register_fake
def _(q, k, v, beta, gc, precision):
    B, H, _, K = q.shape
    N, C = beta.shape[2], beta.shape[3]
    square = q.new_empty(B, H, N, C, C)
    return square, q.new_empty(B, H, N, C, K), q.new_empty(B, H, N, C, K), q.new_empty(B, H, N, C, v.shape[-1]), \
        square.new_empty(square.shape)


@triton.jit
def factors_bwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, gc_ptr, tb_ptr, dp_ptr, dquery_ptr, dw_ptr, du_ptr,
    dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dgc_ptr,
    T, N, H, K, V, sqb, sqh, sqt, svb, svh, svt,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, IP: tl.constexpr,
):
    """Grid ``(N, H, B)``: one chunk's ``dq, dk`` (``[B, H, T, K]``), ``dv`` (``[B, H, T, V]``) and ``dβ, d gc``
    (``[B, H, N·C]``) from the inputs of :func:`factors_kernels` (q, k, v through their strides), its saved
    ``T`` and the gradients of ``P`` (``[B, H, N, C, C]``), ``query, W`` (``[B, H, N·C, K]``) and ``U₀``
    (``[B, H, N·C, V]``), all contiguous. Formulas in the module docstring."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = (i_b * H + i_h).to(tl.int64)
    rc = tl.arange(0, C)
    rk = tl.arange(0, BK)
    t = i_c * C + rc
    rows = bh * N * C + t
    NC = N * C
    q_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    k_ptr += i_b.to(tl.int64) * sqb + i_h * sqh
    v_ptr += i_b.to(tl.int64) * svb + i_h * svh
    gc = tl.load(gc_ptr + rows)
    beta = tl.load(beta_ptr + rows)
    gamma = tl.exp(gc)
    write = beta * gamma
    square = (bh * N + i_c) * C * C + rc[:, None] * C + rc[None, :]
    t_beta = tl.load(tb_ptr + square)
    # S = Γ ⊙ Q Kᵀ for R = S T and dW' = dW - Sᵀ dquery; formed again at the end rather than kept
    q = load_tile(q_ptr, sqt, t, T, rk, K).to(gc.dtype)
    k = load_tile(k_ptr, sqt, t, T, rk, K).to(gc.dtype)
    scores = decay_matrix(gc, C) * tl.dot(q, tl.trans(k), input_precision=IP)
    dquery = load_tile(dquery_ptr + bh * NC * K, K, t, NC, rk, K)
    d_gamma = tl.sum(dquery * q, 1)
    dw = load_tile(dw_ptr + bh * NC * K, K, t, NC, rk, K) - dot_split(tl.trans(scores), dquery, IP)
    r = dot_split(scores, t_beta, IP)
    dr = tl.load(dp_ptr + square)
    d_beta = tl.sum(dr * r, 0)
    dr *= beta[None, :]
    m = dot_split(tl.trans(r), dr, IP)
    keys_in = k * write[:, None]
    d_scores = dot_split(dr, tl.trans(t_beta), IP) - dot_split(dquery, tl.trans(dot_split(t_beta, keys_in, IP)), IP)
    dx = dot_split(tl.trans(t_beta), dw, IP)
    m += dot_split(dx, tl.trans(keys_in), IP)
    dk = dx * write[:, None]
    dx_k = tl.sum(dx * k, 1)
    d_beta += gamma * dx_k
    d_gamma += beta * dx_k
    for i_v in range(NV):
        cols = i_v * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, svt, t, T, cols, V).to(gc.dtype)
        du = load_tile(du_ptr + bh * NC * V, V, t, NC, cols, V)
        dy = dot_split(tl.trans(t_beta), du, IP)
        m += dot_split(dy, tl.trans(v * beta[:, None]), IP)
        d_beta += tl.sum(dy * v, 1)
        store_tile(dv_ptr + bh * T * V, V, t, T, cols, V, dy * beta[:, None])
    strict = rc[:, None] > rc[None, :]
    d_a = tl.where(strict, -dot_split(m, tl.trans(t_beta), IP), 0.0)
    q = load_tile(q_ptr, sqt, t, T, rk, K).to(gc.dtype)
    k = load_tile(k_ptr, sqt, t, T, rk, K).to(gc.dtype)
    decay = decay_matrix(gc, C)
    d_qk = d_scores * decay
    d_decay = d_qk * tl.dot(q, tl.trans(k), input_precision=IP)
    dq = load_tile(dquery_ptr + bh * NC * K, K, t, NC, rk, K) * gamma[:, None] + dot_split(d_qk, k, IP)
    dk += dot_split(tl.trans(d_qk), q, IP)
    kk = decay * tl.dot(k, tl.trans(k), input_precision=IP)
    d_beta += tl.sum(d_a * kk, 1)
    d_decay += d_a * beta[:, None] * kk
    d_kk = d_a * decay * beta[:, None]
    dk += dot_split(d_kk + tl.trans(d_kk), k, IP)
    d_gc = tl.sum(d_decay, 1) - tl.sum(d_decay, 0) + d_gamma * gamma
    store_tile(dq_ptr + bh * T * K, K, t, T, rk, K, dq)
    store_tile(dk_ptr + bh * T * K, K, t, T, rk, K, dk)
    tl.store(dbeta_ptr + rows, d_beta)
    tl.store(dgc_ptr + rows, d_gc)


@torch.library.custom_op("loglin_edu::delta_factors_backward", mutates_args=())
def delta_factors_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, gc: torch.Tensor,
                           t_beta: torch.Tensor, d_intra: torch.Tensor, d_query: torch.Tensor, d_w: torch.Tensor,
                           d_u0: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                        torch.Tensor, torch.Tensor]:
    """:func:`factors_bwd_kernel` as one operator: ``(dq, dk, dv, dβ, d gc)``, shaped as q, k, v, beta, gc."""
    B, H, T, K = q.shape
    V, N, C = v.shape[-1], beta.shape[2], beta.shape[3]
    q, k = same_strides(q, k)
    v = last_dim_contiguous(v)
    dq, dk, dv = q.new_empty(B, H, T, K), q.new_empty(B, H, T, K), q.new_empty(B, H, T, V)
    d_beta, d_gc = beta.new_empty(beta.shape), gc.new_empty(gc.shape)  # contiguous, as the kernel writes them
    _, _, BV, NV = factor_tiles(K, V)
    factors_bwd_kernel[(N, H, B)](
        q, k, v, beta.contiguous(), gc.contiguous(), t_beta.contiguous(), d_intra.contiguous(), d_query.contiguous(),
        d_w.contiguous(), d_u0.contiguous(), dq, dk, dv, d_beta, d_gc, T, N, H, K, V,
        q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        C=C, BK=block(K), BV=BV, NV=NV, IP=precision, num_warps=FACTOR_WARPS,
    )
    return dq, dk, dv, d_beta, d_gc


@delta_factors_backward.register_fake
def _(q, k, v, beta, gc, t_beta, d_intra, d_query, d_w, d_u0, precision):
    return q.new_empty(q.shape), q.new_empty(q.shape), v.new_empty(v.shape), beta.new_empty(beta.shape), \
        gc.new_empty(gc.shape)


def setup_context(ctx, inputs, output):
    """The backward keeps the inputs and ``T``; the gradients of outputs nobody used arrive as None."""
    q, k, v, beta, gc, precision = inputs
    t_beta = output[-1]
    ctx.mark_non_differentiable(t_beta)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, beta, gc, t_beta)
    ctx.precision = precision


def backward(ctx, d_intra, d_query, d_w, d_u0, _):
    q, k, v, beta, gc, t_beta = ctx.saved_tensors
    B, H, _, K = q.shape
    N, C = beta.shape[2], beta.shape[3]
    zeros = lambda d, *shape: q.new_zeros(B, H, N, C, *shape) if d is None else d  # noqa: E731
    grads = delta_factors_backward(q, k, v, beta, gc, t_beta, zeros(d_intra, C), zeros(d_query, K), zeros(d_w, K),
                                   zeros(d_u0, v.shape[-1]), ctx.precision)
    return (*grads, None)


delta_factors.register_autograd(backward, setup_context=setup_context)
torch.library.register_vmap(delta_factors, fold_members(delta_factors, 5))
torch.library.register_vmap(delta_factors_backward, fold_members(delta_factors_backward, 10))


def wy_factors_triton(qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, beta: torch.Tensor,
                      g_cum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """:func:`loglin_edu.chunking.wy_factors` by this operator, for the chunkwise forms.

    qc, kc: ``[B, H, N, C, K]``; vc: ``[B, H, N, C, V]``; beta, g_cum: ``[B, H, N, C]`` (zero-padded past ``T``).
    Returns ``(intra, query, w, u0, None)``: ``T_β`` is not returned (it is no differentiable output here), so
    the chunk terms carry no write keys. 16-bit inputs are computed in fp32 and the factors rounded to their type
    once, for the rest of the form, which runs in it.
    """
    check_device(qc)
    C = qc.shape[3]
    if C < 16 or C & (C - 1) or qc.shape[-1] > 256:
        raise ValueError(f"the WY-factor kernels take chunk sizes that are powers of two >= 16 and K <= 256, got "
                         f"chunk_size={C}, K={qc.shape[-1]}")
    wide = torch.promote_types(qc.dtype, torch.float32)
    flat = [x.to(wide).flatten(2, 3) for x in (qc, kc, vc)]  # [B, H, N·C, D]: the padded tokens are zeros
    factors = delta_factors(*flat, beta.to(wide).contiguous(), g_cum.to(wide).contiguous(), factor_precision(wide))[:4]
    return (*(x.to(qc.dtype) for x in factors), None)
