"""Chapter 1: decoding with a KV cache, and merging two blocks of an online softmax."""

from __future__ import annotations

import math

import torch

from ..ops import softmax_attention
from .checking import Case, Exercise, Mismatch, call, sequence_cases


def kv_cache_step(cache, q_t, k_t, v_t):
    """One decoding step of causal softmax attention with scale ``1/√K``.

    cache: ``(keys [B, n, H, K], values [B, n, H, V])`` of the ``n`` tokens so far; q_t, k_t: ``[B, H, K]``;
    v_t: ``[B, H, V]``. Returns the cache with token t appended and ``o_t: [B, H, V]``.
    """
    keys = torch.cat([cache[0], k_t[:, None]], dim=1)
    values = torch.cat([cache[1], v_t[:, None]], dim=1)
    weights = (torch.einsum("bhk,bshk->bhs", q_t, keys) / math.sqrt(q_t.shape[-1])).softmax(dim=-1)
    return (keys, values), torch.einsum("bhs,bshv->bhv", weights, values)


def _unscaled_step(cache, q_t, k_t, v_t):
    return kv_cache_step(cache, q_t * math.sqrt(q_t.shape[-1]), k_t, v_t)


def _drive_decoding(step, q, k, v):
    """Decode the whole sequence with ``step``, checking that the cache grows by one token per step."""
    B, T, H, K = q.shape
    cache = (q.new_zeros(B, 0, H, K), v.new_zeros(B, 0, H, v.shape[-1]))
    outputs = []
    for t in range(T):
        cache, o_t = call(step, cache, q[:, t], k[:, t], v[:, t])
        if cache[0].shape[1] != t + 1 or cache[1].shape[1] != t + 1:
            raise Mismatch(f"after token {t} the cache should hold {t + 1} keys and values, "
                           f"it holds {cache[0].shape[1]} and {cache[1].shape[1]}")
        outputs.append(o_t)
    return torch.stack(outputs, dim=1)


KV_CACHE_STEP = Exercise(
    name="softmax.kv_cache_step",
    chapter=1,
    signature="kv_cache_step(cache, q_t, k_t, v_t) -> (cache, o_t)",
    task="Decode one token of causal softmax attention: append `k_t`, `v_t` to the cache "
         "`(keys [B, n, H, K], values [B, n, H, V])` and return the new cache and `o_t: [B, H, V]`, "
         "the softmax-weighted sum of the cached values with scores `q_t · k_s / √K`.",
    solution=kv_cache_step,
    cases=sequence_cases,
    driver=_drive_decoding,
    reference=lambda q, k, v: softmax_attention(q, k, v, form="naive"),
    mistakes=((_unscaled_step, "the scores are scaled by 1/√K before the softmax."),),
)


def block_stats(scores: torch.Tensor, values: torch.Tensor):
    """Online-softmax statistics of one block of keys.

    scores: ``[..., S]``; values: ``[..., S, V]``. Returns ``m = max_s score`` and ``l = Σ_s exp(score - m)``
    (both ``[...]``) and ``acc = Σ_s exp(score - m) v_s`` (``[..., V]``); the block's output is ``acc / l``.
    """
    m = scores.amax(dim=-1)
    weights = (scores - m[..., None]).exp()
    return m, weights.sum(dim=-1), weights @ values


def merge_softmax_blocks(m1, l1, acc1, m2, l2, acc2):
    """Statistics of two blocks of keys together, from each block's :func:`block_stats`.

    ``m = max(m1, m2)``; each block is rescaled by ``exp(m_i - m)`` before the sums are added.
    """
    m = torch.maximum(m1, m2)
    scale1, scale2 = (m1 - m).exp(), (m2 - m).exp()
    return m, scale1 * l1 + scale2 * l2, scale1[..., None] * acc1 + scale2[..., None] * acc2


def _merge_without_rescaling(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def _blocks(rng):
    for _ in range(12):
        B, H, T, S, V = rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 9), rng.randint(2, 40), rng.randint(1, 5)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        scores = rng.uniform(1, 8) * torch.randn(B, H, T, S, generator=gen, dtype=torch.float64)
        values = torch.randn(B, H, S, V, generator=gen, dtype=torch.float64)
        cut = rng.randint(1, S - 1)
        first = block_stats(scores[..., :cut], values[..., :cut, :])
        second = block_stats(scores[..., cut:], values[..., cut:, :])
        yield Case((*first, *second, scores, values), f"B={B}, H={H}, T={T}, V={V}, keys {cut} + {S - cut}")


MERGE_SOFTMAX_BLOCKS = Exercise(
    name="softmax.merge_softmax_blocks",
    chapter=1,
    signature="merge_softmax_blocks(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)",
    task="Each block of keys gives a running maximum `m`, a sum `l = Σ exp(score - m)` and an accumulator "
         "`acc = Σ exp(score - m) v` (`m, l: [B, H, T]`, `acc: [B, H, T, V]`). Return the same three "
         "statistics for the two blocks together, as FlashAttention does when it moves to the next block.",
    solution=merge_softmax_blocks,
    cases=_blocks,
    driver=lambda fn, m1, l1, acc1, m2, l2, acc2, scores, values: tuple(call(fn, m1, l1, acc1, m2, l2, acc2)),
    reference=lambda m1, l1, acc1, m2, l2, acc2, scores, values: block_stats(scores, values),
    mistakes=((_merge_without_rescaling, "before adding, rescale each block's l and acc by exp(m_i - m)."),),
)

EXERCISES = (KV_CACHE_STEP, MERGE_SOFTMAX_BLOCKS)
