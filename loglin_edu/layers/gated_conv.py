"""A gated short convolution: the layer Zoology places before attention in its associative-recall baselines.

    y_t = conv(x)_t ⊙ (x_t W + b) + x_t,      conv(x)_t = Σ_{i<w} C[:, i] x_{t-w+1+i} + c

a depthwise causal convolution of width ``w`` (no activation), multiplied channel by channel by a linear map of
the token itself, plus the token. In a two-layer model whose first layer is this and whose second is attention
(Zoology's ``Hybrid[BaseConv, MHA]``), the first layer moves what came just before a token into it, so the
attention layer can find the key whose successor it is asked for.

Decoding keeps the convolution's last ``w - 1`` inputs, as every short convolution of the package.
"""

from __future__ import annotations

import torch
from torch import nn

from .cache import MixerCache, check_room
from .parts import ShortConvolution


class GatedConvolution(nn.Module):
    """``[B, T, d_model] -> [B, T, d_model]`` (module docstring); kernel_size: the convolution's width ``w``."""

    def __init__(self, d_model: int, kernel_size: int = 3) -> None:
        super().__init__()
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(f"kernel_size must be an integer >= 1, got {kernel_size!r}")
        self.conv = ShortConvolution(d_model, kernel_size, activation=False)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * self.proj(x) + x

    def describe(self) -> str:
        """The layer's class and sizes: what a cache must have been made by."""
        return f"GatedConvolution(d_model={self.proj.in_features}, kernel_size={self.conv.kernel_size})"

    def state_size(self) -> int:
        """Entries held between decoding steps per sequence: the window, ``(w - 1) · d_model``."""
        return (self.conv.kernel_size - 1) * self.proj.in_features

    def init_cache(
        self, batch: int, max_len: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixerCache:
        """An empty cache: the window ``[batch, w - 1, d_model]`` of zeros, position 0."""
        check_room(0, max_len, None, self.describe())
        weight = self.proj.weight
        window = torch.zeros(batch, self.conv.kernel_size - 1, self.proj.in_features, device=device or weight.device,
                             dtype=dtype or weight.dtype)
        return MixerCache(self.describe(), batch, max_len, tensors={"conv": window})

    def prefill(self, x: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """The outputs ``[B, T, d_model]`` of a prompt x ``[B, T, d_model]`` and the cache after it."""
        B, T, _ = x.shape
        check_room(T, max_len, None, self.describe())
        y = self(x)
        cache = self.init_cache(B, max_len, device=x.device, dtype=y.dtype)
        cache.tensors["conv"] = self.conv.window(x).to(y.dtype)
        cache.position = T
        return y, cache

    def step(self, x_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token of every sequence: x_t ``[B, d_model]`` -> ``[B, d_model]``; advances ``cache``."""
        cache.check_step(self.describe(), x_t)
        window = cache.tensors["conv"]
        shifted, cache.tensors["conv"] = self.conv.step(x_t.to(window.dtype), window)
        cache.advance()
        return shifted * self.proj(x_t) + x_t
