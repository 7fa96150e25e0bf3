"""The decoding state of log-linear attention: one ``K × V`` state per Fenwick level, a binary counter.

At step ``t`` level ``l`` holds the keys of query ``t``'s bucket ``l``, carried to ``t``:

    S_t^(l) = Σ_{s : level(t, s) = l} exp(G_t - G_s) P_{t,s} β_s k_s v_sᵀ,       o_t = Σ_l λ[t, l] S_t^(l)ᵀ q_t

(``P_{t,s}`` the delta-rule factors, ``β = 1`` without them). One step ``t >= 1``, with ``j`` the number
of trailing zero bits of ``t``:

1. merge levels ``0..j`` into level ``j + 1`` (which is empty) and clear them — a binary-counter carry;
2. apply the token's transition ``exp(g_t)(I - β_t k_t k_tᵀ)`` to every level;
3. write ``β_t k_t v_tᵀ`` into level 0.

A length-T sequence never holds more than ``num_levels(T)`` levels: O(log T) memory.

The state after a prefix of ``T`` tokens does not depend on the queries or on λ, only on the keys,
values and transitions: :func:`prefix_state` builds it from the definition above; the chunk scan
(:func:`~loglin_edu.chunk_scan.chunk_scan` with ``return_state=True``) returns it after a prefill.
"""

from __future__ import annotations

import torch

from .fenwick import buckets, trailing_zeros
from .recurrence import read, transition, write


class FenwickState:
    """Log-linear decoding state for ``B`` sequences and ``H`` heads (levels are ``[B, H, K, V]``).

    ``levels[l]`` is the state of level ``l`` or ``None`` while that bucket is empty. Use :meth:`step`
    once per token; ``position`` is the index the next token will get.
    """

    def __init__(self, levels: list[torch.Tensor | None] | None = None, position: int = 0) -> None:
        self.levels: list[torch.Tensor | None] = [] if levels is None else list(levels)
        self.position = position

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


def carried_keys(k: torch.Tensor, log_decay: torch.Tensor | None, beta: torch.Tensor | None) -> torch.Tensor:
    """Every key carried to the last token: ``P_{T-1,s} β_s k_s`` with
    ``P_{t,s} = Π_{r=s+1..t} exp(g_r) (I - β_r k_r k_rᵀ)``.

    k: ``[B, H, T, K]``; log_decay, beta: ``[B, H, T]`` or None. Returns ``[B, H, T, K]``. With decay only,
    ``P_{T-1,s} = exp(Σ_{r>s} g_r)``; with the delta rule, one ``K × K`` product per token, from the last
    token backwards (``P_{t,s-1} = P_{t,s} · exp(g_s)(I - β_s k_s k_sᵀ)``).
    """
    if beta is None:
        if log_decay is None:
            return k
        later = torch.cat([log_decay[..., 1:], torch.zeros_like(log_decay[..., :1])], dim=-1)
        return k * later.flip(-1).cumsum(-1).flip(-1).exp()[..., None]  # Σ_{r=s+1..T-1} g_r
    B, H, T, K = k.shape
    carry = torch.eye(K, dtype=k.dtype, device=k.device).expand(B, H, K, K)  # P_{T-1,s}, starting at s = T-1
    keys = [None] * T
    for s in range(T - 1, -1, -1):
        keys[s] = (carry @ (beta[:, :, s, None] * k[:, :, s])[..., None])[..., 0]  # P β_s k_s
        carry = carry - keys[s][..., :, None] * k[:, :, s, None, :]  # P (I - β_s k_s k_sᵀ)
        if log_decay is not None:
            carry = carry * log_decay[:, :, s, None, None].exp()
    return torch.stack(keys, dim=2)


def prefix_state(
    k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None, beta: torch.Tensor | None = None
) -> FenwickState:
    """The decoding state after tokens ``0..T-1``, from its definition (module docstring):

        S^(l) = Σ_{s in bucket(T-1, l)} P_{T-1,s} β_s k_s v_sᵀ        (None for an empty bucket)

    k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; log_decay, beta: ``[B, H, T]`` or None. Returns a
    :class:`FenwickState` at position ``T`` with ``num_levels(T)`` levels of ``[B, H, K, V]``: the state
    :class:`FenwickState` holds after stepping through the same ``T`` tokens.
    """
    keys = carried_keys(k, log_decay, beta)
    T = k.shape[2]
    levels = [
        keys[:, :, bucket.start : bucket.stop].transpose(-1, -2) @ v[:, :, bucket.start : bucket.stop]
        if len(bucket) else None
        for bucket in buckets(T - 1)
    ]
    return FenwickState(levels, position=T)


def linear_prefix_state(
    k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None, beta: torch.Tensor | None = None
) -> torch.Tensor:
    """The linear model's state after tokens ``0..T-1``, from its definition: one bucket holding every key,

        S_{T-1} = Σ_s P_{T-1,s} β_s k_s v_sᵀ.

    k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; log_decay, beta: ``[B, H, T]`` or None. Returns ``[B, H, K, V]``.
    """
    return carried_keys(k, log_decay, beta).transpose(-1, -2) @ v
