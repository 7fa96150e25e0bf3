"""Step 5 — the PyTorch operator behind ``loglinear_attention(..., form="triton")``.

:func:`loglinear_mamba2_forward` runs step 3 forward and, as its registered gradient, step 4 backward on one
block of key and value columns (``K, V <= 128``); :func:`loglinear_mamba2` takes any shapes:

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

import json
from dataclasses import asdict, replace
from functools import cache

import torch

from . import check_device
from .config import MAX_BLOCK, LaunchConfig, accumulator_dtype, head_block, state_dtype
from .inputs import chunk_decay, fold_members, kernel_layout, last_dim_contiguous
from .step3_chunk_tree import FenwickTree, loglinear_forward
from .step4_tree_backward import loglinear_backward

CONFIG = LaunchConfig(head_group=1, block_levels=4, num_warps=4, tree_warps=4, tree_key_split=2, decay_sums_in_kernels=True)
"""Launch configuration used by :func:`loglinear_mamba2`: the fastest of the variants ``python -m loglin_edu.bench
--variants`` times."""


def config_name(config: LaunchConfig) -> str:
    """``config`` as the string an operator takes (its fields as JSON): operators take no Python objects."""
    return json.dumps(asdict(config), sort_keys=True)


NARROW_CONFIG = replace(CONFIG, num_warps=2, tree_warps=2)
"""The launch configuration for 16 × 16 state tiles (fp32 calls with heads of at most 16 columns): on an H200, 2 warps
per program take a sixth less time than 4 for the many short sequences of a training step (``CONFIG``'s are for
wide heads and long sequences)."""
CONFIG_NAME, NARROW_CONFIG_NAME = config_name(CONFIG), config_name(NARROW_CONFIG)
""":data:`CONFIG` and :data:`NARROW_CONFIG` as operators take them, written once (``torch.compile`` does not trace
``json``)."""


@cache
def launch_config(name: str) -> LaunchConfig:
    """The :class:`~.config.LaunchConfig` that :func:`config_name` wrote as ``name``."""
    return LaunchConfig(**json.loads(name))


def forward_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, level_scales: torch.Tensor,
                    log_decay: torch.Tensor | None, chunk_size: int, config: str,
                    backward: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 3 forward, made one PyTorch operator below, for ``K, V <= 128``: ``(o, gc, gend, nodes, residuals)``.

    Only ``o`` is differentiable; ``gc, gend`` (the decay sums) and ``nodes, residuals`` (the Fenwick tree of
    states, :class:`~loglin_edu.kernels.step3_chunk_tree.FenwickTree`) are what the backward needs.
    ``backward=False`` (the call runs without autograd recording it) lets the tree skip what only a backward
    reads (:func:`~loglin_edu.kernels.step3_chunk_tree.build_tree`). config: :func:`config_name` of a
    :class:`~.config.LaunchConfig`. An operator rather than an ``autograd.Function``: ``torch.compile`` keeps it as
    one node of a compiled graph; its gradient and its vmap rule are registered below.
    """
    config = launch_config(config)
    q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
    B, T, H = v.shape[:3]
    gc, gend = chunk_decay(log_decay, B, T, H, chunk_size, q.device, q.dtype, config.decay_sums_in_kernels)
    o, tree = loglinear_forward(q, k, v, level_scales, gc, gend, chunk_size, config, residuals=backward)
    return (o, gc, gend, *tree)


loglinear_mamba2_forward = torch.library.custom_op("loglin_edu::loglinear_mamba2", forward_kernels, mutates_args=())
"""The operator :func:`forward_kernels` makes; its fake (shapes only), gradient and vmap rule are registered below."""


