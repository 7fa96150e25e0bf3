"""Chapter 2: linear attention one token at a time, and one chunk at a time."""

from __future__ import annotations

import torch

from ..ops import linear_attention
from .checking import Case, Exercise, call, drive_steps, sequence_cases


def linear_step(state, q_t, k_t, v_t):
    """``S_t = S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t``. state: ``[B, H, K, V]``; q_t, k_t: ``[B, H, K]``;
    v_t: ``[B, H, V]``. Returns ``(S_t, o_t)``.
    """
    state = state + torch.einsum("bhk,bhv->bhkv", k_t, v_t)
    return state, torch.einsum("bhkv,bhk->bhv", state, q_t)


def _read_before_write(state, q_t, k_t, v_t):
    return state + torch.einsum("bhk,bhv->bhkv", k_t, v_t), torch.einsum("bhkv,bhk->bhv", state, q_t)


def _drive_tokens(step, q, k, v):
    B, _, H, K = q.shape
    return drive_steps(step, q.new_zeros(B, H, K, v.shape[-1]), q, k, v)


LINEAR_STEP = Exercise(
    name="linear.linear_step",
    chapter=2,
    signature="linear_step(state, q_t, k_t, v_t) -> (state, o_t)",
    task="One token of causal linear attention: add `k_t v_tᵀ` to the state `S: [B, H, K, V]` and read "
         "`o_t = S_tᵀ q_t: [B, H, V]` (no scale, no normalisation).",
    solution=linear_step,
    cases=sequence_cases,
    driver=_drive_tokens,
    reference=lambda q, k, v: linear_attention(q, k, v, form="naive"),
    mistakes=((_read_before_write, "write k_t v_tᵀ into the state before reading it: token t attends to itself."),),
)


def linear_chunk_step(state, q_c, k_c, v_c):
    """One chunk of causal linear attention: the chunk's own keys densely, the earlier ones from the state.

    state: ``[B, H, K, V]`` at the chunk's start; q_c, k_c: ``[B, C, H, K]``; v_c: ``[B, C, H, V]``.
    Returns the state at the chunk's end and ``o_c = tril(Q_c K_cᵀ) V_c + Q_c S: [B, C, H, V]``.
    """
    scores = torch.einsum("bihk,bjhk->bhij", q_c, k_c).tril()
    o_c = torch.einsum("bhij,bjhv->bihv", scores, v_c) + torch.einsum("bihk,bhkv->bihv", q_c, state)
    return state + torch.einsum("bjhk,bjhv->bhkv", k_c, v_c), o_c


def _chunk_without_causal_mask(state, q_c, k_c, v_c):
    scores = torch.einsum("bihk,bjhk->bhij", q_c, k_c)
    o_c = torch.einsum("bhij,bjhv->bihv", scores, v_c) + torch.einsum("bihk,bhkv->bihv", q_c, state)
    return state + torch.einsum("bjhk,bjhv->bhkv", k_c, v_c), o_c


def _drive_chunks(step, q, k, v, chunk_size):
    B, T, H, K = q.shape
    state, outputs = q.new_zeros(B, H, K, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        part = slice(start, start + chunk_size)
        state, o_c = call(step, state, q[:, part], k[:, part], v[:, part])
        outputs.append(o_c)
    return torch.cat(outputs, dim=1)


def _chunked_sequences(rng):
    for case in sequence_cases(rng):
        chunk = rng.choice([1, 2, 3, 4, 8, 16])
        yield Case((*case.args, chunk), case.describe + f", chunks of {chunk}")


LINEAR_CHUNK_STEP = Exercise(
    name="linear.linear_chunk_step",
    chapter=2,
    signature="linear_chunk_step(state, q_c, k_c, v_c) -> (state, o_c)",
    task="One chunk of `C` tokens (`q_c, k_c: [B, C, H, K]`, `v_c: [B, C, H, V]`; the last chunk may be "
         "shorter): compute the chunk's outputs from its own keys (a causal `C × C` product) plus the state "
         "`S: [B, H, K, V]` carried from the earlier chunks, and return the state at the chunk's end.",
    solution=linear_chunk_step,
    cases=_chunked_sequences,
    driver=_drive_chunks,
    reference=lambda q, k, v, chunk: linear_attention(q, k, v, form="naive"),
    mistakes=((_chunk_without_causal_mask, "inside the chunk a query reads only keys s <= t: mask Q_c K_cᵀ "
                                           "with a lower-triangular mask."),),
)

EXERCISES = (LINEAR_STEP, LINEAR_CHUNK_STEP)
