"""Causal softmax attention, the Transformer's sequence mixer, with an optional short convolution before it.

    x <- short_conv(x)                       (when conv_size > 0: Zoology's token shift, width 3 in the recall tiers)
    q, k, v = x W_qkv,   q, k <- RoPE(q), RoPE(k)  (when rope)
    o_t = Σ_{s<=t} softmax_s(q_t·k_s / √D_h) v_s,   y = o W_o

The short convolution is a causal depthwise convolution without activation: channel ``c`` of ``x_t`` becomes
``Σ_{i<w} W[c, i] x_{t-w+1+i, c} + b_c``, so every token's q, k and v also see the ``w - 1`` tokens before it.
Zoology's attention baseline has it (``BaseConv`` before ``MHA``) and no position embedding: the convolution
already tells a token what came just before it, which is what associative recall needs (a key's value is the
token after the key). The four recurrent mixers have their own short convolutions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..ops import REFERENCE_FORMS, softmax_attention
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
        if self.conv is not None:
            x = self.conv(x)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)  # [B, T, H, D_h]
        if self.rope:
            q, k = rotary(q, self.rope_base), rotary(k, self.rope_base)
        backend = self.backend if self.backend != "auto" else ("sdpa" if x.is_cuda else "torch")
        if backend == "sdpa":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            o = o.transpose(1, 2)
        else:
            o = softmax_attention(q, k, v, form=self.form, chunk_size=self.chunk_size)
        return self.out_proj(o.flatten(2))
