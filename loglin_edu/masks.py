"""The masks of ``O = (A ⊙ M) V``: causal, semiseparable decay ``M^S``, hierarchical ``M^H``.

All masks are ``[B, H, T, T]`` (``[T, T]`` for the causal one), indexed ``[t, s]`` (query, key), zero
above the diagonal. They are dense by construction: for pictures and the naive form.
"""

from __future__ import annotations

import torch

from .fenwick import level_matrix


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[T, T]`` bool, ``True`` where ``s <= t``."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def segment_sum(log_decay: torch.Tensor) -> torch.Tensor:
    """``[..., T] -> [..., T, T]``: ``G_t - G_s = sum_{s < r <= t} g_r`` for ``s <= t``, ``-inf`` above.

    Computed as a masked cumulative sum of differences, so no large ``G_t`` is ever subtracted from
    another (exact for long sequences, unlike ``cumsum(g)[t] - cumsum(g)[s]``).
    """
    T = log_decay.shape[-1]
    strict = torch.ones(T, T, dtype=torch.bool, device=log_decay.device).tril(-1)
    g = log_decay[..., :, None].expand(*log_decay.shape, T)  # g[..., r, s] = g_r
    g = g.masked_fill(~strict, 0)  # keep r > s; the cumulative sum over r ends at row t
    out = g.cumsum(dim=-2)
    return out.masked_fill(~causal_mask(T, log_decay.device), float("-inf"))


def decay_mask(log_decay: torch.Tensor) -> torch.Tensor:
    """Semiseparable mask ``M^S[t, s] = exp(G_t - G_s)`` for ``s <= t`` (0 above).

    log_decay: ``[B, T, H]`` -> ``[B, H, T, T]``.
    """
    return segment_sum(log_decay.transpose(1, 2)).exp()


def hierarchical_mask(level_scales: torch.Tensor) -> torch.Tensor:
    """Hierarchical mask ``M^H[t, s] = λ[t, level(t, s)]`` for ``s <= t`` (0 above).

    level_scales: ``[B, T, H, L]`` with ``L >= num_levels(T)`` -> ``[B, H, T, T]``.
    """
    B, T, H, _ = level_scales.shape
    levels = level_matrix(T, device=level_scales.device)
    lam = level_scales.transpose(1, 2)  # [B, H, T, L]
    index = levels.clamp(min=0).expand(B, H, T, T)
    return torch.gather(lam, 3, index) * (levels >= 0)


def loglinear_mask(level_scales: torch.Tensor, log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """``M = M^S ⊙ M^H`` (just ``M^H`` without decay). ``[B, T, H, L] -> [B, H, T, T]``."""
    mask = hierarchical_mask(level_scales)
    return mask if log_decay is None else mask * decay_mask(log_decay)
