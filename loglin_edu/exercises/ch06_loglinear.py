"""Chapter 6: the binary-counter carry of the decoding state, and how much memory decoding holds."""

from __future__ import annotations

import torch

from ..ops import loglinear_attention
from ..state import FenwickState
from .checking import Case, Exercise, Mismatch, call, describe, random_qkv, tensor_cases


def carry(levels: list, j: int) -> list:
    """The carry of step ``t`` (``j`` = trailing zeros of ``t``): levels ``0..j`` merge into level ``j + 1``.

    levels: one ``[B, H, K, V]`` state or ``None`` (empty) per level. Returns the new list: levels ``0..j``
    empty, level ``j + 1`` the sum of the old levels ``0..j`` (it was empty: bit ``j`` of ``t - 1`` is 0).
    """
    new = list(levels) + [None] * max(0, j + 2 - len(levels))
    for lvl in range(j + 1):
        if new[lvl] is not None:
            new[j + 1] = new[lvl] if new[j + 1] is None else new[j + 1] + new[lvl]
            new[lvl] = None
    return new


def _carry_one_level_short(levels: list, j: int) -> list:
    return carry(levels, j - 1) if j > 0 else list(levels)


def _drive_decoding(carry_fn, q, k, v, level_scales, log_decay):
    """Decode with a :class:`FenwickState` whose carry is ``carry_fn``; returns ``[B, T, H, V]``."""

    class ReadersState(FenwickState):
        def _carry(self, j):
            self.levels = list(call(carry_fn, list(self.levels), j))
            if self.levels and self.levels[0] is not None:
                raise Mismatch(f"after the carry of token {self.position} level 0 should be empty")

    state = ReadersState()
    outputs = [state.step(q[:, t], k[:, t], v[:, t], level_scales[:, t], log_decay[:, t]) for t in range(q.shape[1])]
    return torch.stack(outputs, dim=1)


def _sequences(rng):
    for sizes, seed in tensor_cases(rng, max_len=70):
        q, k, v, g, _ = random_qkv(sizes, seed)
        L = (sizes["T"] - 1).bit_length() + 1
        lam = 0.5 + torch.rand(sizes["B"], sizes["T"], sizes["H"], L, generator=torch.Generator().manual_seed(seed),
                               dtype=torch.float64)
        yield Case((q, k, v, lam, g), describe(sizes))


CARRY = Exercise(
    name="loglinear.carry",
    chapter=6,
    signature="carry(levels, j) -> levels",
    task="Write the binary-counter carry of the decoding state: at token `t` with `j` trailing zero bits, the "
         "states of levels `0..j` (tensors, or `None` when empty) are added into level `j + 1` and cleared. "
         "Return the new list (append levels when it is too short).",
    solution=carry,
    cases=_sequences,
    driver=_drive_decoding,
    reference=lambda q, k, v, lam, g: loglinear_attention(q, k, v, lam, g, form="naive"),
    mistakes=((_carry_one_level_short, "the carry goes one level up: levels 0..j become level j + 1."),),
)


def decoding_memory(T: int, B: int, H: int, K: int, V: int) -> int:
    """State elements held after ``T`` tokens: ``popcount(T - 1) + 1`` non-empty levels of ``B·H·K·V`` each."""
    return (bin(T - 1).count("1") + 1) * B * H * K * V


def _all_levels_memory(T: int, B: int, H: int, K: int, V: int) -> int:
    return ((T - 1).bit_length() + 1) * B * H * K * V


def _measured_memory(sizes: dict[str, int], lengths: list[int]) -> dict[int, int]:
    """``FenwickState.state_elements()`` after each length in ``lengths``, by decoding zeros."""
    B, H, K, V = (sizes[n] for n in "BHKV")
    state, zeros_k, zeros_v = FenwickState(), torch.zeros(B, H, K), torch.zeros(B, H, V)
    lam = torch.ones(B, H, (max(lengths) - 1).bit_length() + 1)
    measured = {}
    for t in range(max(lengths)):
        state.step(zeros_k, zeros_k, zeros_v, lam)
        if t + 1 in lengths:
            measured[t + 1] = state.state_elements()
    return measured


def _memory_cases(rng):
    for _ in range(6):
        sizes = {n: rng.randint(1, 4) for n in "BHKV"}
        lengths = sorted({1, 2, 3, 4, 8, 16, 64, 65, *(rng.randint(1, 300) for _ in range(6))})
        yield Case((sizes, lengths), describe(sizes) + f", T in {lengths}")


DECODING_MEMORY = Exercise(
    name="loglinear.decoding_memory",
    chapter=6,
    signature="decoding_memory(T, B, H, K, V) -> int",
    task="How many numbers does the log-linear decoding state hold after `T` tokens, for batch `B`, `H` heads "
         "and `K × V` states? (The reference is measured with `FenwickState.state_elements()`.)",
    solution=decoding_memory,
    cases=_memory_cases,
    driver=lambda fn, sizes, lengths: {T: call(fn, T, *(sizes[n] for n in "BHKV")) for T in lengths},
    reference=_measured_memory,
    mistakes=((_all_levels_memory, "only non-empty levels hold a state: after T tokens, popcount(T - 1) + 1 of them."),),
)

EXERCISES = (CARRY, DECODING_MEMORY)
