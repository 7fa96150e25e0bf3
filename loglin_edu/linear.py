"""Linear attention and Mamba-2 (scalar decay): three forms of one function.

    o_t = Σ_{s <= t} (q_t · k_s) exp(G_t - G_s) v_s,      G_t = Σ_{r <= t} g_r,   g <= 0

Without decay (``log_decay=None``) this is plain causal linear attention. The three forms:

- ``naive``:     ``O = ((Q Kᵀ) ⊙ M^S) V`` with the dense ``T × T`` mask: O(T²).
- ``recurrent``: ``S_t = exp(g_t) S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t``: O(T) time, O(1) state.
- ``chunkwise``: dense inside chunks of ``C`` tokens, one state passed between chunks: O(T C).

The same recurrent and chunkwise routines serve the delta rule (``beta``); see :mod:`loglin_edu.deltanet`.
No scale and no normalisation are applied: callers scale or normalise q and k. The forms here are
heads-first (``[B, H, T, D]``); the public operators :func:`~loglin_edu.ops.linear_attention` and
:func:`~loglin_edu.ops.mamba2_attention` check their ``[B, T, H, D]`` inputs and dispatch to them.
"""

from __future__ import annotations

import torch

from .chunking import chunk_terms, split_chunks, wy_factors
from .masks import segment_sum
from .recurrence import read, transition, write

def decay_attention_matrix(q: torch.Tensor, k: torch.Tensor, log_decay: torch.Tensor | None) -> torch.Tensor:
    """``(Q Kᵀ) ⊙ M^S`` restricted to ``s <= t``. q, k: ``[B, H, T, K]``; log_decay: ``[B, H, T]`` or None.

    Returns ``[B, H, T, T]``.
    """
    scores = q @ k.transpose(-1, -2)
    if log_decay is None:
        return scores.tril()
    return scores * segment_sum(log_decay).exp()


def recurrent_linear(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    return_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token recurrence with one ``[B, H, K, V]`` state. q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``;
    log_decay, beta: ``[B, H, T]`` or None. Returns ``[B, H, T, V]``, and with ``return_state`` the final
    state ``[B, H, K, V]``.
    """
    B, H, T, K = q.shape
    state = q.new_zeros(B, H, K, v.shape[-1])
    outputs = []
    for t in range(T):
        g_t = None if log_decay is None else log_decay[:, :, t]
        b_t = None if beta is None else beta[:, :, t]
        state = transition(state, k[:, :, t], g_t, b_t) + write(k[:, :, t], v[:, :, t], b_t)
        outputs.append(read(state, q[:, :, t]))
    out = torch.stack(outputs, dim=2)
    return (out, state) if return_state else out


def chunkwise_linear(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    chunk_size: int = 64,
    return_state: bool = False,
    factors=wy_factors,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise form: ``o = intra V + S_cᵀ query`` per chunk, ``S_{c+1} = Φ_c S_c + own_c``.

    Shapes as :func:`recurrent_linear` (the state after the last, zero-padded chunk is the state after
    token ``T - 1``: padded tokens neither write nor decay). Cost O(T·C·(K+V) + T·K·V) (plus O(T·K²) with
    the delta rule). factors: how the delta rule's WY factors are computed (:func:`~loglin_edu.chunking.chunk_terms`).
    """
    T = q.shape[2]
    terms = chunk_terms(q, k, v, log_decay, beta, chunk_size, factors)
    out = terms.intra @ split_chunks(v, chunk_size)  # [B, H, N, C, V]
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    from_state = []
    for c in range(out.shape[2]):
        from_state.append(terms.query[:, :, c] @ state)
        state = terms.propagate(c, state) + terms.own[:, :, c]
    out = (out + torch.stack(from_state, dim=2)).flatten(2, 3)[:, :, :T]
    return (out, state) if return_state else out
