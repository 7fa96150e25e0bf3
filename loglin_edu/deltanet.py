"""Gated DeltaNet: the delta rule with a scalar decay, in three forms.

    S_t = exp(g_t) (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,      o_t = S_tᵀ q_t

Unrolled, it is ``O = (A ⊙ M^S) V`` with the attention-like matrix

    A[t, s] = q_tᵀ (Π_{r=s+1..t} (I - β_r k_r k_rᵀ)) k_s β_s        (s <= t)

``log_decay=None`` gives DeltaNet. The chunkwise form solves each chunk with the WY/UT representation
(:mod:`loglin_edu.chunking`). No scale and no normalisation are applied: the layer L2-normalises q, k.
"""

from __future__ import annotations

import torch

from ._checks import check_chunk_size, check_form, check_gate, check_qkv
from ._layout import heads_first, time_first
from .linear import FORMS, _linear_forms
from .masks import segment_sum
from .recurrence import transition


def delta_attention_matrix(
    q: torch.Tensor, k: torch.Tensor, log_decay: torch.Tensor | None, beta: torch.Tensor
) -> torch.Tensor:
    """``A ⊙ M^S`` of the delta rule from its definition. q, k: ``[B, H, T, K]``; log_decay, beta:
    ``[B, H, T]`` (log_decay may be None). Returns ``[B, H, T, T]``, zero above the diagonal.

    Row ``t`` carries every earlier key ``β_s k_s`` through the transitions of tokens ``s+1..t``:
    O(T² K) work, a loop over T.
    """
    B, H, T, K = q.shape
    carried = q.new_zeros(B, H, 0, K)  # row s: Π_{r=s+1..t}(I - β_r k_r k_rᵀ) β_s k_s, for s < t
    rows = []
    for t in range(T):
        carried = carried.transpose(2, 3)  # [B, H, K, s]: the transition acts on columns
        carried = transition(carried, k[:, :, t], None, beta[:, :, t]).transpose(2, 3)
        carried = torch.cat([carried, (beta[:, :, t, None] * k[:, :, t])[:, :, None]], dim=2)
        row = torch.einsum("bhk,bhsk->bhs", q[:, :, t], carried)
        rows.append(torch.nn.functional.pad(row, (0, T - t - 1)))
    matrix = torch.stack(rows, dim=2)
    if log_decay is None:
        return matrix
    return matrix * segment_sum(log_decay).exp()


def gated_deltanet_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    form: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Gated DeltaNet (module docstring). q, k: ``[B, T, H, K]`` (or ``H = 1``); v: ``[B, T, H, V]``;
    log_decay: ``[B, T, H]`` (``g <= 0``) or None (DeltaNet); beta: ``[B, T, H]``. Returns ``[B, T, H, V]``.
    """
    dims = check_qkv(q, k, v)
    if log_decay is not None:
        check_gate("log_decay", log_decay, dims, q, nonpositive=True)
    check_gate("beta", beta, dims, q)
    check_form(form, FORMS)
    check_chunk_size(chunk_size)
    H = dims.H
    g = None if log_decay is None else log_decay.transpose(1, 2)
    out = _linear_forms(
        heads_first(q, H), heads_first(k, H), heads_first(v, H), g, beta.transpose(1, 2), form, chunk_size,
        lambda q_, k_, g_, b_: delta_attention_matrix(q_, k_, g_, b_),
    )
    return time_first(out)
