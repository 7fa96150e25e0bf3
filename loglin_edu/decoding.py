"""The decoding state as one fixed tensor: every Fenwick level in a ``[B, H, L, K, V]`` buffer.

:class:`~loglin_edu.state.FenwickState` holds a Python list whose entries come and go; its step branches
on the position. Here the ``L = num_levels(max_len)`` levels live in one buffer, empty levels held as
zeros, and which levels are live follows from the position alone (PAPER.md §2). After ``t`` tokens (the
last one ``t - 1``):

    level 0 is live iff t >= 1;     level l >= 1 is live iff bit l - 1 of t - 1 is set.

The step of token ``t`` (``t`` tokens consumed before it) writes the binary-counter carry as masks over
the levels: with ``low = t & -t`` (``2^j``, ``j`` the trailing zeros of ``t``; ``0`` at ``t = 0``)

    into[l]    = (l >= 1) and 2^(l-1) = low         the level the carry fills: l = j + 1
    cleared[l] = 2^l <= low                         the levels it empties: l <= j
    S^(l) <- Σ_{m <= l} S^(m) if into[l],  0 if cleared[l],  S^(l) otherwise

(level ``j + 1`` is empty before the carry, so including it in the sum adds zero), then applies the
transition to every level, writes ``β k vᵀ`` into level 0 and reads ``o = Σ_l λ_l S^(l)ᵀ q``. Every
shape is fixed and nothing branches on the position's value: one step compiles to one graph
(``torch.compile(fullgraph=True)``), can be captured in a CUDA graph, and batches sequences that may
even sit at different positions.

The lazy layout defers the decay. Every level decays by the same ``exp(g)`` each token, so a level need
not be rewritten to decay: it can keep a scale ``c^(l)`` and hold ``S^(l) = c^(l) stored^(l)``. A step then
changes every scale but the stored tiles of two levels only:

    carry:  stored^(j+1) <- Σ_{m <= j} c^(m) stored^(m),  c^(j+1) <- 1;   c^(l) <- 0 for l <= j
    decay:  c^(l) <- exp(g) c^(l) for every level     (so the carry's target keeps scale exp(g))
    write:  stored^(0) <- β k vᵀ,  c^(0) <- 1;         read:  o = Σ_l λ_l c^(l) stored^(l)ᵀ q

An empty level has scale 0 and whatever tile it held before (never read). The delta rule's
``(I - β k kᵀ)`` is linear, so it commutes with the scales and still acts on every stored tile. The scales
are held as ``decay_scales: [B, H, L, V]``, each level's scale repeated in every value column: programs
that split the value columns (the Triton step) then each own the copies of their columns and update them
in place, where one shared copy would be read by one program after another had already updated it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fenwick import num_levels
from .state import FenwickState


def live_levels(position: torch.Tensor, levels: int) -> torch.Tensor:
    """Which levels hold keys after ``position`` tokens (module docstring).

    position: int64 ``[...]``; levels: ``L``. Returns bool ``[..., L]``.
    """
    index = torch.arange(levels, device=position.device)
    last = (position - 1)[..., None]
    higher = (last >> (index - 1).clamp(min=0)) & 1 == 1
    return torch.where(index == 0, position[..., None] >= 1, higher & (index >= 1) & (last >= 0))


def carry_masks(position: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(into, cleared)``: bool ``[..., L]`` masks of the carry before the token at ``position``.

    ``into[l]``: level ``l = j + 1`` receives the sum of levels ``0..j``; ``cleared[l]``: ``l <= j``. Both
    all-false at ``position = 0``. position: int64 ``[...]``.
    """
    index = torch.arange(levels, device=position.device)
    low = (position & -position)[..., None]  # 2^j, 0 at position 0
    into = (index >= 1) & ((1 << index) >> 1 == low)
    cleared = (1 << index) <= low
    return into, cleared


