"""Causal softmax attention with rotary position embeddings: the Transformer's sequence mixer.

    q, k, v = x W_qkv,   q, k <- RoPE(q), RoPE(k),   o_t = Σ_{s<=t} softmax_s(q_t·k_s / √D_h) v_s,   y = o W_o
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_form
from ..ops import REFERENCE_FORMS, softmax_attention
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
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(2)  # [B, T, H, D_h]
        q, k = rotary(q, self.rope_base), rotary(k, self.rope_base)
        backend = self.backend if self.backend != "auto" else ("sdpa" if x.is_cuda else "torch")
        if backend == "sdpa":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            o = o.transpose(1, 2)
        else:
            o = softmax_attention(q, k, v, form=self.form, chunk_size=self.chunk_size)
        return self.out_proj(o.flatten(2))
