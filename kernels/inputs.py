"""What the kernels read, prepared once per call on the host: the decay's prefix sums and the tensors' layout.

Every kernel reads ``[B, T, H, D]`` tensors through their strides (the last dimension contiguous); the
decay is prepared as two small tensors:

    gc[b, h, t]   = Σ_{chunk start <= r <= t} g_r      (fp32, within-chunk cumulative sum, [B, H, N·C])
    gend[b, h, c] = Σ_{r <= last token of chunk c} g_r  (fp64, global, [B, H, N])

Kernels take differences of ``gend`` in fp64 and convert them to fp32 only then, so a long sequence
never subtracts two large fp32 numbers; within a chunk ``gc`` is small and fp32 suffices.
"""

from __future__ import annotations

import torch

from .config import accumulator_dtype


def chunk_decay(log_decay: torch.Tensor | None, B: int, T: int, H: int, chunk_size: int, device,
                dtype: torch.dtype = torch.float32) -> tuple:
    """``(gc, gend)`` of the module docstring from ``log_decay: [B, T, H]`` (or None: no decay).

    Returns ``gc: [B, H, N·C]`` (``accumulator_dtype(dtype)``; kernels take their accumulator type
    from it) and ``gend: [B, H, N]`` (fp64), padded tokens decaying by nothing.
    """
    n_chunks = -(-T // chunk_size)
    acc = accumulator_dtype(dtype)
    if log_decay is None:
        return (torch.zeros(B, H, n_chunks * chunk_size, device=device, dtype=acc),
                torch.zeros(B, H, n_chunks, device=device, dtype=torch.float64))
    g = torch.zeros(B, n_chunks * chunk_size, H, device=device, dtype=acc)
    g[:, :T] = log_decay
    # scans over a middle dimension (heads innermost): one thread per sequence of sums, coalesced, where a scan
    # along 64-element innermost rows is an order of magnitude slower on a GPU
    gc = g.view(B, n_chunks, chunk_size, H).cumsum(2)
    gend = gc[:, :, -1].double().cumsum(1)  # [B, N, H]
    return gc.permute(0, 3, 1, 2).reshape(B, H, -1).contiguous(), gend.transpose(1, 2).contiguous()


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
