"""Causal softmax attention with rotary position embeddings: the Transformer's sequence mixer.

    q, k, v = x W_qkv,   q, k <- RoPE(q), RoPE(k),   o_t = Σ_{s<=t} softmax_s(q_t·k_s / √D_h) v_s,   y = o W_o

Decoding keeps a KV cache: the rotated keys and the values of every token so far (O(T) memory); a step
rotates its query and key at its own position, appends them and attends over the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..ops import REFERENCE_FORMS, softmax_attention
from .cache import MixerCache, check_room
from .parts import rotary

SOFTMAX_BACKENDS = ("auto", "torch", "sdpa")


class SoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention with RoPE. x: ``[B, T, d_model]`` -> ``[B, T, d_model]``.

    backend: ``"torch"`` runs the package's :func:`~loglin_edu.softmax_attention` (``form`` = naive,
    recurrent or chunkwise); ``"sdpa"`` runs PyTorch's fused ``scaled_dot_product_attention`` (the
    FlashAttention kernel on a GPU); ``"auto"`` picks ``"sdpa"`` on CUDA and ``"torch"`` elsewhere. Inside
    :func:`torch.func.vmap` SDPA is correct but runs member by member: an ensemble picks ``"torch"``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 1,
        *,
        rope_base: float = 10000.0,
        backend: str = "auto",
        form: str = "chunkwise",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into num_heads={num_heads} heads of even width")
        if backend not in SOFTMAX_BACKENDS:
            raise ValueError(f"backend must be one of {SOFTMAX_BACKENDS}, got {backend!r}")
        check_form(form, REFERENCE_FORMS)
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.rope_base, self.backend, self.form, self.chunk_size = rope_base, backend, form, chunk_size
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.out_proj(self.attend(q, k, v).flatten(2))

    def project(self, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (rotated at positions ``offset..offset+T-1``), v: ``[B, T, H, D_h]`` from x ``[B, T, d_model]``."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)
        return rotary(q, self.rope_base, offset), rotary(k, self.rope_base, offset), v

    def resolved_backend(self, x: torch.Tensor) -> str:
        """``"sdpa"`` or ``"torch"`` (class docstring)."""
        return self.backend if self.backend != "auto" else ("sdpa" if x.is_cuda else "torch")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax attention of ``[B, T, H, D_h]`` inputs -> ``[B, T, H, D_h]``."""
        if self.resolved_backend(q) == "sdpa":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            return o.transpose(1, 2)
        return softmax_attention(q, k, v, form=self.form, chunk_size=self.chunk_size)

    def describe(self) -> str:
        """The layer's class and sizes: what a cache must have been made by."""
        return f"SoftmaxAttention(d_model={self.qkv.in_features}, num_heads={self.num_heads})"

    def init_cache(
        self, batch: int, max_len: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixerCache:
        """An empty KV cache: keys and values ``[batch, H, max_len, D_h]`` (zeros), position 0."""
        check_room(0, max_len, None, self.describe())
        weight = self.qkv.weight
        shape = (batch, self.num_heads, max_len, self.head_dim)
        zeros = {"device": device or weight.device, "dtype": dtype or weight.dtype}
        tensors = {"keys": torch.zeros(shape, **zeros), "values": torch.zeros(shape, **zeros)}
        return MixerCache(self.describe(), batch, max_len, tensors=tensors)

    def prefill(self, x: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """The outputs ``[B, T, d_model]`` of a prompt x ``[B, T, d_model]`` and the KV cache after it."""
        B, T, _ = x.shape
        check_room(T, max_len, None, self.describe())
        q, k, v = self.project(x)
        cache = self.init_cache(B, max_len, device=x.device, dtype=k.dtype)
        cache.tensors["keys"][:, :, :T] = k.transpose(1, 2)
        cache.tensors["values"][:, :, :T] = v.transpose(1, 2)
        cache.position = T
        return self.out_proj(self.attend(q, k, v).flatten(2)), cache

    def step(self, x_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token of every sequence: x_t ``[B, d_model]`` -> ``[B, d_model]``; appends to ``cache``."""
        cache.check_step(self.describe(), x_t)
        t = cache.position
        q, k, v = (y[:, 0].to(cache.tensors["keys"].dtype) for y in self.project(x_t[:, None], offset=t))
        cache.tensors["keys"][:, :, t] = k
        cache.tensors["values"][:, :, t] = v
        keys, values = cache.tensors["keys"][:, :, : t + 1], cache.tensors["values"][:, :, : t + 1]
        if self.resolved_backend(x_t) == "sdpa":
            o = F.scaled_dot_product_attention(q[:, :, None], keys, values)[:, :, 0]
        else:
            weights = (torch.einsum("bhd,bhsd->bhs", q, keys) * self.head_dim**-0.5).softmax(dim=-1)
            o = torch.einsum("bhs,bhsd->bhd", weights, values)
        cache.advance()
        return self.out_proj(o.flatten(1).to(x_t.dtype))
