"""Chapter 3: Mamba-2's decayed step, its decay mask, and Gated DeltaNet's delta-rule step."""

from __future__ import annotations

import torch

from ..ops import gated_deltanet_attention
from ..ops import mamba2_attention
from ..masks import decay_mask
from .checking import Case, Exercise, drive_steps, sequence_cases


def mamba2_step(state, q_t, k_t, v_t, g_t):
    """``S_t = exp(g_t) S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t``. state: ``[B, H, K, V]``; q_t, k_t: ``[B, H, K]``;
    v_t: ``[B, H, V]``; g_t: ``[B, H]`` (``<= 0``). Returns ``(S_t, o_t)``.
    """
    state = g_t.exp()[..., None, None] * state + torch.einsum("bhk,bhv->bhkv", k_t, v_t)
    return state, torch.einsum("bhkv,bhk->bhv", state, q_t)


def _decay_after_write(state, q_t, k_t, v_t, g_t):
    state = g_t.exp()[..., None, None] * (state + torch.einsum("bhk,bhv->bhkv", k_t, v_t))
    return state, torch.einsum("bhkv,bhk->bhv", state, q_t)


def _drive_tokens(step, q, k, v, *gates):
    B, _, H, K = q.shape
    return drive_steps(step, q.new_zeros(B, H, K, v.shape[-1]), q, k, v, *gates)


MAMBA2_STEP = Exercise(
    name="gated.mamba2_step",
    chapter=3,
    signature="mamba2_step(state, q_t, k_t, v_t, g_t) -> (state, o_t)",
    task="One token of Mamba-2: decay the state `S: [B, H, K, V]` by `exp(g_t)` (`g_t: [B, H]`, one gate per "
         "head), add `k_t v_tᵀ`, and read `o_t = S_tᵀ q_t`.",
    solution=mamba2_step,
    cases=lambda rng: sequence_cases(rng, inputs=4),
    driver=_drive_tokens,
    reference=lambda q, k, v, g: mamba2_attention(q, k, v, g, form="naive"),
    mistakes=((_decay_after_write, "decay the old state, then write: token t's own key is not decayed by g_t."),),
)


def my_decay_mask(log_decay):
    """``M^S[t, s] = exp(G_t - G_s)`` for ``s <= t``, 0 above, with ``G_t = Σ_{r <= t} g_r``.

    log_decay: ``[B, T, H]`` -> ``[B, H, T, T]``. (Fine for short sequences; the package's ``segment_sum``
    avoids subtracting two large cumulative sums.)
    """
    G = log_decay.cumsum(dim=1).transpose(1, 2)  # [B, H, T]
    return (G[..., :, None] - G[..., None, :]).exp().tril()


def _decay_mask_with_own_gate(log_decay):
    G = log_decay.cumsum(dim=1).transpose(1, 2)
    g = log_decay.transpose(1, 2)
    return (G[..., :, None] - G[..., None, :] + g[..., None, :]).exp().tril()


DECAY_MASK = Exercise(
    name="gated.decay_mask",
    chapter=3,
    signature="my_decay_mask(log_decay) -> mask",
    task="Build Mamba-2's semiseparable mask `M^S[t, s] = exp(G_t - G_s)` (`G_t = g_0 + ... + g_t`) for "
         "`s <= t` and 0 above the diagonal, from `log_decay: [B, T, H]`, as a `[B, H, T, T]` tensor.",
    solution=my_decay_mask,
    cases=lambda rng: (Case((c.args[3],), c.describe) for c in sequence_cases(rng, inputs=4)),
    reference=decay_mask,
    mistakes=((_decay_mask_with_own_gate, "M^S[t, t] = 1: key s is decayed by the gates of tokens s+1..t, "
                                          "not by its own g_s."),),
)


def gated_delta_step(state, q_t, k_t, v_t, g_t, beta_t):
    """``S_t = exp(g_t) (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ``, ``o_t = S_tᵀ q_t``.

    Shapes as :func:`mamba2_step`, and beta_t: ``[B, H]``.
    """
    erased = state - beta_t[..., None, None] * torch.einsum("bhk,bhj,bhjv->bhkv", k_t, k_t, state)
    state = g_t.exp()[..., None, None] * erased + beta_t[..., None, None] * torch.einsum("bhk,bhv->bhkv", k_t, v_t)
    return state, torch.einsum("bhkv,bhk->bhv", state, q_t)


def _delta_write_without_beta(state, q_t, k_t, v_t, g_t, beta_t):
    erased = state - beta_t[..., None, None] * torch.einsum("bhk,bhj,bhjv->bhkv", k_t, k_t, state)
    state = g_t.exp()[..., None, None] * erased + torch.einsum("bhk,bhv->bhkv", k_t, v_t)
    return state, torch.einsum("bhkv,bhk->bhv", state, q_t)


GATED_DELTA_STEP = Exercise(
    name="gated.gated_delta_step",
    chapter=3,
    signature="gated_delta_step(state, q_t, k_t, v_t, g_t, beta_t) -> (state, o_t)",
    task="One token of Gated DeltaNet: erase the old value stored at `k_t` (`(I - β_t k_t k_tᵀ) S`), decay "
         "by `exp(g_t)`, write `β_t k_t v_tᵀ`, and read `o_t = S_tᵀ q_t` (`g_t, beta_t: [B, H]`).",
    solution=gated_delta_step,
    cases=lambda rng: sequence_cases(rng, inputs=5, unit_keys=True),
    driver=_drive_tokens,
    reference=lambda q, k, v, g, beta: gated_deltanet_attention(q, k, v, g, beta, form="naive"),
    mistakes=((_delta_write_without_beta, "the write is β_t k_t v_tᵀ: the delta rule moves the stored value "
                                          "a fraction β_t towards v_t."),),
)

EXERCISES = (MAMBA2_STEP, DECAY_MASK, GATED_DELTA_STEP)
