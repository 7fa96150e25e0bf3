"""The decoding state as one fixed tensor: the Fenwick levels of the next query in a ``[B, H, L, K, V]`` buffer.

:class:`~loglin_edu.state.FenwickState` holds a Python list whose entries come and go; its step branches
on the position. Here the levels live in one buffer, empty levels held as zeros, and which levels are live
follows from the position alone (PAPER.md §2). After ``t`` tokens (the last one ``t - 1``) the buffer holds
the buckets ``l >= 1`` of the *next* query ``t``, carried to the last token:

    S^(l) = Σ_{s in bucket(t, l)} P_{t-1,s} β_s k_s v_sᵀ,        live iff bit l - 1 of t is set

(``P`` the transitions, ``β = 1`` without the delta rule). Level 0, the query's own token, is not kept: the
step of that token has it. Slot ``i`` of the buffer holds level ``i + 1``, so slot ``i`` is live iff bit ``i``
of ``t`` is set: the live slots are the binary digits of ``t``. A buffer for at most ``max_len`` tokens has
``L = bit_length(max_len - 1) = num_levels(max_len) - 1`` slots (20 for ``max_len = 2^20``).

The step of token ``t`` (``t`` tokens consumed before it), with ``λ`` indexed by level (column 0 for level 0):

    transition:  S^(l) <- exp(g_t) (I - β_t k_t k_tᵀ) S^(l)                     every level
    read:        o = λ_0 β_t (q_t·k_t) v_t + Σ_{l >= 1} λ_l S^(l)ᵀ q_t
    carry:       low = (t + 1) & -(t + 1) = 2^j      (j: the trailing zeros of t + 1)
                 into[i]    = 2^i = low              the slot the carry fills: level j + 1
                 cleared[i] = 2^i < low              the slots it empties: levels 1..j
                 S^(j+1) <- β_t k_t v_tᵀ + Σ_{1 <= l <= j} S^(l),     S^(l) <- 0 for 1 <= l <= j

Level ``j + 1`` is empty before the carry (bit ``j`` of ``t`` is clear) and levels ``1..j`` are all live
(bits ``0..j-1`` of ``t`` are set). This is the state of :class:`~loglin_edu.state.FenwickState` with its next
carry done early: that list keeps level 0 and the buckets of the last query ``t - 1``, and its step of token
``t + 1`` first merges levels ``0..j`` into ``j + 1``, the merge the step above does at the end of token ``t``.
The outputs are the same sums, added in another order. Every shape is fixed and nothing branches on the
position's value: one step compiles to one graph (``torch.compile(fullgraph=True)``), can be captured in a CUDA
graph, and batches sequences that may even sit at different positions.

The last token. The state after ``t <= max_len - 1`` tokens has levels up to ``bit_length(max_len - 1) = L``:
it fits. The step of token ``max_len - 1`` carries into level ``j + 1`` with ``2^j = low(max_len)``; when
``max_len`` is a power of two that is level ``L + 1``, which the buffer does not have. That step computes its
output, clears levels ``1..L`` as every carry clears the levels below its target, and drops the sum: no slot
receives it (``into`` is all false). The buffer then holds its levels truthfully, all of them empty, and the
state's one live level, ``L + 1``, is not kept; nothing can step from it, as no step passes ``max_len``
(:meth:`FenwickCache.step` refuses). For any other ``max_len`` the state after ``max_len`` tokens fits.

The lazy layout defers the decay. Every level decays by the same ``exp(g)`` each token, so a level need
not be rewritten to decay: it can keep a scale ``c^(l)`` and hold ``S^(l) = c^(l) stored^(l)``. A step then
changes every scale but the stored tile of one level only:

    transition:  c^(l) <- exp(g) c^(l) for every level;   (I - β k kᵀ) on every stored tile
    read:        o = λ_0 β (q·k) v + Σ_{l >= 1} λ_l c^(l) stored^(l)ᵀ q
    carry:       stored^(j+1) <- β k vᵀ + Σ_{l <= j} c^(l) stored^(l),  c^(j+1) <- 1;   c^(l) <- 0 for l <= j

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
    """Which slots of a buffer of ``levels`` slots hold keys after ``position`` tokens (module docstring): slot
    ``i`` (level ``i + 1``) iff bit ``i`` of ``position`` is set.

    position: int64 ``[...]``; levels: ``L``. Returns bool ``[..., L]``.
    """
    index = torch.arange(levels, device=position.device)
    return (position[..., None] >> index) & 1 == 1


def carry_masks(position: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(into, cleared)``: bool ``[..., L]`` masks over the slots of the carry that ends the step of the token at
    ``position`` (``position`` tokens consumed before it), with ``low = (position + 1) & -(position + 1) = 2^j``:

        into[i] = 2^i = low   (slot j, level j + 1: receives the token's write and the slots below)
        cleared[i] = 2^i < low   (slots 0..j-1, levels 1..j: emptied)

    ``into`` is all false when slot ``j`` lies past the buffer (module docstring). position: int64 ``[...]``.
    """
    index = torch.arange(levels, device=position.device)
    after = position[..., None] + 1
    low = after & -after  # 2^j
    slot = 1 << index
    return slot == low, slot < low


