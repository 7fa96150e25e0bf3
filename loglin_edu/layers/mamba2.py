"""Mamba-2 and log-linear Mamba-2 as layers (PAPER.md §5).

Mamba-2 mixer, ``H`` heads of width ``P``, state width ``N``, one group (B, C shared by all heads):

    [z, x, B, C, dt_raw] = in_proj(u)                         u: [B, T, d_model]
    [x, B, C] = SiLU(short_conv([x, B, C]))
    dt = softplus(dt_raw + dt_bias),   g = -exp(A_log) · dt   (per head, g <= 0)
    y = mamba2_attention(q=C, k=B, v=x · dt, log_decay=g) + D · x
    out = out_proj(RMSNorm(y ⊙ SiLU(z)))

Log-linear Mamba-2 adds ``H · L`` outputs ``dl`` to ``in_proj`` and reads every Fenwick level with
``λ = softplus(L_{h,ℓ} · dl)``: ``y = loglinear_attention(C, B, x · dt, λ, g) + D · x``.

Decoding (:mod:`loglin_edu.layers.cache`): the short convolution keeps its last ``w - 1`` inputs; Mamba-2
keeps one state ``[B, H, N, P]``, log-linear Mamba-2 a :class:`~loglin_edu.decoding.FenwickCache`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..decoding import FenwickCache, lazy_fenwick_step
from ..fenwick import num_levels
from ..ops import REFERENCE_FORMS, mix, resolve_backend
from ..recurrence import read, transition, write
from .cache import MixerCache, check_room
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
        z, xbc, dt, extra = self.split_projection(self.in_proj(u))
        x, b, c, v, log_decay = self.gates(self.conv(xbc), dt)
        y = self.mixer(c[:, :, None], b[:, :, None], v, log_decay, extra)  # q = C, k = B: one group, all heads
        return self.output(y, x, z)

    def split_projection(self, projected: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``in_proj(u)`` ``[..., ·]`` -> z ``[..., H·P]``, xbc ``[..., H·P + 2N]`` (before the convolution),
        dt_raw ``[..., H]``, extra ``[..., ·]``."""
        H, N = self.num_heads, self.d_state
        return projected.split([self.d_inner, self.d_inner + 2 * N, H, self.extra_outputs()], -1)

    def gates(self, xbc: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """From the convolved ``xbc`` and ``dt_raw`` (any leading dims): x ``[..., H, P]``, B, C ``[..., N]``,
        v = x · dt ``[..., H, P]``, log_decay ``[..., H]``."""
        x, b, c = xbc.split([self.d_inner, self.d_state, self.d_state], -1)
        dt = F.softplus(dt + self.dt_bias)
        x = x.unflatten(-1, (self.num_heads, self.head_dim))
        return x, b, c, x * dt[..., None], -torch.exp(self.A_log) * dt

    def output(self, y: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``out_proj(RMSNorm((y + D·x) ⊙ SiLU(z)))``: y, x ``[..., H, P]``, z ``[..., H·P]`` -> ``[..., d_model]``."""
        y = y + self.D[:, None] * x
        return self.out_proj(self.norm(y.flatten(-2), z))

    def mixer(self, q, k, v, log_decay, extra, return_state=False):
        """``mamba2_attention(q, k, v, log_decay)`` on the chosen backend. q, k: ``[B, T, 1, N]``; v:
        ``[B, T, H, P]``; log_decay: ``[B, T, H]``. Returns ``[B, T, H, P]`` (and with ``return_state`` the
        state ``[B, H, N, P]`` after the last token)."""
        form = "triton" if resolve_backend(self.backend, v, loglinear=False, beta=False) == "triton" else self.form
        return mix(q, k, v, log_decay, form=form, chunk_size=self.chunk_size, return_state=return_state)

    def describe(self) -> str:
        """The layer's class and sizes: what a cache must have been made by."""
        return (f"{type(self).__name__}(d_model={self.in_proj.in_features}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, d_state={self.d_state}, conv_size={self.conv.kernel_size})")

    def max_cache_len(self) -> int | None:
        """The longest cache the layer can decode into (None: no limit)."""
        return None

    def init_cache(
        self, batch: int, max_len: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixerCache:
        """The state before the first token: convolution window ``[batch, w-1, H·P + 2N]`` and the mixer's
        state (:meth:`empty_state`), zeros."""
        check_room(0, max_len, self.max_cache_len(), self.describe())
        weight = self.in_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        window = torch.zeros(batch, self.conv.kernel_size - 1, self.conv.weight.shape[0], device=device, dtype=dtype)
        cache = MixerCache(self.describe(), batch, max_len, tensors={"conv": window})
        self.empty_state(cache, device, dtype)
        return cache

    def empty_state(self, cache: MixerCache, device, dtype) -> None:
        """Mamba-2's one state ``[B, H, N, P]``, zeros."""
        cache.tensors["state"] = torch.zeros(
            cache.batch, self.num_heads, self.d_state, self.head_dim, device=device, dtype=dtype
        )

    def prefill(self, u: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """The outputs ``[B, T, d_model]`` of a prompt u ``[B, T, d_model]`` and the cache after it."""
        B, T, _ = u.shape
        check_room(T, max_len, self.max_cache_len(), self.describe())
        z, xbc, dt, extra = self.split_projection(self.in_proj(u))
        x, b, c, v, log_decay = self.gates(self.conv(xbc), dt)
        y, state = self.mixer(c[:, :, None], b[:, :, None], v, log_decay, extra, return_state=True)
        cache = MixerCache(self.describe(), B, max_len, position=T, tensors={"conv": self.conv.window(xbc)})
        self.keep_state(cache, state)
        return self.output(y, x, z), cache

    def keep_state(self, cache: MixerCache, state) -> None:
        """Store a prefill's mixer state in the cache."""
        cache.tensors["state"] = state

    def step(self, u_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token of every sequence: u_t ``[B, d_model]`` -> ``[B, d_model]``; advances ``cache``."""
        cache.check_step(self.describe(), u_t)
        z, xbc, dt, extra = self.split_projection(self.in_proj(u_t))
        xbc, cache.tensors["conv"] = self.conv.step(xbc, cache.tensors["conv"])
        x, b, c, v, log_decay = self.gates(xbc, dt)
        heads = (u_t.shape[0], self.num_heads, self.d_state)
        y = self.mixer_step(c[:, None].expand(heads), b[:, None].expand(heads), v, log_decay, extra, cache)
        cache.advance()
        return self.output(y.to(x.dtype), x, z)

    def mixer_step(self, q, k, v, log_decay, extra, cache: MixerCache) -> torch.Tensor:
        """``S <- exp(g) S + k vᵀ``, ``y = Sᵀ q``. q, k: ``[B, H, N]``; v: ``[B, H, P]``; log_decay: ``[B, H]``."""
        state = cache.tensors["state"]
        q, k, v, log_decay = (a.to(state.dtype) for a in (q, k, v, log_decay))
        state = transition(state, k, log_decay, None) + write(k, v, None)
        cache.tensors["state"] = state
        return read(state, q)


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

    def mixer(self, q, k, v, log_decay, extra, return_state=False):
        """``loglinear_attention(q, k, v, λ, log_decay)`` with ``λ = softplus(L · dl)``, ``dl = extra``
        (with ``return_state`` also the :class:`~loglin_edu.state.FenwickState` after the last token)."""
        level_scales = self.level_scales(extra)
        form = "triton" if resolve_backend(self.backend, v, loglinear=True, beta=False) == "triton" else self.form
        return mix(q, k, v, log_decay, None, level_scales, form=form, chunk_size=self.chunk_size,
                   return_state=return_state)

    def describe(self) -> str:
        return super().describe()[:-1] + f", max_len={self.max_len})"

    def max_cache_len(self) -> int:
        """λ has ``num_levels(max_len)`` levels: no decoding past the layer's ``max_len``."""
        return self.max_len

    def empty_state(self, cache: MixerCache, device, dtype) -> None:
        """An empty :class:`~loglin_edu.decoding.FenwickCache` ``[B, H, num_levels(max_len) - 1, N, P]`` in the
        lazy layout (the levels' decay kept as scales ``[B, H, L, P]``: a step rewrites one tile, not every live
        one)."""
        cache.levels = FenwickCache.empty(
            cache.batch, self.num_heads, self.d_state, self.head_dim, cache.max_len, dtype=dtype, device=device,
            lazy=True,
        )

    def keep_state(self, cache: MixerCache, state) -> None:
        cache.levels = FenwickCache.from_state(state, cache.max_len, lazy=True)

    def mixer_step(self, q, k, v, log_decay, extra, cache: MixerCache) -> torch.Tensor:
        """One step of the Fenwick levels (lazy layout), λ from ``extra``: the Triton decode kernel
        (:mod:`loglin_edu.kernels.decode_step`, its default schedule, in place, one launch) when the backend is
        ``"triton"`` and the levels are float32, else :func:`~loglin_edu.decoding.lazy_fenwick_step`."""
        levels = cache.levels
        level_scales = self.level_scales(extra[:, None])[:, 0, :, : levels.num_levels]  # [B, H, L]
        kernel = resolve_backend(self.backend, v, loglinear=True, beta=False) == "triton"
        if kernel and levels.levels.dtype == torch.float32 and self.d_state <= 128:
            from ..kernels.decode_step import decode_step_

            return decode_step_(levels.levels, levels.position, q[:, :1], k[:, :1], v, level_scales, log_decay,
                                decay_scales=levels.decay_scales)
        out, levels.levels, levels.decay_scales, levels.position = lazy_fenwick_step(
            levels.levels, levels.decay_scales, levels.position, q, k, v, level_scales, log_decay
        )
        return out
