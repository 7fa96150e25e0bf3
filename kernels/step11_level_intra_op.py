"""Step 11 — the intra-chunk product of log-linear Gated DeltaNet, ``(P ⊙ Λ) V``, as one PyTorch operator.

Inside ``torch.compile`` the Triton form of log-linear Gated DeltaNet is a chunk scan (:func:`loglin_edu.ops.
loglinear_delta_rule_triton`): step 10's operator gives every chunk's block ``P`` of ``A ⊙ M^S``, and the chunk's
tokens reach each other through it scaled by their levels, as step 2 does for Mamba-2:

    O = (P ⊙ Λ) V,        Λ[i, j] = λ[i, level(i, j)]   (levels ``0..log2 C``, j <= i)

In PyTorch that is a ``C × C`` tensor ``Λ`` per chunk written to memory, the product, and in the backward two more
``C × C`` tensors and a reduction per level. Here one program per chunk holds ``P`` and ``Λ`` in registers, and its
backward one more program per chunk forms, with ``G = dO Vᵀ``,

    dP = causal(G ⊙ Λ),      dV = (P ⊙ Λ)ᵀ dO,      dλ[i, l] = Σ_{j: level(i, j) = l} (G ⊙ P)[i, j]   (l <= log2 C)

and zero for the higher levels, which only the reads across chunks use. Memory traffic per chunk and head: ``P``
(``C²``), ``V`` and the output (``C·V`` each) forward; ``P``, ``V``, ``dO``, ``dP``, ``dV`` and ``dλ`` backward.

The products run in the precision of step 10's (:func:`~.step10_delta_factors_op.factor_precision`): tf32 while
``torch.backends.cuda.matmul.allow_tf32`` is set, tf32x3 otherwise, exactly for fp64 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import check_device
from .config import block
from .inputs import fold_members, last_dim_contiguous
from .step10_delta_factors_op import factor_precision
from .tiles import fenwick_levels, load_level_scale_matrix, store_level_column, store_level_sums

VALUE_TILE = 64
"""Value columns one program multiplies at a time."""


@triton.jit
def chunk_start(ptr, i_b, i_h, i_c, stride_b, stride_h, stride_n):
    """``ptr`` moved to chunk ``i_c`` of batch ``i_b`` and head ``i_h`` of a ``[B, H, N, ...]`` tensor."""
    return ptr + i_b.to(tl.int64) * stride_b + i_h.to(tl.int64) * stride_h + i_c.to(tl.int64) * stride_n


@triton.jit
def level_intra_kernel(p_ptr, lam_ptr, v_ptr, o_ptr, V, L, spb, sph, spn, spc, slb, slh, sln, slc,
                       svb, svh, svn, svc,
                       C: tl.constexpr, C_LOG: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, IP: tl.constexpr):
    """Grid ``(N, H, B)``: ``o = (P ⊙ Λ) V`` of one chunk. P: ``[B, H, N, C, C]``; lam: ``[B, H, N, C, L]``; v:
    ``[B, H, N, C, V]`` (any strides, each last dimension contiguous); o: ``[B, H, N, C, V]``, contiguous."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rc = tl.arange(0, C)
    p_ptr = chunk_start(p_ptr, i_b, i_h, i_c, spb, sph, spn)
    lam_ptr = chunk_start(lam_ptr, i_b, i_h, i_c, slb, slh, sln)
    v_ptr = chunk_start(v_ptr, i_b, i_h, i_c, svb, svh, svn)
    o_ptr += ((i_b * tl.num_programs(1) + i_h).to(tl.int64) * tl.num_programs(0) + i_c) * C * V
    p = tl.load(p_ptr + rc[:, None] * spc + rc[None, :])
    weights = p * load_level_scale_matrix(lam_ptr, slc, rc, C, L, fenwick_levels(C, C_LOG), C_LOG, p.dtype)
    for i_v in range(NV):
        cols = i_v * BV + tl.arange(0, BV)
        inside = cols[None, :] < V
        v = tl.load(v_ptr + rc[:, None] * svc + cols[None, :], mask=inside, other=0.0)
        tl.store(o_ptr + rc[:, None] * V + cols[None, :], tl.dot(weights, v, input_precision=IP), mask=inside)


