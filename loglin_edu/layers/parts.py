"""Small parts the layers share: short causal convolution, gated RMSNorm, the λ head, rotary embeddings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..fenwick import num_levels


class ShortConvolution(nn.Module):
    """Depthwise causal convolution over time, ``y_t = act(Σ_{i<w} W[:, i] x_{t-w+1+i} + b)``.

    The "short convolution" of Mamba-2 and Gated DeltaNet: each channel sees its last ``w`` inputs.
    x: ``[B, T, C]`` -> ``[B, T, C]``. The sum is written out as ``w`` shifted products, summed in float32 and
    rounded once to the input's precision: elementwise work that ``torch.compile`` fuses with the gates around it
    (a depthwise convolution kernel would run on its own, forward and backward).
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: bool = True) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        nn.init.uniform_(self.weight, -1 / math.sqrt(kernel_size), 1 / math.sqrt(kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, w = x.shape[1], self.kernel_size
        wide = torch.promote_types(x.dtype, torch.float32)
        padded = F.pad(x, (0, 0, w - 1, 0)).to(wide)  # left padding keeps it causal
        weight = self.weight[:, 0].to(x.dtype).to(wide)  # under autocast x is bf16: weights rounded as it is
        y = self.bias.to(x.dtype).to(wide) + sum(padded[:, i : i + T] * weight[:, i] for i in range(w))
        y = y.to(x.dtype)
        return F.silu(y) if self.activation else y

    def window(self, x: torch.Tensor) -> torch.Tensor:
        """The decoding state after ``x``: its last ``w - 1`` inputs, oldest first, zeros before the start.

        x: ``[B, T, C]`` -> ``[B, w - 1, C]``.
        """
        padded = F.pad(x, (0, 0, self.kernel_size - 1, 0))
        return padded[:, padded.shape[1] - (self.kernel_size - 1) :]

    def step(self, x_t: torch.Tensor, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: ``y_t = act(Σ_i W[:, i] [window; x_t]_i + b)``.

        x_t: ``[B, C]``; window: ``[B, w - 1, C]`` (:meth:`window`). Returns ``(y_t: [B, C], next window)``.
        """
        inputs = torch.cat([window, x_t[:, None]], dim=1)  # [B, w, C]
        y = torch.einsum("bwc,cw->bc", inputs, self.weight[:, 0].to(inputs.dtype)) + self.bias.to(inputs.dtype)
        return (F.silu(y) if self.activation else y), inputs[:, 1:]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x²) + eps) · weight`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned gain (initialised to 1). ``[..., D] -> [..., D]``."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Output norm with a SiLU gate, in groups of ``group_size`` channels.

    ``norm_before_gate=False`` (Mamba-2):       ``y = RMSNorm(x ⊙ silu(z))``
    ``norm_before_gate=True``  (Gated DeltaNet): ``y = RMSNorm(x) ⊙ silu(z)``

    x, z: ``[..., D]`` with ``D`` a multiple of ``group_size`` -> ``[..., D]``.
    """

    def __init__(self, dim: int, group_size: int | None = None, norm_before_gate: bool = False, eps: float = 1e-5):
        super().__init__()
        self.group_size = dim if group_size is None else group_size
        if dim % self.group_size:
            raise ValueError(f"dim={dim} must be a multiple of group_size={self.group_size}")
        self.norm_before_gate = norm_before_gate
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if not self.norm_before_gate:
            x = x * F.silu(z)
        groups = x.unflatten(-1, (-1, self.group_size))
        normed = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        y = normed.flatten(-2) * self.weight
        return y * F.silu(z) if self.norm_before_gate else y


class LevelScales(nn.Module):
    """The λ of log-linear attention: ``λ[t, h, ℓ] = softplus(L[h, ℓ] · dl[t, h, ℓ])``.

    ``dl`` are ``H · L`` extra outputs of a projection of the layer input; ``L`` is a per-head, per-level
    parameter initialised to 1. The number of levels follows from the configured maximum length:
    ``num_levels(max_len)`` (15 for 16384). A longer sequence raises a ``ValueError``.

    tie_levels: one λ per token and head for every level, ``λ[t, h, ℓ] = softplus(L[h] · dl[t, h])`` from ``H``
    projection outputs. Then ``M^H`` is the causal mask times ``λ_t``: the layer is its linear model with a
    per-token output gate, and the Fenwick partition no longer weighs one bucket against another (an ablation).

    dl: ``[B, T, H · L]`` (``[B, T, H]`` when tied) -> ``[B, T, H, L]``.
    """

    def __init__(self, num_heads: int, max_len: int, tie_levels: bool = False) -> None:
        super().__init__()
        self.max_len = max_len
        self.num_levels = num_levels(max_len)
        self.tie_levels = tie_levels
        self.weight = nn.Parameter(torch.ones(num_heads, 1 if tie_levels else self.num_levels))

    @property
    def inputs(self) -> int:
        """How many projection outputs ``dl`` the layer needs per token: ``H · L``, or ``H`` when tied."""
        return self.weight.numel()

    def check_length(self, seq_len: int) -> None:
        """A sequence longer than ``max_len`` would need more levels than this layer has."""
        if seq_len > self.max_len:
            raise ValueError(
                f"sequence of length T={seq_len} is longer than this layer's max_len={self.max_len} "
                f"({self.num_levels} Fenwick levels); build the layer with max_len >= {seq_len}"
            )

    def forward(self, dl: torch.Tensor) -> torch.Tensor:
        self.check_length(dl.shape[1])
        scales = F.softplus(self.weight * dl.unflatten(-1, self.weight.shape))
        return scales.expand(*scales.shape[:-1], self.num_levels).contiguous() if self.tie_levels else scales


def rotary(x: torch.Tensor, base: float = 10000.0, offset: int = 0) -> torch.Tensor:
    """Rotary position embedding (RoPE): rotate channel pairs ``(i, i + D/2)`` of position ``t`` by
    ``t · base^(-2i/D)``. x: ``[B, T, H, D]`` with ``D`` even, at positions ``offset .. offset + T - 1``
    (a decoding step passes its position) -> ``[B, T, H, D]``.
    """
    T, D = x.shape[1], x.shape[-1]
    freqs = base ** (-torch.arange(0, D // 2, device=x.device, dtype=torch.float32) * 2 / D)
    angles = torch.arange(offset, offset + T, device=x.device, dtype=torch.float32)[:, None] * freqs  # [T, D/2]
    cos, sin = angles.cos()[:, None].to(x.dtype), angles.sin()[:, None].to(x.dtype)
    first, second = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """``x`` with ``softplus(x) = y`` (for ``y > 0``): ``y + log(-expm1(-y))``."""
    return y + torch.log(-torch.expm1(-y))


def log_uniform(n: int, low: float, high: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` values spread log-uniformly over ``[low, high]`` (random draws)."""
    u = torch.rand(n, generator=generator)
    return torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))
