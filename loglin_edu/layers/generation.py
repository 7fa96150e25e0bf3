"""Generation with a decoding cache: the model's cache, and how the next token is drawn.

A language model decodes a prompt in two phases:

1. **prefill**: run the prompt ``[B, T]`` through every layer once (the parallel forms) and keep what each
   layer needs to go on (:class:`ModelCache`, one :class:`~loglin_edu.layers.cache.MixerCache` per block);
2. **decode**: feed one token per step; each layer updates its cache in ``O(1)`` (linear), ``O(log T)``
   (log-linear) or ``O(T)`` (softmax attention) time and memory.

The next token is drawn from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits,
or is the argmax when ``temperature == 0`` (greedy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .cache import MixerCache


@dataclass
class ModelCache:
    """The decoding state of a :class:`~loglin_edu.layers.LanguageModel` for ``batch`` sequences.

    owner: the identity of the model that made it (see ``LanguageModel.cache_owner``); config: that
    model's configuration as a dict; position: tokens consumed; layers: one cache per block.
    """

    owner: int
    config: dict[str, Any]
    batch: int
    max_len: int
    position: int = 0
    layers: list[MixerCache] = field(default_factory=list)

    def state_bytes(self) -> int:
        """Bytes held by every layer's cache."""
        return sum(layer.state_bytes() for layer in self.layers)


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per sequence from logits ``[B, vocab]`` -> ``[B]`` (int64), as the module docstring says."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


def check_generation(prompt, max_new_tokens, temperature, top_k, max_len: int) -> None:
    """The arguments of ``generate``: a ``[B, T]`` int prompt with ``T + max_new_tokens <= max_len``."""
    if not isinstance(prompt, torch.Tensor) or prompt.dtype not in (torch.int64, torch.int32) or prompt.dim() != 2:
        got = f"{prompt.dtype} of shape {tuple(prompt.shape)}" if isinstance(prompt, torch.Tensor) else type(prompt)
        raise ValueError(f"prompt must be an int tensor [B, T] or [T], got {got}")
    if prompt.shape[1] < 1:
        raise ValueError("prompt must hold at least one token (T >= 1), got T=0")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if prompt.shape[1] + max_new_tokens > max_len:
        raise ValueError(
            f"a prompt of T={prompt.shape[1]} tokens plus max_new_tokens={max_new_tokens} is longer than the "
            f"model's max_len={max_len}"
        )
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
