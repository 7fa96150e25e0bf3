"""Chapter 12: which levels are live, the state after a prefix, and the carry as masks."""

from __future__ import annotations

import torch

from ..decoding import carry_masks as package_carry_masks
from ..fenwick import buckets
from ..state import FenwickState, prefix_state
from .checking import Case, Exercise, call, describe, random_qkv, tensor_cases


def live_levels(tokens: int, levels: int) -> list[bool]:
    """Which of ``levels`` levels hold keys after ``tokens`` tokens: level 0 once a token came, level
    ``l >= 1`` when bit ``l - 1`` of the last position ``tokens - 1`` is set."""
    if tokens == 0:
        return [False] * levels
    return [True] + [bool((tokens - 1) >> (lvl - 1) & 1) for lvl in range(1, levels)]


def _bits_of_tokens(tokens: int, levels: int) -> list[bool]:
    return [tokens >= 1] + [bool(tokens >> (lvl - 1) & 1) for lvl in range(1, levels)]


def _measured_live(counts: list[int], levels: int) -> dict[int, list[bool]]:
    """Live levels measured by stepping a :class:`FenwickState` (``K = V = 1``) through ``max(counts)`` tokens."""
    state, one = FenwickState(), torch.ones(1, 1, 1, dtype=torch.float64)
    lam = torch.ones(1, 1, levels, dtype=torch.float64)
    measured = {0: [False] * levels} if 0 in counts else {}
    for t in range(max(counts)):
        state.step(one, one, one, lam)
        if t + 1 in counts:
            held = [s is not None for s in state.levels]
            measured[t + 1] = held + [False] * (levels - len(held))
    return measured


def _token_counts(rng):
    yield Case((list(range(0, 40)), 7), "0..39 tokens, 7 levels")
    counts = sorted({rng.randrange(1, 2000) for _ in range(20)} | {1024, 1025})
    yield Case((counts, 12), f"{len(counts)} random counts below 2000, 12 levels")


LIVE_LEVELS = Exercise(
    name="decoding.live_levels",
    chapter=12,
    signature="live_levels(tokens, levels) -> list[bool]",
    task="After `tokens` tokens, which of the `levels` levels of a `FenwickState` (chapter 6's list state, level 0 "
         "included; not this chapter's buffer) hold keys? Return one bool per level. (The reference steps a "
         "`FenwickState` through the tokens and looks.)",
    solution=live_levels,
    cases=_token_counts,
    driver=lambda fn, counts, levels: {t: list(call(fn, t, levels)) for t in counts},
    reference=_measured_live,
    mistakes=((_bits_of_tokens, "the buckets are those of the last query, position tokens - 1, not of tokens."),),
)


def prefix_levels(k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor) -> dict[int, torch.Tensor]:
    """Decay-only state after the ``T`` tokens: ``S^(l) = Σ_{s in bucket(T-1, l)} exp(G_{T-1} - G_s) k_s v_sᵀ``.

    k: ``[B, T, H, K]``, v: ``[B, T, H, V]``, log_decay: ``[B, T, H]`` -> {level: ``[B, H, K, V]``} (non-empty levels).
    """
    later = torch.cat([log_decay[:, 1:], torch.zeros_like(log_decay[:, :1])], dim=1)  # g_{s+1}
    to_last = later.flip(1).cumsum(1).flip(1)  # G_{T-1} - G_s = Σ_{r=s+1..T-1} g_r, [B, T, H]
    weighted = k * to_last.exp()[..., None]
    levels = {}
    for lvl, keys in enumerate(buckets(k.shape[1] - 1)):
        if len(keys):
            levels[lvl] = torch.einsum("bshk,bshv->bhkv", weighted[:, keys.start : keys.stop], v[:, keys.start : keys.stop])
    return levels


def _without_decay(k, v, log_decay):
    return prefix_levels(k, v, torch.zeros_like(log_decay))


