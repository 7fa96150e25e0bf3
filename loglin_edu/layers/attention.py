"""Causal softmax attention, the Transformer's sequence mixer, with an optional short convolution before it.

    x <- short_conv(x)                       (when conv_size > 0: Zoology's token shift, width 3 in the recall tiers)
    q, k, v = x W_qkv,   q, k <- RoPE(q), RoPE(k)  (when rope)
    o_t = Σ_{s<=t} softmax_s(q_t·k_s / √D_h) v_s,   y = o W_o

The short convolution is a causal depthwise convolution without activation: channel ``c`` of ``x_t`` becomes
``Σ_{i<w} W[c, i] x_{t-w+1+i, c} + b_c``, so every token's q, k and v also see the ``w - 1`` tokens before it.
Zoology's attention baseline has such a shift and no position embedding (its first layer is the convolution,
``BaseConv``, its second ``MHA``; here the convolution runs before attention inside every layer): the convolution
already tells a token what came just before it, which is what associative recall needs (a key's value is the
token after the key). The four recurrent mixers have their own short convolutions.

Decoding keeps a KV cache: the keys (rotated when ``rope``) and the values of every token so far (O(T) memory),
and the convolution's last ``w - 1`` inputs; a step shifts its input, projects it at its own position, appends
its key and value and attends over the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..ops import REFERENCE_FORMS, softmax_attention
from .cache import MixerCache, check_room
from .parts import ShortConvolution, rotary

SOFTMAX_BACKENDS = ("auto", "torch", "sdpa")


class SoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention. x: ``[B, T, d_model]`` -> ``[B, T, d_model]``.

    conv_size: width of the short causal convolution applied to x first (0: none); rope: rotary position
    embeddings on q and k. backend: ``"torch"`` runs the package's :func:`~loglin_edu.softmax_attention`
    (``form`` = naive, recurrent or chunkwise); ``"sdpa"`` runs PyTorch's fused ``scaled_dot_product_attention``
    (the FlashAttention kernel on a GPU); ``"auto"`` picks ``"sdpa"`` on CUDA and ``"torch"`` elsewhere. Inside
    :func:`torch.func.vmap` SDPA is correct but runs member by member: an ensemble picks ``"torch"``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 1,
        *,
        conv_size: int = 0,
        rope: bool = True,
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
        if not isinstance(conv_size, int) or conv_size < 0:
            raise ValueError(f"conv_size must be an integer >= 0 (0: no convolution), got {conv_size!r}")
        check_form(form, REFERENCE_FORMS)
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.rope, self.rope_base = rope, rope_base
        self.backend, self.form, self.chunk_size = backend, form, chunk_size
        self.conv = ShortConvolution(d_model, conv_size, activation=False) if conv_size else None
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(self.shift(x))
        return self.out_proj(self.attend(q, k, v).flatten(2))

    def shift(self, x: torch.Tensor) -> torch.Tensor:
        """The short convolution (the identity without one). ``[B, T, d_model] -> [B, T, d_model]``."""
        return x if self.conv is None else self.conv(x)

    def project(self, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (rotated at positions ``offset..offset+T-1`` when ``rope``), v: ``[B, T, H, D_h]`` from the shifted
        x ``[B, T, d_model]``."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)
        if not self.rope:
            return q, k, v
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
        conv = 0 if self.conv is None else self.conv.kernel_size
        return (f"SoftmaxAttention(d_model={self.qkv.in_features}, num_heads={self.num_heads}, conv_size={conv}, "
                f"rope={self.rope})")

    def init_cache(
        self, batch: int, max_len: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixerCache:
        """An empty KV cache: keys and values ``[batch, H, max_len, D_h]`` (zeros), the convolution's window
        ``[batch, w - 1, d_model]`` when there is one, position 0."""
        check_room(0, max_len, None, self.describe())
        weight = self.qkv.weight
        shape = (batch, self.num_heads, max_len, self.head_dim)
        zeros = {"device": device or weight.device, "dtype": dtype or weight.dtype}
        tensors = {"keys": torch.zeros(shape, **zeros), "values": torch.zeros(shape, **zeros)}
        if self.conv is not None:
            tensors["conv"] = torch.zeros(batch, self.conv.kernel_size - 1, self.qkv.in_features, **zeros)
        return MixerCache(self.describe(), batch, max_len, tensors=tensors)

    def prefill(self, x: torch.Tensor, max_len: int) -> tuple[torch.Tensor, MixerCache]:
        """The outputs ``[B, T, d_model]`` of a prompt x ``[B, T, d_model]`` and the KV cache after it."""
        B, T, _ = x.shape
        check_room(T, max_len, None, self.describe())
        q, k, v = self.project(self.shift(x))
        cache = self.init_cache(B, max_len, device=x.device, dtype=k.dtype)
        cache.tensors["keys"][:, :, :T] = k.transpose(1, 2)
        cache.tensors["values"][:, :, :T] = v.transpose(1, 2)
        if self.conv is not None:
            cache.tensors["conv"] = self.conv.window(x).to(k.dtype)
        cache.position = T
        return self.out_proj(self.attend(q, k, v).flatten(2)), cache

    def step(self, x_t: torch.Tensor, cache: MixerCache) -> torch.Tensor:
        """One token of every sequence: x_t ``[B, d_model]`` -> ``[B, d_model]``; appends to ``cache``."""
        cache.check_step(self.describe(), x_t)
        t = cache.position
        shifted = x_t
        if self.conv is not None:
            shifted, cache.tensors["conv"] = self.conv.step(x_t.to(cache.tensors["conv"].dtype), cache.tensors["conv"])
        q, k, v = (y[:, 0].to(cache.tensors["keys"].dtype) for y in self.project(shifted[:, None], offset=t))
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