@triton.jit
def level_intra_bwd_kernel(p_ptr, lam_ptr, v_ptr, do_ptr, dp_ptr, dlam_ptr, dv_ptr, V, L,
                           spb, sph, spn, spc, slb, slh, sln, slc, svb, svh, svn, svc, sdob, sdoh, sdon, sdoc,
                           C: tl.constexpr, C_LOG: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
                           IP: tl.constexpr):
    """Grid ``(N, H, B)``: one chunk's ``dP`` (``[B, H, N, C, C]``), ``dλ`` (``[B, H, N, C, L]``) and ``dV``
    (``[B, H, N, C, V]``), all three contiguous, from the inputs of :func:`level_intra_kernel` and ``dO``
    (``[B, H, N, C, V]``, any strides, the last dimension contiguous). Formulas in the module docstring."""
    i_c, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    chunk = (i_b * tl.num_programs(1) + i_h).to(tl.int64) * tl.num_programs(0) + i_c
    rc = tl.arange(0, C)
    p_ptr = chunk_start(p_ptr, i_b, i_h, i_c, spb, sph, spn)
    lam_ptr = chunk_start(lam_ptr, i_b, i_h, i_c, slb, slh, sln)
    v_ptr = chunk_start(v_ptr, i_b, i_h, i_c, svb, svh, svn)
    do_ptr = chunk_start(do_ptr, i_b, i_h, i_c, sdob, sdoh, sdon)
    levels = fenwick_levels(C, C_LOG)
    p = tl.load(p_ptr + rc[:, None] * spc + rc[None, :])
    scales = load_level_scale_matrix(lam_ptr, slc, rc, C, L, levels, C_LOG, p.dtype)
    weights = p * scales
    d_pairs = tl.zeros((C, C), dtype=p.dtype)  # G = dO Vᵀ
    for i_v in range(NV):
        cols = i_v * BV + tl.arange(0, BV)
        inside = cols[None, :] < V
        v = tl.load(v_ptr + rc[:, None] * svc + cols[None, :], mask=inside, other=0.0)
        do = tl.load(do_ptr + rc[:, None] * sdoc + cols[None, :], mask=inside, other=0.0)
        d_pairs += tl.dot(do, tl.trans(v), input_precision=IP)
        tl.store(dv_ptr + (chunk * C + rc[:, None]) * V + cols[None, :], tl.dot(tl.trans(weights), do,
                                                                                input_precision=IP), mask=inside)
    dlam_ptr += chunk * C * L
    store_level_sums(dlam_ptr, L, rc, C, L, d_pairs * p, levels, C_LOG)
    for level in range(C_LOG + 1, L):
        store_level_column(dlam_ptr, L, rc, C, L, level, tl.zeros((C,), dtype=p.dtype))
    causal = rc[:, None] >= rc[None, :]
    tl.store(dp_ptr + chunk * C * C + rc[:, None] * C + rc[None, :], tl.where(causal, d_pairs * scales, 0.0))


def chunk_strides(*tensors: torch.Tensor) -> list[int]:
    """The batch, head, chunk and token strides of each ``[B, H, N, C, ...]`` tensor, one after another."""
    return [s for x in tensors for s in x.stride()[:4]]


