"""Causal softmax attention in three forms.

    o_t = Σ_{s <= t} softmax_s(scale · q_t · k_s) v_s,        scale = 1/√K unless given

- ``naive``:     the ``T × T`` score matrix, masked and normalised row by row: O(T²) time and memory.
- ``recurrent``: decoding with a KV cache: token ``t`` attends to the ``t + 1`` cached keys; the cache
  grows as O(T).
- ``chunkwise``: FlashAttention's online softmax over blocks of keys: a running maximum ``m``, a
  running sum ``l`` and an unnormalised accumulator, rescaled by ``exp(m_old - m_new)`` whenever the
  maximum grows. O(T²) time, O(T·C) memory.

The forms are heads-first (``[B, H, T, D]``); :func:`~loglin_edu.ops.softmax_attention` checks its
``[B, T, H, D]`` inputs and dispatches to them.
"""

from __future__ import annotations

import torch

from .masks import causal_mask


def naive_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]`` -> ``[B, H, T, V]``."""
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~causal_mask(q.shape[2], q.device), float("-inf"))
    return scores.softmax(dim=-1) @ v


def recurrent_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Decoding with a KV cache, one token at a time. Shapes as :func:`naive_softmax`."""
    outputs = []
    for t in range(q.shape[2]):
        cached_k, cached_v = k[:, :, : t + 1], v[:, :, : t + 1]  # the cache after writing token t
        weights = (torch.einsum("bhk,bhsk->bhs", q[:, :, t], cached_k) * scale).softmax(dim=-1)
        outputs.append(torch.einsum("bhs,bhsv->bhv", weights, cached_v))
    return torch.stack(outputs, dim=2)


def chunkwise_softmax(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, chunk_size: int
) -> torch.Tensor:
    """Online softmax over key blocks of ``chunk_size`` (FlashAttention). Shapes as :func:`naive_softmax`."""
    T = q.shape[2]
    pos = torch.arange(T, device=q.device)
    blocks = []
    for q_start in range(0, T, chunk_size):
        q_blk = q[:, :, q_start : q_start + chunk_size] * scale
        q_pos = pos[q_start : q_start + chunk_size]
        running_max = q.new_full(q_blk.shape[:-1], float("-inf"))
        running_sum = q.new_zeros(q_blk.shape[:-1])
        acc = q.new_zeros(*q_blk.shape[:-1], v.shape[-1])
        for k_start in range(0, q_start + q_blk.shape[2], chunk_size):
            k_blk, v_blk = k[:, :, k_start : k_start + chunk_size], v[:, :, k_start : k_start + chunk_size]
            scores = q_blk @ k_blk.transpose(-1, -2)
            visible = q_pos[:, None] >= pos[k_start : k_start + chunk_size][None, :]
            scores = scores.masked_fill(~visible, float("-inf"))
            new_max = torch.maximum(running_max, scores.amax(dim=-1))
            rescale = (running_max - new_max).exp()
            probs = (scores - new_max[..., None]).exp()
            running_sum = running_sum * rescale + probs.sum(dim=-1)
            acc = acc * rescale[..., None] + probs @ v_blk
            running_max = new_max
        blocks.append(acc / running_sum[..., None])
    return torch.cat(blocks, dim=2)
