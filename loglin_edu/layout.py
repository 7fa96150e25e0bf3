"""Layout helpers: the public layout is ``[B, T, H, D]``; the forms compute in ``[B, H, T, D]``."""

from __future__ import annotations

import torch


def heads_first(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, T, Hx, ...] -> [B, H, T, ...]``, broadcasting a shared head (``Hx = 1``) to ``heads``."""
    x = x.transpose(1, 2)
    return x.expand(x.shape[0], heads, *x.shape[2:]) if x.shape[1] != heads else x


def time_first(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, D] -> [B, T, H, D]`` (contiguous)."""
    return x.transpose(1, 2).contiguous()


def pad_time(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad ``x`` along ``dim`` (the time axis) up to ``length``."""
    extra = length - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)