def _buckets_of_T(k, v, log_decay):
    return prefix_levels(torch.cat([k, torch.zeros_like(k[:, :1])], 1), torch.cat([v, torch.zeros_like(v[:, :1])], 1),
                         torch.cat([log_decay, torch.zeros_like(log_decay[:, :1])], 1))


def _prefixes(rng):
    for sizes, seed in tensor_cases(rng, count=8, max_len=70):
        _, k, v, g, _ = random_qkv(sizes, seed)
        yield Case((k, v, g), describe(sizes))


def _reference_levels(k, v, log_decay):
    state = prefix_state(k.transpose(1, 2), v.transpose(1, 2), log_decay.transpose(1, 2))
    return {lvl: s for lvl, s in enumerate(state.levels) if s is not None}


PREFIX_LEVELS = Exercise(
    name="decoding.prefix_levels",
    chapter=12,
    signature="prefix_levels(k, v, log_decay) -> dict[int, Tensor]",
    task="Build the decoding state of log-linear Mamba-2 after a prompt of `T` tokens, without stepping: for "
         "each non-empty level `l` of the last query `T - 1`, the keys of its bucket carried to the last token, "
         "`Σ exp(G_{T-1} - G_s) k_s v_sᵀ` (`[B, H, K, V]`). Inputs `[B, T, H, ·]`; return `{level: state}`.",
    solution=prefix_levels,
    cases=_prefixes,
    reference=_reference_levels,
    mistakes=(
        (_without_decay, "every key decays from its own position to the last token: exp(G_{T-1} - G_s)."),
        (_buckets_of_T, "the state after T tokens holds the buckets of the last query T - 1."),
    ),
)


def carry_masks(position: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(into, cleared)`` of the carry that ends the step of the token at each ``position`` (``[B]`` int64), over
    the buffer's ``levels`` slots (slot ``i``: level ``i + 1``), ``[B, L]`` bool."""
    index = torch.arange(levels)
    after = position[:, None] + 1
    low = after & -after  # 2^j: the carry fills slot j
    return (1 << index) == low, (1 << index) < low


def _carry_of_position(position, levels):
    index = torch.arange(levels)
    low = (position & -position)[:, None]
    return (1 << index) == low, (1 << index) < low


def _clears_the_target_too(position, levels):
    into, cleared = package_carry_masks(position, levels)
    return into, cleared | into


def _positions(rng):
    yield Case((torch.arange(0, 70), 8), "positions 0..69, 8 slots")
    yield Case((torch.arange(0, 70), 5), "positions 0..69, 5 slots: the carries into level 6 and 7 have no slot")
    yield Case((torch.tensor([rng.randrange(1, 4096) for _ in range(30)] + [2047, 4094]), 12),
               "32 random positions below 4096, 12 slots")


CARRY_MASKS = Exercise(
    name="decoding.carry_masks",
    chapter=12,
    signature="carry_masks(position, levels) -> (into, cleared)",
    task="Write the binary-counter carry of the tensor decoding state as masks, for a batch of positions "
         "(`[B]` int64, the tokens each sequence has consumed before the token it steps): `into[b, i]` marks the "
         "slot (level `i + 1`) that receives the token's `β k vᵀ` and the sum of the slots below it at the end of "
         "the step of the token at `position[b]`, `cleared[b, i]` the slots emptied. Both `[B, levels]` bool; a "
         "carry into a level past the buffer fills no slot. Tensor operations only, no loop over positions.",
    solution=carry_masks,
    cases=_positions,
    reference=package_carry_masks,
    mistakes=(
        (_carry_of_position, "the carry prepares the next query, position + 1: the trailing zeros of "
                             "position + 1, not of position."),
        (_clears_the_target_too, "level j + 1 receives the sum: it is not cleared."),
    ),
)

EXERCISES = (LIVE_LEVELS, PREFIX_LEVELS, CARRY_MASKS)
