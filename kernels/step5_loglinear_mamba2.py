"""Step 5 — the autograd Function behind ``loglinear_attention(..., form="triton")``.

:class:`LogLinearMamba2` runs step 3 forward and step 4 backward on one block of key and value
columns (``K, V <= 128``); :func:`loglinear_mamba2` takes any shapes:

- any ``T``: the kernels mask the tokens past ``T`` (no copy is padded);
- any ``K, V``: padded to tiles of 16..128 (64..128 for 16-bit inputs on a GPU: ``head_block``);
  wider heads are cut into blocks of 128 columns — the operator is linear in ``v`` and, for fixed
  masks, bilinear in ``(q, k)``, so ``o = Σ_key blocks o(q_b, k_b)`` and the value blocks are independent;
- q, k per head or shared by all heads (``H = 1``, Mamba-2's single group);
- fp32, fp16, bf16 (fp64 too, under the interpreter) inputs, fp32 accumulation;
- inside :func:`torch.func.vmap` (its vmap rule folds the mapped dimension into the batch).

Nothing is ``T × T``: besides the outputs, memory holds one ``K × V`` state per chunk (forward, kept for
the backward) and one node gradient per chunk (backward).
"""

from __future__ import annotations

import torch

from . import interpreted
from .config import MAX_BLOCK, LaunchConfig
from .inputs import chunk_decay, fold_into_batch, kernel_layout, last_dim_contiguous
from .step3_chunk_tree import FenwickTree, loglinear_forward
from .step4_tree_backward import loglinear_backward

CONFIG = LaunchConfig(head_group=1, block_levels=4, num_warps=4, tree_warps=4, tree_key_split=2, decay_sums_in_kernels=True)
"""Launch configuration used by :func:`loglinear_mamba2`: the fastest of the variants ``python -m loglin_edu.bench
--variants`` times."""


class LogLinearMamba2(torch.autograd.Function):
    """``(o, gc, gend, nodes, residuals) = LogLinearMamba2.apply(q, k, v, level_scales, log_decay, chunk_size,
    config, backward)`` for ``K, V <= 128``.

    Only ``o`` is differentiable; ``gc, gend`` (the decay sums) and ``nodes, residuals`` (the Fenwick tree of
    states, :class:`~loglin_edu.kernels.step3_chunk_tree.FenwickTree`) are what the backward needs.
    ``backward=False`` (the call runs without autograd recording it) lets the tree skip what only a backward
    reads (:func:`~loglin_edu.kernels.step3_chunk_tree.build_tree`). Under
    :func:`torch.func.vmap` (the training ensemble) the mapped dimension is folded into the batch — every
    sequence is independent — so the kernels run once for all members.
    """

    generate_vmap_rule = False

    @staticmethod
    def forward(q, k, v, level_scales, log_decay, chunk_size, config, backward=True):
        q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
        B, T, H = v.shape[:3]
        gc, gend = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype, config.decay_sums_in_kernels)
        o, tree = loglinear_forward(q, k, v, level_scales, gc, gend, chunk_size, config, residuals=backward)
        return (o, gc, gend, *tree)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, level_scales, log_decay, chunk_size, config = inputs[:7]
        _, gc, gend, nodes, residuals = output
        ctx.mark_non_differentiable(gc, gend, nodes, residuals)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the tree (as large as the states)
        ctx.save_for_backward(q, k, v, level_scales, gc, gend, nodes, residuals)
        ctx.chunk_size, ctx.config = chunk_size, config
        ctx.decay_dtype = None if log_decay is None else log_decay.dtype

    @staticmethod
    def backward(ctx, do, *_):
        if do is None:
            return None, None, None, None, None, None, None, None
        q, k, v, level_scales, gc, gend, *tree = ctx.saved_tensors
        q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
        B, T, H = v.shape[:3]
        grads = {} if ctx.decay_dtype is None else {"dlog_decay": v.new_empty(B, T, H, dtype=ctx.decay_dtype)}
        dq, dk, dv, dlam, dg = loglinear_backward(
            q, k, v, level_scales, gc, gend, FenwickTree(*tree), last_dim_contiguous(do), ctx.chunk_size, ctx.config,
            grads,
        )
        return dq, dk, dv, dlam, None if ctx.decay_dtype is None else dg, None, None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, level_scales, log_decay, chunk_size, config, backward=True):
        """``[M, B, ...]`` -> ``[M·B, ...]``, one call, and back (unmapped inputs are expanded)."""
        M = info.batch_size
        args = [fold_into_batch(x, d, M) for x, d in zip((q, k, v, level_scales, log_decay), in_dims[:5])]
        outputs = LogLinearMamba2.apply(*args, chunk_size, config, backward)
        residuals_dim = 0 if outputs[4].numel() else None  # empty: fp32 nodes, or no backward to read them
        return tuple(x.unflatten(0, (M, -1)) if x.numel() else x for x in outputs), (0, 0, 0, 0, residuals_dim)


def loglinear_mamba2(q, k, v, level_scales, log_decay=None, chunk_size: int = 64,
                     config: LaunchConfig | None = None) -> torch.Tensor:
    """Log-linear Mamba-2 by the Triton kernels, differentiable.

    q, k: ``[B, T, H, K]`` or ``[B, T, 1, K]`` (shared by heads); v: ``[B, T, H, V]``;
    level_scales: ``[B, T, H, L]`` (``L >= num_levels(T)``); log_decay: ``[B, T, H]`` (``<= 0``) or None.
    chunk_size: a power of two, raised to 16 (the smallest ``tl.dot`` tile) if smaller; the result does
    not depend on it. Returns ``[B, T, H, V]``. Inputs are assumed checked (``loglinear_attention`` does).
    """
    if not q.is_cuda and not interpreted():
        raise RuntimeError(
            "the Triton kernels got CPU tensors but triton is not in interpreter mode: set TRITON_INTERPRET=1 in the "
            "environment before triton is first imported (os.environ['TRITON_INTERPRET'] = '1')"
        )
    chunk_size = max(chunk_size, 16)
    config = config or CONFIG
    backward = torch.is_grad_enabled()  # without grad mode no backward can run through this call
    K, V = q.shape[-1], v.shape[-1]
    outputs = []
    for vs in range(0, V, MAX_BLOCK):
        parts = [
            LogLinearMamba2.apply(q[..., ks : ks + MAX_BLOCK], k[..., ks : ks + MAX_BLOCK], v[..., vs : vs + MAX_BLOCK],
                                  level_scales, log_decay, chunk_size, config, backward)[0]
            for ks in range(0, K, MAX_BLOCK)
        ]
        outputs.append(parts[0] if len(parts) == 1 else sum(parts))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
