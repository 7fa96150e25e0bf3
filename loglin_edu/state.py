"""The decoding state of log-linear attention: one ``K × V`` state per Fenwick level, a binary counter.

At step ``t`` level ``l`` holds the keys of query ``t``'s bucket ``l``, carried to ``t``:

    S_t^(l) = Σ_{s : level(t, s) = l} exp(G_t - G_s) P_{t,s} β_s k_s v_sᵀ,       o_t = Σ_l λ[t, l] S_t^(l)ᵀ q_t

(``P_{t,s}`` the delta-rule factors, ``β = 1`` without them). One step ``t >= 1``, with ``j`` the number
of trailing zero bits of ``t``:

1. merge levels ``0..j`` into level ``j + 1`` (which is empty) and clear them — a binary-counter carry;
2. apply the token's transition ``exp(g_t)(I - β_t k_t k_tᵀ)`` to every level;
3. write ``β_t k_t v_tᵀ`` into level 0.

A length-T sequence never holds more than ``num_levels(T)`` levels: O(log T) memory.
"""

from __future__ import annotations

import torch

from .fenwick import trailing_zeros
from .recurrence import read, transition, write


class FenwickState:
    """Log-linear decoding state for ``B`` sequences and ``H`` heads (levels are ``[B, H, K, V]``).

    ``levels[l]`` is the state of level ``l`` or ``None`` while that bucket is empty. Use :meth:`step`
    once per token; ``position`` is the index the next token will get.
    """

    def __init__(self) -> None:
        self.levels: list[torch.Tensor | None] = []
        self.position = 0

    @property
    def num_states(self) -> int:
        """Number of non-empty levels held now (``popcount(t) + 1`` after token ``t``)."""
        return sum(s is not None for s in self.levels)

    def state_elements(self) -> int:
        """Number of stored state elements (``num_states · B · H · K · V``): the decoding memory."""
        return sum(s.numel() for s in self.levels if s is not None)

    def step(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        level_scales: torch.Tensor,
        log_decay: torch.Tensor | None = None,
        beta: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Consume one token and return its output.

        q, k: ``[B, H, K]``; v: ``[B, H, V]``; level_scales: ``[B, H, L]`` with ``L > bit_length(t)``;
        log_decay, beta: ``[B, H]`` or None. Returns ``[B, H, V]``.
        """
        t = self.position
        if level_scales.shape[-1] <= t.bit_length():
            raise ValueError(
                f"level_scales has L={level_scales.shape[-1]} levels but token {t} needs {t.bit_length() + 1}"
            )
        if t > 0:
            self._carry(trailing_zeros(t))
        self.levels = [None if s is None else transition(s, k, log_decay, beta) for s in self.levels]
        if not self.levels:
            self.levels.append(None)
        self.levels[0] = write(k, v, beta)
        self.position += 1
        return sum(
            level_scales[..., lvl, None] * read(s, q) for lvl, s in enumerate(self.levels) if s is not None
        )

    def _carry(self, j: int) -> None:
        """Merge levels ``0..j`` into level ``j + 1`` and clear them."""
        merged = [s for s in self.levels[: j + 1] if s is not None]
        while len(self.levels) < j + 2:
            self.levels.append(None)
        if self.levels[j + 1] is not None:
            raise AssertionError("binary-counter carry into a non-empty level")  # cannot happen: bit j of t-1 is 0
        self.levels[j + 1] = sum(merged[1:], merged[0])
        for lvl in range(j + 1):
            self.levels[lvl] = None
