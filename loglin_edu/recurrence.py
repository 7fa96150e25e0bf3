"""One step of the linear recurrences, shared by every recurrent form and the Fenwick decoding state.

A state is ``S: [B, H, K, V]``; the output reads it as ``o = Sᵀ q``. One token ``t`` moves a state by

    transition:  S <- exp(g_t) (I - β_t k_t k_tᵀ) S        (the delta factor only when β is given)
    write:       S <- S + β_t k_t v_tᵀ                      (β_t = 1 without the delta rule)
"""

from __future__ import annotations

import torch


def transition(
    state: torch.Tensor, k: torch.Tensor, log_decay: torch.Tensor | None, beta: torch.Tensor | None
) -> torch.Tensor:
    """``exp(g) (I - β k kᵀ) S``. state: ``[B, H, K, V]``, k: ``[B, H, K]``, log_decay, beta: ``[B, H]``."""
    if beta is not None:
        state = state - (beta[..., None] * k)[..., :, None] * torch.einsum("bhk,bhkv->bhv", k, state)[..., None, :]
    if log_decay is not None:
        state = state * log_decay.exp()[..., None, None]
    return state


def write(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """The new token's outer product ``β k vᵀ``: ``[B, H, K]``, ``[B, H, V]`` -> ``[B, H, K, V]``."""
    if beta is not None:
        k = k * beta[..., None]
    return k[..., :, None] * v[..., None, :]


def read(state: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``o = Sᵀ q``: state ``[..., K, V]``, q ``[..., K]`` -> ``[..., V]``."""
    return torch.einsum("...k,...kv->...v", q, state)
