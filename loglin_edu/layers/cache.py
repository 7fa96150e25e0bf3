"""What a mixer keeps between decoding steps, and the checks that keep a cache with its layer.

Every mixer offers ``init_cache(batch, max_len)`` (before the first token), ``prefill(x, max_len)``
(a prompt: the outputs and the cache after it) and ``step(x_t, cache)`` (one token, ``x_t: [B, d_model]``).
What each cache holds, per sequence:

| mixer | tensors | memory |
|---|---|---|
| softmax attention | keys and values ``[B, H, max_len, D]`` (RoPE applied) | O(T) |
| Mamba-2, Gated DeltaNet | one state ``[B, H, K, V]``, short-convolution windows | O(1) |
| log-linear versions | a :class:`~loglin_edu.decoding.FenwickCache` ``[B, H, L, K, V]``, windows | O(log T) |
| gated convolution (hybrid layers) | its window | O(1) |

A short convolution of width ``w`` keeps its last ``w - 1`` inputs (``[B, w - 1, C]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding import FenwickCache


@dataclass
class MixerCache:
    """The decoding state of one mixer for ``batch`` sequences of at most ``max_len`` tokens.

    owner: the layer that made it, as :meth:`describe` of that layer (class and sizes); position: tokens
    consumed so far; tensors: named state tensors (table in the module docstring); levels: the Fenwick
    levels of a log-linear mixer, else None.
    """

    owner: str
    batch: int
    max_len: int
    position: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    levels: FenwickCache | None = None

    def state_bytes(self) -> int:
        """Bytes held by the cache's tensors (keys and values at full ``max_len`` for attention)."""
        held = sum(t.numel() * t.element_size() for t in self.tensors.values())
        return held + (0 if self.levels is None else self.levels.state_bytes())

    def check_step(self, owner: str, x_t: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``x_t: [batch, d]`` can take one more step with this cache of ``owner``."""
        if self.owner != owner:
            raise ValueError(f"this cache was made by another layer: {self.owner}, not {owner}")
        if x_t.dim() != 2 or x_t.shape[0] != self.batch:
            raise ValueError(
                f"x_t must have shape [B={self.batch}, d_model] (the cache's batch), got {tuple(x_t.shape)}"
            )
        if self.position >= self.max_len:
            raise ValueError(
                f"decoding past max_len={self.max_len}: the cache already holds {self.position} tokens"
            )

    def advance(self) -> None:
        """Count one consumed token."""
        self.position += 1


def check_room(length: int, max_len: int, limit: int | None, what: str) -> None:
    """A prefill of ``length`` tokens into a cache of ``max_len`` tokens, for a layer ``what`` that decodes
    at most ``limit`` tokens (None: no limit)."""
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len={max_len} is more than {what} can decode ({limit} tokens)")
    if length > max_len:
        raise ValueError(f"a prompt of {length} tokens does not fit in a cache of max_len={max_len}")