def fenwick_step(
    levels: torch.Tensor,
    position: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoding step of every sequence (module docstring): a pure function of fixed shapes.

    levels: ``[B, H, L, K, V]``; position: int64 ``[B]`` (tokens consumed so far); q, k: ``[B, H, K]``;
    v: ``[B, H, V]``; level_scales: ``[B, H, L]``; log_decay, beta: ``[B, H]`` or None. Computes in the
    dtype of ``levels``. Returns ``(o: [B, H, V], levels, position + 1)``. No check that the position
    stays below the buffer's capacity (:meth:`FenwickCache.step` checks it).
    """
    L = levels.shape[2]
    q, k, v = (x.to(levels.dtype) for x in (q, k, v))
    into, cleared = (m[:, None, :, None, None] for m in carry_masks(position, L))  # [B, 1, L, 1, 1]
    merged = (levels * (into | cleared)).sum(2, keepdim=True)  # Σ_{m <= j+1} S^(m)
    levels = torch.where(into, merged, levels.masked_fill(cleared, 0))
    if beta is not None:  # (I - β k kᵀ) on every level
        beta = beta.to(levels.dtype)
        projected = torch.einsum("bhk,bhlkv->bhlv", k, levels)
        levels = levels - (beta[..., None] * k)[:, :, None, :, None] * projected[:, :, :, None, :]
    if log_decay is not None:
        levels = levels * log_decay.to(levels.dtype).exp()[:, :, None, None, None]
    written = (k if beta is None else beta[..., None] * k)[..., :, None] * v[..., None, :]  # β k vᵀ
    is_level0 = torch.arange(L, device=levels.device)[:, None, None] == 0
    levels = torch.where(is_level0, written[:, :, None], levels)
    out = torch.einsum("bhl,bhk,bhlkv->bhv", level_scales.to(levels.dtype), q, levels)
    return out, levels, position + 1


def lazy_fenwick_step(
    levels: torch.Tensor,
    decay_scales: torch.Tensor,
    position: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fenwick_step` on the lazy layout (module docstring): the same output, the same level values.

    levels: ``[B, H, L, K, V]`` stored tiles; decay_scales: ``[B, H, L, V]``; other arguments as
    :func:`fenwick_step`. Returns ``(o: [B, H, V], levels, decay_scales, position + 1)``. Empty levels are
    masked out, whatever they hold.
    """
    L = levels.shape[2]
    q, k, v = (x.to(levels.dtype) for x in (q, k, v))
    into, cleared = (m[:, None, :, None] for m in carry_masks(position, L))  # [B, 1, L, 1]
    values = decay_scales[..., None, :] * levels
    merged = torch.where(cleared[..., None], values, 0).sum(2, keepdim=True)  # Σ_{m <= j} c^(m) ⊙ stored^(m)
    levels = torch.where(into[..., None], merged, levels)
    decay_scales = torch.where(into, 1.0, decay_scales.masked_fill(cleared, 0))
    if beta is not None:  # (I - β k kᵀ) on every stored tile
        beta = beta.to(levels.dtype)
        projected = torch.einsum("bhk,bhlkv->bhlv", k, levels)
        levels = levels - (beta[..., None] * k)[:, :, None, :, None] * projected[:, :, :, None, :]
    if log_decay is not None:
        decay_scales = decay_scales * log_decay.to(levels.dtype).exp()[:, :, None, None]
    written = (k if beta is None else beta[..., None] * k)[..., :, None] * v[..., None, :]  # β k vᵀ
    is_level0 = torch.arange(L, device=levels.device) == 0
    levels = torch.where(is_level0[:, None, None], written[:, :, None], levels)
    decay_scales = torch.where(is_level0[:, None], 1.0, decay_scales)
    live = live_levels(position + 1, L)[:, None, :, None, None]  # [B, 1, L, 1, 1]
    values = torch.where(live, decay_scales[..., None, :] * levels, 0)
    out = torch.einsum("bhl,bhk,bhlkv->bhv", level_scales.to(levels.dtype), q, values)
    return out, levels, decay_scales, position + 1


@dataclass
class FenwickCache:
    """The decoding state of ``B`` sequences as a fixed buffer (module docstring).

    levels: ``[B, H, L, K, V]`` with ``L = num_levels(max_len)``; position: int64 ``[B]``, tokens consumed by
    each sequence; max_len: the most tokens a sequence may consume; decay_scales: None for the eager layout
    (each level holds its value, zeros where a level is empty) or ``[B, H, L, V]`` for the lazy one (a
    level's value is ``decay_scales[:, :, l, None, :] * levels[:, :, l]``; module docstring).
    """

    levels: torch.Tensor
    position: torch.Tensor
    max_len: int
    decay_scales: torch.Tensor | None = None

    @classmethod
    def empty(
        cls,
        batch: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        lazy: bool = False,
    ) -> FenwickCache:
        """A cache before the first token: ``[batch, heads, num_levels(max_len), key_dim, value_dim]`` zeros
        (and zero scales ``[batch, heads, L, value_dim]`` when ``lazy``)."""
        L = num_levels(max_len)
        levels = torch.zeros(batch, heads, L, key_dim, value_dim, dtype=dtype, device=device)
        scales = torch.zeros(batch, heads, L, value_dim, dtype=dtype, device=device) if lazy else None
        return cls(levels, torch.zeros(batch, dtype=torch.long, device=device), max_len, scales)

    @classmethod
    def from_state(
        cls, state: FenwickState, max_len: int, dtype: torch.dtype | None = None, *, lazy: bool = False
    ) -> FenwickCache:
        """The buffer holding a :class:`FenwickState` (for example a prefill's), with room up to ``max_len``;
        ``lazy``: in the lazy layout, every live level stored with scale 1."""
        held = [s for s in state.levels if s is not None]
        if not held:
            raise ValueError("the FenwickState holds no level (position 0): start from FenwickCache.empty(...)")
        if state.position > max_len:
            raise ValueError(f"the state is at position {state.position}, past max_len={max_len}")
        cache = cls.empty(*held[0].shape, max_len, dtype=dtype or held[0].dtype, device=held[0].device, lazy=lazy)
        for lvl, s in enumerate(state.levels):
            if s is not None:
                cache.levels[:, :, lvl] = s
                if lazy:
                    cache.decay_scales[:, :, lvl] = 1
        cache.position.fill_(state.position)
        return cache

    @property
    def num_levels(self) -> int:
        """``L``: the levels the buffer holds, live or not."""
        return self.levels.shape[2]

    @property
    def lazy(self) -> bool:
        """Whether the cache keeps the lazy layout (``decay_scales`` set)."""
        return self.decay_scales is not None

    def live(self) -> torch.Tensor:
        """Bool ``[B, L]``: which levels hold keys now."""
        return live_levels(self.position, self.num_levels)

    def level_values(self) -> torch.Tensor:
        """``[B, H, L, K, V]``: every level's value, zeros where empty, in either layout."""
        if self.decay_scales is None:
            return self.levels
        live = self.live()[:, None, :, None, None]
        return torch.where(live, self.decay_scales[..., None, :] * self.levels, 0)

    def state_bytes(self) -> int:
        """Bytes of the buffers: ``B · H · L · K · V`` elements, whatever the position, and ``B · H · L · V``
        scales in the lazy layout."""
        held = [self.levels] if self.decay_scales is None else [self.levels, self.decay_scales]
        return sum(x.numel() * x.element_size() for x in held)

    def to_state(self) -> FenwickState:
        """The same state as a :class:`FenwickState` list (every sequence at one position)."""
        position = int(self.position[0])
        if not bool((self.position == position).all()):
            raise ValueError(f"the sequences sit at different positions {self.position.tolist()}: no one FenwickState")
        live = live_levels(torch.tensor(position), self.num_levels).tolist()
        count = 0 if position == 0 else num_levels(position)
        values = self.level_values()
        return FenwickState([values[:, :, lvl] if live[lvl] else None for lvl in range(count)], position)

    def step(self, q, k, v, level_scales, log_decay=None, beta=None) -> torch.Tensor:
        """Consume one token of every sequence; shapes as :func:`fenwick_step` (:func:`lazy_fenwick_step` in
        the lazy layout). Returns ``o: [B, H, V]``.

        Raises ``ValueError`` when a sequence would pass ``max_len`` or ``level_scales`` has fewer than
        ``L`` levels (only ``L`` are read).
        """
        if level_scales.shape[-1] < self.num_levels:
            raise ValueError(
                f"level_scales has L={level_scales.shape[-1]} levels but the cache holds {self.num_levels} "
                f"(max_len={self.max_len})"
            )
        if not torch.compiler.is_compiling() and bool((self.position >= self.max_len).any()):
            raise ValueError(f"decoding past max_len={self.max_len}: positions {self.position.tolist()}")
        level_scales = level_scales[..., : self.num_levels]
        if self.decay_scales is None:
            out, self.levels, self.position = fenwick_step(
                self.levels, self.position, q, k, v, level_scales, log_decay, beta
            )
        else:
            out, self.levels, self.decay_scales, self.position = lazy_fenwick_step(
                self.levels, self.decay_scales, self.position, q, k, v, level_scales, log_decay, beta
            )
        return out.to(q.dtype)