def value_tiling(V: int) -> tuple[int, int]:
    """``(BV, NV)``: the value tile and how many cover ``V``."""
    BV = min(block(V), VALUE_TILE)
    return BV, -(-V // BV)


def level_intra_kernels(intra: torch.Tensor, level_scales: torch.Tensor, v: torch.Tensor,
                        precision: str) -> torch.Tensor:
    """The forward, one operator below: ``(P ⊙ Λ) V``. intra (``P``): ``[B, H, N, C, C]``; level_scales (chunked λ):
    ``[B, H, N, C, L]`` (``L > log2 C``); v: ``[B, H, N, C, V]``; all fp32 or all fp64, any strides. Returns
    ``[B, H, N, C, V]``."""
    B, H, N, C, _ = intra.shape
    L, V = level_scales.shape[-1], v.shape[-1]
    intra, level_scales, v = (last_dim_contiguous(x) for x in (intra, level_scales, v))
    out = v.new_empty(B, H, N, C, V)
    BV, NV = value_tiling(V)
    level_intra_kernel[(N, H, B)](
        intra, level_scales, v, out, V, L, *chunk_strides(intra, level_scales, v),
        C=C, C_LOG=C.bit_length() - 1, BV=BV, NV=NV, IP=precision,
    )
    return out


level_intra_product = torch.library.custom_op("loglin_edu::level_intra_product", level_intra_kernels,
                                              mutates_args=())
"""The operator :func:`level_intra_kernels` makes; its fake, gradient and vmap rule are registered below."""


@level_intra_product.register_fake
def _(intra, level_scales, v, precision):
    return v.new_empty(v.shape)


@torch.library.custom_op("loglin_edu::level_intra_product_backward", mutates_args=())
def level_intra_product_backward(intra: torch.Tensor, level_scales: torch.Tensor, v: torch.Tensor,
                                 d_out: torch.Tensor, precision: str
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`level_intra_bwd_kernel` as one operator: ``(dP, dλ, dV)``, shaped as intra, level_scales and v."""
    B, H, N, C, _ = intra.shape
    L, V = level_scales.shape[-1], v.shape[-1]
    intra, level_scales, v, d_out = (last_dim_contiguous(x) for x in (intra, level_scales, v, d_out))
    d_intra, d_scales = intra.new_empty(intra.shape), level_scales.new_empty(level_scales.shape)
    dv = v.new_empty(v.shape)
    BV, NV = value_tiling(V)
    level_intra_bwd_kernel[(N, H, B)](
        intra, level_scales, v, d_out, d_intra, d_scales, dv, V, L, *chunk_strides(intra, level_scales, v, d_out),
        C=C, C_LOG=C.bit_length() - 1, BV=BV, NV=NV, IP=precision,
    )
    return d_intra, d_scales, dv


@level_intra_product_backward.register_fake
def _(intra, level_scales, v, d_out, precision):
    return intra.new_empty(intra.shape), level_scales.new_empty(level_scales.shape), v.new_empty(v.shape)


def setup_context(ctx, inputs, output):
    intra, level_scales, v, precision = inputs
    ctx.save_for_backward(intra, level_scales, v)
    ctx.precision = precision


def backward(ctx, d_out):
    return (*level_intra_product_backward(*ctx.saved_tensors, d_out, ctx.precision), None)


level_intra_product.register_autograd(backward, setup_context=setup_context)
torch.library.register_vmap(level_intra_product, fold_members(level_intra_product, 3))
torch.library.register_vmap(level_intra_product_backward, fold_members(level_intra_product_backward, 4))


def level_intra_triton(intra: torch.Tensor, level_scales: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(P ⊙ Λ) V`` of every chunk by this operator, for :func:`loglin_edu.chunk_scan.chunk_scan`.

    intra: ``[B, H, N, C, C]``; level_scales: ``[B, H, N, C, L]`` (``L > log2 C``); v: ``[B, H, N, C, V]``.
    Returns ``[B, H, N, C, V]`` in intra's dtype; 16-bit inputs are multiplied in fp32 and the result rounded once.
    """
    check_device(intra)
    C = intra.shape[-1]
    if C < 16 or C & (C - 1) or level_scales.shape[-1] < C.bit_length():
        raise ValueError(f"the intra-chunk kernels take chunk sizes that are powers of two >= 16 and at least "
                         f"log2(C) + 1 levels, got chunk_size={C}, {level_scales.shape[-1]} levels")
    wide = torch.promote_types(intra.dtype, torch.float32)
    out = level_intra_product(intra.to(wide), level_scales.to(wide), v.to(wide), factor_precision(wide))
    return out.to(intra.dtype)
