"""What the kernels read, prepared once per call: the decay's prefix sums (by PyTorch, or by two small kernels) and
the tensors' layout (and, under ``torch.func.vmap``, the mapped dimension folded into the batch).

Every kernel reads ``[B, T, H, D]`` tensors through their strides (the last dimension contiguous); the
decay is prepared as two small tensors:

    gc[b, h, t]   = Σ_{chunk start <= r <= t} g_r      (fp32, within-chunk cumulative sum, [B, H, N·C])
    gend[b, h, c] = Σ_{r <= last token of chunk c} g_r  (fp64, global, [B, H, N])

Kernels take differences of ``gend`` in fp64 and convert them to fp32 only then, so a long sequence
never subtracts two large fp32 numbers; within a chunk ``gc`` is small and fp32 suffices.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import accumulator_dtype, block


def chunk_decay(log_decay: torch.Tensor | None, B: int, T: int, H: int, chunk_size: int, device,
                dtype: torch.dtype = torch.float32, in_kernels: bool = False) -> tuple:
    """``(gc, gend)`` of the module docstring from ``log_decay: [B, T, H]`` (or None: no decay).

    Returns ``gc: [B, H, N·C]`` (``accumulator_dtype(dtype)``; kernels take their accumulator type
    from it) and ``gend: [B, H, N]`` (fp64), padded tokens decaying by nothing. ``in_kernels``: by
    :func:`chunk_decay_kernel` and :func:`chunk_ends_kernel` (two launches) rather than PyTorch's scans and copies;
    the same sums, added in another order.
    """
    n_chunks = -(-T // chunk_size)
    acc = accumulator_dtype(dtype)
    if log_decay is None:
        return (torch.zeros(B, H, n_chunks * chunk_size, device=device, dtype=acc),
                torch.zeros(B, H, n_chunks, device=device, dtype=torch.float64))
    if in_kernels:
        gc = torch.empty(B, H, n_chunks * chunk_size, device=device, dtype=acc)
        gend = torch.empty(B, H, n_chunks, device=device, dtype=torch.float64)
        chunk_decay_kernel[(n_chunks, B)](log_decay, gc, T, n_chunks, H, *log_decay.stride(), C=chunk_size,
                                          BH=block(H, 1))
        chunk_ends_kernel[(B * H,)](gc, gend, n_chunks, C=chunk_size, BN=block(n_chunks, 1))
        return gc, gend
    g = torch.zeros(B, n_chunks * chunk_size, H, device=device, dtype=acc)
    g[:, :T] = log_decay
    # scans over a middle dimension (heads innermost): one thread per sequence of sums, coalesced, where a scan
    # along 64-element innermost rows is an order of magnitude slower on a GPU
    gc = g.view(B, n_chunks, chunk_size, H).cumsum(2)
    gend = gc[:, :, -1].double().cumsum(1)  # [B, N, H]
    return gc.permute(0, 3, 1, 2).reshape(B, H, -1).contiguous(), gend.transpose(1, 2).contiguous()


@triton.jit
def chunk_decay_kernel(g_ptr, gc_ptr, T, N, H, sgb, sgt, sgh, C: tl.constexpr, BH: tl.constexpr):
    """Grid ``(N, B)``: chunk ``c``'s ``gc`` for every head, the cumulative sum of ``g`` (``[B, T, H]``, strides
    ``sg*``; zero past ``T``) over the chunk's tokens, stored in ``gc: [B, H, N·C]``."""
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    t = i_c * C + tl.arange(0, C)
    h = tl.arange(0, BH)
    g = tl.load(g_ptr + i_b.to(tl.int64) * sgb + t[:, None].to(tl.int64) * sgt + h[None, :] * sgh,
                mask=(t[:, None] < T) & (h[None, :] < H), other=0.0)
    gc = tl.cumsum(g.to(gc_ptr.dtype.element_ty), 0)
    tl.store(gc_ptr + (i_b * H + h[None, :]).to(tl.int64) * N * C + t[:, None], gc, mask=h[None, :] < H)


@triton.jit
def chunk_ends_kernel(gc_ptr, gend_ptr, N, C: tl.constexpr, BN: tl.constexpr):
    """Grid ``(B·H,)``: ``gend[c] = Σ_{c' <= c} gc[c'·C + C - 1]`` in fp64, the decay summed to each chunk's end.
    gc: ``[B·H, N·C]``; gend: ``[B·H, N]``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BN)
    ends = tl.load(gc_ptr + row * N * C + c * C + C - 1, mask=c < N, other=0.0).to(tl.float64)
    tl.store(gend_ptr + row * N + c, tl.cumsum(ends, 0), mask=c < N)


def reverse_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``y_t = Σ_{r >= t} x_r`` along ``dim``, in fp64."""
    return x.double().flip(dim).cumsum(dim).flip(dim)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Kernels index the last dimension with stride 1; other strides are free (views are fine)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def same_strides(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k with their last dimension contiguous and equal strides (the kernels index both with one set)."""
    q, k = last_dim_contiguous(q), last_dim_contiguous(k)
    if q.stride() != k.stride():
        q, k = q.contiguous(), k.contiguous()
    return q, k


def kernel_layout(q, k, v, level_scales):
    """What the kernels read: last dimensions contiguous, q and k with equal strides."""
    q, k = same_strides(q, k)
    return q, k, last_dim_contiguous(v), last_dim_contiguous(level_scales)


def fold_into_batch(x: torch.Tensor | None, dim: int | None, size: int) -> torch.Tensor | None:
    """An input of a vmap rule as one batch: ``[size, B, ...]`` (the mapped dimension ``dim`` moved first, or,
    when ``dim`` is None, ``x: [B, ...]`` expanded to ``size`` members) -> ``[size·B, ...]``. None stays None.
    Every sequence is independent, so the kernels run once for all members."""
    if x is None:
        return None
    x = x.unsqueeze(0).expand(size, *x.shape) if dim is None else x.movedim(dim, 0)
    return x.reshape(size * x.shape[1], *x.shape[2:])


def fold_members(op, tensors: int):
    """A vmap rule for ``op``: its first ``tensors`` arguments ``[M, B, ...]`` -> ``[M·B, ...]`` (unmapped ones
    expanded, :func:`fold_into_batch`), one call, its output (one tensor or a tuple) ``[M·B, ...]`` -> ``[M, B, ...]``
    (an empty one stays unmapped). Every sequence is independent, so the kernels run once for all members of a
    training ensemble."""

    def rule(info, in_dims, *args):
        M = info.batch_size
        folded = [fold_into_batch(x, d, M) for x, d in zip(args[:tensors], in_dims[:tensors])]
        outputs = op(*folded, *args[tensors:])
        if isinstance(outputs, torch.Tensor):
            return outputs.unflatten(0, (M, -1)), 0
        return (tuple(x.unflatten(0, (M, -1)) if x.numel() else x for x in outputs),
                tuple(0 if x.numel() else None for x in outputs))

    return rule
