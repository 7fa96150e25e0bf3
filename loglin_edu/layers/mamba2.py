"""Mamba-2 and log-linear Mamba-2 as layers (PAPER.md §5).

Mamba-2 mixer, ``H`` heads of width ``P``, state width ``N``, one group (B, C shared by all heads):

    [z, x, B, C, dt_raw] = in_proj(u)                         u: [B, T, d_model]
    [x, B, C] = SiLU(short_conv([x, B, C]))
    dt = softplus(dt_raw + dt_bias),   g = -exp(A_log) · dt   (per head, g <= 0)
    y = mamba2_attention(q=C, k=B, v=x · dt, log_decay=g) + D · x
    out = out_proj(RMSNorm(y ⊙ SiLU(z)))

Log-linear Mamba-2 adds ``H · L`` outputs ``dl`` to ``in_proj`` and reads every Fenwick level with
``λ = softplus(L_{h,ℓ} · dl)``: ``y = loglinear_attention(C, B, x · dt, λ, g) + D · x``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..fenwick import num_levels
from ..checks import check_form
from ..ops import REFERENCE_FORMS, mix, resolve_backend
from .parts import GatedRMSNorm, LevelScales, ShortConvolution, inverse_softplus, log_uniform


class Mamba2(nn.Module):
    """Mamba-2 layer (module docstring). x: ``[B, T, d_model]`` -> ``[B, T, d_model]``.

    d_state: N (the key width, ``key_dim``); head_dim: P (the value width, ``value_dim``); expand: inner width
    ``expand · d_model = H · P``; conv_size: short
    convolution width; backend/form/chunk_size: how the operator runs (:func:`loglin_edu.ops.resolve_backend`, :func:`~loglin_edu.ops.mix`).
    """

    def __init__(
        self,
        d_model: int,
        *,
        d_state: int = 16,
        head_dim: int = 16,
        expand: int = 2,
        conv_size: int = 4,
        dt_range: tuple[float, float] = (1e-3, 1e-1),
        a_range: tuple[float, float] = (1.0, 16.0),
        backend: str = "auto",
        form: str = "chunkwise",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        d_inner = expand * d_model
        if d_inner % head_dim:
            raise ValueError(f"expand·d_model={d_inner} must be a multiple of head_dim={head_dim}")
        check_form(form, REFERENCE_FORMS)
        self.d_inner, self.d_state, self.head_dim = d_inner, d_state, head_dim
        self.num_heads = d_inner // head_dim
        self.key_dim, self.value_dim = d_state, head_dim  # q = C and k = B have width N, v = x · dt width P
        self.backend, self.form, self.chunk_size = backend, form, chunk_size
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * d_state + self.num_heads + self.extra_outputs(), bias=False)
        self.conv = ShortConvolution(d_inner + 2 * d_state, conv_size)
        self.dt_bias = nn.Parameter(inverse_softplus(log_uniform(self.num_heads, *dt_range)))
        self.A_log = nn.Parameter(torch.empty(self.num_heads).uniform_(*a_range).log())
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.norm = GatedRMSNorm(d_inner, norm_before_gate=False)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def state_size(self) -> int:
        """Entries of the recurrent state of one sequence: ``H · K · V`` (per Fenwick level when log-linear)."""
        return self.num_heads * self.key_dim * self.value_dim

    def extra_outputs(self) -> int:
        """Extra outputs of ``in_proj`` beyond Mamba-2's own (none here; λ's inputs in the log-linear layer)."""
        return 0

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        B, T, _ = u.shape
        H, P, N = self.num_heads, self.head_dim, self.d_state
        z, xbc, dt, extra = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * N, H, self.extra_outputs()], -1)
        x, b, c = self.conv(xbc).split([self.d_inner, N, N], -1)
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H]
        log_decay = -torch.exp(self.A_log) * dt
        x = x.unflatten(-1, (H, P))
        v = x * dt[..., None]
        y = self.mixer(c[:, :, None], b[:, :, None], v, log_decay, extra)  # q = C, k = B: one group, all heads
        y = y + self.D[:, None] * x
        return self.out_proj(self.norm(y.flatten(2), z))

    def mixer(self, q, k, v, log_decay, extra) -> torch.Tensor:
        """``mamba2_attention(q, k, v, log_decay)`` on the chosen backend. q, k: ``[B, T, 1, N]``; v:
        ``[B, T, H, P]``; log_decay: ``[B, T, H]``. Returns ``[B, T, H, P]``."""
        form = "triton" if resolve_backend(self.backend, v, loglinear=False, beta=False) == "triton" else self.form
        return mix(q, k, v, log_decay, form=form, chunk_size=self.chunk_size)


class LogLinearMamba2(Mamba2):
    """Log-linear Mamba-2: Mamba-2 whose single state becomes one state per Fenwick level, read with λ.

    max_len: the longest sequence the layer accepts; it fixes the number of levels ``num_levels(max_len)``.
    tie_levels: one λ per token and head for all levels (:class:`~loglin_edu.layers.LevelScales`). Other
    arguments as :class:`Mamba2`.
    """

    def __init__(self, d_model: int, *, max_len: int = 2048, tie_levels: bool = False, **kwargs) -> None:
        self.max_len, self.tie_levels = max_len, tie_levels  # read by extra_outputs() while Mamba2.__init__ runs
        super().__init__(d_model, **kwargs)
        self.level_scales = LevelScales(self.num_heads, max_len, tie_levels)

    def extra_outputs(self) -> int:
        """``dl``: one input of λ per head and Fenwick level (per head when the levels are tied)."""
        return self.num_heads * (1 if self.tie_levels else num_levels(self.max_len))

    def mixer(self, q, k, v, log_decay, extra) -> torch.Tensor:
        """``loglinear_attention(q, k, v, λ, log_decay)`` with ``λ = softplus(L · dl)``, ``dl = extra``."""
        level_scales = self.level_scales(extra)
        form = "triton" if resolve_backend(self.backend, v, loglinear=True, beta=False) == "triton" else self.form
        return mix(q, k, v, log_decay, None, level_scales, form=form, chunk_size=self.chunk_size)
