"""Gated DeltaNet and log-linear Gated DeltaNet as layers (PAPER.md §5).

``H`` heads, key width ``K``, value width ``V = expand_v · K``:

    q, k, v = SiLU(short_conv(x W_q)), SiLU(short_conv(x W_k)), SiLU(short_conv(x W_v))
    q <- normalize(q) / √K,   k <- normalize(k)                      (L2 per head)
    β = sigmoid(x W_β),   g = -exp(A_log) · softplus(x W_a + dt_bias)  (per head, g <= 0)
    o = gated_deltanet_attention(q, k, v, g, β)
    y = o_proj(RMSNorm(o) ⊙ SiLU(x W_gate))                          (norm per head, then gate)

Log-linear Gated DeltaNet adds a bias-free ``l_proj`` giving ``dl`` (``H · L`` values) and reads the
Fenwick levels with ``λ = softplus(L_{h,ℓ} · dl)``: ``o = loglinear_attention(q, k, v, λ, g, β)``.
Here q is scaled by 1/√K, as in Gated DeltaNet. The authors' code divides λ by the same 1/√K that their kernel
then multiplies into q: the two cancel, and their operator applies no scale at all. So this layer's o is 1/√K
times theirs, a factor the per-head RMSNorm that follows removes except through its ε.

Decoding (:mod:`loglin_edu.layers.cache`): each short convolution keeps its last ``w - 1`` inputs; Gated
DeltaNet keeps one state ``[B, H, K, V]``, the log-linear layer a :class:`~loglin_edu.decoding.FenwickCache`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..decoding import FenwickCache, fenwick_step
from ..ops import REFERENCE_FORMS, mix, resolve_backend
from ..recurrence import read, transition, write
from .cache import MixerCache, check_room
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
        q, k, v, beta, log_decay = self.gates(
            self.q_conv(self.q_proj(x)), self.k_conv(self.k_proj(x)), self.v_conv(self.v_proj(x)), x
        )
        return self.output(self.mixer(q, k, v, log_decay, beta, x), x)

    def gates(self, q, k, v, x) -> tuple[torch.Tensor, ...]:
        """From the convolved projections (any leading dims): q, k ``[..., H, K]`` (L2-normalised, q / √K),
        v ``[..., H, V]``, β and log_decay ``[..., H]`` from the layer input x."""
        H, K, V = self.num_heads, self.key_dim, self.value_dim
        q = F.normalize(q.unflatten(-1, (H, K)), dim=-1, eps=1e-6) * K**-0.5
        k = F.normalize(k.unflatten(-1, (H, K)), dim=-1, eps=1e-6)
        beta = torch.sigmoid(self.b_proj(x))
        log_decay = -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
        return q, k, v.unflatten(-1, (H, V)), beta, log_decay

    def output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``o_proj(RMSNorm(o) ⊙ SiLU(x W_gate))``: o ``[..., H, V]``, x ``[..., d_model]`` -> ``[..., d_model]``."""
        return self.o_proj(self.o_norm(o.flatten(-2), self.gate_proj(x)))

    def state_size(self) -> int:
        """Entries of the recurrent state of one sequence: ``H · K · V`` (per Fenwick level when log-linear)."""
        return self.num_heads * self.key_dim * self.value_dim

    def mixer(self, q, k, v, log_decay, beta, x, return_state=False):
        """``gated_deltanet_attention(q, k, v, log_decay, beta)`` on the chosen backend. q, k: ``[B, T, H, K]``;
        v: ``[B, T, H, V]``; log_decay, beta: ``[B, T, H]``; x: the layer input. Returns ``[B, T, H, V]``
        (and with ``return_state`` the state ``[B, H, K, V]`` after the last token)."""
        form = "triton" if resolve_backend(self.backend, v, loglinear=False, beta=True) == "triton" else self.form
        return mix(q, k, v, log_decay, beta, form=form, chunk_size=self.chunk_size, return_state=return_state)

    def describe(self) -> str:
        """The layer's class and sizes: what a cache must have been made by."""
        return (f"{type(self).__name__}(d_model={self.q_proj.in_features}, num_heads={self.num_heads}, "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}, conv_size={self.q_conv.kernel_size})")

    def max_cache_len(self) -> int | None:
        """The longest cache the layer can decode into (None: no limit)."""
        return None

    def convolutions(self) -> dict[str, nn.Module]:
        """The three short convolutions by name (their windows in a cache have the same names)."""
        return {"q_conv": self.q_conv, "k_conv": self.k_conv, "v_conv": self.v_conv}

    def init_cache(
        self, batch: int, max_len: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixerCache:
        """The state before the first token: three convolution windows ``[batch, w-1, ·]`` and the mixer's
        state (:meth:`empty_state`), zeros."""
        check_room(0, max_len, self.max_cache_len(), self.describe())
        weight = self.q_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        windows = {
            name: torch.zeros(batch, conv.kernel_size - 1, conv.weight.shape[0], device=device, dtype=dtype)
            for name, conv in self.convolutions().items()
        }
        cache = MixerCache(self.describe(), batch, max_len, tensors=windows)
        self.empty_state(cache, device, dtype)
        return cache

    def empty_state(self, cache: MixerCache, device, dtype) -> None:
        """Gated DeltaNet's one state ``[B, H, K, V]``, zeros."""
        cache.tensors["state"] = torch.zeros(
            cache.batch, self.num_heads, self.key_dim, self.value_dim, device=device, dtype=dtype
        )

    def keep_state(self, cache: MixerCache, state) -> None:
        """Store a prefill's mixer state in the cache."""
        cache.tensors["state"] = state

    def prefill(self, x: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """The outputs ``[B, T, d_model]`` of a prompt x ``[B, T, d_model]`` and the cache after it."""
        B, T, _ = x.shape
        check_room(T, max_len, self.max_cache_len(), self.describe())
        raw = {"q_conv": self.q_proj(x), "k_conv": self.k_proj(x), "v_conv": self.v_proj(x)}
        convs = self.convolutions()
        q, k, v, beta, log_decay = self.gates(*(convs[name](raw[name]) for name in convs), x)
        o, state = self.mixer(q, k, v, log_decay, beta, x, return_state=True)
        windows = {name: convs[name].window(raw[name]) for name in convs}
        cache = MixerCache(self.describe(), B, max_len, position=T, tensors=windows)
        self.keep_state(cache, state)
        return self.output(o, x), cache

    def step(self, x_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token of every sequence: x_t ``[B, d_model]`` -> ``[B, d_model]``; advances ``cache``."""
        cache.check_step(self.describe(), x_t)
        raw = {"q_conv": self.q_proj(x_t), "k_conv": self.k_proj(x_t), "v_conv": self.v_proj(x_t)}
        convolved = []
        for name, conv in self.convolutions().items():
            y, cache.tensors[name] = conv.step(raw[name], cache.tensors[name])
            convolved.append(y)
        q, k, v, beta, log_decay = self.gates(*convolved, x_t)
        o = self.mixer_step(q, k, v, log_decay, beta, x_t, cache)
        cache.advance()
        return self.output(o.to(v.dtype), x_t)

    def mixer_step(self, q, k, v, log_decay, beta, x_t, cache: MixerCache) -> torch.Tensor:
        """``S <- exp(g)(I - β k kᵀ) S + β k vᵀ``, ``o = Sᵀ q``. q, k: ``[B, H, K]``; v: ``[B, H, V]``;
        log_decay, beta: ``[B, H]``."""
        state = cache.tensors["state"]
        q, k, v, log_decay, beta = (a.to(state.dtype) for a in (q, k, v, log_decay, beta))
        state = transition(state, k, log_decay, beta) + write(k, v, beta)
        cache.tensors["state"] = state
        return read(state, q)


class LogLinearGatedDeltaNet(GatedDeltaNet):
    """Log-linear Gated DeltaNet: one delta-rule state per Fenwick level, read with λ.

    max_len: the longest sequence accepted; it fixes ``num_levels(max_len)``. tie_levels: one λ per token and
    head for all levels (:class:`~loglin_edu.layers.LevelScales`). Other arguments as :class:`GatedDeltaNet`.
    """

    def __init__(self, d_model: int, *, max_len: int = 2048, tie_levels: bool = False, **kwargs) -> None:
        super().__init__(d_model, **kwargs)
        self.level_scales = LevelScales(self.num_heads, max_len, tie_levels)
        self.l_proj = nn.Linear(d_model, self.level_scales.inputs, bias=False)

    def mixer(self, q, k, v, log_decay, beta, x, return_state=False):
        """``loglinear_attention(q, k, v, λ, log_decay, beta)`` with ``λ = softplus(L · l_proj(x))`` (with
        ``return_state`` also the :class:`~loglin_edu.state.FenwickState` after the last token)."""
        level_scales = self.level_scales(self.l_proj(x))
        form = "triton" if resolve_backend(self.backend, v, loglinear=True, beta=True) == "triton" else self.form
        return mix(q, k, v, log_decay, beta, level_scales, form=form, chunk_size=self.chunk_size,
                   return_state=return_state)

    def describe(self) -> str:
        return super().describe()[:-1] + f", max_len={self.level_scales.max_len})"

    def max_cache_len(self) -> int:
        """λ has ``num_levels(max_len)`` levels: no decoding past the layer's ``max_len``."""
        return self.level_scales.max_len

    def empty_state(self, cache: MixerCache, device, dtype) -> None:
        """An empty :class:`~loglin_edu.decoding.FenwickCache` ``[B, H, num_levels(max_len) - 1, K, V]``."""
        cache.levels = FenwickCache.empty(
            cache.batch, self.num_heads, self.key_dim, self.value_dim, cache.max_len, dtype=dtype, device=device
        )

    def keep_state(self, cache: MixerCache, state) -> None:
        cache.levels = FenwickCache.from_state(state, cache.max_len)

    def mixer_step(self, q, k, v, log_decay, beta, x_t, cache: MixerCache) -> torch.Tensor:
        """One step of the Fenwick levels (:func:`~loglin_edu.decoding.fenwick_step`), λ from ``l_proj(x_t)``."""
        levels = cache.levels
        level_scales = self.level_scales(self.l_proj(x_t)[:, None])[:, 0, :, : levels.num_levels]  # [B, H, L]
        out, levels.levels, levels.position = fenwick_step(
            levels.levels, levels.position, q, k, v, level_scales, log_decay, beta
        )
        return out