def token_write(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """``β k vᵀ``: k ``[B, H, K]``, v ``[B, H, V]``, beta ``[B, H]`` or None -> ``[B, H, K, V]``."""
    return (k if beta is None else beta[..., None] * k)[..., :, None] * v[..., None, :]


def own_read(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, level0_scale: torch.Tensor,
             beta: torch.Tensor | None) -> torch.Tensor:
    """Level 0 of the read, the token's own: ``λ_0 β (q·k) v``. q, k: ``[B, H, K]``; v: ``[B, H, V]``;
    level0_scale, beta: ``[B, H]`` (beta None for 1). Returns ``[B, H, V]``."""
    weight = level0_scale * (q * k).sum(-1)
    if beta is not None:
        weight = weight * beta
    return weight[..., None] * v


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

    levels: ``[B, H, L, K, V]`` (slot ``i`` holds level ``i + 1``); position: int64 ``[B]`` (tokens consumed so
    far); q, k: ``[B, H, K]``; v: ``[B, H, V]``; level_scales: ``[B, H, L + 1]`` (column ``l`` for level ``l``,
    level 0 at column 0); log_decay, beta: ``[B, H]`` or None. Computes in the dtype of ``levels``. Returns
    ``(o: [B, H, V], levels, position + 1)``. No check that the position stays below the buffer's capacity
    (:meth:`FenwickCache.step` checks it).
    """
    L = levels.shape[2]
    q, k, v, level_scales = (x.to(levels.dtype) for x in (q, k, v, level_scales))
    if beta is not None:  # (I - β k kᵀ) on every level
        beta = beta.to(levels.dtype)
        projected = torch.einsum("bhk,bhlkv->bhlv", k, levels)
        levels = levels - (beta[..., None] * k)[:, :, None, :, None] * projected[:, :, :, None, :]
    if log_decay is not None:
        levels = levels * log_decay.to(levels.dtype).exp()[:, :, None, None, None]
    out = own_read(q, k, v, level_scales[..., 0], beta)
    out = out + torch.einsum("bhl,bhk,bhlkv->bhv", level_scales[..., 1 : L + 1], q, levels)
    into, cleared = (m[:, None, :, None, None] for m in carry_masks(position, L))  # [B, 1, L, 1, 1]
    merged = token_write(k, v, beta)[:, :, None] + (levels * cleared).sum(2, keepdim=True)  # β k vᵀ + Σ_{l≤j} S^(l)
    levels = torch.where(into, merged, levels.masked_fill(cleared, 0))
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
    q, k, v, level_scales = (x.to(levels.dtype) for x in (q, k, v, level_scales))
    if beta is not None:  # (I - β k kᵀ) on every stored tile
        beta = beta.to(levels.dtype)
        projected = torch.einsum("bhk,bhlkv->bhlv", k, levels)
        levels = levels - (beta[..., None] * k)[:, :, None, :, None] * projected[:, :, :, None, :]
    if log_decay is not None:
        decay_scales = decay_scales * log_decay.to(levels.dtype).exp()[:, :, None, None]
    live = live_levels(position, L)[:, None, :, None, None]  # [B, 1, L, 1, 1]
    values = torch.where(live, decay_scales[..., None, :] * levels, 0)  # c^(l) ⊙ stored^(l), zeros where empty
    out = own_read(q, k, v, level_scales[..., 0], beta)
    out = out + torch.einsum("bhl,bhk,bhlkv->bhv", level_scales[..., 1 : L + 1], q, values)
    into, cleared = (m[:, None, :, None] for m in carry_masks(position, L))  # [B, 1, L, 1]
    merged = token_write(k, v, beta)[:, :, None] + torch.where(cleared[..., None], values, 0).sum(2, keepdim=True)
    levels = torch.where(into[..., None], merged, levels)
    decay_scales = torch.where(into, 1.0, decay_scales.masked_fill(cleared, 0))
    return out, levels, decay_scales, position + 1


@dataclass
class FenwickCache:
    """The decoding state of ``B`` sequences as a fixed buffer (module docstring).

    levels: ``[B, H, L, K, V]`` with ``L = num_levels(max_len) - 1`` slots, slot ``i`` holding level ``i + 1``;
    position: int64 ``[B]``, tokens consumed by each sequence; max_len: the most tokens a sequence may consume;
    decay_scales: None for the eager layout (each level holds its value, zeros where a level is empty) or
    ``[B, H, L, V]`` for the lazy one (a level's value is ``decay_scales[:, :, i, None, :] * levels[:, :, i]``;
    module docstring).
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
        """A cache before the first token: ``[batch, heads, num_levels(max_len) - 1, key_dim, value_dim]`` zeros
        (and zero scales ``[batch, heads, L, value_dim]`` when ``lazy``)."""
        L = num_levels(max_len) - 1
        levels = torch.zeros(batch, heads, L, key_dim, value_dim, dtype=dtype, device=device)
        scales = torch.zeros(batch, heads, L, value_dim, dtype=dtype, device=device) if lazy else None
        return cls(levels, torch.zeros(batch, dtype=torch.long, device=device), max_len, scales)

    @classmethod
    def from_state(
        cls, state: FenwickState, max_len: int, dtype: torch.dtype | None = None, *, lazy: bool = False
    ) -> FenwickCache:
        """The buffer holding a :class:`FenwickState` (for example a prefill's), with room up to ``max_len``;
        ``lazy``: in the lazy layout, every live level stored with scale 1.

        The list keeps level 0 and the buckets of the last query ``t - 1``; the buffer those of the next query
        ``t``: the conversion is the list's next carry, levels ``0..j`` summed into level ``j + 1``
        (``2^j = t & -t``; dropped when level ``j + 1`` lies past the buffer, module docstring)."""
        held = [s for s in state.levels if s is not None]
        if not held:
            raise ValueError("the FenwickState holds no level (position 0): start from FenwickCache.empty(...)")
        if state.position > max_len:
            raise ValueError(f"the state is at position {state.position}, past max_len={max_len}")
        cache = cls.empty(*held[0].shape, max_len, dtype=dtype or held[0].dtype, device=held[0].device, lazy=lazy)
        j = (state.position & -state.position).bit_length() - 1
        carried = {j + 1: sum(s for s in state.levels[: j + 1] if s is not None)}
        carried |= {lvl: s for lvl, s in enumerate(state.levels) if lvl > j + 1 and s is not None}
        for lvl, s in carried.items():
            if lvl <= cache.stored_levels:
                cache.levels[:, :, lvl - 1] = s
                if lazy:
                    cache.decay_scales[:, :, lvl - 1] = 1
        cache.position.fill_(state.position)
        return cache

    @property
    def stored_levels(self) -> int:
        """``L``: the slots of the buffer, live or not (levels ``1..L``)."""
        return self.levels.shape[2]

    @property
    def num_levels(self) -> int:
        """``L + 1``: the levels a step reads, level 0 (the token's own) included; the columns of ``λ`` it takes."""
        return self.stored_levels + 1

    @property
    def lazy(self) -> bool:
        """Whether the cache keeps the lazy layout (``decay_scales`` set)."""
        return self.decay_scales is not None

    def live(self) -> torch.Tensor:
        """Bool ``[B, L]``: which slots hold keys now (slot ``i``: bit ``i`` of the position)."""
        return live_levels(self.position, self.stored_levels)

    def level_values(self) -> torch.Tensor:
        """``[B, H, L, K, V]``: every stored level's value, zeros where empty, in either layout."""
        if self.decay_scales is None:
            return self.levels
        live = self.live()[:, None, :, None, None]
        return torch.where(live, self.decay_scales[..., None, :] * self.levels, 0)

    def state_bytes(self) -> int:
        """Bytes of the buffers: ``B · H · L · K · V`` elements, whatever the position, and ``B · H · L · V``
        scales in the lazy layout."""
        held = [self.levels] if self.decay_scales is None else [self.levels, self.decay_scales]
        return sum(x.numel() * x.element_size() for x in held)

    def step(self, q, k, v, level_scales, log_decay=None, beta=None) -> torch.Tensor:
        """Consume one token of every sequence; shapes as :func:`fenwick_step` (:func:`lazy_fenwick_step` in
        the lazy layout). Returns ``o: [B, H, V]``.

        Raises ``ValueError`` when a sequence would pass ``max_len`` or ``level_scales`` has fewer than
        ``L + 1`` levels (only ``L + 1`` are read).
        """
        if level_scales.shape[-1] < self.num_levels:
            raise ValueError(
                f"level_scales has L={level_scales.shape[-1]} levels but a step reads {self.num_levels} "
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