@loglinear_mamba2_forward.register_fake
def _(q, k, v, level_scales, log_decay, chunk_size, config, backward):
    config = launch_config(config)
    B, T, H, V = v.shape
    N = -(-T // chunk_size)
    nodes = q.new_empty(B, H, N, head_block(k.shape[-1], k.dtype), head_block(V, k.dtype),
                        dtype=state_dtype(k.dtype, config.precision))
    residual = nodes.dtype in (torch.float16, torch.bfloat16) and (backward or not config.tree_registers)
    return (v.new_empty(B, T, H, V), q.new_empty(B, H, N * chunk_size, dtype=accumulator_dtype(q.dtype)),
            q.new_empty(B, H, N, dtype=torch.float64), nodes, nodes.new_empty(nodes.shape if residual else (0,)))


@torch.library.custom_op("loglin_edu::loglinear_mamba2_backward", mutates_args=())
def loglinear_mamba2_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, level_scales: torch.Tensor,
                              gc: torch.Tensor, gend: torch.Tensor, nodes: torch.Tensor, residuals: torch.Tensor,
                              do: torch.Tensor, chunk_size: int, config: str) -> tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor]:
    """Step 4 as one operator: ``(dq, dk, dv, dλ, dG)``, dG the log decay's gradient in the accumulator type."""
    dtypes = [x.dtype for x in (q, k, v, level_scales)]
    q, k, v, level_scales = kernel_layout(q, k, v, level_scales)
    grads = loglinear_backward(q, k, v, level_scales, gc, gend, FenwickTree(nodes, residuals), last_dim_contiguous(do),
                               chunk_size, launch_config(config))
    out = [g.to(dtype).contiguous() for g, dtype in zip(grads[:4], dtypes)]
    return (*out, grads[4].to(accumulator_dtype(q.dtype)).contiguous())


@loglinear_mamba2_backward.register_fake
def _(q, k, v, level_scales, gc, gend, nodes, residuals, do, chunk_size, config):
    return (*(x.new_empty(x.shape) for x in (q, k, v, level_scales)),
            q.new_empty(v.shape[:3], dtype=accumulator_dtype(q.dtype)))


def setup_context(ctx, inputs, output):
    """What the backward keeps: the inputs and the forward's decay sums and tree. The tree is marked
    non-differentiable and its gradients are not materialised (no zero-filled tensors as large as the states)."""
    q, k, v, level_scales, log_decay, chunk_size, config, _ = inputs
    _, gc, gend, nodes, residuals = output
    ctx.mark_non_differentiable(gc, gend, nodes, residuals)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, level_scales, gc, gend, nodes, residuals)
    ctx.chunk_size, ctx.config = chunk_size, config
    ctx.decay_dtype = None if log_decay is None else log_decay.dtype


def backward(ctx, do, *_):
    if do is None:
        return None, None, None, None, None, None, None, None
    dq, dk, dv, dlam, dg = loglinear_mamba2_backward(*ctx.saved_tensors, do, ctx.chunk_size, ctx.config)
    return dq, dk, dv, dlam, None if ctx.decay_dtype is None else dg.to(ctx.decay_dtype), None, None, None


loglinear_mamba2_forward.register_autograd(backward, setup_context=setup_context)


torch.library.register_vmap(loglinear_mamba2_forward, fold_members(loglinear_mamba2_forward, 5))
torch.library.register_vmap(loglinear_mamba2_backward, fold_members(loglinear_mamba2_backward, 9))


def loglinear_mamba2(q, k, v, level_scales, log_decay=None, chunk_size: int = 64,
                     config: LaunchConfig | None = None) -> torch.Tensor:
    """Log-linear Mamba-2 by the Triton kernels, differentiable.

    q, k: ``[B, T, H, K]`` or ``[B, T, 1, K]`` (shared by heads); v: ``[B, T, H, V]``;
    level_scales: ``[B, T, H, L]`` (``L >= num_levels(T)``); log_decay: ``[B, T, H]`` (``<= 0``) or None.
    chunk_size: a power of two, raised to 16 (the smallest ``tl.dot`` tile) if smaller; config: None is
    :data:`NARROW_CONFIG` for 16 × 16 head tiles, :data:`CONFIG` otherwise; the result depends on neither.
    Returns ``[B, T, H, V]``. Inputs are assumed checked (``loglinear_attention`` does).
    """
    check_device(q)
    chunk_size = max(chunk_size, 16)
    K, V = q.shape[-1], v.shape[-1]
    narrow = head_block(K, q.dtype) * head_block(V, q.dtype) <= 256
    name = (NARROW_CONFIG_NAME if narrow else CONFIG_NAME) if config is None else config_name(config)
    backward = torch.is_grad_enabled()  # without grad mode no backward can run through this call
    outputs = []
    for vs in range(0, V, MAX_BLOCK):
        parts = [
            loglinear_mamba2_forward(q[..., ks : ks + MAX_BLOCK], k[..., ks : ks + MAX_BLOCK],
                                     v[..., vs : vs + MAX_BLOCK], level_scales, log_decay, chunk_size, name, backward)[0]
            for ks in range(0, K, MAX_BLOCK)
        ]
        outputs.append(parts[0] if len(parts) == 1 else sum(parts))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
