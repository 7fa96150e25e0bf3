"""Step 9 — the autograd Function behind ``loglinear_attention(..., beta=..., form="triton")`` called eagerly.

(``torch.compile`` cannot keep an ``autograd.Function`` in one graph; inside it the Triton form is the chunk scan on
step 10's operator, :func:`loglin_edu.ops.loglinear_delta_rule_triton`.)

:class:`LogLinearGatedDeltaNet` runs steps 6-7 forward and step 8 backward; :func:`loglinear_gated_deltanet`
takes any shapes:

- any ``T``: the kernels mask the tokens past ``T`` (padded tokens have ``k = v = β = 0`` and no decay);
- ``K <= 256``, held whole (the delta rule couples every key column, so unlike Mamba-2 the keys cannot be
  cut into independent blocks), in one tile or two (``K = 192`` is ``128 + 64``); any ``V``, in tiles of
  ``DeltaLaunchConfig.value_tile`` columns (``V = 384`` is six tiles of 64);
- q, k per head or shared by all heads (``H = 1``);
- fp32, fp16, bf16 (fp64 too, under the interpreter) inputs; every intermediate in fp32;
- inside :func:`torch.func.vmap` (its vmap rule folds the mapped dimension into the batch).

Memory: the forward keeps the WY factors (about ``2K + V + 2C`` fp32 numbers per token and head) and the
read states (``Σ_c popcount(c)`` blocks of ``K × V`` per head); the backward adds one adjoint per chunk
and level, ``N · log2 N`` blocks of ``K × V`` per head, while it runs.
"""

from __future__ import annotations

import torch

from . import check_device
from .config import DeltaLaunchConfig
from .inputs import fold_into_batch, kernel_layout, last_dim_contiguous
from .step6_delta_chunks import DeltaChunks
from .step7_delta_levels import loglinear_delta_forward
from .step8_delta_backward import chunk_reverse_cumsum, loglinear_delta_backward

CONFIG = DeltaLaunchConfig()
"""Launch configuration used by :func:`loglinear_gated_deltanet`."""


class LogLinearGatedDeltaNet(torch.autograd.Function):
    """``(o, *chunks, states) = LogLinearGatedDeltaNet.apply(q, k, v, level_scales, log_decay, beta, chunk_size,
    config)``.

    Only ``o`` is differentiable; ``chunks`` (the seven tensors of
    :class:`~loglin_edu.kernels.step6_delta_chunks.DeltaChunks`) and ``states`` (the read states of step 7)
    are what the backward needs. Under :func:`torch.func.vmap` the mapped dimension is folded into the
    batch — every sequence is independent — so the kernels run once for all members.
    """

    generate_vmap_rule = False

    @staticmethod
    def forward(q, k, v, level_scales, log_decay, beta, chunk_size, config):
        q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
        o, chunks, states = loglinear_delta_forward(q, k, v, level_scales, beta, log_decay, chunk_size, config)
        return (o, *chunks, states)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, level_scales, log_decay, beta, chunk_size, config = inputs
        saved = output[1:]
        ctx.mark_non_differentiable(*saved)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved factors and states
        ctx.save_for_backward(q, k, v, level_scales, *saved)
        ctx.chunk_size, ctx.config = chunk_size, config
        ctx.decay_dtype = None if log_decay is None else log_decay.dtype
        ctx.beta_dtype = beta.dtype

    @staticmethod
    def backward(ctx, do, *_):
        if do is None:
            return None, None, None, None, None, None, None, None
        q, k, v, level_scales, *saved = ctx.saved_tensors
        q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
        chunks, states = DeltaChunks(*saved[:-1]), saved[-1]
        dq, dk, dv, dlam, dbeta, d_gc = loglinear_delta_backward(
            q, k, v, level_scales, chunks, states, last_dim_contiguous(do), ctx.chunk_size, ctx.config
        )
        dg = None
        if ctx.decay_dtype is not None:
            dg = chunk_reverse_cumsum(d_gc, q.shape[1], ctx.chunk_size).to(ctx.decay_dtype)
        return dq, dk, dv, dlam, dg, dbeta.to(ctx.beta_dtype), None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, level_scales, log_decay, beta, chunk_size, config):
        """``[M, B, ...]`` -> ``[M·B, ...]``, one call, and back (unmapped inputs are expanded)."""
        M = info.batch_size
        args = [fold_into_batch(x, d, M) for x, d in zip((q, k, v, level_scales, log_decay, beta), in_dims[:6])]
        outputs = LogLinearGatedDeltaNet.apply(*args, chunk_size, config)
        return tuple(x.unflatten(0, (M, -1)) for x in outputs), (0,) * len(outputs)


def loglinear_gated_deltanet(q, k, v, level_scales, log_decay, beta, chunk_size: int = 64,
                             config: DeltaLaunchConfig | None = None) -> torch.Tensor:
    """Log-linear Gated DeltaNet by the Triton kernels, differentiable.

    q, k: ``[B, T, H, K]`` or ``[B, T, 1, K]`` (shared by heads), ``K <= 256``; v: ``[B, T, H, V]``;
    level_scales: ``[B, T, H, L]`` (``L >= num_levels(T)``); log_decay: ``[B, T, H]`` (``<= 0``) or None
    (log-linear DeltaNet); beta: ``[B, T, H]``. chunk_size: a power of two, raised to 16 (the smallest
    ``tl.dot`` tile) if smaller; the result does not depend on it. Returns ``[B, T, H, V]``. Inputs are
    assumed checked (``loglinear_attention`` does).
    """
    check_device(q)
    config = config or CONFIG
    if q.shape[-1] > 2 * config.key_tile:
        raise ValueError(f"the delta-rule kernels hold K <= {2 * config.key_tile} key columns (two tiles of "
                         f"{config.key_tile}), got K={q.shape[-1]}")
    return LogLinearGatedDeltaNet.apply(q, k, v, level_scales, log_decay, beta, max(chunk_size, 16), config)[0]
