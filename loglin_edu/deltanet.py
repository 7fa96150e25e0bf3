"""Gated DeltaNet: the delta rule with a scalar decay, in three forms.

    S_t = exp(g_t) (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,      o_t = S_tᵀ q_t

Unrolled, it is ``O = (A ⊙ M^S) V`` with the attention-like matrix

    A[t, s] = q_tᵀ (Π_{r=s+1..t} (I - β_r k_r k_rᵀ)) k_s β_s        (s <= t)

``log_decay=None`` gives DeltaNet. The chunkwise form solves each chunk with the WY/UT representation
(:mod:`loglin_edu.chunking`); the recurrent and chunkwise forms are those of :mod:`loglin_edu.linear`, given
``beta``. No scale and no normalisation are applied: the layer L2-normalises q, k. The public operator is
:func:`~loglin_edu.ops.gated_deltanet_attention`.
"""

from __future__ import annotations

import torch

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
