"""Gated DeltaNet and log-linear Gated DeltaNet as layers (PAPER.md §5).

``H`` heads, key width ``K``, value width ``V = expand_v · K``:

    q, k, v = SiLU(short_conv(x W_q)), SiLU(short_conv(x W_k)), SiLU(short_conv(x W_v))
    q <- normalize(q) / √K,   k <- normalize(k)                      (L2 per head)
    β = sigmoid(x W_β),   g = -exp(A_log) · softplus(x W_a + dt_bias)  (per head, g <= 0)
    o = gated_deltanet_attention(q, k, v, g, β)
    y = o_proj(RMSNorm(o) ⊙ SiLU(x W_gate))                          (norm per head, then gate)

Log-linear Gated DeltaNet adds a bias-free ``l_proj`` giving ``dl`` (``H · L`` values) and reads the
Fenwick levels with ``λ = softplus(L_{h,ℓ} · dl)``: ``o = loglinear_attention(q, k, v, λ, g, β)``.
The 1/√K is applied to q here (the authors fold it into λ instead; the function is the same).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..ops import REFERENCE_FORMS, mix, resolve_backend
from .parts import GatedRMSNorm, LevelScales, ShortConvolution, inverse_softplus, log_uniform


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet layer (module docstring). x: ``[B, T, d_model]`` -> ``[B, T, d_model]``.

    num_heads: H; key_dim: K (``d_model // num_heads`` when None); expand_v: ``V / K``; conv_size:
    short convolution width; backend/form/chunk_size: how the operator runs.
    """

    def __init__(
        self,
        d_model: int,
        *,
        num_heads: int = 2,
        key_dim: int | None = None,
        expand_v: int = 2,
        conv_size: int = 4,
        dt_range: tuple[float, float] = (1e-3, 1e-1),
        a_range: tuple[float, float] = (1.0, 16.0),
        backend: str = "auto",
        form: str = "chunkwise",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        check_form(form, REFERENCE_FORMS)
        self.num_heads = num_heads
        self.key_dim = d_model // num_heads if key_dim is None else key_dim
        self.value_dim = expand_v * self.key_dim
        self.backend, self.form, self.chunk_size = backend, form, chunk_size
        H, K, V = num_heads, self.key_dim, self.value_dim
        self.q_proj = nn.Linear(d_model, H * K, bias=False)
        self.k_proj = nn.Linear(d_model, H * K, bias=False)
        self.v_proj = nn.Linear(d_model, H * V, bias=False)
        self.q_conv = ShortConvolution(H * K, conv_size)
        self.k_conv = ShortConvolution(H * K, conv_size)
        self.v_conv = ShortConvolution(H * V, conv_size)
        self.b_proj = nn.Linear(d_model, H, bias=False)
        self.a_proj = nn.Linear(d_model, H, bias=False)
        self.dt_bias = nn.Parameter(inverse_softplus(log_uniform(H, *dt_range)))
        self.A_log = nn.Parameter(torch.empty(H).uniform_(*a_range).log())
        self.gate_proj = nn.Linear(d_model, H * V, bias=False)
        self.o_norm = GatedRMSNorm(H * V, group_size=V, norm_before_gate=True)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, K, V = self.num_heads, self.key_dim, self.value_dim
        q = F.normalize(self.q_conv(self.q_proj(x)).unflatten(-1, (H, K)), dim=-1, eps=1e-6) * K**-0.5
        k = F.normalize(self.k_conv(self.k_proj(x)).unflatten(-1, (H, K)), dim=-1, eps=1e-6)
        v = self.v_conv(self.v_proj(x)).unflatten(-1, (H, V))
        beta = torch.sigmoid(self.b_proj(x))
        log_decay = -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
        o = self.mixer(q, k, v, log_decay, beta, x)
        return self.o_proj(self.o_norm(o.flatten(2), self.gate_proj(x)))

    def state_size(self) -> int:
        """Entries of the recurrent state of one sequence: ``H · K · V`` (per Fenwick level when log-linear)."""
        return self.num_heads * self.key_dim * self.value_dim

    def mixer(self, q, k, v, log_decay, beta, x) -> torch.Tensor:
        """``gated_deltanet_attention(q, k, v, log_decay, beta)`` on the chosen backend. q, k: ``[B, T, H, K]``;
        v: ``[B, T, H, V]``; log_decay, beta: ``[B, T, H]``; x: the layer input. Returns ``[B, T, H, V]``."""
        form = "triton" if resolve_backend(self.backend, v, loglinear=False, beta=True) == "triton" else self.form
        return mix(q, k, v, log_decay, beta, form=form, chunk_size=self.chunk_size)


class LogLinearGatedDeltaNet(GatedDeltaNet):
    """Log-linear Gated DeltaNet: one delta-rule state per Fenwick level, read with λ.

    max_len: the longest sequence accepted; it fixes ``num_levels(max_len)``. tie_levels: one λ per token and
    head for all levels (:class:`~loglin_edu.layers.LevelScales`). Other arguments as :class:`GatedDeltaNet`.
    """

    def __init__(self, d_model: int, *, max_len: int = 2048, tie_levels: bool = False, **kwargs) -> None:
        super().__init__(d_model, **kwargs)
        self.level_scales = LevelScales(self.num_heads, max_len, tie_levels)
        self.l_proj = nn.Linear(d_model, self.level_scales.inputs, bias=False)

    def mixer(self, q, k, v, log_decay, beta, x) -> torch.Tensor:
        """``loglinear_attention(q, k, v, λ, log_decay, beta)`` with ``λ = softplus(L · l_proj(x))``."""
        level_scales = self.level_scales(self.l_proj(x))
        form = "triton" if resolve_backend(self.backend, v, loglinear=True, beta=True) == "triton" else self.form
        return mix(q, k, v, log_decay, beta, level_scales, form=form, chunk_size=self.chunk_size)
